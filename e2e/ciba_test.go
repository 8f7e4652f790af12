package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

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
	exactKeys(t, m, "auth_req_id", "expires_in", "interval")
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
		if r := s.as(t).changeTrust(e.super, e.ag.ID, "registered", "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
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

		// Asked: pending, then slow_down when polled too fast (CIBA Core §11).
		id := e.asked(t, "openid email users:read")
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "authorization_pending")
		expectRFC6749(t, e.poll(t, id), http.StatusBadRequest, "slow_down")
		expectRFC6749(t, e.poll(t, "x"+id[1:]), http.StatusBadRequest, "invalid_grant")

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
		if r := s.as(t).changeTrust(e.super, e.ag.ID, "registered", "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
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
		other := s
		if strings.HasPrefix(dbURL, "postgres") {
			// One issuer, as replicas behind one address have.
			other = s.sibling(t, append(shared, "IDENTITYD_ISSUER="+s.URL)...)
		}

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

		// The person disabled: their delegated tokens end at once.
		access = approved(1)
		if r := s.do(http.MethodPatch, inviteUsers+"/"+e.patID, map[string]any{"status": "disabled"}, bearer(e.admin)...); r.Status != http.StatusOK {
			t.Fatalf("disable: %s", describe(r))
		}
		expectInactive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret))
		if r := s.do(http.MethodPatch, inviteUsers+"/"+e.patID, map[string]any{"status": "active"}, bearer(e.admin)...); r.Status != http.StatusOK {
			t.Fatalf("enable: %s", describe(r))
		}
		// Disabling suspends (docs/decisions.md): enabled again, within
		// the delegation's lifetime, the token speaks for Pat again.
		expectActive(t, other.introspect(t, access, e.ag.ClientID, e.ag.ClientSecret), e.ag.ClientID)

		// A kill ends them, and revokes the delegation.
		access = approved(2)
		if r := s.as(t).killAgent(e.super, e.ag.ID, map[string]any{"reason": "compromised"}); r.Status != http.StatusOK {
			t.Fatalf("kill: %s", describe(r))
		}
		expectInactive(t, other.introspect(t, access, s.AdminID, s.AdminSecret))
		list = s.do(http.MethodGet, m2mDelegations+"?agent="+e.ag.ID+"&status=revoked", nil, bearer(saTok)...).JSON(t)
		if list["total"] != 3.0 { // the desk's, and the two the kill revoked
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
		if r := s.as(t).changeTrust(e.super, e.ag.ID, "registered", "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
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

// CIBA with client libraries someone else wrote (openid-client v6 and
// oauth4webapi: e2e/node/ciba.browser.mjs) and the consent page in
// Chromium: the person opens the e-mailed link with no session, signs in,
// lands on the page and decides.
func TestCIBAClientAndConsentPageBrowser(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		e := newCIBAEnv(t, s, box)
		if r := s.as(t).changeTrust(e.super, e.ag.ID, "registered", "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
		runBrowserSuite(t, dbURL, "ciba.browser.mjs",
			"IDENTITYD_ISSUER="+s.URL, "CHROMIUM="+chromiumPath, "CALLBACK_PORT="+fmt.Sprint(freePort(t)),
			"AGENT_ID="+e.ag.ClientID, "AGENT_SECRET="+e.ag.ClientSecret, "AGENT_NAME="+e.ag.Name,
			"EMAIL=pat@example.com", "PERSON_ID="+e.patID, "PASSWORD="+cibaPassword,
			"MAILBOX="+startMailbox(t, box, s.URL+consentPrefix))

		// The decisions were Pat's, in their SSO session.
		audit := s.do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action=delegation_approved,delegation_denied", nil, bearer(e.super)...).JSON(t)
		entries := audit["entries"].([]any)
		if len(entries) != 2 {
			t.Fatalf("decisions on the trail: %v", audit)
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
		if r := s.as(t).changeTrust(e.super, e.ag.ID, "registered", "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
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
