package handlers

import (
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/jit"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Just-in-time privileges (spec: Just-in-time privileges; issue 15). Rules
// live in extensions/jit.

const (
	jitRequestPath = "/api/v1/jit/request"
	jitGrantsPath  = "/api/v1/jit/grants"
	jitRulesPath   = "/api/v1/jit/rules"
)

// jitRoutes adds the agent's request and status (its own token), the
// admin's revocation and the automatic-approval rules (admin token).
func (a *api) jitRoutes(r *mux.Router, rl RateLimits) {
	if a.jit == nil {
		return
	}
	admin := func(h http.HandlerFunc) http.HandlerFunc {
		return a.guarded(oauth.ScopeAdmin, "", "admin", rl.Admin, h)
	}
	r.HandleFunc(jitRequestPath, a.guarded("", "", "m2m-write", rl.M2MWrite, a.requestJIT)).Methods(http.MethodPost)
	r.HandleFunc(jitGrantsPath+"/{grantId}/status", a.guarded("", "", "m2m-read", rl.M2MRead, a.jitStatus)).Methods(http.MethodGet)
	r.HandleFunc(jitGrantsPath+"/{grantId}/revoke", admin(a.revokeJIT)).Methods(http.MethodPost)
	r.HandleFunc(jitRulesPath, admin(a.createJITRule)).Methods(http.MethodPost)
	r.HandleFunc(jitRulesPath, admin(a.listJITRules)).Methods(http.MethodGet)
	r.HandleFunc(jitRulesPath+"/{ruleId}", admin(a.deleteJITRule)).Methods(http.MethodDelete)
}

// jitGrantJSON is the API shape of a grant (spec: JIT grant).
type jitGrantJSON struct {
	GrantID     string   `json:"grantId"`
	Status      string   `json:"status"`
	Action      string   `json:"action"`
	Resource    string   `json:"resource"`
	Scopes      []string `json:"scopes"`
	Duration    int      `json:"duration"`
	RequestID   *string  `json:"requestId"` // the HITL request that decides it, if any
	CreatedAt   string   `json:"createdAt"`
	ActivatedAt *string  `json:"activatedAt"`
	ExpiresAt   *string  `json:"expiresAt"`
	EndedAt     *string  `json:"endedAt"`
	Reason      *string  `json:"reason"`
}

func isoPtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := isoTime(*t)
	return &s
}

func toJITGrantJSON(g *persistence.JITGrant) jitGrantJSON {
	out := jitGrantJSON{GrantID: g.ID, Status: jit.Status(g, extensions.Now()), Action: g.Action, Resource: g.Resource, Scopes: g.Scopes,
		Duration: g.DurationSeconds, RequestID: g.HITLRequestID, CreatedAt: isoTime(g.CreatedAt), ActivatedAt: isoPtr(g.ActivatedAt),
		ExpiresAt: isoPtr(g.ExpiresAt), EndedAt: isoPtr(g.EndedAt)}
	if out.Scopes == nil {
		out.Scopes = []string{}
	}
	if g.Reason != "" {
		out.Reason = &g.Reason
	}
	return out
}

// POST /api/v1/jit/request: 201 with the grant, active or pending_approval.
func (a *api) requestJIT(w http.ResponseWriter, r *http.Request) {
	agent, err := agentCaller(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var body struct {
		Action   string         `json:"action"`
		Resource string         `json:"resource"`
		Scopes   []string       `json:"scopes"`
		Duration int            `json:"duration"`
		Context  map[string]any `json:"context"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	g, err := a.jit.Request(r.Context(), jit.Agent{Agent: agent, TrustLevel: principalFrom(r.Context()).Agent.TrustLevel},
		jit.RequestInput{Action: body.Action, Resource: body.Resource, Scopes: body.Scopes, DurationSeconds: body.Duration, Context: body.Context})
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", jitGrantsPath+"/"+g.ID+"/status")
	writeJSON(w, http.StatusCreated, toJITGrantJSON(g))
}

// GET /api/v1/jit/grants/{grantId}/status: the agent's own grants only.
func (a *api) jitStatus(w http.ResponseWriter, r *http.Request) {
	agent, err := agentCaller(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	g, err := a.jit.Get(r.Context(), agent.ID, mux.Vars(r)["grantId"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJITGrantJSON(g))
}

// POST /api/v1/jit/grants/{grantId}/revoke
func (a *api) revokeJIT(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	g, err := a.jit.Revoke(r.Context(), actor(r), mux.Vars(r)["grantId"], body.Reason)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJITGrantJSON(g))
}

// jitRuleJSON is the API shape of an automatic-approval rule.
type jitRuleJSON struct {
	ID                 string `json:"id"`
	Scope              string `json:"scope"`
	MaxDurationSeconds int    `json:"maxDurationSeconds"`
	MinTrustLevel      string `json:"minTrustLevel"`
	CreatedAt          string `json:"createdAt"`
}

func toJITRuleJSON(x *persistence.JITRule) jitRuleJSON {
	return jitRuleJSON{ID: x.ID, Scope: x.Scope, MaxDurationSeconds: x.MaxDurationSeconds, MinTrustLevel: x.MinTrustLevel, CreatedAt: isoTime(x.CreatedAt)}
}

// POST /api/v1/jit/rules
func (a *api) createJITRule(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Scope              string `json:"scope"`
		MaxDurationSeconds int    `json:"maxDurationSeconds"`
		MinTrustLevel      string `json:"minTrustLevel"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	x, err := a.jit.CreateRule(r.Context(), jit.RuleInput{Scope: body.Scope, MaxDurationSeconds: body.MaxDurationSeconds, MinTrustLevel: body.MinTrustLevel})
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", jitRulesPath+"/"+x.ID)
	writeJSON(w, http.StatusCreated, toJITRuleJSON(x))
}

// GET /api/v1/jit/rules: every rule (at most jit.MaxRules), oldest first.
func (a *api) listJITRules(w http.ResponseWriter, r *http.Request) {
	rules, err := a.jit.Rules(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]jitRuleJSON, len(rules))
	for i := range rules {
		out[i] = toJITRuleJSON(&rules[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": out, "total": len(out)})
}

// DELETE /api/v1/jit/rules/{ruleId}
func (a *api) deleteJITRule(w http.ResponseWriter, r *http.Request) {
	if err := a.jit.DeleteRule(r.Context(), mux.Vars(r)["ruleId"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
