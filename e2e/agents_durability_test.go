package e2e

import (
	"net/http"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Audit entries of the token path are committed before the answer: a
// token_issued and a token_refused survive a kill -9 that follows at once,
// sitting in the audit inbox until the restarted server moves them.
func TestAgentAuditSurvivesACrash(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		system := "IDENTITYD_SYSTEM_SECRET=" + randomString()
		s := startLogged(t, dbURL, system)
		super := s.superToken()
		a := s.createAgent(super, map[string]any{"name": "crashy", "type": "service", "capabilities": []string{"read_users"}})
		if r := s.agentToken(a.ClientID, a.ClientSecret, ""); r.Status != http.StatusOK {
			t.Fatalf("token: %s", describe(r))
		}
		if r := s.agentToken(a.ClientID, "wrong", ""); r.Status != http.StatusUnauthorized {
			t.Fatalf("refusal: %s", describe(r))
		}
		if err := s.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-s.exited
		s.waitErr = nil // killed on purpose

		again := s.sibling(t, system, "IDENTITYD_ADMIN_CLIENT_SECRET="+s.AdminSecret)
		r := again.do(http.MethodGet, "/api/v1/agents/"+a.ID+"/audit?action=token_issued,token_refused", nil, bearer(again.superToken())...)
		m := mustOK(t, r)
		entries, _ := m["entries"].([]any)
		got := map[string]bool{}
		for _, e := range entries {
			got[e.(map[string]any)["action"].(string)] = true
		}
		if !got["token_issued"] || !got["token_refused"] {
			t.Fatalf("after the crash the trail has %v: %s", got, r.Body)
		}
	})
}
