package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Just-in-time privileges over real HTTP (issue 15): the rule table,
// automatic grants, grants through a person's approval, the tokens that
// carry granted scopes (capped by the grant), revocation, expiry and kill.

const (
	jitRules   = "/api/v1/jit/rules"
	jitRequest = "/api/v1/jit/request"
	jitGrants  = "/api/v1/jit/grants"
)

func (e *hitlEnv) rule(t *testing.T, scope string, max int, trust string) {
	t.Helper()
	r := e.s.as(t).do(http.MethodPost, jitRules, map[string]any{"scope": scope, "maxDurationSeconds": max, "minTrustLevel": trust}, bearer(e.super)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create rule: %s", describe(r))
	}
}

func (e *hitlEnv) askJIT(t *testing.T, tok string, scopes []string, duration int, action, resource string) *response {
	t.Helper()
	return e.s.as(t).do(http.MethodPost, jitRequest, map[string]any{"action": action, "resource": resource, "scopes": scopes, "duration": duration,
		"context": map[string]any{"ticket": "INC-1"}}, bearer(tok)...)
}

func (e *hitlEnv) grant(t *testing.T, s *server, tok, id string) map[string]any {
	t.Helper()
	return mustOK(t, s.as(t).do(http.MethodGet, jitGrants+"/"+id+"/status", nil, bearer(tok)...))
}

func hasScope(tr tokenResponse, scope string) bool {
	return slices.Contains(strings.Fields(tr.Scope), scope)
}

func TestJIT(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)

		// The rule table: never admin, agents:* or introspection.
		for _, c := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"scope": "admin", "maxDurationSeconds": 60, "minTrustLevel": "registered"}, "scope"},
			{map[string]any{"scope": "agents:write", "maxDurationSeconds": 60, "minTrustLevel": "registered"}, "scope"},
			{map[string]any{"scope": "tokens:introspect", "maxDurationSeconds": 60, "minTrustLevel": "registered"}, "scope"},
			{map[string]any{"scope": "nope", "maxDurationSeconds": 60, "minTrustLevel": "registered"}, "scope"},
			{map[string]any{"scope": "orgs:write", "maxDurationSeconds": 0, "minTrustLevel": "registered"}, "maxDurationSeconds"},
			{map[string]any{"scope": "orgs:write", "maxDurationSeconds": 86401, "minTrustLevel": "registered"}, "maxDurationSeconds"},
			{map[string]any{"scope": "orgs:write", "maxDurationSeconds": 60, "minTrustLevel": "root"}, "minTrustLevel"},
		} {
			expectFields(t, s.do(http.MethodPost, jitRules, c.body, bearer(e.super)...), c.field)
		}
		expectError(t, s.do(http.MethodPost, jitRules, map[string]any{"scope": "orgs:write", "maxDurationSeconds": 60, "minTrustLevel": "registered"}, bearer(e.agTok)...),
			http.StatusForbidden, "insufficient_scope")
		e.rule(t, "orgs:write", 600, "registered")
		e.rule(t, "orgs:read", 10, "sandboxed")

		// Sandboxed: the rule is for registered agents up.
		d := expectError(t, e.askJIT(t, e.agTok, []string{"orgs:write"}, 300, "fix_org", "orgs/1"), http.StatusForbidden, "jit_not_allowed")
		if !slices.Equal(strs(d["uncovered"]), []string{"orgs:write"}) {
			t.Fatalf("uncovered: %v", d)
		}
		for _, body := range []map[string]any{
			{"action": "a", "resource": "r", "scopes": []string{"admin"}, "duration": 60},
			{"action": "a", "resource": "r", "scopes": []string{"agents:read"}, "duration": 60},
			{"action": "a", "resource": "r", "scopes": []string{}, "duration": 60},
			{"action": "a", "resource": "r", "scopes": []string{"orgs:write"}, "duration": 0},
			{"action": "a", "resource": "r", "scopes": []string{"orgs:write"}, "duration": 86401},
			{"action": "", "resource": "r", "scopes": []string{"orgs:write"}, "duration": 60},
		} {
			expectError(t, s.do(http.MethodPost, jitRequest, body, bearer(e.agTok)...), http.StatusBadRequest, "invalid_request")
		}
		expectError(t, s.do(http.MethodPost, jitRequest, map[string]any{"action": "a", "resource": "r", "scopes": "orgs:write", "duration": 60}, bearer(e.agTok)...),
			http.StatusBadRequest, "invalid_request")
		for _, raw := range []string{
			`{"action": "a\u0000b", "resource": "r", "scopes": ["orgs:write"], "duration": 60}`,
			"{\"action\": \"a\xffb\", \"resource\": \"r\", \"scopes\": [\"orgs:write\"], \"duration\": 60}",
			`{"action": "a", "resource": "r", "scopes": ["orgs:write"], "duration": 1.5}`,
			`{"action": "a", "resource": "r", "scopes": ["orgs:write"], "duration": 60, "context": ` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40) + `}`,
			`{"action": "a", "resource": "r", "scopes": ["orgs:write"], "duration": 60, "context": "text"}`,
			`[1, 2]`,
		} {
			if r := s.do(http.MethodPost, jitRequest, raw, append(bearer(e.agTok), "Content-Type", "application/json")...); r.Status != http.StatusBadRequest || r.JSON(t)["error"] != "invalid_request" {
				t.Fatalf("%.60q: %s", raw, describe(r))
			}
		}
		expectError(t, s.do(http.MethodPost, jitRequest, map[string]any{"action": "a", "resource": "r", "scopes": []string{"orgs:write"}, "duration": 60}, bearer(e.super)...),
			http.StatusForbidden, "agent_token_required")
		// Longer than the rule allows.
		mustOK(t, s.changeTrust(e.super, e.ag.ID, "registered", "needs org writes"))
		expectError(t, e.askJIT(t, e.agTok, []string{"orgs:write"}, 601, "fix_org", "orgs/1"), http.StatusForbidden, "jit_not_allowed")

		// Automatic: active at once, for its duration.
		before := time.Now()
		r := e.askJIT(t, e.agTok, []string{"orgs:write"}, 300, "fix_org", "orgs/1")
		if r.Status != http.StatusCreated {
			t.Fatalf("jit request: %s", describe(r))
		}
		g := r.JSON(t)
		gid := g["grantId"].(string)
		if g["status"] != "active" || !slices.Equal(strs(g["scopes"]), []string{"orgs:write"}) {
			t.Fatalf("grant: %v", g)
		}
		if exp := isoZ(t, g["expiresAt"]); exp.Before(before.Add(299*time.Second)) || exp.After(time.Now().Add(301*time.Second)) {
			t.Fatalf("expiresAt %v", exp)
		}
		expectError(t, s.do(http.MethodGet, jitGrants+"/"+gid+"/status", nil, bearer(e.otherTok)...), http.StatusNotFound, "not_found")
		if m := e.grant(t, s, e.agTok, gid); m["status"] != "active" {
			t.Fatalf("status: %v", m)
		}

		// Tokens carry the granted scope, and live no longer than the grant.
		tr := decodeToken(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "orgs:write"))
		if !hasScope(tr, "orgs:write") || tr.ExpiresIn > 300 || tr.ExpiresIn < 1 {
			t.Fatalf("token with the grant: %+v", tr)
		}
		plain := decodeToken(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "users:read"))
		if plain.ExpiresIn <= 300 {
			t.Fatalf("a token without granted scopes is capped too: %+v", plain)
		}
		if r := s.do(http.MethodPost, "/api/v1/m2m/orgs", map[string]any{"name": "jit-org"}, bearer(tr.AccessToken)...); r.Status != http.StatusCreated {
			t.Fatalf("org write with the grant: %s", describe(r))
		}
		in := s.introspect(t, tr.AccessToken, s.AdminID, s.AdminSecret)
		if in["active"] != true || !slices.Contains(strings.Fields(in["scope"].(string)), "orgs:write") {
			t.Fatalf("introspection: %v", in)
		}

		// Revoked: at once, the token is inactive and the scope is gone. Two
		// revocations at once: one wins, the other is 409.
		expectFields(t, s.do(http.MethodPost, jitGrants+"/"+gid+"/revoke", map[string]any{}, bearer(e.super)...), "reason")
		expectError(t, s.do(http.MethodPost, jitGrants+"/"+gid+"/revoke", map[string]any{"reason": "x"}, bearer(e.agTok)...), http.StatusForbidden, "insufficient_scope")
		answers := make(chan *response, 2)
		for range 2 {
			go func() {
				r, err := send(http.MethodPost, s.URL+jitGrants+"/"+gid+"/revoke", strings.NewReader(`{"reason": "incident closed"}`),
					append(bearer(e.super), "Content-Type", "application/json")...)
				if err != nil {
					t.Error(err)
				}
				answers <- r
			}()
		}
		a1, a2 := <-answers, <-answers
		if a1 == nil || a2 == nil {
			t.FailNow()
		}
		if a1.Status == http.StatusConflict {
			a1, a2 = a2, a1
		}
		if a1.Status != http.StatusOK || a2.Status != http.StatusConflict || a2.JSON(t)["error"] != "grant_not_active" {
			t.Fatalf("two revocations at once: %s; %s", describe(a1), describe(a2))
		}
		m := a1.JSON(t)
		if m["status"] != "revoked" || m["reason"] != "incident closed" {
			t.Fatalf("revoke: %v", m)
		}
		expectInactive(t, s.introspect(t, tr.AccessToken, s.AdminID, s.AdminSecret))
		if r := s.do(http.MethodPost, "/api/v1/m2m/orgs", map[string]any{"name": "late-org"}, bearer(tr.AccessToken)...); r.Status != http.StatusUnauthorized {
			t.Fatalf("org write after the revocation: %s", describe(r))
		}
		expectRFC6749(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "orgs:write"), http.StatusBadRequest, "invalid_scope")
		expectError(t, s.do(http.MethodPost, jitGrants+"/"+gid+"/revoke", map[string]any{"reason": "again"}, bearer(e.super)...), http.StatusConflict, "grant_not_active")
		if m := e.grant(t, s, e.agTok, gid); m["status"] != "revoked" {
			t.Fatalf("status after revoke: %v", m)
		}

		// Expiry: a five-second grant; its token lives five seconds at most.
		g = e.askJIT(t, e.agTok, []string{"orgs:read"}, 5, "look", "orgs/1").JSON(t)
		short := decodeToken(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "orgs:read"))
		if short.ExpiresIn > 5 {
			t.Fatalf("token of a five-second grant: %+v", short)
		}
		time.Sleep(time.Until(isoZ(t, g["expiresAt"])))
		if m := e.grant(t, s, e.agTok, g["grantId"].(string)); m["status"] != "expired" {
			t.Fatalf("status after expiry: %v", m)
		}
		expectInactive(t, s.introspect(t, short.AccessToken, s.AdminID, s.AdminSecret))
		expectRFC6749(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "orgs:read"), http.StatusBadRequest, "invalid_scope")

		// Through a person: a HITL policy on the action and resource.
		hp := securityPolicy("async", 600, true)
		hp["actionPattern"], hp["resourcePattern"] = "escalate_*", "roles/*"
		e.policy(t, hp)
		r = e.askJIT(t, e.agTok, []string{"roles:read"}, 120, "escalate_audit", "roles/all")
		g = r.JSON(t)
		if r.Status != http.StatusCreated || g["status"] != "pending_approval" || g["requestId"] == nil || g["expiresAt"] != nil {
			t.Fatalf("jit through hitl: %s", describe(r))
		}
		expectRFC6749(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "roles:read"), http.StatusBadRequest, "invalid_scope")
		mustOK(t, e.decide(t, e.patTok, g["requestId"].(string), "approve", "audit week"))
		m = e.grant(t, s, e.agTok, g["grantId"].(string))
		if m["status"] != "active" || m["expiresAt"] == nil {
			t.Fatalf("grant after approval: %v", m)
		}
		rt := decodeToken(t, s.agentToken(e.ag.ClientID, e.ag.ClientSecret, "roles:read"))
		if r := s.do(http.MethodGet, "/api/v1/m2m/roles", nil, bearer(rt.AccessToken)...); r.Status != http.StatusOK || rt.ExpiresIn > 120 {
			t.Fatalf("roles read with the approved grant (%v s): %s", rt.ExpiresIn, describe(r))
		}
		g = e.askJIT(t, e.agTok, []string{"roles:read"}, 120, "escalate_more", "roles/all").JSON(t)
		mustOK(t, e.decide(t, e.patTok, g["requestId"].(string), "deny", "not now"))
		if m := e.grant(t, s, e.agTok, g["grantId"].(string)); m["status"] != "denied" || m["reason"] != "not now" {
			t.Fatalf("grant after denial: %v", m)
		}

		// A kill revokes what the agent holds and what it waits for.
		pending := e.askJIT(t, e.agTok, []string{"roles:read"}, 120, "escalate_again", "roles/all").JSON(t)["grantId"]
		mustOK(t, s.killAgent(e.super, e.ag.ID, map[string]any{"reason": "rogue"}))
		expectInactive(t, s.introspect(t, rt.AccessToken, s.AdminID, s.AdminSecret))
		revoked := map[any]bool{}
		for _, x := range e.audit(t, "jit_revoked") {
			if d := x["details"].(map[string]any); d["killed"] == true && d["reason"] == "agent killed: rogue" {
				revoked[d["grantId"]] = true
			}
		}
		if !revoked[pending] || !revoked[m["grantId"]] {
			t.Fatalf("grants revoked with the kill: %v (pending %v)", revoked, pending)
		}
	})
}

// Two replicas on PostgreSQL: a revocation or a kill answered by one makes
// the grant's token inactive on the other at once.
func TestJITAcrossReplicas(t *testing.T) {
	t.Parallel()
	one, two := startReplicas(t)
	e := newHITLEnv(t, one)
	mustOK(t, one.changeTrust(e.super, e.ag.ID, "registered", "org writes"))
	e.rule(t, "orgs:write", 600, "registered")
	for i := range 2 {
		gid := e.askJIT(t, e.agTok, []string{"orgs:write"}, 300, "fix_org", "orgs/1").JSON(t)["grantId"].(string)
		tok := decodeToken(t, two.agentToken(e.ag.ClientID, e.ag.ClientSecret, "orgs:write")).AccessToken
		in := two.introspect(t, tok, two.AdminID, two.AdminSecret) // now cached on two
		if in["active"] != true {
			t.Fatalf("round %d: introspection on two: %v", i, in)
		}
		if i == 0 {
			mustOK(t, one.do(http.MethodPost, jitGrants+"/"+gid+"/revoke", map[string]any{"reason": "done"}, bearer(e.super)...))
		} else {
			mustOK(t, one.killAgent(e.super, e.ag.ID, map[string]any{"reason": "rogue"}))
		}
		expectInactive(t, two.introspect(t, tok, two.AdminID, two.AdminSecret))
		if r := two.do(http.MethodPost, "/api/v1/m2m/orgs", map[string]any{"name": "after"}, bearer(tok)...); r.Status != http.StatusUnauthorized {
			t.Fatalf("round %d: the grant's token on two after the end on one: %s", i, describe(r))
		}
	}
}
