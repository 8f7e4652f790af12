package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Agents reach the directory through their capabilities: read_users gives
// users:read at any trust level; writing needs write_users from registered
// up; the call is on the agent's audit trail.
func TestDirectoryAgents(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		super := s.superToken()
		reader := s.createAgent(super, map[string]any{"name": "reader", "type": "autonomous", "capabilities": []string{"read_users", "write_users"}})
		tok := decodeToken(t, s.agentToken(reader.ClientID, reader.ClientSecret, "")).AccessToken

		m := mustOK(t, s.do(http.MethodGet, "/api/v1/m2m/users", nil, bearer(tok)...))
		if m["total"] != float64(0) {
			t.Fatalf("users: %v", m)
		}
		// Sandboxed: write_users gives no users:write yet.
		expectScopeRefused(t, s.do(http.MethodPost, "/api/v1/m2m/users", map[string]any{"email": "x@example.com"}, bearer(tok)...), "users:write")
		if r := s.changeTrust(super, reader.ID, "registered", "reviewed"); r.Status != http.StatusOK {
			t.Fatalf("trust: %s", describe(r))
		}
		tok = decodeToken(t, s.agentToken(reader.ClientID, reader.ClientSecret, "")).AccessToken
		if r := s.do(http.MethodPost, "/api/v1/m2m/users", map[string]any{"email": "x@example.com"}, bearer(tok)...); r.Status != http.StatusCreated {
			t.Fatalf("registered agent with write_users creates a user: %s", describe(r))
		}
		// Deleting needs users:admin, which only manage_sessions at privileged gives.
		expectScopeRefused(t, s.do(http.MethodDelete, "/api/v1/m2m/users/00000000-0000-0000-0000-000000000000", nil, bearer(tok)...), "users:admin")

		// An agent without read_users is refused at once.
		none := s.createAgent(super, map[string]any{"name": "none", "type": "autonomous", "capabilities": []string{"read_analytics"}})
		noneTok := decodeToken(t, s.agentToken(none.ClientID, none.ClientSecret, "")).AccessToken
		expectScopeRefused(t, s.do(http.MethodGet, "/api/v1/m2m/users", nil, bearer(noneTok)...), "users:read")

		// The calls are on the trail.
		au := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+reader.ID+"/audit?action=api_call", nil, bearer(super)...))
		if au["total"].(float64) < 2 {
			t.Fatalf("api_call entries: %v", au)
		}
	})
}

// Metadata keeps numbers as written, and its bound counts the JSON as sent
// ('<' is one byte, not the six of an HTML-escaped encoding).
func TestDirectoryMetadata(t *testing.T) {
	s := start(t, dbtest.URLs(t)["sqlite"])
	acct := s.createAccount(s.adminToken(), map[string]any{"name": "meta", "scopes": []string{"users:read", "users:write"}})
	tok := s.token(acct.ClientID, acct.ClientSecret, "")
	body := `{"email":"meta@example.com","metadata":{"big":9007199254740993,"huge":1e400,"f":1.50}}`
	r := s.do(http.MethodPost, "/api/v1/m2m/users", body, append(bearer(tok), "Content-Type", "application/json")...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %s", describe(r))
	}
	var created struct{ ID string }
	if err := json.Unmarshal(r.Body, &created); err != nil {
		t.Fatal(err)
	}
	id := created.ID
	got := s.do(http.MethodGet, "/api/v1/m2m/users/"+id, nil, bearer(tok)...)
	for _, want := range []string{`"big":9007199254740993`, `"huge":1e400`, `"f":1.50`} {
		if !strings.Contains(string(got.Body), want) {
			t.Fatalf("metadata read back as %s, want %s in it", got.Body, want)
		}
	}
	// 16 KiB of '<' in one string: exactly the bound, as sent.
	fill := strings.Repeat("<", 16384-len(`{"k":""}`))
	r = s.do(http.MethodPost, "/api/v1/m2m/users", `{"email":"lt@example.com","metadata":{"k":"`+fill+`"}}`, append(bearer(tok), "Content-Type", "application/json")...)
	if r.Status != http.StatusCreated {
		t.Fatalf("metadata at the bound: %s", describe(r)[:200])
	}
	r = s.do(http.MethodPost, "/api/v1/m2m/users", `{"email":"lt2@example.com","metadata":{"k":"`+fill+`<"}}`, append(bearer(tok), "Content-Type", "application/json")...)
	expectFields(t, r, "metadata")
}
