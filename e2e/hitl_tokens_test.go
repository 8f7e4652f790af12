package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// approvalToken asks for a client-credentials token that redeems the
// approval of request id.
func (s *server) approvalToken(clientID, secret, id string) *response {
	s.t.Helper()
	text, _ := json.Marshal([]any{map[string]any{"type": "hitl_approval", "requestId": id}})
	return s.do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "authorization_details": {string(text)}}, basic(clientID, secret)...)
}

// An approval bound to a token: the M2M route a policy matches answers 403
// approval_required with a request; once approved, the agent redeems it,
// once, for a token that carries what was approved, lives no longer than
// the approval, shows it at introspection and passes the route.
func TestHITLTokens(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("sync", 600, true)) // the route never waits: it answers at once
		// An agent allowed to delete users (privileged, manage_sessions).
		ag := s.createAgent(e.super, map[string]any{"name": "deleter", "type": "service", "capabilities": []string{"read_users", "manage_sessions"}})
		for _, level := range []string{"registered", "verified", "privileged"} {
			mustOK(t, s.changeTrust(e.super, ag.ID, level, "deletes users"))
		}
		tok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
		victim := func(email string) string {
			r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": email}, bearer(admin)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create user: %s", describe(r))
			}
			return r.JSON(t)["id"].(string)
		}
		v1, v2 := victim("v1@example.com"), victim("v2@example.com")

		// The built-in type is advertised, and no RAR type may take its name.
		md := mustOK(t, s.do(http.MethodGet, "/.well-known/oauth-authorization-server", nil))
		if !slices.Contains(strs(md["authorization_details_types_supported"]), "hitl_approval") {
			t.Fatalf("discovery: %v", md["authorization_details_types_supported"])
		}
		expectFields(t, s.do(http.MethodPost, rarTypesPath, map[string]any{"type": "hitl_approval", "schema": map[string]any{"type": "object"}}, bearer(e.super)...), "type")

		// Gated: 403 approval_required with a new request.
		d := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(tok)...), http.StatusForbidden, "approval_required")
		id, _ := d["requestId"].(string)
		if id == "" || d["action"] != "delete_user" || d["resource"] != "users/"+v1 || d["status"] != "pending_approval" {
			t.Fatalf("approval_required details: %v", d)
		}
		// Called again: the same request stands for the call (no new one).
		if again := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(tok)...), http.StatusForbidden, "approval_required"); again["requestId"] != id {
			t.Fatalf("a second refusal made another request: %v, first %s", again, id)
		}
		// A service account is not gated (policies are for agents): read is fine.
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+v1, nil, bearer(admin)...); r.Status != http.StatusOK {
			t.Fatalf("service account read: %s", describe(r))
		}
		// Not approved yet: nothing to redeem.
		expectRFC6749(t, s.approvalToken(ag.ClientID, ag.ClientSecret, id), http.StatusBadRequest, "invalid_authorization_details")
		mustOK(t, e.decide(t, e.patTok, id, "approve", "offboarding"))
		// Approved, not redeemed: the refusal points at it.
		if again := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(tok)...), http.StatusForbidden, "approval_required"); again["requestId"] != id || again["status"] != "approved" {
			t.Fatalf("refusal after the approval: %v", again)
		}
		// Only its agent redeems it; a malformed entry is refused.
		expectRFC6749(t, s.approvalToken(e.other.ClientID, e.other.ClientSecret, id), http.StatusBadRequest, "invalid_authorization_details")
		expectRFC6749(t, s.approvalToken(ag.ClientID, ag.ClientSecret, ""), http.StatusBadRequest, "invalid_authorization_details")
		// A refused token request spends nothing (unknown scope).
		text, _ := json.Marshal([]any{map[string]any{"type": "hitl_approval", "requestId": id}})
		r := s.do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "scope": {"admin"}, "authorization_details": {string(text)}}, basic(ag.ClientID, ag.ClientSecret)...)
		if r.Status < 400 {
			t.Fatalf("a token with the admin scope: %s", describe(r))
		}

		r = s.approvalToken(ag.ClientID, ag.ClientSecret, id)
		if r.Status != http.StatusOK {
			t.Fatalf("redeem: %s", describe(r))
		}
		answer := r.JSON(t)
		granted, _ := answer["authorization_details"].([]any)
		if len(granted) != 1 {
			t.Fatalf("authorization_details: %v", answer)
		}
		entry := granted[0].(map[string]any)
		if entry["type"] != "hitl_approval" || entry["requestId"] != id || entry["action"] != "delete_user" || entry["resource"] != "users/"+v1 ||
			entry["method"] != "DELETE" || entry["path"] != "/api/v1/m2m/users/"+v1 || len(entry["digest"].(string)) != 64 {
			t.Fatalf("granted entry: %v", entry)
		}
		// Lives no longer than the approval (600 s), not the usual hour.
		if exp := answer["expires_in"].(float64); exp > 600 || exp < 1 {
			t.Fatalf("expires_in %v, want at most the approval's 600 s", exp)
		}
		approved := answer["access_token"].(string)
		// Once, never twice.
		expectRFC6749(t, s.approvalToken(ag.ClientID, ag.ClientSecret, id), http.StatusBadRequest, "invalid_authorization_details")
		// Resource servers see it at introspection.
		in := s.introspect(t, approved, s.AdminID, s.AdminSecret)
		if in["active"] != true {
			t.Fatalf("introspection: %v", in)
		}
		seen, _ := in["authorization_details"].([]any)
		if len(seen) != 1 || seen[0].(map[string]any)["requestId"] != id {
			t.Fatalf("introspected authorization_details: %v", in)
		}
		// The approved call passes; another resource is still gated.
		if r := s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(approved)...); r.Status != http.StatusNoContent {
			t.Fatalf("approved delete: %s", describe(r))
		}
		// Once (issue 39): the same call again with the same token is gated,
		// by a new request.
		if again := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(approved)...), http.StatusForbidden, "approval_required"); again["requestId"] == id || again["status"] != "pending_approval" {
			t.Fatalf("a second use of the approval: %v", again)
		}
		if m := e.s.do(http.MethodGet, hitlRequests+"/"+id, nil, bearer(tok)...).JSON(t); m["usedAt"] == nil || m["redeemedAt"] == nil || m["method"] != "DELETE" || m["body"] != nil {
			t.Fatalf("the used request: %v", m)
		}
		expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v2, nil, bearer(approved)...), http.StatusForbidden, "approval_required")
		// Reads are not matched by the policy.
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+v2, nil, bearer(tok)...); r.Status != http.StatusOK {
			t.Fatalf("ungated read: %s", describe(r))
		}

		// Two redemptions at once: one token.
		d = expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v2, nil, bearer(tok)...), http.StatusForbidden, "approval_required")
		id2 := d["requestId"].(string)
		mustOK(t, e.decide(t, e.super, id2, "approve", ""))
		var wg sync.WaitGroup
		codes := make([]int, 3)
		tokens := make([]string, 3)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				text, _ := json.Marshal([]any{map[string]any{"type": "hitl_approval", "requestId": id2}})
				form := url.Values{"grant_type": {"client_credentials"}, "authorization_details": {string(text)}}
				r, err := send(http.MethodPost, s.URL+tokenPath, strings.NewReader(form.Encode()),
					append(basic(ag.ClientID, ag.ClientSecret), "Content-Type", "application/x-www-form-urlencoded")...)
				if err != nil {
					t.Error(err)
					return
				}
				codes[i] = r.Status
				if r.Status == http.StatusOK {
					tokens[i] = r.JSON(t)["access_token"].(string)
				}
			}()
		}
		wg.Wait()
		slices.Sort(codes)
		if !slices.Equal(codes, []int{http.StatusOK, http.StatusBadRequest, http.StatusBadRequest}) {
			t.Fatalf("three redemptions at once: %v", codes)
		}
		// Two calls at once with the redeemed token: one passes, the other
		// is gated (were both let through, the second would be 404).
		won := slices.IndexFunc(tokens, func(s string) bool { return s != "" })
		codes = make([]int, 2)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := send(http.MethodDelete, s.URL+"/api/v1/m2m/users/"+v2, nil, bearer(tokens[won])...)
				if err != nil {
					t.Error(err)
					return
				}
				codes[i] = r.Status
			}()
		}
		wg.Wait()
		slices.Sort(codes)
		if !slices.Equal(codes, []int{http.StatusNoContent, http.StatusForbidden}) {
			t.Fatalf("two uses at once: %v", codes)
		}
		// The trail tells the redemptions and the uses.
		for action, n := range map[string]float64{"hitl_redeemed": 2, "hitl_used": 2} {
			m := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+ag.ID+"/audit?action="+action, nil, bearer(e.super)...))
			if m["total"] != n {
				t.Fatalf("%s on the trail: %v", action, m)
			}
		}
	})
}

// mailedTo waits for a message to rcpt whose text contains want.
func mailedTo(t *testing.T, box *mailServer, rcpt, want string) sentMail {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, m := range box.to(rcpt) {
			if msg := readMail(t, m.Raw); strings.Contains(msg.Text, want) {
				msg.Text = strings.ReplaceAll(msg.Text, "\r\n", "\n")
				msg.HTML = strings.ReplaceAll(msg.HTML, "\r\n", "\n")
				return msg
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no e-mail to %s with %q within 10s", rcpt, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An approval is for one call (issue 39): its method, path and body
// (canonical JSON: key order and whitespace do not matter, any value
// does), asked by the gated call itself or named by an explicit request;
// the approvers' e-mail shows the call, and the redeemed token passes it
// once. One approved create_user no longer creates anyone else.
func TestHITLCallBinding(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env()...)
		e := newHITLEnv(t, s)
		e.policy(t, map[string]any{"name": "new people need security", "actionPattern": "create_user", "resourcePattern": "users", "approvalMode": "async",
			"timeoutSeconds": 600, "approverType": "role", "approverId": "security"})
		ag := s.createAgent(e.super, map[string]any{"name": "onboarder", "type": "autonomous", "capabilities": []string{"read_users", "write_users"}})
		mustOK(t, s.changeTrust(e.super, ag.ID, "registered", "creates users"))
		tok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken
		create := func(tok, body string) *response {
			return s.do(http.MethodPost, "/api/v1/m2m/users", body, append(bearer(tok), "Content-Type", "application/json")...)
		}
		redeem := func(id string) string {
			r := s.approvalToken(ag.ClientID, ag.ClientSecret, id)
			if r.Status != http.StatusOK {
				t.Fatalf("redeem: %s", describe(r))
			}
			return r.JSON(t)["access_token"].(string)
		}
		const ann = `{"email": "ann@example.com", "name": "Ann"}`
		const annAgain = "{\n  \"name\" : \"Ann\",\n\t\"email\":\"ann@example.com\"\n}" // the same call
		const eve = `{"email": "eve@example.com", "name": "Ann"}`

		id := expectError(t, create(tok, ann), http.StatusForbidden, "approval_required")["requestId"]
		if again := expectError(t, create(tok, annAgain), http.StatusForbidden, "approval_required"); again["requestId"] != id {
			t.Fatalf("the same call, keys reordered, made another request: %v, first %v", again, id)
		}
		other := expectError(t, create(tok, eve), http.StatusForbidden, "approval_required")["requestId"]
		if other == id {
			t.Fatalf("another body stands under the same request %v", id)
		}
		// The agent reads the call it asked for; the approvers are e-mailed it.
		m := mustOK(t, s.do(http.MethodGet, hitlRequests+"/"+id.(string), nil, bearer(tok)...))
		if b, _ := m["body"].(map[string]any); m["method"] != "POST" || m["path"] != "/api/v1/m2m/users" || b["email"] != "ann@example.com" || b["name"] != "Ann" || len(b) != 2 {
			t.Fatalf("the request's call: %v", m)
		}
		msg := mailedTo(t, box, "pat@example.com", "ann@example.com")
		if !strings.Contains(msg.Text, "POST /api/v1/m2m/users\n{\n  \"email\": \"ann@example.com\",\n  \"name\": \"Ann\"\n}") ||
			!strings.Contains(msg.HTML, "POST /api/v1/m2m/users") || !strings.Contains(msg.HTML, "&#34;email&#34;: &#34;ann@example.com&#34;") {
			t.Fatalf("the e-mail does not show the call:\n%s\n%s", msg.Text, msg.HTML)
		}

		mustOK(t, e.decide(t, e.patTok, id.(string), "approve", "new hire"))
		approved := redeem(id.(string))
		// Another body with the approved token: refused, under its own request.
		if d := expectError(t, create(approved, eve), http.StatusForbidden, "approval_required"); d["requestId"] != other {
			t.Fatalf("another body with the approval: %v, want request %v", d, other)
		}
		if d := expectError(t, create(approved, `{"email": "ann@example.com", "name": "Ann", "status": "disabled"}`), http.StatusForbidden, "approval_required"); d["requestId"] == id {
			t.Fatalf("a body with one more field passed as the approved one: %v", d)
		}
		// The approved call, keys in another order: passes, once.
		if r := create(approved, annAgain); r.Status != http.StatusCreated {
			t.Fatalf("the approved call: %s", describe(r))
		}
		if d := expectError(t, create(approved, ann), http.StatusForbidden, "approval_required"); d["requestId"] == id || d["status"] != "pending_approval" {
			t.Fatalf("the approved call a second time: %v", d)
		}
		list := mustOK(t, s.do(http.MethodGet, "/api/v1/m2m/users?limit=200", nil, bearer(e.super)...))
		created := 0
		for _, u := range list["users"].([]any) {
			if email := u.(map[string]any)["email"]; email == "ann@example.com" || email == "eve@example.com" {
				created++
			}
		}
		if created != 1 {
			t.Fatalf("%d people created by one approval", created)
		}

		// An explicit request names the call; its approval passes it once.
		r := s.do(http.MethodPost, hitlRequests, map[string]any{"action": "create_user", "resource": "users", "method": "POST", "path": "/api/v1/m2m/users",
			"body": map[string]any{"name": "Bo", "email": "bo@example.com"}, "context": map[string]any{"why": "ticket \u202e24"}}, bearer(tok)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("explicit request: %s", describe(r))
		}
		explicit := r.JSON(t)
		if b, _ := explicit["body"].(map[string]any); explicit["method"] != "POST" || explicit["path"] != "/api/v1/m2m/users" || b["email"] != "bo@example.com" {
			t.Fatalf("explicit request: %v", explicit)
		}
		// The e-mail shows the bidi override in the context as an escape, never applied.
		msg = mailedTo(t, box, "pat@example.com", "bo@example.com")
		if !strings.Contains(msg.Text, "ticket <U+202E>24") || strings.ContainsRune(msg.Text, '\u202e') || strings.ContainsRune(msg.HTML, '\u202e') {
			t.Fatalf("the context's format character in the e-mail:\n%s", msg.Text)
		}
		// The gated call finds the explicit request that names it.
		if d := expectError(t, create(tok, `{"email":"bo@example.com","name":"Bo"}`), http.StatusForbidden, "approval_required"); d["requestId"] != explicit["requestId"] {
			t.Fatalf("the gated call did not find the explicit request: %v", d)
		}
		mustOK(t, e.decide(t, e.super, explicit["requestId"].(string), "approve", ""))
		bo := redeem(explicit["requestId"].(string))
		if r := create(bo, `{"email":"bo@example.com","name":"Bo"}`); r.Status != http.StatusCreated {
			t.Fatalf("the call named by the explicit request: %s", describe(r))
		}
		expectError(t, create(bo, `{"email":"bo@example.com","name":"Bo"}`), http.StatusForbidden, "approval_required")
	})
}
