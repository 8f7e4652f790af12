package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/ciba"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/persistence"
)

// OpenID Connect CIBA, poll mode, and the delegations it makes (issue 16):
// the backchannel authentication endpoint (an OAuth endpoint: RFC 6749 /
// CIBA Core §13 errors), the hosted consent page, and the delegation
// routes for service accounts, agents and people. The token grant is
// oauth/ciba.go; the rules extensions/ciba.

const (
	BackchannelPath     = "/api/v1/oauth/bc-authorize"
	m2mDelegationsPath  = "/api/v1/m2m/delegations"
	authDelegationsPath = "/api/v1/auth/delegations"
	consentPagePattern  = ciba.ConsentPath + "{id}"
)

func (a *api) cibaRoutes(r *mux.Router, rl RateLimits) {
	if a.ciba == nil {
		return
	}
	// Authenticated agents count against rl.Backchannel, and against
	// rl.BackchannelPerson per person they name: an agent cannot flood a
	// person's mailbox, and nobody's asking spends another's budget.
	r.HandleFunc(BackchannelPath, oauthForm(a.backchannelAuthenticate)).Methods(http.MethodPost)
	if a.signin != nil {
		// The consent page: reads count as public reads per address,
		// posts as sign-in form posts (as the approval page's).
		r.HandleFunc(consentPagePattern, a.limited("public", rl.Public, byIP, a.consentPage)).Methods(http.MethodGet, http.MethodHead)
		r.HandleFunc(consentPagePattern, a.signinLimited(a.consentDecide)).Methods(http.MethodPost)
	}
	// M2M routes, as every other: an agent's call a HITL policy matches
	// needs an approval (hitl.go: gated, m2mActions).
	m2m := func(scope, class string, rate Rate, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, "", a.limited(class, rate, byPrincipal, a.gated(a.committed(h))))
	}
	r.HandleFunc(m2mDelegationsPath, m2m("delegations:read", "m2m-read", rl.M2MRead, a.listDelegations)).Methods(http.MethodGet)
	r.HandleFunc(m2mDelegationsPath+"/{id}/revoke", m2m("delegations:write", "m2m-write", rl.M2MWrite, a.revokeDelegation)).Methods(http.MethodPost)
	self := func(h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated("", "", a.personal(a.limited("delegations", rl.M2MRead, byPerson, a.committed(h))))
	}
	r.HandleFunc(authDelegationsPath, self(a.listMyDelegations)).Methods(http.MethodGet)
	r.HandleFunc(authDelegationsPath+"/{id}", self(a.revokeMyDelegation)).Methods(http.MethodDelete)
}

// POST /api/v1/oauth/bc-authorize (CIBA Core §7): the agent authenticates
// as at the token endpoint; the answer is §7.3's, or §13's error.
func (a *api) backchannelAuthenticate(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	caller, ok := a.oauthClient(w, r, a.backchannel)
	if !ok {
		return
	}
	client, ok := caller.(*persistence.Client)
	if !ok {
		a.writeBackchannelError(w, r, fosite.ErrUnauthorizedClient)
		return
	}
	form := r.PostForm
	if a.backchannelAsks != nil {
		key := "backchannel-person:" + limitKey("ask", client.ID+"\x00"+strings.ToLower(strings.TrimSpace(form.Get("login_hint"))))
		if !count(w, r, a.backchannelAsks, key, writeOAuthRateLimited) {
			return
		}
	}
	in := ciba.Request{Scope: form.Get("scope"), LoginHint: form.Get("login_hint"), BindingMessage: form.Get("binding_message"),
		Details: form.Get("authorization_details"), RequestedExp: form.Get("requested_expiry"), Lifetime: form.Get("delegation_expires_in"),
		Other: map[string]bool{}}
	for k := range form {
		in.Other[k] = true
	}
	if client.Agent != nil {
		if ag, err := a.agents.Get(ctx, client.RecordID); err == nil {
			in.AgentName = ag.Name
		}
	}
	asked, err := a.ciba.Ask(ctx, client, in)
	if err != nil {
		a.recordBackchannelRefusal(r, client, err)
		a.writeBackchannelError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	// delegation_expires_in: identityd's, how long the delegation will
	// last once approved (what was asked, or the default).
	writeJSON(w, http.StatusOK, map[string]any{"auth_req_id": asked.AuthReqID, "expires_in": asked.ExpiresIn, "interval": asked.Interval,
		"delegation_expires_in": asked.Lifetime})
}

// recordBackchannelRefusal puts a refused backchannel request of an
// authenticated agent on its trail, as refused token requests are
// (recordRefusal): asking people is the agent's to account for. A caller
// that did not authenticate never gets here (its refusal is counted as a
// failed authentication instead), and a storage failure refused nothing.
// The audit must not fail the answer: a failure to record is logged.
func (a *api) recordBackchannelRefusal(r *http.Request, client *persistence.Client, err error) {
	if client.Kind != persistence.KindAgent || persistence.Unavailable(err) {
		return
	}
	var rfc *fosite.RFC6749Error
	if !errors.As(err, &rfc) {
		return // a server error, logged as such
	}
	if aerr := a.agents.BackchannelRefused(r.Context(), client.RecordID, client.ID, clientIP(r), rfc.ErrorField, intentOf(r)); aerr != nil {
		a.metrics.AuditFailed(agents.ActionBackchannelRefused)
		logger(r).ErrorContext(r.Context(), "recording a refused backchannel request failed", "error", aerr.Error())
	}
}

// writeBackchannelError answers as CIBA Core §13 says: 400, 401 for
// invalid_client (with the Basic challenge), 403 for access_denied; 503
// while storage fails; never an internal cause.
func (a *api) writeBackchannelError(w http.ResponseWriter, r *http.Request, err error) {
	if persistence.Unavailable(err) {
		a.writeUnavailable(w, r, "backchannel authentication", err)
		return
	}
	var rfc *fosite.RFC6749Error
	if !errors.As(err, &rfc) {
		logger(r).ErrorContext(r.Context(), "backchannel authentication failed", "error", err.Error())
		rfc = fosite.ErrServerError
	}
	a.provider.WriteAccessError(r.Context(), w, nil, oauthError(rfc))
}

// delegationJSON is the API shape of a delegation (issue 16).
type delegationJSON struct {
	ID                   string          `json:"id"`
	AgentID              string          `json:"agentId"`
	UserID               string          `json:"userId"`
	Scopes               []string        `json:"scopes"`
	AuthorizationDetails json.RawMessage `json:"authorizationDetails"`
	Status               string          `json:"status"`
	CreatedAt            string          `json:"createdAt"`
	DecidedAt            *string         `json:"decidedAt"`
	ExpiresAt            string          `json:"expiresAt"`
}

func toDelegationJSON(d *persistence.Delegation) delegationJSON {
	out := delegationJSON{ID: d.ID, AgentID: d.AgentID, UserID: d.UserID, Scopes: d.Scopes, AuthorizationDetails: json.RawMessage("null"),
		Status: ciba.Status(d, extensions.Now()), CreatedAt: isoTime(d.CreatedAt), ExpiresAt: isoTime(d.ExpiresAt)}
	if out.Scopes == nil {
		out.Scopes = []string{}
	}
	if d.AuthorizationDetails != nil {
		out.AuthorizationDetails = json.RawMessage(*d.AuthorizationDetails)
	}
	if d.DecidedAt != nil {
		t := isoTime(*d.DecidedAt)
		out.DecidedAt = &t
	}
	return out
}

// delegationFilter reads the list filters (user, agent, status).
func delegationFilter(r *http.Request) (persistence.DelegationFilter, persistence.Page, error) {
	q := r.URL.Query()
	page, err := pageFrom(r)
	if err != nil {
		return persistence.DelegationFilter{}, page, err
	}
	f := persistence.DelegationFilter{UserID: q.Get("user"), AgentID: q.Get("agent"), Status: q.Get("status")}
	for name, v := range map[string]string{"user": f.UserID, "agent": f.AgentID, "status": f.Status} {
		if len(v) > 200 || !extensions.ValidText(v) {
			return f, page, newError(http.StatusBadRequest, "invalid_request", name+" is not valid.", map[string]any{"field": name})
		}
	}
	return f, page, nil
}

// GET /api/v1/m2m/delegations (delegations:read). An agent sees only the
// delegations made to it.
func (a *api) listDelegations(w http.ResponseWriter, r *http.Request) {
	f, page, err := delegationFilter(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if p := principalFrom(r.Context()); p.Agent != nil {
		if f.AgentID != "" && f.AgentID != p.Client.RecordID {
			writeList(w, "delegations", []persistence.Delegation{}, 0, page, toDelegationJSON)
			return
		}
		f.AgentID = p.Client.RecordID
	}
	list, total, err := a.ciba.List(r.Context(), f, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "delegations", list, total, page, toDelegationJSON)
}

// reasonBody reads an optional {"reason": "..."}.
func reasonBody(r *http.Request) (string, error) {
	var body struct {
		Reason string `json:"reason"`
	}
	if r.ContentLength == 0 {
		return "", nil
	}
	err := decodeJSON(r, &body)
	return body.Reason, err
}

// POST /api/v1/m2m/delegations/{id}/revoke (delegations:write), body
// optional {"reason"}. An agent reaches only delegations made to it.
func (a *api) revokeDelegation(w http.ResponseWriter, r *http.Request) {
	reason, err := reasonBody(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	p := principalFrom(r.Context())
	agentID := ""
	if p.Agent != nil {
		agentID = p.Client.RecordID
	}
	d, err := a.ciba.Revoke(r.Context(), p.Actor(), mux.Vars(r)["id"], "", agentID, reason)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toDelegationJSON(d))
}

// GET /api/v1/auth/delegations: the person's own (user token); filters
// agent and status.
func (a *api) listMyDelegations(w http.ResponseWriter, r *http.Request) {
	f, page, err := delegationFilter(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	f.UserID = principalFrom(r.Context()).Subject
	list, total, err := a.ciba.List(r.Context(), f, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "delegations", list, total, page, toDelegationJSON)
}

// DELETE /api/v1/auth/delegations/{id}: the person revokes one of theirs
// (another's is not found); answers the delegation as it now is.
func (a *api) revokeMyDelegation(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	d, err := a.ciba.Revoke(r.Context(), p.Actor(), mux.Vars(r)["id"], p.Subject, "", "revoked by the person")
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toDelegationJSON(d))
}

// --- the consent page

func consentPurpose(id string) string { return "consent:" + id }

var (
	errNoSuchDelegation = extensions.NewError(http.StatusNotFound, "not_found", "There is no such request.", nil)
	errNotDelegator     = extensions.NewError(http.StatusForbidden, "not_delegator", "This request was sent to someone else: only they may decide it.", nil)
)

// consentCaller is the signed-in person and the delegation, when it asks
// them; a browser without a session is sent to sign in (GET) first.
func (a *api) consentCaller(w http.ResponseWriter, r *http.Request) (ciba.Decider, *persistence.Delegation, bool) {
	const title = "Delegation"
	ctx := r.Context()
	ss, user, err := a.signin.Live(ctx, a.cookies.Session(r))
	if err != nil {
		a.pageError(w, r, title, err)
		return ciba.Decider{}, nil, false
	}
	if ss == nil || user == nil {
		a.sendToSignIn(w, r, title)
		return ciba.Decider{}, nil, false
	}
	d, err := a.ciba.Get(ctx, mux.Vars(r)["id"])
	if errors.Is(err, persistence.ErrNotFound) {
		err = errNoSuchDelegation
	}
	if err == nil && d.UserID != user.ID {
		err = errNotDelegator
	}
	if err != nil {
		a.pageError(w, r, title, err)
		return ciba.Decider{}, nil, false
	}
	return ciba.Decider{UserID: user.ID, SessionID: ss.ID}, d, true
}

// GET /delegations/consent/{id}
func (a *api) consentPage(w http.ResponseWriter, r *http.Request) {
	if _, d, ok := a.consentCaller(w, r); ok {
		a.renderConsent(w, r, http.StatusOK, d, "")
	}
}

// renderConsent shows the request in words, with the form while pending.
func (a *api) renderConsent(w http.ResponseWriter, r *http.Request, status int, d *persistence.Delegation, message string) {
	name, typ, trust := d.ClientID, "", ""
	if ag, err := a.agents.Get(r.Context(), d.AgentID); err == nil {
		name, typ, trust = ag.Name, ag.Type, ag.TrustLevel
	}
	now := extensions.Now()
	st := ciba.Status(d, now)
	words := ciba.Describe(d)
	c := &pages.Consent{AgentName: name, AgentType: typ, TrustLevel: trust, BindingMessage: d.BindingMessage, Scopes: words.Scopes,
		Details: words.Details, Lifetime: words.Lifetime, Status: st, ExpiresAt: isoTime(d.ExpiresAt), Until: until(d.ExpiresAt),
		TimeLeft: timeLeft(d.ExpiresAt.Sub(now))}
	p := pages.Page{Title: "Let an agent act for you?", Message: message, Consent: c}
	if st == persistence.DelegationPending {
		if choices := ciba.LifetimeChoices(d); len(choices) > 1 {
			for _, ch := range choices {
				label := ch.Words
				if ch.Asked {
					label += " (as asked)"
				}
				c.Lifetimes = append(c.Lifetimes, pages.Option{Value: strconv.Itoa(ch.Seconds), Label: label, Selected: ch.Asked})
			}
		}
		p.Action = ciba.ConsentPath + d.ID
		p.Hidden = []pages.Field{{Name: "csrf_token", Value: a.csrf.Token(a.ensureBrowser(w, r), consentPurpose(d.ID))}}
	}
	pages.Render(w, status, "consent", p)
}

// until says a time to a person: to the minute, in UTC.
func until(t time.Time) string { return t.UTC().Format("2006-01-02 15:04") + " UTC" }

// timeLeft says how long is left, "none" once it is up.
func timeLeft(d time.Duration) string {
	if d <= 0 {
		return "none"
	}
	if d >= time.Hour {
		return fmt.Sprintf("%d h %02d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%d min %02d s", int(d/time.Minute), int(d%time.Minute/time.Second))
}

// POST /delegations/consent/{id} (csrf_token, decision approve|deny,
// lifetime: seconds, one of the page's choices; absent, the one asked)
func (a *api) consentDecide(w http.ResponseWriter, r *http.Request) {
	const title = "Delegation"
	if !a.readPageForm(w, r) {
		return
	}
	if !a.csrf.Valid(a.cookies.Browser(r), consentPurpose(mux.Vars(r)["id"]), r.PostForm.Get("csrf_token")) {
		a.pageError(w, r, title, errCSRF)
		return
	}
	who, d, ok := a.consentCaller(w, r)
	if !ok {
		return
	}
	decision := r.PostForm.Get("decision")
	if decision != "approve" && decision != "deny" {
		a.pageError(w, r, title, extensions.NewError(http.StatusBadRequest, "invalid_request", "Choose Approve or Deny.", nil))
		return
	}
	lifetime := 0
	if v := r.PostForm.Get("lifetime"); v != "" {
		var err error
		if lifetime, err = strconv.Atoi(v); err != nil || lifetime <= 0 {
			a.pageError(w, r, title, ciba.ErrLifetime)
			return
		}
	}
	done, err := a.ciba.Decide(r.Context(), who, d.ID, decision == "approve", lifetime)
	var refusal *extensions.Error
	switch {
	case errors.As(err, &refusal) && refusal.Status == http.StatusConflict:
		if done == nil {
			if cur, gerr := a.ciba.Get(r.Context(), d.ID); gerr == nil {
				done = cur
			} else {
				done = d
			}
		}
		a.renderConsent(w, r, http.StatusConflict, done, refusal.Message)
	case err != nil:
		a.pageError(w, r, title, err)
	case decision == "approve":
		a.renderConsent(w, r, http.StatusOK, done, "Approved. The agent may now act for you as shown, until "+until(done.ExpiresAt)+".")
	default:
		a.renderConsent(w, r, http.StatusOK, done, "Denied. The agent has been told.")
	}
}
