package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/identityd/identityd/persistence/dbtest"
)

// OpenID Connect CIBA, poll mode (issue 16): a user-delegated agent asks
// a person, the person decides on the e-mailed page (signing in first),
// the agent polls for a token that speaks for the person.

const (
	backchannelPath = "/api/v1/oauth/bc-authorize"
	cibaGrant       = "urn:openid:params:grant-type:ciba"
	m2mDelegations  = "/api/v1/m2m/delegations"
	myDelegations   = "/api/v1/auth/delegations"
	consentPrefix   = "/delegations/consent/"
	cibaPassword    = "a long and private passphrase"
)

type cibaEnv struct {
	s             *server
	box           *mailServer
	super, admin  string
	patID, patTok string
	kimID, kimTok string
	ag            agent // user-delegated, delegate + read_users + write_users, registered
	helper        agent // verified, a2a_exchange + read_users: exchanges delegated tokens
	browser       *hostedBrowser
	signedIn      bool
}

func newCIBAEnv(t *testing.T, s *server, box *mailServer) *cibaEnv {
	t.Helper()
	h := newHITLEnv(t, s) // Pat and Kim with user tokens, signed in through an application
	e := &cibaEnv{s: s, box: box, super: h.super, patID: h.patID, patTok: h.patTok, kimID: h.kimID, kimTok: h.kimTok}
	e.admin = s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
	sa := s.as(t)
	e.ag = sa.createAgent(e.super, map[string]any{"name": "Calendar assistant", "type": "user-delegated",
		"capabilities": []string{"delegate", "read_users", "write_users"}})
	e.helper = sa.createAgent(e.super, map[string]any{"name": "Scheduler", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users"}})
	for _, lvl := range []string{"registered", "verified"} {
		if r := sa.changeTrust(e.super, e.helper.ID, lvl, "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
	}
	e.browser = newHostedBrowser(t, s, "http://never.invalid/")
	return e
}

// registered raises the agent from sandboxed, which may not ask, to
// registered.
func (e *cibaEnv) registered(t *testing.T) {
	t.Helper()
	if r := e.s.as(t).changeTrust(e.super, e.ag.ID, "registered", "reviewed"); r.Status != http.StatusOK {
		t.Fatalf("trust: %s", describe(r))
	}
}

// capabilities sets the agent's capabilities.
func (e *cibaEnv) capabilities(t *testing.T, c ...string) {
	t.Helper()
	if r := e.s.do(http.MethodPut, agentsPath+"/"+e.ag.ID+"/capabilities", map[string]any{"capabilities": c}, bearer(e.super)...); r.Status != http.StatusOK {
		t.Fatalf("capabilities: %s", describe(r))
	}
}

// activeEnd is when Pat's active delegation id ends, as their list says.
func (e *cibaEnv) activeEnd(t *testing.T, id string) time.Time {
	t.Helper()
	for _, x := range e.s.do(http.MethodGet, myDelegations+"?status=active", nil, bearer(e.patTok)...).JSON(t)["delegations"].([]any) {
		if d := x.(map[string]any); d["id"] == id {
			end, err := time.Parse(time.RFC3339, fmt.Sprint(d["expiresAt"]))
			if err != nil {
				t.Fatalf("delegation %s: %v", id, d)
			}
			return end
		}
	}
	t.Fatalf("no active delegation %s", id)
	return time.Time{}
}

// replica is, on PostgreSQL, a second server on s's database, started with
// env and s's issuer (as replicas behind one address have); on SQLite (one
// process per file) s itself.
func replica(t *testing.T, s *server, dbURL string, env []string) *server {
	t.Helper()
	if !strings.HasPrefix(dbURL, "postgres") {
		return s
	}
	return s.sibling(t, append(env, "IDENTITYD_ISSUER="+s.URL)...)
}

// ask is a backchannel authentication request of the agent.
func (e *cibaEnv) ask(t *testing.T, form url.Values) *response {
	t.Helper()
	return e.s.as(t).do(http.MethodPost, backchannelPath, form, basic(e.ag.ClientID, e.ag.ClientSecret)...)
}

// asked makes a request that must be accepted and answers its auth_req_id.
func (e *cibaEnv) asked(t *testing.T, scope string, extra ...string) string {
	t.Helper()
	form := url.Values{"scope": {scope}, "login_hint": {"pat@example.com"}, "binding_message": {"W4SCT"}}
	for i := 0; i+1 < len(extra); i += 2 {
		form.Set(extra[i], extra[i+1])
	}
	r := e.ask(t, form)
	if r.Status != http.StatusOK {
		t.Fatalf("backchannel request: %s", describe(r))
	}
	m := r.JSON(t)
	exactKeys(t, m, "auth_req_id", "expires_in", "interval", "delegation_expires_in")
	if id, _ := m["auth_req_id"].(string); len(id) != 43 || m["interval"] != 5.0 {
		t.Fatalf("backchannel answer: %v", m)
	}
	return m["auth_req_id"].(string)
}

func (e *cibaEnv) poll(t *testing.T, id string) *response {
	t.Helper()
	return e.s.as(t).do(http.MethodPost, tokenPath, url.Values{"grant_type": {cibaGrant}, "auth_req_id": {id}}, basic(e.ag.ClientID, e.ag.ClientSecret)...)
}

// consent opens the n-th e-mailed link to Pat and answers the page,
// signing in on the way the first time (no session yet).
func (e *cibaEnv) consent(t *testing.T, n int) (*response, string) {
	t.Helper()
	m := e.box.after(t, "pat@example.com", n)
	link := linkPattern(e.s.URL + consentPrefix).FindString(m.Text)
	if link == "" {
		t.Fatalf("no consent link in %q", m.Text)
	}
	page := e.browser.get(link)
	if !e.signedIn {
		// No session: the page sent the browser to the hosted sign-in.
		expectPage(t, page, http.StatusOK, `<label for="email">Email</label>`)
		page = e.browser.submit(page, "/signin/email", "", url.Values{"email": {"pat@example.com"}})
		page = e.browser.submit(page, "/signin/password", "", url.Values{"password": {cibaPassword}})
		e.signedIn = true
	}
	expectPage(t, page, http.StatusOK, "Let an agent act for you?", "Calendar assistant", "W4SCT")
	return page, strings.TrimPrefix(link, e.s.URL)
}

func (e *cibaEnv) decide(t *testing.T, page *response, action, decision string) *response {
	t.Helper()
	return e.browser.submit(page, action, "", url.Values{"decision": {decision}})
}

// approved asks for scope (extra: more parameters), has Pat approve the
// n-th e-mail, polls, and answers the token response and the delegation's id.
func (e *cibaEnv) approved(t *testing.T, n int, scope string, extra ...string) (map[string]any, string) {
	t.Helper()
	id := e.asked(t, scope, extra...)
	page, action := e.consent(t, n)
	expectPage(t, e.decide(t, page, action, "approve"), http.StatusOK, "Approved.")
	r := e.poll(t, id)
	if r.Status != http.StatusOK {
		t.Fatalf("token: %s", describe(r))
	}
	return r.JSON(t), strings.TrimPrefix(action, consentPrefix)
}

// refresh is a refresh token request of the agent at s (RFC 6749 §6).
func (e *cibaEnv) refresh(t *testing.T, s *server, token string) *response {
	t.Helper()
	return s.as(t).do(http.MethodPost, tokenPath, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {token}}, basic(e.ag.ClientID, e.ag.ClientSecret)...)
}

// revoke is Pat revoking delegation id, which must succeed.
func (e *cibaEnv) revoke(t *testing.T, id string) {
	t.Helper()
	if r := e.s.do(http.MethodDelete, myDelegations+"/"+id, nil, bearer(e.patTok)...); r.Status != http.StatusOK || r.JSON(t)["status"] != "revoked" {
		t.Fatalf("revoke: %s", describe(r))
	}
}

func TestCIBADelegation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		e := newCIBAEnv(t, s, box)

		// Discovery (CIBA Core §4).
		md := s.do(http.MethodGet, "/.well-known/openid-configuration", nil).JSON(t)
		if md["backchannel_authentication_endpoint"] != s.URL+backchannelPath || fmt.Sprint(md["backchannel_token_delivery_modes_supported"]) != "[poll]" ||
			!strings.Contains(fmt.Sprint(md["grant_types_supported"]), cibaGrant) || md["backchannel_user_code_parameter_supported"] != false {
			t.Fatalf("discovery: %v", md)
		}

		// A sandboxed agent may not ask (spec: no delegation).
		form := url.Values{"scope": {"openid"}, "login_hint": {"pat@example.com"}}
		expectRFC6749(t, e.ask(t, form), http.StatusBadRequest, "unauthorized_client")
		e.registered(t)
		// A registered agent: read scopes only.
		form.Set("scope", "openid users:write")
		expectRFC6749(t, e.ask(t, form), http.StatusBadRequest, "invalid_scope")
		form.Set("scope", "openid admin")
		expectRFC6749(t, e.ask(t, form), http.StatusBadRequest, "invalid_scope")
		form.Set("scope", "openid")
		form.Set("login_hint", "nobody@example.com")
		expectRFC6749(t, e.ask(t, form), http.StatusBadRequest, "unknown_user_id")
		form.Set("login_hint", e.patID)
		form.Set("binding_message", "two\nlines")
		expectRFC6749(t, e.ask(t, form), http.StatusBadRequest, "invalid_binding_message")
		if n := len(box.to("pat@example.com")); n != 0 {
			t.Fatalf("%d e-mails for refused requests", n)
		}
		// Each refusal of the authenticated agent is on its trail, as a
		// refused token request is; a caller who failed to authenticate
		// as the agent leaves nothing there.
		expectRFC6749(t, s.as(t).do(http.MethodPost, backchannelPath, form, basic(e.ag.ClientID, "wrong")...), http.StatusUnauthorized, "invalid_client")
		refusals := s.do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action=backchannel_refused", nil, bearer(e.super)...).JSON(t)
		var codes []string
		for _, x := range refusals["entries"].([]any) {
			entry := x.(map[string]any)
			codes = append(codes, fmt.Sprint(entry["details"].(map[string]any)["error"]))
			if entry["ip"] == nil || entry["details"].(map[string]any)["loginHint"] != nil {
				t.Fatalf("refusal entry: %v", entry)
			}
		}
		slices.Sort(codes)
		if fmt.Sprint(codes) != "[invalid_binding_message invalid_scope invalid_scope unauthorized_client unknown_user_id]" {
			t.Fatalf("refusals on the trail: %v", codes)
		}

		// Asked: pending, then slow_down when polled too fast (CIBA Core §11).
		id := e.asked(t, "openid email users:read")
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "authorization_pending")
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "slow_down")
		wrong := "A" + id[1:] // another auth_req_id: its first character changed (an id may begin with any)
		if wrong == id {
			wrong = "B" + id[1:]
		}
		expectRFC6749(t, e.poll(t, wrong), http.StatusBadRequest, "invalid_grant")

		// Pat opens the e-mailed link with no session, signs in, lands on
		// the page, approves.
		page, action := e.consent(t, 0)
		expectPage(t, page, http.StatusOK, "users:read", "See your e-mail address", "trust level registered")
		expectPage(t, e.decide(t, page, action, "approve"), http.StatusOK, "Approved.")

		r := e.poll(t, id)
		if r.Status != http.StatusOK {
			t.Fatalf("token after approval: %s", describe(r))
		}
		tok := r.JSON(t)
		if tok["token_type"] != "Bearer" || tok["scope"] != "openid email users:read" || tok["id_token"] == nil {
			t.Fatalf("token: %v", tok)
		}
		access := tok["access_token"].(string)
		// Once only.
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "invalid_grant")

		m := s.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret)
		expectActive(t, m, e.ag.ClientID)
		if m["sub"] != e.patID || fmt.Sprint(m["act"]) != fmt.Sprintf("map[sub:%s]", e.ag.ClientID) || m["scope"] != "openid email users:read" {
			t.Fatalf("introspection of the delegated token: %v", m)
		}
		if w := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(access)...).JSON(t); w["sub"] != e.patID {
			t.Fatalf("whoami: %v", w)
		}

		// The person sees it; another person does not; the person revokes it.
		list := s.do(http.MethodGet, myDelegations, nil, bearer(e.patTok)...).JSON(t)
		ds := list["delegations"].([]any)
		if len(ds) != 1 || ds[0].(map[string]any)["status"] != "active" || ds[0].(map[string]any)["agentId"] != e.ag.ID {
			t.Fatalf("Pat's delegations: %v", list)
		}
		did := ds[0].(map[string]any)["id"].(string)
		exactKeys(t, ds[0].(map[string]any), "id", "agentId", "userId", "scopes", "authorizationDetails", "status", "createdAt", "decidedAt", "expiresAt")
		expectError(t, s.do(http.MethodDelete, myDelegations+"/"+did, nil, bearer(e.kimTok)...), http.StatusNotFound, "not_found")
		expectError(t, s.do(http.MethodGet, myDelegations, nil, bearer(access)...), http.StatusForbidden, "user_token_required")

		// A verified agent exchanges the delegated token: the person stays
		// sub, act nests (RFC 8693 §4.1).
		ex := s.do(http.MethodPost, tokenPath, url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"},
			"subject_token": {access}, "subject_token_type": {"urn:ietf:params:oauth:token-type:access_token"}}, basic(e.helper.ClientID, e.helper.ClientSecret)...)
		if ex.Status != http.StatusOK {
			t.Fatalf("exchange: %s", describe(ex))
		}
		chained := ex.JSON(t)["access_token"].(string)
		cm := s.introspect(t, chained, e.helper.ClientID, e.helper.ClientSecret)
		if cm["sub"] != e.patID || fmt.Sprint(cm["act"]) != fmt.Sprintf("map[act:map[sub:%s] sub:%s]", e.ag.ClientID, e.helper.ClientID) || cm["scope"] != "users:read" {
			t.Fatalf("exchanged: %v", cm)
		}

		r = s.do(http.MethodDelete, myDelegations+"/"+did, nil, bearer(e.patTok)...)
		if r.Status != http.StatusOK || r.JSON(t)["status"] != "revoked" {
			t.Fatalf("revoke: %s", describe(r))
		}
		expectInactive(t, s.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret))
		expectInactive(t, s.introspect(t, chained, e.helper.ClientID, e.helper.ClientSecret))
		expectError(t, s.do(http.MethodDelete, myDelegations+"/"+did, nil, bearer(e.patTok)...), http.StatusConflict, "delegation_not_active")

		// Denied.
		id = e.asked(t, "openid")
		page, action = e.consent(t, 1)
		expectPage(t, e.decide(t, page, action, "deny"), http.StatusOK, "Denied.")
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "access_denied")
		expectPage(t, e.decide(t, page, action, "approve"), http.StatusConflict, "decided already")

		// Expired: the person did not decide in time.
		id = e.asked(t, "openid", "requested_expiry", "1")
		time.Sleep(1100 * time.Millisecond)
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "expired_token")
		page, action = e.consent(t, 2)
		expectPage(t, page, http.StatusOK, "expired")
		if strings.Contains(string(page.Body), `value="approve"`) {
			t.Fatal("a form on an expired request")
		}

		// Every step on the agent's trail.
		audit := s.do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action=delegation_requested,delegation_approved,delegation_denied,delegation_expired,delegation_redeemed,delegation_revoked",
			nil, bearer(e.super)...).JSON(t)
		seen := map[string]int{}
		for _, x := range audit["entries"].([]any) {
			seen[x.(map[string]any)["action"].(string)]++
		}
		if seen["delegation_requested"] != 3 || seen["delegation_approved"] != 1 || seen["delegation_denied"] != 1 || seen["delegation_expired"] != 1 ||
			seen["delegation_redeemed"] != 1 || seen["delegation_revoked"] != 1 {
			t.Fatalf("audit: %v", seen)
		}
	})
}

// A kill ends the delegated tokens; a service account with
// delegations:write revokes, and a second replica sees it at once
// (PostgreSQL); a disabled person's delegated tokens end.
func TestCIBARevocation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		shared := box.env("IDENTITYD_RISK_DISABLED=all", "IDENTITYD_SYSTEM_SECRET="+randomString(), "IDENTITYD_ADMIN_CLIENT_SECRET="+randomString())
		s := start(t, dbURL, shared...)
		e := newCIBAEnv(t, s, box)
		e.registered(t)
		approved := func(n int) string {
			id := e.asked(t, "openid users:read")
			page, action := e.consent(t, n)
			expectPage(t, e.decide(t, page, action, "approve"), http.StatusOK, "Approved.")
			r := e.poll(t, id)
			if r.Status != http.StatusOK {
				t.Fatalf("token: %s", describe(r))
			}
			return r.JSON(t)["access_token"].(string)
		}
		_, saTok := s.as(t).registryToken(e.admin, "delegation desk", "delegations:read", "delegations:write")
		other := replica(t, s, dbURL, shared)

		access := approved(0)
		expectActive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret), e.ag.ClientID)
		list := s.do(http.MethodGet, m2mDelegations+"?user="+e.patID+"&status=active", nil, bearer(saTok)...).JSON(t)
		if list["total"] != 1.0 {
			t.Fatalf("list: %v", list)
		}
		did := list["delegations"].([]any)[0].(map[string]any)["id"].(string)
		if r := s.do(http.MethodPost, m2mDelegations+"/"+did+"/revoke", map[string]any{"reason": "offboarding"}, bearer(saTok)...); r.Status != http.StatusOK {
			t.Fatalf("revoke: %s", describe(r))
		}
		expectInactive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret))
		expectError(t, s.do(http.MethodGet, m2mDelegations+"?status=nonsense", nil, bearer(saTok)...), http.StatusBadRequest, "invalid_request")

		// The person disabled: their delegated tokens end at once, and
		// their delegations are revoked with the disabling (docs/decisions.md),
		// the pending request too.
		access = approved(1)
		pending := e.asked(t, "openid")
		s.setStatus(t, e.admin, e.patID, "disabled")
		expectInactive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret))
		s.setStatus(t, e.admin, e.patID, "active")
		// Enabled again, within the delegation's lifetime, the token stays
		// dead, and the pending request is denied to the agent.
		expectInactive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret))
		expectRFC6749(t, e.poll(t, pending), http.StatusBadRequest, "access_denied")
		if list := s.do(http.MethodGet, m2mDelegations+"?user="+e.patID+"&status=active", nil, bearer(saTok)...).JSON(t); list["total"] != 0.0 {
			t.Fatalf("active after the disabling: %v", list)
		}
		trail := s.do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action=delegation_revoked", nil, bearer(e.super)...).JSON(t)
		disabled := 0
		for _, x := range trail["entries"].([]any) {
			entry := x.(map[string]any)
			if d := entry["details"].(map[string]any); d["userDisabled"] == true && d["reason"] == "person disabled" {
				if entry["actor"].(map[string]any)["sub"] != s.AdminID {
					t.Fatalf("revoked by: %v", entry)
				}
				disabled++
			}
		}
		if disabled != 2 {
			t.Fatalf("revocations by the disabling on the trail: %d in %v", disabled, trail)
		}
		e.signedIn = false // the disabling ended Pat's session too: the next consent link signs in again

		// A kill ends them, and revokes the delegation.
		access = approved(3)
		if r := s.as(t).killAgent(e.super, e.ag.ID, map[string]any{"reason": "compromised"}); r.Status != http.StatusOK {
			t.Fatalf("kill: %s", describe(r))
		}
		expectInactive(t, other.introspect(t, access, s.AdminID, s.AdminSecret))
		list = s.do(http.MethodGet, m2mDelegations+"?agent="+e.ag.ID+"&status=revoked", nil, bearer(saTok)...).JSON(t)
		if list["total"] != 4.0 { // the desk's, the two the disabling revoked, and the one the kill did
			t.Fatalf("after the kill: %v", list)
		}
	})
}

// Two decisions at once: one wins; concurrent polls of one approval: one
// token (none after a denial).
func TestCIBARaces(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		e := newCIBAEnv(t, s, box)
		e.registered(t)
		id := e.asked(t, "openid")
		page, action := e.consent(t, 0)
		// Two decisions at once (the same form twice): one wins, the other
		// sees it decided.
		results := make([]*response, 2)
		var wg sync.WaitGroup
		for i, d := range []string{"approve", "deny"} {
			wg.Add(1)
			go func() { defer wg.Done(); results[i] = e.decide(t, page, action, d) }()
		}
		wg.Wait()
		codes := []int{results[0].Status, results[1].Status}
		if !(codes[0] == 200 && codes[1] == 409 || codes[0] == 409 && codes[1] == 200) {
			t.Fatalf("two decisions: %v", codes)
		}
		approvedWon := results[0].Status == 200
		// Polls at once: if approved, exactly one token.
		polls := make([]*response, 6)
		for i := range polls {
			wg.Add(1)
			go func() { defer wg.Done(); polls[i] = e.poll(t, id) }()
		}
		wg.Wait()
		tokens := 0
		for _, p := range polls {
			switch {
			case p.Status == 200:
				tokens++
			case !strings.Contains(string(p.Body), "invalid_grant") && !strings.Contains(string(p.Body), "slow_down") && !strings.Contains(string(p.Body), "access_denied"):
				t.Fatalf("poll: %s", describe(p))
			}
		}
		if (approvedWon && tokens != 1) || (!approvedWon && tokens != 0) {
			t.Fatalf("%d tokens (approved: %v)", tokens, approvedWon)
		}
	})
}

// A delegation lasts what the agent asked (delegation_expires_in) and the
// person approved, up to the server's maximum; the agent's access tokens
// stay short, and a refresh token bound to the delegation renews them
// (CIBA Core §10.1.1, RFC 6749 §6): each refresh narrowed to what the
// agent still holds, and refused on every replica once the delegation is
// revoked.
func TestCIBARefresh(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		// Reuse is reuse at once: no grace window (TestRefreshRetries has it).
		shared := box.env("IDENTITYD_RISK_DISABLED=all", "IDENTITYD_ACCESS_TOKEN_TTL=60", "IDENTITYD_DELEGATION_MAX_TTL=1209600",
			"IDENTITYD_SYSTEM_SECRET="+randomString(), "IDENTITYD_ADMIN_CLIENT_SECRET="+randomString(), "IDENTITYD_REFRESH_REUSE_GRACE=0")
		s := start(t, dbURL, shared...)
		e := newCIBAEnv(t, s, box)
		e.registered(t)
		other := replica(t, s, dbURL, shared)
		// Above the maximum (two weeks here): refused, not shortened.
		form := url.Values{"scope": {"openid"}, "login_hint": {"pat@example.com"}, "delegation_expires_in": {"1209601"}}
		expectRFC6749(t, e.ask(t, form), http.StatusBadRequest, "invalid_request")

		// A week, as asked: the answer, the e-mail and the page say so.
		form.Set("delegation_expires_in", "604800")
		form.Set("scope", "openid email users:read")
		form.Set("binding_message", "W4SCT")
		asked := e.ask(t, form).JSON(t)
		if asked["delegation_expires_in"] != 604800.0 || asked["expires_in"] != 600.0 {
			t.Fatalf("backchannel answer: %v", asked)
		}
		if m := box.after(t, "pat@example.com", 0); !strings.Contains(m.Text, "for 7 days after you approve") {
			t.Fatalf("the e-mail does not say how long: %q", m.Text)
		}
		page, action := e.consent(t, 0)
		expectPage(t, page, http.StatusOK, "7 days after you approve")
		expectPage(t, e.decide(t, page, action, "approve"), http.StatusOK, "Approved.")
		r := e.poll(t, asked["auth_req_id"].(string))
		if r.Status != http.StatusOK {
			t.Fatalf("token: %s", describe(r))
		}
		tok := r.JSON(t)
		rt, _ := tok["refresh_token"].(string)
		if tok["expires_in"] != 60.0 || rt == "" || tok["id_token"] == nil {
			t.Fatalf("token response: %v", tok)
		}
		d := s.do(http.MethodGet, myDelegations+"?status=active", nil, bearer(e.patTok)...).JSON(t)["delegations"].([]any)[0].(map[string]any)
		decided, _ := time.Parse(time.RFC3339, d["decidedAt"].(string))
		ends, _ := time.Parse(time.RFC3339, d["expiresAt"].(string))
		if got := ends.Sub(decided).Round(time.Second); got != 7*24*time.Hour {
			t.Fatalf("the delegation lasts %v: %v", got, d)
		}

		// Refreshed on the other replica: a new pair for the person, acted
		// for by the agent, ending no later than the delegation.
		r = e.refresh(t, other, rt)
		if r.Status != http.StatusOK {
			t.Fatalf("refresh: %s", describe(r))
		}
		next := r.JSON(t)
		rt2, _ := next["refresh_token"].(string)
		if next["expires_in"] != 60.0 || rt2 == "" || rt2 == rt || next["scope"] != "openid email users:read" || next["id_token"] == nil ||
			next["access_token"] == tok["access_token"] {
			t.Fatalf("refreshed: %v", next)
		}
		m := other.introspect(t, next["access_token"].(string), e.ag.ClientID, e.ag.ClientSecret)
		expectActive(t, m, e.ag.ClientID)
		if m["sub"] != e.patID || fmt.Sprint(m["act"]) != fmt.Sprintf("map[sub:%s]", e.ag.ClientID) || m["scope"] != "openid email users:read" ||
			m["exp"].(float64) > float64(ends.Unix()) {
			t.Fatalf("introspection of the refreshed token: %v", m)
		}
		// The refresh is on the agent's trail, under the delegation.
		issued := s.do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action=token_issued", nil, bearer(e.super)...).JSON(t)["entries"].([]any)
		if det := issued[0].(map[string]any)["details"].(map[string]any); det["grantType"] != "refresh_token" || det["delegationId"] != d["id"] {
			t.Fatalf("newest token_issued: %v", det)
		}
		// A refresh token is spent once (RFC 9700 §4.14.2: reuse ends the family).
		expectRFC6749(t, e.refresh(t, s, rt), http.StatusBadRequest, "invalid_grant")
		expectRFC6749(t, e.refresh(t, s, rt2), http.StatusBadRequest, "invalid_grant")

		// A new delegation; the agent loses read_users: the refresh
		// narrows to what it still holds, as its tokens do on use.
		tok, did := e.approved(t, 1, "openid email users:read", "delegation_expires_in", "86400")
		e.capabilities(t, "delegate", "write_users")
		r = e.refresh(t, other, tok["refresh_token"].(string))
		if r.Status != http.StatusOK || r.JSON(t)["scope"] != "openid email" {
			t.Fatalf("narrowed refresh: %s", describe(r))
		}
		rt = r.JSON(t)["refresh_token"].(string)

		// Revoked by the person: the next refresh is refused at once, on
		// the other replica too, and the access token is inactive.
		access := r.JSON(t)["access_token"].(string)
		e.revoke(t, did)
		expectRFC6749(t, e.refresh(t, other, rt), http.StatusBadRequest, "invalid_grant")
		expectInactive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret))

		// Without delegation_expires_in a delegation lasts the access
		// token's lifetime: nothing to renew, no refresh token.
		tok, _ = e.approved(t, 2, "openid")
		if _, ok := tok["refresh_token"]; ok || tok["expires_in"] != 60.0 {
			t.Fatalf("a delegation as long as its token: %v", tok)
		}

		// A delegation that ends within a refresh's token lifetime: the
		// refreshed tokens, its ID token too, end with the delegation.
		tok, did = e.approved(t, 3, "openid", "delegation_expires_in", "65")
		rt, _ = tok["refresh_token"].(string)
		if rt == "" {
			t.Fatalf("a delegation longer than its token, without a refresh token: %v", tok)
		}
		time.Sleep(8 * time.Second) // the refresh's 60 s now reach at least 3 s past the delegation's 65
		r = e.refresh(t, other, rt)
		if r.Status != http.StatusOK {
			t.Fatalf("refresh: %s", describe(r))
		}
		next = r.JSON(t)
		ends = e.activeEnd(t, did)
		provider, err := oidc.NewProvider(context.Background(), s.URL)
		if err != nil {
			t.Fatal(err)
		}
		idToken, err := provider.Verifier(&oidc.Config{ClientID: e.ag.ClientID}).Verify(context.Background(), fmt.Sprint(next["id_token"]))
		if err != nil {
			t.Fatalf("the refreshed ID token: %v", err)
		}
		if next["expires_in"].(float64) >= 60 || idToken.Expiry.After(ends) {
			t.Fatalf("refreshed near the delegation's end (%v): expires_in %v, ID token until %v", ends, next["expires_in"], idToken.Expiry)
		}

		// The agent loses a scope between the approval and its poll: the
		// token narrows to what it still holds, as a refresh does; with
		// nothing left, the poll is refused and spends nothing.
		e.capabilities(t, "delegate", "read_users")
		narrowed, empty := e.asked(t, "openid users:read"), e.asked(t, "users:read")
		for i := 4; i <= 5; i++ {
			page, action := e.consent(t, i)
			expectPage(t, e.decide(t, page, action, "approve"), http.StatusOK, "Approved.")
		}
		e.capabilities(t, "delegate")
		if r := e.poll(t, narrowed); r.Status != http.StatusOK || r.JSON(t)["scope"] != "openid" {
			t.Fatalf("a poll after the agent lost a scope: %s", describe(r))
		}
		expectRFC6749(t, e.poll(t, empty), http.StatusBadRequest, "invalid_grant")
		e.capabilities(t, "delegate", "read_users")
		if r := e.poll(t, empty); r.Status != http.StatusOK || r.JSON(t)["scope"] != "users:read" {
			t.Fatalf("the refused poll spent the approval: %s", describe(r))
		}

		// The person gives the agent less time than it asked: a day of the
		// week asked, from the page's choices; a lifetime not offered is
		// refused and decides nothing.
		week := e.asked(t, "openid", "delegation_expires_in", "604800")
		page, action = e.consent(t, 6)
		expectPage(t, page, http.StatusOK, `<label for="lifetime-choice">Approve for</label>`, `<option value="604800" selected>7 days (as asked)</option>`,
			`<option value="86400">1 day</option>`, `<option value="3600">1 hour</option>`, `<option value="900">15 minutes</option>`)
		if strings.Contains(string(page.Body), `value="2592000"`) {
			t.Fatal("a choice longer than the lifetime asked")
		}
		for _, bad := range []string{"2592000", "12345", "0", "-1", "a day"} {
			r := e.browser.submit(page, action, "", url.Values{"decision": {"approve"}, "lifetime": {bad}})
			expectPage(t, r, http.StatusBadRequest, "Choose one of the lifetimes offered.")
		}
		approvedAt := time.Now()
		r = e.browser.submit(page, action, "", url.Values{"decision": {"approve"}, "lifetime": {"86400"}})
		expectPage(t, r, http.StatusOK, "Approved.", "1 day after you approve")
		tok = e.poll(t, week).JSON(t)
		if tok["refresh_token"] == nil || tok["access_token"] == nil {
			t.Fatalf("a day's delegation: %v", tok)
		}
		if until := e.activeEnd(t, strings.TrimPrefix(action, consentPrefix)); until.Before(approvedAt.Add(24*time.Hour-time.Minute)) || until.After(approvedAt.Add(24*time.Hour+time.Minute)) {
			t.Fatalf("approved for a day, ends %v (approved at %v)", until, approvedAt)
		}

		// Something that is no refresh token.
		expectRFC6749(t, e.refresh(t, s, "not-a-refresh-token"), http.StatusBadRequest, "invalid_grant")
	})
}

// Of a revocation racing the poll that would redeem the approval, either
// the poll gets no token (access_denied), or it gets one that is inactive,
// on every replica, once the revocation has answered; the same of a
// revocation racing a refresh (invalid_grant, or new tokens dead at once).
func TestCIBARevocationRaces(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		shared := box.env("IDENTITYD_RISK_DISABLED=all", "IDENTITYD_ACCESS_TOKEN_TTL=60",
			"IDENTITYD_SYSTEM_SECRET="+randomString(), "IDENTITYD_ADMIN_CLIENT_SECRET="+randomString())
		s := start(t, dbURL, shared...)
		e := newCIBAEnv(t, s, box)
		e.registered(t)
		other := replica(t, s, dbURL, shared)
		race := func(a, b func()) {
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); a() }()
			go func() { defer wg.Done(); b() }()
			wg.Wait()
		}
		n := 0
		for round := range 3 {
			// The poll against the revocation.
			id := e.asked(t, "openid users:read", "delegation_expires_in", "3600")
			page, action := e.consent(t, n)
			n++
			expectPage(t, e.decide(t, page, action, "approve"), http.StatusOK, "Approved.")
			did := strings.TrimPrefix(action, consentPrefix)
			var poll *response
			race(func() { poll = e.poll(t, id) }, func() { e.revoke(t, did) })
			switch {
			case poll.Status == http.StatusOK:
				tok := poll.JSON(t)
				expectInactive(t, other.introspect(t, tok["access_token"].(string), e.ag.ClientID, e.ag.ClientSecret))
				expectRFC6749(t, e.refresh(t, other, tok["refresh_token"].(string)), http.StatusBadRequest, "invalid_grant")
			default:
				expectRFC6749(t, poll, http.StatusBadRequest, "access_denied")
			}

			// The refresh against the revocation.
			tok, did := e.approved(t, n, "openid users:read", "delegation_expires_in", "3600")
			n++
			var refreshed *response
			race(func() { refreshed = e.refresh(t, other, tok["refresh_token"].(string)) }, func() { e.revoke(t, did) })
			switch {
			case refreshed.Status == http.StatusOK:
				next := refreshed.JSON(t)
				expectInactive(t, other.introspect(t, next["access_token"].(string), e.ag.ClientID, e.ag.ClientSecret))
				expectInactive(t, s.introspect(t, next["access_token"].(string), e.ag.ClientID, e.ag.ClientSecret))
				expectRFC6749(t, e.refresh(t, s, next["refresh_token"].(string)), http.StatusBadRequest, "invalid_grant")
			default:
				expectRFC6749(t, refreshed, http.StatusBadRequest, "invalid_grant")
			}
			expectInactive(t, other.introspect(t, tok["access_token"].(string), e.ag.ClientID, e.ag.ClientSecret))
			t.Logf("round %d: poll %d, refresh %d", round, poll.Status, refreshed.Status)
		}
	})
}

// CIBA with client libraries someone else wrote (openid-client v6 and
// oauth4webapi: e2e/node/ciba.browser.mjs) and the consent page in
// Chromium: the person opens the e-mailed link with no session, signs in,
// lands on the page and decides.
func TestCIBAClientAndConsentPageBrowser(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		// The suite reuses a rotated refresh token at once: no grace window.
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all", "IDENTITYD_REFRESH_REUSE_GRACE=0")...)
		e := newCIBAEnv(t, s, box)
		e.registered(t)
		runBrowserSuite(t, dbURL, "ciba.browser.mjs",
			"IDENTITYD_ISSUER="+s.URL, "CHROMIUM="+chromiumPath, "CALLBACK_PORT="+fmt.Sprint(freePort(t)),
			"AGENT_ID="+e.ag.ClientID, "AGENT_SECRET="+e.ag.ClientSecret, "AGENT_NAME="+e.ag.Name,
			"EMAIL=pat@example.com", "PERSON_ID="+e.patID, "PASSWORD="+cibaPassword,
			"MAILBOX="+startMailbox(t, box, s.URL+consentPrefix))

		// The decisions were Pat's, in their SSO session; the newest
		// approval, for a day of the week asked, says what was asked.
		audit := s.do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action=delegation_approved,delegation_denied", nil, bearer(e.super)...).JSON(t)
		entries := audit["entries"].([]any)
		if len(entries) != 3 {
			t.Fatalf("decisions on the trail: %v", audit)
		}
		if det := entries[0].(map[string]any)["details"].(map[string]any); det["lifetimeAsked"] != 604800.0 {
			t.Fatalf("the shortened approval: %v", det)
		}
		if det := entries[2].(map[string]any)["details"].(map[string]any); det["lifetimeAsked"] != nil {
			t.Fatalf("an approval as asked: %v", det)
		}
		for _, x := range entries {
			if a, _ := x.(map[string]any)["actor"].(map[string]any); a["sub"] != e.patID || a["sessionId"] == nil {
				t.Fatalf("decision not by Pat's session: %v", x)
			}
		}
	})
}

// Bad input at the backchannel endpoint, the grant, the consent page and
// the delegation routes: RFC 6749 errors at the OAuth endpoints, the
// envelope elsewhere, pages for the page; nothing stored, nobody e-mailed.
func TestCIBABadInput(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		e := newCIBAEnv(t, s, box)
		e.registered(t)
		auth := basic(e.ag.ClientID, e.ag.ClientSecret)
		raw := func(body, contentType string) *response {
			return s.as(t).do(http.MethodPost, backchannelPath, body, append(auth, "Content-Type", contentType)...)
		}
		form := "application/x-www-form-urlencoded"
		for name, body := range map[string]string{
			"NUL in login_hint":     "scope=openid&login_hint=pat%00@example.com",
			"invalid UTF-8":         "scope=openid&login_hint=%ff%fe",
			"NUL in binding":        "scope=openid&login_hint=pat@example.com&binding_message=a%00b",
			"repeated scope":        "scope=openid&scope=email&login_hint=pat@example.com",
			"negative expiry":       "scope=openid&login_hint=pat@example.com&requested_expiry=-1",
			"expiry not a number":   "scope=openid&login_hint=pat@example.com&requested_expiry=1e3",
			"huge expiry":           "scope=openid&login_hint=pat@example.com&requested_expiry=99999999999999999999",
			"details not JSON":      "scope=openid&login_hint=pat@example.com&authorization_details=%5B",
			"deep details":          "scope=openid&login_hint=pat@example.com&authorization_details=" + url.QueryEscape(strings.Repeat("[", 5000)+strings.Repeat("]", 5000)),
			"unsupported user_code": "scope=openid&login_hint=pat@example.com&user_code=1",
			"zero lifetime":         "scope=openid&login_hint=pat@example.com&delegation_expires_in=0",
			"negative lifetime":     "scope=openid&login_hint=pat@example.com&delegation_expires_in=-5",
			"lifetime not a number": "scope=openid&login_hint=pat@example.com&delegation_expires_in=7d",
			"fractional lifetime":   "scope=openid&login_hint=pat@example.com&delegation_expires_in=60.5",
			"huge lifetime":         "scope=openid&login_hint=pat@example.com&delegation_expires_in=99999999999999999999",
			"lifetime over the max": "scope=openid&login_hint=pat@example.com&delegation_expires_in=2592001",
			"repeated lifetime":     "scope=openid&login_hint=pat@example.com&delegation_expires_in=60&delegation_expires_in=120",
		} {
			r := raw(body, form)
			if r.Status != http.StatusBadRequest {
				t.Errorf("%s: %s", name, describe(r))
				continue
			}
			if m := r.JSON(t); m["error"] == nil || m["error_description"] == nil || m["message"] != nil {
				t.Errorf("%s: not an RFC 6749 error: %s", name, r.Body)
			}
		}
		expectRFC6749(t, raw(`{"scope":["openid"],"login_hint":"pat@example.com"}`, "application/json"), http.StatusBadRequest, "invalid_request")
		expectRFC6749(t, raw(`{"scope":"openid","login_hint":"pat@example.com"`, "application/json"), http.StatusBadRequest, "invalid_request")
		expectRFC6749(t, raw("scope=openid&login_hint=pat@example.com", "multipart/form-data"), http.StatusBadRequest, "invalid_request")
		if r := raw("scope=openid&login_hint="+strings.Repeat("a", 2<<20), form); r.Status != http.StatusRequestEntityTooLarge {
			t.Errorf("a huge body: %s", describe(r))
		}
		// Wrong client credentials: invalid_client with the Basic challenge.
		r := s.as(t).do(http.MethodPost, backchannelPath, url.Values{"scope": {"openid"}, "login_hint": {"pat@example.com"}}, basic(e.ag.ClientID, "wrong")...)
		expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
		if r.Header.Get("WWW-Authenticate") == "" {
			t.Error("no challenge")
		}
		if r := s.as(t).do(http.MethodGet, backchannelPath, nil, auth...); r.Status != http.StatusMethodNotAllowed {
			t.Errorf("GET: %s", describe(r))
		}
		// The grant: missing, malformed, NUL-bearing auth_req_id.
		for _, id := range []string{"", "short", strings.Repeat("a", 43), "a\x00" + strings.Repeat("b", 41)} {
			r := s.as(t).do(http.MethodPost, tokenPath, url.Values{"grant_type": {cibaGrant}, "auth_req_id": {id}}, auth...)
			if r.Status != http.StatusBadRequest {
				t.Errorf("auth_req_id %q: %s", id, describe(r))
			}
		}
		// The refresh grant: missing, junk, NUL-bearing, huge refresh tokens.
		for _, rt := range []string{"", "junk", "a\x00b", strings.Repeat("r", 4096)} {
			r := s.as(t).do(http.MethodPost, tokenPath, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}}, auth...)
			if r.Status != http.StatusBadRequest {
				t.Errorf("refresh_token %q: %s", rt, describe(r))
			}
		}
		// The routes: junk ids and filters.
		_, saTok := s.as(t).registryToken(e.admin, "desk", "delegations:read", "delegations:write")
		expectError(t, s.do(http.MethodPost, m2mDelegations+"/not-a-uuid/revoke", nil, bearer(saTok)...), http.StatusNotFound, "not_found")
		expectError(t, s.do(http.MethodPost, m2mDelegations+"/"+e.patID+"/revoke", map[string]any{"reason": 7}, bearer(saTok)...), http.StatusBadRequest, "invalid_request")
		expectError(t, s.do(http.MethodPost, m2mDelegations+"/"+e.patID+"/revoke", map[string]any{"reason": strings.Repeat("x", 1001)}, bearer(saTok)...), http.StatusBadRequest, "invalid_request")
		if r := s.do(http.MethodGet, m2mDelegations+"?user=%ff", nil, bearer(saTok)...); r.Status != http.StatusBadRequest {
			t.Errorf("invalid UTF-8 filter: %s", describe(r))
		}
		if r := s.do(http.MethodGet, m2mDelegations+"?agent=x", nil, bearer(saTok)...); r.Status != http.StatusOK || r.JSON(t)["total"] != 0.0 {
			t.Errorf("junk agent filter: %s", describe(r))
		}
		// The page: a junk id, once signed in, is a 404 page; a forged post a 403 page.
		e.asked(t, "openid")
		e.consent(t, 0)
		if r := e.browser.get(s.URL + consentPrefix + "not-a-uuid"); r.Status != http.StatusNotFound {
			t.Errorf("junk consent id: %d", r.Status)
		}
		// Nothing was stored for the refused requests: one delegation.
		if r := s.do(http.MethodGet, m2mDelegations, nil, bearer(saTok)...); r.JSON(t)["total"] != 1.0 {
			t.Errorf("stored: %s", r.Body)
		}
	})
}
