package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Admin is never reachable from a lesser scope (issue 39, items 1, 2 and
// 4), over real HTTP on each dialect: console administration is a flag
// only an admin gives, roles that approve agents' actions are the admin's
// to hand out, a person's address changes only with users:admin (and
// tells the old address, and signs the person out), and an agent gets no
// more through JIT rules or capabilities than its grantor holds.

const consoleAdminPath = "/api/v1/m2m/users/%s/console-admin"

// authorityPassword is the password of the people these tests sign in.
const authorityPassword = "a long and private passphrase"

// personToken creates a person with authorityPassword through admin, signs
// them in through app's embedded password sign-in and answers their id
// and the code exchange's tokens (access and refresh).
func personToken(t *testing.T, s *server, admin string, app hostedApp, email string) (string, map[string]any) {
	t.Helper()
	r := s.as(t).do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": email, "password": authorityPassword}, bearer(admin)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create person: %s", describe(r))
	}
	return r.JSON(t)["id"].(string), signInTokens(t, s, app, email)
}

// signInTokens signs a person in through app's embedded password sign-in.
func signInTokens(t *testing.T, s *server, app hostedApp, email string) map[string]any {
	t.Helper()
	verifier, challenge := pkce()
	r := s.embed(t, "/password", map[string]any{"clientId": app.id, "email": email, "password": authorityPassword, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
	if r.Status != http.StatusOK {
		t.Fatalf("password sign-in: %s", describe(r))
	}
	r = exchangeCode(t, s, app.id, app.secret, r.JSON(t)["code"].(string), verifier)
	codeExchanged(t, s, app.id, r)
	return r.JSON(t)
}

// expectChallenge checks a 403 insufficient_scope naming scope, in the
// body and in the RFC 6750 challenge.
func expectChallenge(t *testing.T, r *response, scope string) {
	t.Helper()
	expectScopeRefused(t, r, scope)
	if h := r.Header.Get("WWW-Authenticate"); !strings.Contains(h, `error="insufficient_scope"`) || !strings.Contains(h, `scope="`+scope+`"`) {
		t.Fatalf("WWW-Authenticate %q, want insufficient_scope naming %s", h, scope)
	}
}

// Item 1: a roles:manage (+ users:write) token that creates the role admin
// and gives it to a person makes nobody an admin; console administration
// is given and taken on its own routes, by admin tokens only (a console
// administrator's included); a role a HITL policy names as approver is the
// admin's to assign, remove or delete.
func TestConsoleAdminIsTheAdminsOnly(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		super := s.superToken()
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		console := newHostedApp(t, s, super, "Acme Console", redirect, map[string]any{"signInMethods": []string{"password"}, "adminConsole": true})
		notes := newHostedApp(t, s, super, "Acme Notes", redirect, map[string]any{"signInMethods": []string{"password"}})
		patID, pat := personToken(t, s, super, console, "pat@example.com")
		patConsole := pat["access_token"].(string)
		patNotes := signInTokens(t, s, notes, "pat@example.com")["access_token"].(string)
		kimID, _ := personToken(t, s, super, notes, "kim@example.com")
		_, roles := s.registryToken(super, "role desk", "roles:manage", "roles:read", "users:write", "users:read")
		asAdmin := func(tok string) int {
			return s.as(t).do(http.MethodGet, "/api/v1/service-accounts", nil, bearer(tok)...).Status
		}

		// The review's two steps: the role admin, made and given by a
		// roles:manage token, is an ordinary role now.
		if r := s.do(http.MethodPost, "/api/v1/m2m/roles", map[string]any{"name": "admin"}, bearer(roles)...); r.Status != http.StatusCreated {
			t.Fatalf("create the role admin: %s", describe(r))
		}
		mustOK(t, s.do(http.MethodPost, "/api/v1/m2m/roles/assign", map[string]any{"userId": patID, "role": "admin"}, bearer(roles)...))
		if got := asAdmin(patConsole); got != http.StatusForbidden {
			t.Fatalf("the role admin given by a roles:manage token made the person an admin: %d", got)
		}
		if u := mustOK(t, s.do(http.MethodGet, inviteUsers+"/"+patID, nil, bearer(roles)...)); u["consoleAdmin"] != false {
			t.Fatalf("consoleAdmin after the role: %v", u)
		}
		// Nor can it give console administration itself, on its route or
		// through a PATCH of the person.
		for _, method := range []string{http.MethodPut, http.MethodDelete} {
			expectChallenge(t, s.do(method, fmt.Sprintf(consoleAdminPath, patID), nil, bearer(roles)...), "admin")
			expectChallenge(t, s.do(method, fmt.Sprintf(consoleAdminPath, patID), nil, bearer(patNotes)...), "admin")
		}
		if d := expectError(t, s.do(http.MethodPatch, inviteUsers+"/"+patID, map[string]any{"consoleAdmin": true}, bearer(roles)...), http.StatusBadRequest, "invalid_request"); d["field"] != "consoleAdmin" {
			t.Fatalf("PATCH consoleAdmin: %v", d)
		}

		// An admin gives it: the person acts as admin through the console
		// application and no other, and may give it in turn; taken, it bites
		// at the next call.
		for range 2 { // idempotent
			if u := mustOK(t, s.do(http.MethodPut, fmt.Sprintf(consoleAdminPath, patID), nil, bearer(super)...)); u["consoleAdmin"] != true || u["id"] != patID {
				t.Fatalf("give: %v", u)
			}
		}
		if got := asAdmin(patConsole); got != http.StatusOK {
			t.Fatalf("a console administrator through the console application: %d", got)
		}
		if got := asAdmin(patNotes); got != http.StatusForbidden {
			t.Fatalf("a console administrator through another application: %d", got)
		}
		if u := mustOK(t, s.do(http.MethodPut, fmt.Sprintf(consoleAdminPath, kimID), nil, bearer(patConsole)...)); u["consoleAdmin"] != true {
			t.Fatalf("a console administrator gives it: %v", u)
		}
		mustOK(t, s.do(http.MethodDelete, fmt.Sprintf(consoleAdminPath, kimID), nil, bearer(patConsole)...))
		expectError(t, s.do(http.MethodPut, fmt.Sprintf(consoleAdminPath, "0190d7a2-0000-7000-8000-000000000000"), nil, bearer(super)...), http.StatusNotFound, "not_found")
		mustOK(t, s.do(http.MethodDelete, fmt.Sprintf(consoleAdminPath, patID), nil, bearer(super)...))
		if got := asAdmin(patConsole); got != http.StatusForbidden {
			t.Fatalf("console administration taken, the token still acts as admin: %d", got)
		}

		// A role a HITL policy names as approver decides agents' actions:
		// roles:manage neither gives, takes nor deletes it; admin does.
		for _, role := range []string{"security", "support"} {
			if r := s.do(http.MethodPost, "/api/v1/m2m/roles", map[string]any{"name": role}, bearer(roles)...); r.Status != http.StatusCreated {
				t.Fatalf("create role %s: %s", role, describe(r))
			}
		}
		if r := s.do(http.MethodPost, hitlPolicies, map[string]any{"name": "deploys need security", "actionPattern": "deploy_*", "resourcePattern": "*",
			"approvalMode": "async", "timeoutSeconds": 300, "approverType": "role", "approverId": "security"}, bearer(super)...); r.Status != http.StatusCreated {
			t.Fatalf("create policy: %s", describe(r))
		}
		change := func(method, path, tok, role string) *response {
			return s.as(t).do(method, path, map[string]any{"userId": kimID, "role": role}, bearer(tok)...)
		}
		expectChallenge(t, change(http.MethodPost, "/api/v1/m2m/roles/assign", roles, "security"), "admin")
		mustOK(t, change(http.MethodPost, "/api/v1/m2m/roles/assign", roles, "support")) // an ordinary role: as before
		if r := mustOK(t, s.do(http.MethodGet, inviteUsers+"/"+kimID+"/roles", nil, bearer(roles)...)); len(r["roles"].([]any)) != 1 {
			t.Fatalf("the refused assignment was made: %v", r)
		}
		mustOK(t, change(http.MethodPost, "/api/v1/m2m/roles/assign", super, "security"))
		expectChallenge(t, change(http.MethodDelete, "/api/v1/m2m/roles/remove", roles, "security"), "admin")
		expectChallenge(t, s.do(http.MethodDelete, "/api/v1/m2m/roles/security", nil, bearer(roles)...), "admin")
		mustOK(t, change(http.MethodDelete, "/api/v1/m2m/roles/remove", super, "security"))
	})
}

// Item 2, and item 4's agent path: a person's address and its
// verification change only with users:admin (an agent's token too); a
// change e-mails the old address and ends the person's sessions and
// tokens, in the transaction of the change.
func TestEmailChangeNeedsUsersAdmin(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env()...)
		super := s.superToken()
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		app := newHostedApp(t, s, super, "Acme Notes", redirect, map[string]any{"signInMethods": []string{"password"}})
		const old, next = "pat@example.com", "pat@other.example"
		patID, tokens := personToken(t, s, super, app, old)
		access, refresh := tokens["access_token"].(string), tokens["refresh_token"].(string)
		path := inviteUsers + "/" + patID
		_, writer := s.registryToken(super, "directory writer", "users:write", "users:read")
		_, keeper := s.registryToken(super, "directory keeper", "users:write", "users:read", "users:admin")
		sessions := func() float64 {
			t.Helper()
			return mustOK(t, s.as(t).do(http.MethodGet, path+"/sessions", nil, bearer(keeper)...))["total"].(float64)
		}

		// users:write alone: refused, nothing changed, nobody told, still
		// signed in. Sent as they are, they pass.
		expectChallenge(t, s.do(http.MethodPatch, path, map[string]any{"email": "mallory@evil.example"}, bearer(writer)...), "users:admin")
		expectChallenge(t, s.do(http.MethodPatch, path, map[string]any{"emailVerified": true}, bearer(writer)...), "users:admin")
		expectChallenge(t, s.do(http.MethodPatch, path, map[string]any{"name": "Pat", "email": "mallory@evil.example"}, bearer(writer)...), "users:admin")
		if u := mustOK(t, s.do(http.MethodPatch, path, map[string]any{"name": "Pat", "email": old, "emailVerified": false}, bearer(writer)...)); u["name"] != "Pat" || u["email"] != old {
			t.Fatalf("a PATCH that changes no address: %v", u)
		}

		// An agent writing users at trust registered holds users:write, not
		// users:admin: refused as the account is.
		ag := s.createAgent(super, map[string]any{"name": "helpdesk", "type": "autonomous", "capabilities": []string{"read_users", "write_users"}})
		mustOK(t, s.changeTrust(super, ag.ID, "registered", "writes users"))
		agTok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, ""))
		if !hasScope(agTok, "users:write") || hasScope(agTok, "users:admin") {
			t.Fatalf("agent scopes %q", agTok.Scope)
		}
		expectChallenge(t, s.do(http.MethodPatch, path, map[string]any{"email": "mallory@evil.example"}, bearer(agTok.AccessToken)...), "users:admin")
		expectChallenge(t, s.do(http.MethodPatch, path, map[string]any{"emailVerified": true}, bearer(agTok.AccessToken)...), "users:admin")
		mustOK(t, s.do(http.MethodPatch, path, map[string]any{"name": "Pat L."}, bearer(agTok.AccessToken)...))

		time.Sleep(300 * time.Millisecond) // a notice sent in error would have arrived
		if n := len(box.to(old)); n != 0 {
			t.Fatalf("%d messages to the old address before any change", n)
		}
		expectActive(t, s.introspect(t, access, app.id, app.secret), app.id)
		if n := sessions(); n != 1 {
			t.Fatalf("sessions before the change: %v", n)
		}

		// users:admin changes it: the old address is told (not the new
		// one), the sessions end, the tokens die.
		if u := mustOK(t, s.do(http.MethodPatch, path, map[string]any{"email": next}, bearer(keeper)...)); u["email"] != next {
			t.Fatalf("changed: %v", u)
		}
		notice := readMail(t, box.waitFor(t, old, 10*time.Second).Raw)
		if !strings.Contains(notice.Subject, "e-mail address") || !strings.Contains(notice.Text, "signed out") || strings.Contains(notice.Text, next) || strings.Contains(notice.HTML, next) {
			t.Fatalf("notice: %+v", notice)
		}
		if n := sessions(); n != 0 {
			t.Fatalf("sessions after the change: %v", n)
		}
		expectInactive(t, s.introspect(t, access, app.id, app.secret))
		r := s.do(http.MethodPost, tokenPath, post(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}}, app.id, app.secret))
		expectOAuthError(t, r, http.StatusBadRequest, "invalid_grant")
		if n := len(box.to(next)); n != 0 {
			t.Fatalf("%d messages to the new address", n)
		}
		// emailVerified alone with users:admin: changed, nobody signed out
		// again, no notice.
		if u := mustOK(t, s.do(http.MethodPatch, path, map[string]any{"emailVerified": true}, bearer(keeper)...)); u["emailVerified"] != true {
			t.Fatalf("verified: %v", u)
		}
	})
}

// Item 4: JIT rules never grant the scopes that reach admin or another's
// account, and an agents:write caller gives an agent no capability whose
// scopes it does not hold itself (an admin holds all).
func TestAgentsGetNoMoreThanTheirGrantor(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		super := s.superToken()
		for _, scope := range []string{"roles:manage", "users:admin", "admin", "tokens:introspect", "agents:read", "agents:write"} {
			r := s.do(http.MethodPost, jitRules, map[string]any{"scope": scope, "maxDurationSeconds": 60, "minTrustLevel": "privileged"}, bearer(super)...)
			expectFields(t, r, "scope")
			if msg := r.JSON(t)["details"].(map[string]any)["fields"].(map[string]any)["scope"].(string); !strings.Contains(msg, `"`+scope+`"`) {
				t.Fatalf("the refusal does not name %s: %q", scope, msg)
			}
		}
		ag := s.createAgent(super, map[string]any{"name": "climber", "type": "autonomous", "capabilities": []string{"read_users"}})
		agTok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken
		for _, scope := range []string{"roles:manage", "users:admin"} {
			expectFields(t, s.do(http.MethodPost, jitRequest, map[string]any{"action": "fix", "resource": "users/1", "scopes": []string{scope}, "duration": 60}, bearer(agTok)...), "scopes")
		}

		// A registry holding agents:write and users:write only.
		_, registry := s.registryToken(super, "agent registry", "agents:read", "agents:write", "users:read", "users:write")
		capsPath := agentsPath + "/" + ag.ID + "/capabilities"
		put := func(tok string, caps ...string) *response {
			return s.as(t).do(http.MethodPut, capsPath, map[string]any{"capabilities": caps}, bearer(tok)...)
		}
		refused := func(r *response, scope, capability string) {
			t.Helper()
			expectChallenge(t, r, scope)
			if d := r.JSON(t)["details"].(map[string]any); d["capability"] != capability {
				t.Fatalf("details %v, want capability %s", d, capability)
			}
		}
		refused(put(registry, "read_users", "manage_sessions"), "users:admin", "manage_sessions")
		refused(put(registry, "read_users", "read_analytics"), "analytics:read", "read_analytics")
		refused(put(registry, "delegate"), "delegations:read", "delegate")
		if r := s.do(http.MethodPost, agentsPath, map[string]any{"name": "x", "type": "service", "capabilities": []string{"manage_sessions"}}, bearer(registry)...); r.Status != http.StatusForbidden {
			t.Fatalf("create with a capability beyond the registry's scopes: %s", describe(r))
		}
		if g := mustOK(t, s.do(http.MethodGet, capsPath, nil, bearer(registry)...)); !slices.Equal(strs(g["capabilities"]), []string{"read_users"}) {
			t.Fatalf("a refused change was made: %v", g)
		}
		// What it holds it gives, and what needs no scope.
		mustOK(t, put(registry, "read_users", "write_users", "read_tickets", "a2a_exchange"))
		// What the agent has from an admin it may keep, or lose.
		mustOK(t, put(super, "read_users", "manage_sessions"))
		mustOK(t, put(registry, "read_users", "write_users", "manage_sessions"))
		mustOK(t, put(registry, "write_users"))
		refused(put(registry, "write_users", "manage_sessions"), "users:admin", "manage_sessions")
		if r := s.do(http.MethodPost, agentsPath, map[string]any{"name": "y", "type": "service", "capabilities": []string{"read_users", "write_users"}}, bearer(registry)...); r.Status != http.StatusCreated {
			t.Fatalf("create with the registry's own scopes: %s", describe(r))
		}
	})
}
