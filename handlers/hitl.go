package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Human-in-the-loop approvals (spec: Human-in-the-loop; issue 15). Rules
// live in extensions/hitl.

const (
	hitlPoliciesPath = "/api/v1/agents/hitl/policies"
	hitlRequestPath  = "/api/v1/agents/hitl/request"
)

// hitlRoutes adds the policy routes (admin token), the agent's request and
// poll (its own token), and the decisions (an approver's token).
func (a *api) hitlRoutes(r *mux.Router, rl RateLimits) {
	if a.hitl == nil {
		return
	}
	admin := func(h http.HandlerFunc) http.HandlerFunc {
		return a.guarded(oauth.ScopeAdmin, "", "admin", rl.Admin, h)
	}
	r.HandleFunc(hitlPoliciesPath, admin(a.createHITLPolicy)).Methods(http.MethodPost)
	r.HandleFunc(hitlPoliciesPath, admin(a.listHITLPolicies)).Methods(http.MethodGet)
	r.HandleFunc(hitlPoliciesPath+"/{policyId}", admin(a.getHITLPolicy)).Methods(http.MethodGet)
	r.HandleFunc(hitlPoliciesPath+"/{policyId}", admin(a.updateHITLPolicy)).Methods(http.MethodPatch)
	r.HandleFunc(hitlPoliciesPath+"/{policyId}", admin(a.deleteHITLPolicy)).Methods(http.MethodDelete)
	// The request is written in a transaction of its own (with its audit
	// entry), not in a unit held open for the sync wait: the approver must
	// see it, and SQLite's one writer must not wait on a person.
	r.HandleFunc(hitlRequestPath, a.authenticated("", "", a.limited("m2m-write", rl.M2MWrite, byPrincipal, a.requestHITL))).Methods(http.MethodPost)
	r.HandleFunc(hitlRequestPath+"/{requestId}", a.guarded("", "", "m2m-read", rl.M2MRead, a.getHITLRequest)).Methods(http.MethodGet)
	decide := func(approve bool) http.HandlerFunc {
		return a.guarded("", "", "admin", rl.Admin, a.decideHITL(approve))
	}
	r.HandleFunc(hitlRequestPath+"/{requestId}/approve", decide(true)).Methods(http.MethodPost)
	r.HandleFunc(hitlRequestPath+"/{requestId}/deny", decide(false)).Methods(http.MethodPost)
}

// hitlPolicyJSON is the API shape of a policy (spec: HITL policy, with our
// id and times).
type hitlPolicyJSON struct {
	ID                string  `json:"id"`
	Name              string  `json:"name"`
	ActionPattern     string  `json:"actionPattern"`
	ResourcePattern   string  `json:"resourcePattern"`
	ApprovalMode      string  `json:"approvalMode"`
	TimeoutSeconds    int     `json:"timeoutSeconds"`
	ApproverType      string  `json:"approverType"`
	ApproverID        string  `json:"approverId"`
	AutoDenyOnTimeout bool    `json:"autoDenyOnTimeout"`
	Priority          float64 `json:"priority"`
	CreatedAt         string  `json:"createdAt"`
	UpdatedAt         string  `json:"updatedAt"`
}

func toHITLPolicyJSON(p *persistence.HITLPolicy) hitlPolicyJSON {
	return hitlPolicyJSON{ID: p.ID, Name: p.Name, ActionPattern: p.ActionPattern, ResourcePattern: p.ResourcePattern,
		ApprovalMode: p.ApprovalMode, TimeoutSeconds: p.TimeoutSeconds, ApproverType: p.ApproverType, ApproverID: p.ApproverID,
		AutoDenyOnTimeout: p.AutoDenyOnTimeout, Priority: p.Priority, CreatedAt: isoTime(p.CreatedAt), UpdatedAt: isoTime(p.UpdatedAt)}
}

// hitlPolicyBody is a policy as sent; absent fields are nil.
type hitlPolicyBody struct {
	Name              *string  `json:"name"`
	ActionPattern     *string  `json:"actionPattern"`
	ResourcePattern   *string  `json:"resourcePattern"`
	ApprovalMode      *string  `json:"approvalMode"`
	TimeoutSeconds    *int     `json:"timeoutSeconds"`
	ApproverType      *string  `json:"approverType"`
	ApproverID        *string  `json:"approverId"`
	AutoDenyOnTimeout *bool    `json:"autoDenyOnTimeout"`
	Priority          *float64 `json:"priority"`
}

func (b hitlPolicyBody) input() hitl.PolicyInput {
	return hitl.PolicyInput{Name: b.Name, ActionPattern: b.ActionPattern, ResourcePattern: b.ResourcePattern, ApprovalMode: b.ApprovalMode,
		TimeoutSeconds: b.TimeoutSeconds, ApproverType: b.ApproverType, ApproverID: b.ApproverID, AutoDenyOnTimeout: b.AutoDenyOnTimeout, Priority: b.Priority}
}

// POST /api/v1/agents/hitl/policies
func (a *api) createHITLPolicy(w http.ResponseWriter, r *http.Request) {
	var body hitlPolicyBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	p, err := a.hitl.CreatePolicy(r.Context(), body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", hitlPoliciesPath+"/"+p.ID)
	writeJSON(w, http.StatusCreated, toHITLPolicyJSON(p))
}

// GET /api/v1/agents/hitl/policies: in evaluation order.
func (a *api) listHITLPolicies(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.hitl.ListPolicies(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "policies", list, total, page, toHITLPolicyJSON)
}

// GET /api/v1/agents/hitl/policies/{policyId}
func (a *api) getHITLPolicy(w http.ResponseWriter, r *http.Request) {
	p, err := a.hitl.GetPolicy(r.Context(), mux.Vars(r)["policyId"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toHITLPolicyJSON(p))
}

// PATCH /api/v1/agents/hitl/policies/{policyId}
func (a *api) updateHITLPolicy(w http.ResponseWriter, r *http.Request) {
	var body hitlPolicyBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	p, err := a.hitl.UpdatePolicy(r.Context(), mux.Vars(r)["policyId"], body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toHITLPolicyJSON(p))
}

// DELETE /api/v1/agents/hitl/policies/{policyId}
func (a *api) deleteHITLPolicy(w http.ResponseWriter, r *http.Request) {
	if err := a.hitl.DeletePolicy(r.Context(), mux.Vars(r)["policyId"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// hitlRequestJSON is the API shape of a request (spec: HITL request).
type hitlRequestJSON struct {
	RequestID    string         `json:"requestId"`
	Status       string         `json:"status"`
	PolicyID     *string        `json:"policyId"`
	Action       string         `json:"action"`
	Resource     string         `json:"resource"`
	Context      map[string]any `json:"context"`
	ApprovalMode string         `json:"approvalMode"`
	CreatedAt    string         `json:"createdAt"`
	ExpiresAt    string         `json:"expiresAt"`
	DecidedAt    *string        `json:"decidedAt"`
	Reason       *string        `json:"reason"`
	RedeemedAt   *string        `json:"redeemedAt"`
	// The one call the approval is for (issue 39); null when it names none.
	Method *string         `json:"method"`
	Path   *string         `json:"path"`
	Body   json.RawMessage `json:"body"`
	UsedAt *string         `json:"usedAt"`
}

func (a *api) toHITLRequestJSON(x *persistence.HITLRequest) hitlRequestJSON {
	now := extensions.Now()
	out := hitlRequestJSON{RequestID: x.ID, Status: hitl.Status(x, now), PolicyID: x.PolicyID, Action: x.Action, Resource: x.Resource,
		Context: x.Context, ApprovalMode: x.ApprovalMode, CreatedAt: isoTime(x.CreatedAt), ExpiresAt: isoTime(x.ExpiresAt)}
	if out.Context == nil {
		out.Context = map[string]any{}
	}
	if x.DecidedAt != nil {
		t := isoTime(*x.DecidedAt)
		out.DecidedAt = &t
		if !hitl.TimedOut(x, now) {
			out.Reason = &x.Reason
		}
	}
	if x.RedeemedAt != nil {
		t := isoTime(*x.RedeemedAt)
		out.RedeemedAt = &t
	}
	out.Body = json.RawMessage("null")
	if x.CallMethod != "" {
		out.Method, out.Path = &x.CallMethod, &x.CallPath
		if x.CallBody != "" {
			out.Body = json.RawMessage(x.CallBody)
		}
	}
	if x.UsedAt != nil {
		t := isoTime(*x.UsedAt)
		out.UsedAt = &t
	}
	return out
}

// agentCaller is the agent a call comes from, acting for itself: the HITL
// and JIT routes an agent calls accept nothing else (spec: Authentication 5).
func agentCaller(r *http.Request) (hitl.Agent, error) {
	p := principalFrom(r.Context())
	if p.Agent == nil || !p.ForItself() {
		return hitl.Agent{}, newError(http.StatusForbidden, "agent_token_required", "This call needs an agent's own token (client credentials).", nil)
	}
	return hitl.Agent{ID: p.Client.RecordID, ClientID: p.ClientID(), Actor: p.Actor()}, nil
}

// POST /api/v1/agents/hitl/request: 201 with the pending request when a
// policy matches (a sync policy holds the call until a decision, the
// timeout or hitl.MaxSyncWait); 200 approved with requestId and policyId
// null when none does: no approval is needed. With method and path (and
// body) the approval is for that one call (issue 39): a gated M2M call
// passes with it once.
func (a *api) requestHITL(w http.ResponseWriter, r *http.Request) {
	agent, err := agentCaller(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var body struct {
		Action   string         `json:"action"`
		Resource string         `json:"resource"`
		Context  map[string]any `json:"context"`
		Method   *string        `json:"method"`
		Path     *string        `json:"path"`
		Body     any            `json:"body"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	in := hitl.RequestInput{Action: body.Action, Resource: body.Resource, Context: body.Context}
	if body.Method != nil || body.Path != nil || body.Body != nil {
		var v extensions.ValidationError
		call := hitl.NewCall(&v, deref(body.Method), deref(body.Path), body.Body, loggablePath)
		if v.Err() == nil {
			a.checkCallAction(&v, call, body.Action, body.Resource)
		}
		if err := v.Err(); err != nil {
			writeError(w, r, err)
			return
		}
		in.Call = &call
	}
	req, err := a.hitl.Request(r.Context(), agent, in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if req == nil {
		writeJSON(w, http.StatusOK, map[string]any{"requestId": nil, "status": persistence.HITLApproved, "policyId": nil, "expiresAt": nil,
			"action": body.Action, "resource": body.Resource})
		return
	}
	if req.ApprovalMode == hitl.ModeSync {
		if req, err = a.hitl.Wait(r.Context(), req.ID, hitl.MaxSyncWait); err != nil {
			writeError(w, r, err)
			return
		}
	}
	w.Header().Set("Location", hitlRequestPath+"/"+req.ID)
	writeJSON(w, http.StatusCreated, a.toHITLRequestJSON(req))
}

// GET /api/v1/agents/hitl/request/{requestId}: the requesting agent only;
// to anyone else the request does not exist.
func (a *api) getHITLRequest(w http.ResponseWriter, r *http.Request) {
	agent, err := agentCaller(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	req, err := a.hitl.Get(r.Context(), agent.ID, mux.Vars(r)["requestId"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a.toHITLRequestJSON(req))
}

// errDecideScope refuses a decision through the API to a token that may
// not take one (issue 39): an admin token, or a person's token from an
// adminConsole application, decides; people otherwise decide on the
// approval page (their SSO session and a CSRF token).
var errDecideScope = newError(http.StatusForbidden, "insufficient_scope",
	"Deciding an approval through the API needs an admin token or a token of an adminConsole application; approvers may also decide on the approval page.",
	map[string]any{"requiredScope": oauth.ScopeAdmin})

// approver is the caller of a decision, as hitl sees it. Agents are
// refused by hitl (self_approval, not_approver); a token that is neither
// an admin's nor a person's from an adminConsole application, with
// errDecideScope.
func (a *api) approver(w http.ResponseWriter, r *http.Request) (hitl.Approver, error) {
	p := principalFrom(r.Context())
	who := hitl.Approver{Actor: p.Actor(), Admin: p.HasScope(oauth.ScopeAdmin)}
	if p.Agent != nil {
		who.AgentID = p.Client.RecordID
		return who, nil
	}
	console := p.SessionID != "" && p.Client.App != nil && p.Client.App.AdminConsole
	if !who.Admin && !console {
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="insufficient_scope", scope="`+oauth.ScopeAdmin+`"`)
		return who, errDecideScope
	}
	if console {
		who.UserID = p.Subject
		if !who.Admin {
			admin, err := a.personIsAdmin(r.Context(), p)
			if err != nil {
				return who, err
			}
			who.Admin = admin
		}
	}
	return who, nil
}

// POST /api/v1/agents/hitl/request/{requestId}/approve and …/deny
func (a *api) decideHITL(approve bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Reason string `json:"reason"`
		}
		if r.ContentLength != 0 {
			if err := decodeJSON(r, &body); err != nil {
				writeError(w, r, err)
				return
			}
		}
		who, err := a.approver(w, r)
		if err != nil {
			writeError(w, r, err)
			return
		}
		req, err := a.hitl.Decide(r.Context(), who, mux.Vars(r)["requestId"], approve, body.Reason)
		if err != nil {
			writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, a.toHITLRequestJSON(req))
	}
}

// m2mActions names the action of each M2M route, as HITL policies match
// it: the verb and the object ("delete_user"). The resource is the path
// after /api/v1/m2m/ ("users/{id}" with the id), invite tokens hidden.
var m2mActions = map[string]string{
	"GET /api/v1/m2m/users":                                 "list_users",
	"POST /api/v1/m2m/users":                                "create_user",
	"POST /api/v1/m2m/users/invite":                         "invite_user",
	"GET /api/v1/m2m/users/{id}":                            "read_user",
	"PATCH /api/v1/m2m/users/{id}":                          "update_user",
	"DELETE /api/v1/m2m/users/{id}":                         "delete_user",
	"GET /api/v1/m2m/users/{id}/sessions":                   "list_sessions",
	"DELETE /api/v1/m2m/users/{id}/sessions":                "delete_sessions",
	"PUT /api/v1/m2m/users/{id}/console-admin":              "grant_console_admin",
	"DELETE /api/v1/m2m/users/{id}/console-admin":           "revoke_console_admin",
	"GET /api/v1/m2m/users/{id}/roles":                      "list_user_roles",
	"GET /api/v1/m2m/orgs":                                  "list_orgs",
	"POST /api/v1/m2m/orgs":                                 "create_org",
	"GET /api/v1/m2m/orgs/{id}":                             "read_org",
	"PATCH /api/v1/m2m/orgs/{id}":                           "update_org",
	"DELETE /api/v1/m2m/orgs/{id}":                          "delete_org",
	"GET /api/v1/m2m/orgs/{id}/members":                     "list_members",
	"POST /api/v1/m2m/orgs/{id}/members":                    "add_member",
	"DELETE /api/v1/m2m/orgs/{id}/members/{userId}":         "remove_member",
	"GET /api/v1/m2m/roles":                                 "list_roles",
	"POST /api/v1/m2m/roles":                                "create_role",
	"POST /api/v1/m2m/roles/assign":                         "assign_role",
	"DELETE /api/v1/m2m/roles/remove":                       "remove_role",
	"DELETE /api/v1/m2m/roles/{name}":                       "delete_role",
	"POST /api/v1/m2m/invites/{token}/accept":               "accept_invite",
	"GET /api/v1/m2m/analytics/overview":                    "read_analytics_overview",
	"GET /api/v1/m2m/analytics/events":                      "list_auth_events",
	"GET /api/v1/m2m/analytics/users/active":                "read_active_users",
	"PUT /api/v1/m2m/authz/model":                           "write_authz_model",
	"GET /api/v1/m2m/authz/model":                           "read_authz_model",
	"POST /api/v1/m2m/authz/tuples":                         "write_authz_tuples",
	"GET /api/v1/m2m/authz/tuples":                          "list_authz_tuples",
	"POST /api/v1/m2m/authz/check":                          "check_authz",
	"POST /api/v1/m2m/authz/batch-check":                    "batch_check_authz",
	"POST /api/v1/m2m/authz/list-objects":                   "list_authz_objects",
	"GET /api/v1/m2m/applications/{appId}/users":            "list_application_users",
	"GET /api/v1/m2m/applications/{appId}/sessions":         "list_application_sessions",
	"GET /api/v1/m2m/delegations":                           "list_delegations",
	"POST /api/v1/m2m/delegations/{id}/revoke":              "revoke_delegation",
	"POST /api/v1/m2m/applications/{appId}/api-keys":        "issue_api_key",
	"GET /api/v1/m2m/applications/{appId}/api-keys":         "list_api_keys",
	"GET /api/v1/m2m/applications/{appId}/api-keys/{id}":    "read_api_key",
	"DELETE /api/v1/m2m/applications/{appId}/api-keys/{id}": "revoke_api_key",
	"POST /api/v1/m2m/api-keys/validate":                    "validate_api_key",
	"GET /api/v1/m2m/usage":                                 "read_usage",
}

// m2mAction is the action and resource of an M2M call (m2mActions).
func m2mAction(r *http.Request) (string, string, bool) {
	route := mux.CurrentRoute(r)
	if route == nil {
		return "", "", false
	}
	tpl, err := route.GetPathTemplate()
	if err != nil {
		return "", "", false
	}
	action, ok := m2mActions[r.Method+" "+tpl]
	return action, strings.TrimPrefix(loggablePath(r.URL.Path), "/api/v1/m2m/"), ok
}

// checkCallAction refuses an explicit request whose call is an M2M route
// of another action or resource than the request names: the approver
// reads both, and they must agree (the gate would refuse such an approval
// anyway: it looks for the call's own action and resource).
func (a *api) checkCallAction(v *extensions.ValidationError, call hitl.Call, action, resource string) {
	req, err := http.NewRequest(call.Method, call.Path, nil)
	var m mux.RouteMatch
	if err != nil || a.routes == nil || !a.routes.Match(req, &m) || m.Route == nil {
		return
	}
	tpl, err := m.Route.GetPathTemplate()
	want, ok := m2mActions[call.Method+" "+tpl]
	if err != nil || !ok {
		return
	}
	if action != want {
		v.Add("action", "must be %s, the action of %s %s", want, call.Method, tpl)
	}
	if res := strings.TrimPrefix(loggablePath(req.URL.Path), "/api/v1/m2m/"); resource != res {
		v.Add("resource", "must be %s, the resource of the call", res)
	}
}

// gated holds an agent's M2M call to the HITL policies: a call a policy
// matches needs a token that carries an approval of this one call (method,
// path with query, canonical JSON body; redeemed at the token endpoint),
// and passes with it once (issue 39). Else it is 403 approval_required
// with the request that stands for the call: one still open for the same
// call (pending, or approved and not redeemed), else a new one. The use
// and a new request are each written in a transaction of their own,
// before the call's unit (which a refusal rolls back): an approval let
// through is spent whatever the call then answers. Service accounts and
// people are not gated.
func (a *api) gated(next http.HandlerFunc) http.HandlerFunc {
	if a.hitl == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		p := principalFrom(r.Context())
		action, resource, ok := m2mAction(r)
		if p == nil || p.Agent == nil || !ok {
			next(w, r)
			return
		}
		policy, err := a.hitl.Match(r.Context(), action, resource)
		if err != nil {
			writeError(w, r, err)
			return
		}
		if policy == nil {
			next(w, r)
			return
		}
		call, err := gatedCall(r)
		if err != nil {
			writeError(w, r, err)
			return
		}
		agent := hitl.Agent{ID: p.Client.RecordID, ClientID: p.ClientID(), Actor: p.Actor()}
		if id := hitl.Approval(p.Details, action, resource); id != "" {
			err := a.hitl.Use(r.Context(), agent, id, call)
			if err == nil {
				next(w, r)
				return
			}
			if !errors.Is(err, hitl.ErrNotThisCall) {
				writeError(w, r, err)
				return
			}
		}
		req, err := a.hitl.ForCall(r.Context(), agent, hitl.RequestInput{Action: action, Resource: resource, Call: &call})
		if err != nil {
			writeError(w, r, err)
			return
		}
		if req == nil { // the policy went meanwhile
			next(w, r)
			return
		}
		writeError(w, r, newError(http.StatusForbidden, "approval_required", "A person must approve this call first: redeem the approval at the token endpoint (authorization_details type hitl_approval) and call again with that token. An approval is for one call (method, path, body), once.",
			map[string]any{"requestId": req.ID, "status": hitl.Status(req, extensions.Now()), "policyId": req.PolicyID, "expiresAt": isoTime(req.ExpiresAt), "action": action, "resource": resource}))
	}
}

// gatedCall is the call r makes, as an approval binds it; its body is read
// and put back for the handler. A body that is not JSON is refused here
// (the handler would refuse it too).
func gatedCall(r *http.Request) (hitl.Call, error) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return hitl.Call{}, jsonError(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	body, err := hitl.CanonicalJSON(raw)
	if err != nil {
		return hitl.Call{}, newError(http.StatusBadRequest, "invalid_json", "The body is not a single valid JSON value.", nil)
	}
	if len(body) > hitl.MaxCallBodyBytes {
		return hitl.Call{}, newError(http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("A call that needs an approval has a body of at most %d bytes.", hitl.MaxCallBodyBytes), map[string]any{"maxBytes": hitl.MaxCallBodyBytes})
	}
	return hitl.Call{Method: r.Method, Path: hitl.CanonicalPath(r.URL.Path, r.URL.RawQuery), Body: body,
		Shown: hitl.CanonicalPath(loggablePath(r.URL.Path), r.URL.RawQuery)}, nil
}
