package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Sandboxed agents are rate-limited harder: a fifth of each limit. whoami
// (GET /m2m/*, 100/min) allows a sandboxed agent 20 calls a minute, while a
// registered agent goes on.
func TestAgentSandboxedRateLimit(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"], "IDENTITYD_RATE_LIMITS=on")
	super := s.superToken()
	tokenOf := func(a agent) string {
		var tr tokenResponse
		if err := json.Unmarshal(s.agentToken(a.ClientID, a.ClientSecret, "").Body, &tr); err != nil || tr.AccessToken == "" {
			t.Fatalf("agent token: %v", err)
		}
		return tr.AccessToken
	}
	sandboxed := s.createAgent(super, map[string]any{"name": "limited", "type": "autonomous", "capabilities": []string{"read_users"}})
	registered := s.createAgent(super, map[string]any{"name": "trusted", "type": "autonomous", "capabilities": []string{"read_users"}})
	mustOK(t, s.changeTrust(super, registered.ID, "registered", "reviewed"))

	sb, rg := tokenOf(sandboxed), tokenOf(registered)
	for i := range 20 {
		if r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(sb)...); r.Status != http.StatusOK {
			t.Fatalf("sandboxed call %d: %s", i+1, describe(r))
		}
	}
	r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(sb)...)
	expectError(t, r, http.StatusTooManyRequests, "rate_limited")
	if r.Header.Get("X-RateLimit-Limit") != "20" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("headers %v", r.Header)
	}
	for i := range 21 {
		if r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(rg)...); r.Status != http.StatusOK || r.Header.Get("X-RateLimit-Limit") != "100" {
			t.Fatalf("registered call %d: %s %v", i+1, describe(r), r.Header)
		}
	}
}
