package handlers

import (
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// agentJSON is the API shape of an agent (spec: Agent). The secret appears
// only in the answers to create and recover.
type agentJSON struct {
	ID           string   `json:"id"`
	ClientID     string   `json:"clientId"`
	ClientSecret string   `json:"clientSecret,omitempty"`
	Name         string   `json:"name"`
	Type         string   `json:"type"`
	Description  string   `json:"description"`
	Capabilities []string `json:"capabilities"`
	TrustLevel   string   `json:"trustLevel"`
	Status       string   `json:"status"`
	CreatedAt    string   `json:"createdAt"`
	UpdatedAt    string   `json:"updatedAt"`
	KilledAt     *string  `json:"killedAt,omitempty"`
}

func toAgentJSON(a *persistence.Agent, secret string) agentJSON {
	out := agentJSON{
		ID: a.ID, ClientID: a.ClientID, ClientSecret: secret, Name: a.Name, Type: a.Type, Description: a.Description,
		Capabilities: a.Capabilities, TrustLevel: a.TrustLevel, Status: a.Status,
		CreatedAt: isoTime(a.CreatedAt), UpdatedAt: isoTime(a.UpdatedAt),
	}
	if out.Capabilities == nil {
		out.Capabilities = []string{}
	}
	if a.KilledAt != nil {
		t := isoTime(*a.KilledAt)
		out.KilledAt = &t
	}
	return out
}

// actor names the caller in audit entries and events.
func actor(r *http.Request) persistence.Actor { return principalFrom(r.Context()).Actor() }

// POST /api/v1/agents
func (a *api) createAgent(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name         string   `json:"name"`
		Type         string   `json:"type"`
		Description  string   `json:"description"`
		Capabilities []string `json:"capabilities"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	ag, secret, err := a.agents.Create(r.Context(), actor(r), grantor(r), agents.Input{Name: body.Name, Type: body.Type, Description: body.Description, Capabilities: body.Capabilities})
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/agents/"+ag.ID)
	writeJSON(w, http.StatusCreated, toAgentJSON(ag, secret))
}

// grantor is the caller as the giver of capabilities: an admin holds
// every scope, anyone else those of its token.
func grantor(r *http.Request) agents.Grantor {
	p := principalFrom(r.Context())
	if p.HasScope(oauth.ScopeAdmin) {
		return agents.AnyScope
	}
	return p.HasScope
}

// GET /api/v1/agents
func (a *api) listAgents(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	list, total, err := a.agents.List(r.Context(), persistence.AgentFilter{Status: q.Get("status"), TrustLevel: q.Get("trustLevel"), Type: q.Get("type")}, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "agents", list, total, page, func(x *persistence.Agent) agentJSON { return toAgentJSON(x, "") })
}

// GET /api/v1/agents/{id}
func (a *api) getAgent(w http.ResponseWriter, r *http.Request) {
	ag, err := a.agents.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAgentJSON(ag, ""))
}

// PATCH /api/v1/agents/{id}
func (a *api) updateAgent(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name        *string `json:"name"`
		Description *string `json:"description"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	ag, err := a.agents.Update(r.Context(), actor(r), mux.Vars(r)["id"], agents.Patch{Name: body.Name, Description: body.Description})
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAgentJSON(ag, ""))
}

// DELETE /api/v1/agents/{id}
func (a *api) deleteAgent(w http.ResponseWriter, r *http.Request) {
	if err := a.agents.Delete(r.Context(), actor(r), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// GET /api/v1/agents/{id}/capabilities
func (a *api) getAgentCapabilities(w http.ResponseWriter, r *http.Request) {
	ag, err := a.agents.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"agentId": ag.ID, "capabilities": toAgentJSON(ag, "").Capabilities})
}

// PUT /api/v1/agents/{id}/capabilities
func (a *api) setAgentCapabilities(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Capabilities *[]string `json:"capabilities"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	if body.Capabilities == nil {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "capabilities is required (an array, possibly empty).", map[string]any{"field": "capabilities"}))
		return
	}
	ag, err := a.agents.SetCapabilities(r.Context(), actor(r), grantor(r), mux.Vars(r)["id"], *body.Capabilities)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"agentId": ag.ID, "capabilities": toAgentJSON(ag, "").Capabilities})
}

// POST /api/v1/agents/{id}/trust
func (a *api) changeAgentTrust(w http.ResponseWriter, r *http.Request) {
	var body struct {
		TrustLevel string `json:"trustLevel"`
		Reason     string `json:"reason"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	ag, err := a.agents.ChangeTrust(r.Context(), actor(r), mux.Vars(r)["id"], body.TrustLevel, body.Reason)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAgentJSON(ag, ""))
}

// POST /api/v1/agents/{id}/kill
func (a *api) killAgent(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	ag, err := a.agents.Kill(r.Context(), actor(r), mux.Vars(r)["id"], body.Reason)
	// In the kill's unit of work: its grants are revoked with it, and its
	// pending requests denied.
	if err == nil && a.jit != nil {
		err = a.jit.RevokeAll(r.Context(), ag.ID, actor(r), body.Reason)
	}
	if err == nil && a.hitl != nil {
		err = a.hitl.DenyPending(r.Context(), ag.ID, actor(r), body.Reason)
	}
	if err == nil && a.ciba != nil { // and its delegations revoked
		err = a.ciba.RevokeAll(r.Context(), ag.ID, actor(r), body.Reason)
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "agentId": ag.ID, "status": ag.Status, "killedAt": isoTime(*ag.KilledAt), "reason": body.Reason})
}

// POST /api/v1/agents/{id}/recover: no body, or {"reason": "..."} (ours,
// optional) for the history.
func (a *api) recoverAgent(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if r.ContentLength != 0 {
		if err := decodeJSON(r, &body); err != nil {
			writeError(w, r, err)
			return
		}
	}
	ag, secret, err := a.agents.Recover(r.Context(), actor(r), mux.Vars(r)["id"], body.Reason)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "agentId": ag.ID, "status": ag.Status,
		"clientId": ag.ClientID, "clientSecret": secret, "recoveredAt": isoTime(ag.UpdatedAt)})
}

// auditJSON is the API shape of an audit entry (spec: Agent audit entry).
type auditJSON struct {
	Timestamp string             `json:"timestamp"`
	Action    string             `json:"action"`
	Actor     *persistence.Actor `json:"actor,omitempty"`
	IP        string             `json:"ip,omitempty"`
	Endpoint  string             `json:"endpoint,omitempty"`
	Status    *int               `json:"status,omitempty"`
	Details   map[string]any     `json:"details"`
	Intent    *intentFields      `json:"intent,omitempty"` // the request's X-Service-* headers, when it sent any
}

func toAuditJSON(e persistence.AuditEntry) auditJSON {
	d := map[string]any(e.Details)
	if d == nil {
		d = map[string]any{}
	}
	out := auditJSON{Timestamp: isoTime(e.CreatedAt), Action: e.Action, IP: e.IP, Endpoint: e.Endpoint, Status: e.Status, Details: d}
	if !e.Actor.IsZero() {
		out.Actor = &e.Actor
	}
	if e.Intent != (persistence.Intent{}) {
		f := toIntentFields(e.Intent)
		out.Intent = &f
	}
	return out
}

// GET /api/v1/agents/{id}/audit: filters action (comma-separated), from and
// to (RFC 3339 times, or YYYY-MM-DD dates in UTC; to is exclusive).
func (a *api) agentAudit(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	f := persistence.AuditFilter{}
	if v := q.Get("action"); v != "" {
		f.Actions = strings.Split(v, ",")
	}
	if f.From, err = timeParam(q.Get("from"), "from"); err != nil {
		writeError(w, r, err)
		return
	}
	if f.To, err = timeParam(q.Get("to"), "to"); err != nil {
		writeError(w, r, err)
		return
	}
	a.writeAudit(w, r, "entries", f, page)
}

// GET /api/v1/agents/{id}/kill-events: the kill and recover history.
func (a *api) agentKillEvents(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	a.writeAudit(w, r, "events", persistence.AuditFilter{Actions: []string{agents.ActionKilled, agents.ActionRecovered}}, page)
}

func (a *api) writeAudit(w http.ResponseWriter, r *http.Request, key string, f persistence.AuditFilter, page persistence.Page) {
	entries, total, err := a.agents.Audit(r.Context(), mux.Vars(r)["id"], f, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := make([]auditJSON, len(entries))
	for i, e := range entries {
		out[i] = toAuditJSON(e)
	}
	writeJSON(w, http.StatusOK, map[string]any{key: out, "total": total, "limit": page.Limit, "offset": page.Offset})
}

// timeParam reads an RFC 3339 time or a YYYY-MM-DD date (midnight UTC).
func timeParam(v, name string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
		if t, err := time.Parse(layout, v); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, newError(http.StatusBadRequest, "invalid_request", name+" must be an RFC 3339 time or a YYYY-MM-DD date.", map[string]any{"field": name})
}
