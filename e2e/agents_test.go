package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Agents over real HTTP: the registry, trust levels, agent tokens and the
// kill switch, on each dialect, and the kill across two replicas.
//
// With PostgreSQL every change to an agent (PATCH, capabilities, trust,
// kill, recover, delete) waits out the cache lease before it answers, so
// these scenarios make few changes and run in parallel.

const (
	agentsPath = "/api/v1/agents"
	whoamiPath = "/api/v1/m2m/whoami"
)

// agent is an agent as the create call answers it.
type agent struct {
	ID           string   `json:"id"`
	ClientID     string   `json:"clientId"`
	ClientSecret string   `json:"clientSecret"`
	Name         string   `json:"name"`
	Type         string   `json:"type"`
	Capabilities []string `json:"capabilities"`
	TrustLevel   string   `json:"trustLevel"`
	Status       string   `json:"status"`
}

// superToken is the bootstrap admin's token with every scope it holds:
// admin for trust and kill, agents:read/write for the registry.
func (s *server) superToken() string { return s.token(s.AdminID, s.AdminSecret, "") }

// capabilityScopes are the scopes the built-in capabilities allow: a
// registry gives an agent no capability beyond its own scopes.
var capabilityScopes = []string{"users:read", "users:write", "users:admin", "analytics:read", "delegations:read", "delegations:write"}

// registryToken creates a service account with exactly these scopes and
// returns its client id and a token with all of them.
func (s *server) registryToken(admin, name string, scopes ...string) (string, string) {
	s.t.Helper()
	a := s.createAccount(admin, map[string]any{"name": name, "scopes": scopes})
	return a.ClientID, s.token(a.ClientID, a.ClientSecret, "")
}

func (s *server) createAgent(tok string, body map[string]any) agent {
	s.t.Helper()
	r := s.do(http.MethodPost, agentsPath, body, bearer(tok)...)
	if r.Status != http.StatusCreated {
		s.t.Fatalf("create agent: %s", describe(r))
	}
	var a agent
	if err := json.Unmarshal(r.Body, &a); err != nil {
		s.t.Fatal(err)
	}
	return a
}

// agentToken asks for a client-credentials token with the agent's secret
// (HTTP Basic) and returns the raw answer.
func (s *server) agentToken(clientID, secret, scope string) *response {
	s.t.Helper()
	return s.do(http.MethodPost, tokenPath, ccForm(scope), basic(clientID, secret)...)
}

// changeTrust calls POST /agents/{id}/trust.
func (s *server) changeTrust(tok, id, level, reason string) *response {
	s.t.Helper()
	body := map[string]any{"trustLevel": level}
	if reason != "" {
		body["reason"] = reason
	}
	return s.do(http.MethodPost, agentsPath+"/"+id+"/trust", body, bearer(tok)...)
}

// killAgent, recoverAgent and killEvents call the kill switch with tok.
func (s *server) killAgent(tok, id string, body any) *response {
	s.t.Helper()
	return s.do(http.MethodPost, agentsPath+"/"+id+"/kill", body, bearer(tok)...)
}

func (s *server) recoverAgent(tok, id string) *response {
	s.t.Helper()
	return s.do(http.MethodPost, agentsPath+"/"+id+"/recover", nil, bearer(tok)...)
}

func (s *server) killEvents(tok, id string) *response {
	s.t.Helper()
	return s.do(http.MethodGet, agentsPath+"/"+id+"/kill-events", nil, bearer(tok)...)
}

// mustOK fails unless r is a 200 and returns its body.
func mustOK(t *testing.T, r *response) map[string]any {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("want 200: %s", describe(r))
	}
	return r.JSON(t)
}

// expectFields checks a 400 whose details.fields names exactly these fields.
func expectFields(t *testing.T, r *response, fields ...string) {
	t.Helper()
	d := expectError(t, r, http.StatusBadRequest, "invalid_request")
	f, ok := d["fields"].(map[string]any)
	if !ok {
		t.Fatalf("400 without details.fields: %s", r.Body)
	}
	exactKeys(t, f, fields...)
}

// expectScopeRefused checks 403 insufficient_scope naming the scope needed.
func expectScopeRefused(t *testing.T, r *response, scope string) {
	t.Helper()
	d := expectError(t, r, http.StatusForbidden, "insufficient_scope")
	if d["requiredScope"] != scope {
		t.Fatalf("details.requiredScope %v, want %q: %s", d["requiredScope"], scope, r.Body)
	}
}

// expectTokenRefused checks that an API call with tok is answered 401
// invalid_token with the RFC 6750 challenge.
func expectTokenRefused(t *testing.T, s *server, tok string) {
	t.Helper()
	r := s.as(t).do(http.MethodGet, whoamiPath, nil, bearer(tok)...)
	expectError(t, r, http.StatusUnauthorized, "invalid_token")
	if h := r.Header.Get("WWW-Authenticate"); !strings.Contains(h, `error="invalid_token"`) {
		t.Fatalf("WWW-Authenticate %q lacks invalid_token", h)
	}
}

func scopeSet(scope string) []string { return slices.Sorted(slices.Values(strings.Fields(scope))) }

// The registry: create, read, list with filters and pages, update,
// capabilities, delete, and every refusal, with agents:* scoped tokens.
func TestAgentRegistry(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		registryID, tok := s.registryToken(admin, "agent-registry", append([]string{"agents:read", "agents:write"}, capabilityScopes...)...)
		auth := bearer(tok)

		t.Run("create", func(t *testing.T) {
			s := s.as(t)
			before := time.Now().Add(-time.Second)
			body := map[string]any{"name": "  triage-bot  ", "type": "autonomous", "description": "Sorts tickets.",
				"capabilities": []string{"read_users", "read_tickets", "read_users"}}
			r := s.do(http.MethodPost, agentsPath, body, auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, "id", "clientId", "clientSecret", "name", "type", "description", "capabilities", "trustLevel", "status", "createdAt", "updatedAt")
			id, _ := m["id"].(string)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("id %q is not a UUID", id)
			}
			if loc := r.Header.Get("Location"); loc != agentsPath+"/"+id {
				t.Fatalf("Location %q, want %s/%s", loc, agentsPath, id)
			}
			if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("an answer with a secret has Cache-Control %q, want no-store", cc)
			}
			clientID, _ := m["clientId"].(string)
			secret, _ := m["clientSecret"].(string)
			if !strings.HasPrefix(clientID, "agt_") || len(clientID) <= len("agt_") {
				t.Fatalf("clientId %q lacks the agt_ prefix", clientID)
			}
			if len(secret) != 43 {
				t.Fatalf("clientSecret %q is %d characters, want 43 (256 bits)", secret, len(secret))
			}
			if m["name"] != "triage-bot" || m["type"] != "autonomous" || m["description"] != "Sorts tickets." ||
				!slices.Equal(strs(m["capabilities"]), []string{"read_users", "read_tickets"}) {
				t.Fatalf("fields not as sent (name trimmed, capabilities deduplicated): %s", r.Body)
			}
			if m["trustLevel"] != "sandboxed" || m["status"] != "active" {
				t.Fatalf("a new agent must be sandboxed and active: %s", r.Body)
			}
			if c := isoZ(t, m["createdAt"]); c.Before(before) || c.After(time.Now().Add(time.Second)) {
				t.Fatalf("createdAt %v is not now", c)
			}
			isoZ(t, m["updatedAt"])

			// GET shows the same agent, without the secret.
			g := s.do(http.MethodGet, agentsPath+"/"+id, nil, auth...)
			gm := mustOK(t, g)
			exactKeys(t, gm, "id", "clientId", "name", "type", "description", "capabilities", "trustLevel", "status", "createdAt", "updatedAt")
			if strings.Contains(string(g.Body), secret) {
				t.Fatal("GET shows the client secret")
			}
			if gm["id"] != id || gm["clientId"] != clientID || gm["name"] != "triage-bot" || gm["createdAt"] != m["createdAt"] ||
				!slices.Equal(strs(gm["capabilities"]), []string{"read_users", "read_tickets"}) {
				t.Fatalf("get: %s", g.Body)
			}

			// Optional fields default; credentials are new each time.
			o := s.do(http.MethodPost, agentsPath, map[string]any{"name": "minimal", "type": "service"}, auth...)
			if o.Status != http.StatusCreated {
				t.Fatalf("create minimal: %s", describe(o))
			}
			om := o.JSON(t)
			if om["id"] == id || om["clientId"] == clientID || om["clientSecret"] == secret {
				t.Fatalf("second agent reuses identifiers: %s", o.Body)
			}
			if caps, ok := om["capabilities"].([]any); !ok || len(caps) != 0 || om["description"] != "" {
				t.Fatalf("defaults: capabilities must be [], description \"\": %s", o.Body)
			}
		})

		t.Run("create refusals", func(t *testing.T) {
			s := s.as(t)
			for _, c := range []struct {
				name   string
				body   any
				fields []string
			}{
				{"no name", map[string]any{"type": "service"}, []string{"name"}},
				{"blank name", map[string]any{"name": " \t ", "type": "service"}, []string{"name"}},
				{"no type", map[string]any{"name": "x"}, []string{"type"}},
				{"bad type", map[string]any{"name": "x", "type": "robot"}, []string{"type"}},
				{"unknown capability", map[string]any{"name": "x", "type": "service", "capabilities": []string{"read_users", "fly"}}, []string{"capabilities[1]"}},
				{"everything wrong", map[string]any{"type": "Service", "capabilities": []string{"READ_USERS"}}, []string{"name", "type", "capabilities[0]"}},
			} {
				t.Run(c.name, func(t *testing.T) {
					expectFields(t, s.as(t).do(http.MethodPost, agentsPath, c.body, auth...), c.fields...)
				})
			}
			if r := s.do(http.MethodPost, agentsPath, map[string]any{"name": "x", "type": "service", "trustLevel": "privileged"}, auth...); r.Status != http.StatusBadRequest {
				t.Fatalf("an unknown member (trustLevel) must be refused, not ignored: %s", describe(r))
			}
			if r := s.do(http.MethodPost, agentsPath, map[string]any{"name": "x", "type": "service", "capabilities": "read_users"}, auth...); r.Status != http.StatusBadRequest {
				t.Fatalf("capabilities as a string: %s", describe(r))
			}
		})

		t.Run("scopes", func(t *testing.T) {
			s := s.as(t)
			_, readOnly := s.registryToken(admin, "agents-reader", "agents:read")
			_, writeOnly := s.registryToken(admin, "agents-writer", "agents:write")
			a := s.createAgent(tok, map[string]any{"name": "scoped", "type": "service"})
			expectScopeRefused(t, s.do(http.MethodPost, agentsPath, map[string]any{"name": "x", "type": "service"}, bearer(readOnly)...), "agents:write")
			expectScopeRefused(t, s.do(http.MethodPatch, agentsPath+"/"+a.ID, map[string]any{"name": "x"}, bearer(readOnly)...), "agents:write")
			expectScopeRefused(t, s.do(http.MethodDelete, agentsPath+"/"+a.ID, nil, bearer(readOnly)...), "agents:write")
			expectScopeRefused(t, s.do(http.MethodPut, agentsPath+"/"+a.ID+"/capabilities", map[string]any{"capabilities": []string{}}, bearer(readOnly)...), "agents:write")
			expectScopeRefused(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, bearer(writeOnly)...), "agents:read")
			expectScopeRefused(t, s.do(http.MethodGet, agentsPath, nil, bearer(writeOnly)...), "agents:read")
			expectScopeRefused(t, s.do(http.MethodGet, agentsPath+"/"+a.ID+"/capabilities", nil, bearer(writeOnly)...), "agents:read")
			expectScopeRefused(t, s.do(http.MethodGet, agentsPath+"/"+a.ID+"/audit", nil, bearer(writeOnly)...), "agents:read")
			// The admin scope alone is not agents:read.
			expectScopeRefused(t, s.do(http.MethodGet, agentsPath, nil, bearer(admin)...), "agents:read")
			// The reader may read.
			mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, bearer(readOnly)...))
			// No token at all.
			expectError(t, s.do(http.MethodGet, agentsPath, nil), http.StatusUnauthorized, "unauthorized")
			// An agent's own token never reaches the registry.
			at := decodeToken(t, s.agentToken(a.ClientID, a.ClientSecret, ""))
			expectScopeRefused(t, s.do(http.MethodGet, agentsPath, nil, bearer(at.AccessToken)...), "agents:read")
		})

		t.Run("list", func(t *testing.T) {
			s := s.as(t)
			// A database of its own: the agents made here and in the subtests before.
			all := mustOK(t, s.do(http.MethodGet, agentsPath+"?limit=200", nil, auth...))
			exactKeys(t, all, "agents", "total", "limit", "offset")
			before := int(all["total"].(float64))
			for i, typ := range []string{"autonomous", "user-delegated", "service", "user-delegated"} {
				s.createAgent(tok, map[string]any{"name": fmt.Sprintf("list-%d", i), "type": typ})
			}
			m := mustOK(t, s.do(http.MethodGet, agentsPath, nil, auth...))
			if m["limit"] != float64(50) || m["offset"] != float64(0) {
				t.Fatalf("default page: limit %v offset %v", m["limit"], m["offset"])
			}
			list := m["agents"].([]any)
			n := int(m["total"].(float64))
			if n != before+4 || len(list) != n {
				t.Fatalf("total %d with %d items, want %d", n, len(list), before+4)
			}
			var names []string
			for _, x := range list {
				a := x.(map[string]any)
				if _, ok := a["clientSecret"]; ok {
					t.Fatal("list shows a client secret")
				}
				names = append(names, a["name"].(string))
			}
			if !slices.Equal(names[n-4:], []string{"list-0", "list-1", "list-2", "list-3"}) {
				t.Fatalf("list not oldest first: %v", names)
			}

			// Pages of two walk the same order.
			var paged []string
			for off := 0; off < n; off += 2 {
				p := mustOK(t, s.do(http.MethodGet, fmt.Sprintf("%s?limit=2&offset=%d", agentsPath, off), nil, auth...))
				if p["total"] != float64(n) || p["limit"] != float64(2) || p["offset"] != float64(off) {
					t.Fatalf("page at %d: %v", off, p)
				}
				for _, x := range p["agents"].([]any) {
					paged = append(paged, x.(map[string]any)["name"].(string))
				}
			}
			if !slices.Equal(paged, names) {
				t.Fatalf("pages %v, list %v", paged, names)
			}
			if p := mustOK(t, s.do(http.MethodGet, fmt.Sprintf("%s?offset=%d", agentsPath, n), nil, auth...)); len(p["agents"].([]any)) != 0 || p["total"] != float64(n) {
				t.Fatalf("past the end: %v", p)
			}

			// Filters.
			count := func(t *testing.T, query string) ([]string, float64) {
				t.Helper()
				p := mustOK(t, s.as(t).do(http.MethodGet, agentsPath+"?"+query, nil, auth...))
				var got []string
				for _, x := range p["agents"].([]any) {
					got = append(got, x.(map[string]any)["name"].(string))
				}
				return got, p["total"].(float64)
			}
			if got, total := count(t, "type=user-delegated"); !slices.Equal(got, []string{"list-1", "list-3"}) || total != 2 {
				t.Fatalf("type=user-delegated: %v (total %v)", got, total)
			}
			if got, total := count(t, "type=user-delegated&limit=1&offset=1"); !slices.Equal(got, []string{"list-3"}) || total != 2 {
				t.Fatalf("type=user-delegated, second page: %v (total %v)", got, total)
			}
			if got, _ := count(t, "type=autonomous&status=active&trustLevel=sandboxed"); !slices.Contains(got, "list-0") || slices.Contains(got, "list-1") {
				t.Fatalf("combined filters: %v", got)
			}
			if _, total := count(t, "status=active"); total != float64(n) {
				t.Fatalf("status=active: total %v, want %d", total, n)
			}
			if _, total := count(t, "trustLevel=sandboxed"); total != float64(n) {
				t.Fatalf("trustLevel=sandboxed: total %v, want %d", total, n)
			}
			for _, q := range []string{"status=killed", "trustLevel=registered", "trustLevel=privileged"} {
				if got, total := count(t, q); len(got) != 0 || total != 0 {
					t.Fatalf("%s: %v (total %v), want none", q, got, total)
				}
			}

			// Bad filter and page values.
			for _, c := range []struct{ query, field string }{
				{"status=dead", "status"}, {"status=Active", "status"},
				{"trustLevel=root", "trustLevel"}, {"type=robot", "type"},
			} {
				expectFields(t, s.do(http.MethodGet, agentsPath+"?"+c.query, nil, auth...), c.field)
			}
			for _, c := range []struct{ query, field string }{{"limit=0", "limit"}, {"limit=x", "limit"}, {"limit=201", "limit"}, {"offset=-1", "offset"}} {
				if d := expectError(t, s.do(http.MethodGet, agentsPath+"?"+c.query, nil, auth...), http.StatusBadRequest, "invalid_request"); d["field"] != c.field {
					t.Fatalf("%s: details %v", c.query, d)
				}
			}
		})

		t.Run("update", func(t *testing.T) {
			s := s.as(t)
			a := s.createAgent(tok, map[string]any{"name": "before", "type": "service", "description": "old", "capabilities": []string{"read_users"}})
			created := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, auth...))
			p := s.do(http.MethodPatch, agentsPath+"/"+a.ID, map[string]any{"name": "after", "description": "new"}, auth...)
			pm := mustOK(t, p)
			if _, ok := pm["clientSecret"]; ok {
				t.Fatalf("PATCH shows a secret: %s", p.Body)
			}
			if pm["name"] != "after" || pm["description"] != "new" || pm["type"] != "service" || pm["trustLevel"] != "sandboxed" ||
				!slices.Equal(strs(pm["capabilities"]), []string{"read_users"}) || pm["createdAt"] != created["createdAt"] {
				t.Fatalf("patch: %s", p.Body)
			}
			if !isoZ(t, pm["updatedAt"]).After(isoZ(t, created["updatedAt"])) {
				t.Fatalf("updatedAt %v did not move past %v", pm["updatedAt"], created["updatedAt"])
			}
			if g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, auth...)); g["name"] != "after" || g["description"] != "new" {
				t.Fatalf("stored: %v", g)
			}
			// Refusals change nothing (and, failing inside the transaction, cost no commit wait).
			expectFields(t, s.do(http.MethodPatch, agentsPath+"/"+a.ID, map[string]any{"name": ""}, auth...), "name")
			expectFields(t, s.do(http.MethodPatch, agentsPath+"/"+a.ID, map[string]any{"name": "   ", "description": "ok"}, auth...), "name")
			if r := s.do(http.MethodPatch, agentsPath+"/"+a.ID, map[string]any{"type": "autonomous"}, auth...); r.Status != http.StatusBadRequest {
				t.Fatalf("PATCH type (not updatable) must be refused: %s", describe(r))
			}
			if g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, auth...)); g["name"] != "after" || g["description"] != "new" || g["type"] != "service" {
				t.Fatalf("a refused PATCH changed the agent: %v", g)
			}
			expectError(t, s.do(http.MethodPatch, agentsPath+"/"+uuid.NewString(), map[string]any{"name": "x"}, auth...), http.StatusNotFound, "not_found")
		})

		t.Run("capabilities", func(t *testing.T) {
			s := s.as(t)
			a := s.createAgent(tok, map[string]any{"name": "capable", "type": "autonomous", "capabilities": []string{"read_users"}})
			path := agentsPath + "/" + a.ID + "/capabilities"
			g := mustOK(t, s.do(http.MethodGet, path, nil, auth...))
			exactKeys(t, g, "agentId", "capabilities")
			if g["agentId"] != a.ID || !slices.Equal(strs(g["capabilities"]), []string{"read_users"}) {
				t.Fatalf("get capabilities: %v", g)
			}
			all := []string{"read_users", "write_users", "read_tickets", "send_notifications", "manage_sessions", "read_analytics", "delegate", "a2a_exchange"}
			p := mustOK(t, s.do(http.MethodPut, path, map[string]any{"capabilities": append(slices.Clone(all), "read_users")}, auth...))
			if p["agentId"] != a.ID || !slices.Equal(strs(p["capabilities"]), all) {
				t.Fatalf("put capabilities (every built-in one, a duplicate dropped): %v", p)
			}
			if g := mustOK(t, s.do(http.MethodGet, path, nil, auth...)); !slices.Equal(strs(g["capabilities"]), all) {
				t.Fatalf("stored capabilities: %v", g)
			}
			expectFields(t, s.do(http.MethodPut, path, map[string]any{"capabilities": []string{"read_users", "fly", "delegate", ""}}, auth...), "capabilities[1]", "capabilities[3]")
			if d := expectError(t, s.do(http.MethodPut, path, map[string]any{}, auth...), http.StatusBadRequest, "invalid_request"); d["field"] != "capabilities" {
				t.Fatalf("missing capabilities: details %v", d)
			}
			if g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, auth...)); !slices.Equal(strs(g["capabilities"]), all) {
				t.Fatalf("a refused PUT changed the agent: %v", g)
			}
			expectError(t, s.do(http.MethodGet, agentsPath+"/"+uuid.NewString()+"/capabilities", nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodPut, agentsPath+"/"+uuid.NewString()+"/capabilities", map[string]any{"capabilities": []string{}}, auth...), http.StatusNotFound, "not_found")
		})

		t.Run("not found", func(t *testing.T) {
			s := s.as(t)
			for _, id := range []string{"not-a-uuid", "1", uuid.NewString()} {
				p := agentsPath + "/" + url.PathEscape(id)
				for _, c := range []struct {
					method, path string
					body         any
				}{
					{http.MethodGet, p, nil},
					{http.MethodPatch, p, map[string]any{"name": "x"}},
					{http.MethodDelete, p, nil},
					{http.MethodGet, p + "/capabilities", nil},
					{http.MethodPut, p + "/capabilities", map[string]any{"capabilities": []string{}}},
					{http.MethodGet, p + "/audit", nil},
				} {
					if r := s.do(c.method, c.path, c.body, auth...); r.Status != http.StatusNotFound || r.JSON(t)["error"] != "not_found" {
						t.Fatalf("%s %s: %s, want 404 not_found", c.method, c.path, describe(r))
					}
				}
			}
		})

		t.Run("delete", func(t *testing.T) {
			s := s.as(t)
			a := s.createAgent(tok, map[string]any{"name": "doomed", "type": "service", "capabilities": []string{"read_users"}})
			at := decodeToken(t, s.agentToken(a.ClientID, a.ClientSecret, "")).AccessToken
			mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(at)...))
			d := s.do(http.MethodDelete, agentsPath+"/"+a.ID, nil, auth...)
			if d.Status != http.StatusNoContent || len(d.Body) != 0 {
				t.Fatalf("delete: %s", describe(d))
			}
			expectError(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, agentsPath+"/"+a.ID, nil, auth...), http.StatusNotFound, "not_found")
			expectTokenRefused(t, s, at)
			expectInactive(t, s.introspect(t, at, s.AdminID, s.AdminSecret))
			expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, ""), http.StatusUnauthorized, "invalid_client")
			if l := mustOK(t, s.do(http.MethodGet, agentsPath+"?limit=200", nil, auth...)); strings.Contains(fmt.Sprint(l["agents"]), a.ID) {
				t.Fatal("a deleted agent is still listed")
			}
		})

		t.Run("audit of registry changes", func(t *testing.T) {
			s := s.as(t)
			a := s.createAgent(tok, map[string]any{"name": "audited", "type": "service"})
			m := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID+"/audit", nil, auth...))
			exactKeys(t, m, "entries", "total", "limit", "offset")
			entries := m["entries"].([]any)
			if len(entries) != 1 || m["total"] != float64(1) {
				t.Fatalf("a new agent's audit: %v", m)
			}
			e := entries[0].(map[string]any)
			if e["action"] != "created" || actorOf(e) != registryID {
				t.Fatalf("creation entry %v, want action created by %s", e, registryID)
			}
			isoZ(t, e["timestamp"])
		})
	})
}

// Trust levels: one step up at a time, down any number, with a reason, by
// an admin only; every change in the audit, newest first, with filters.
func TestAgentTrust(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		registryID, registry := s.registryToken(s.adminToken(), "agent-registry", "agents:read", "agents:write", "users:read")
		a := s.createAgent(registry, map[string]any{"name": "climber", "type": "autonomous", "capabilities": []string{"read_users"}})

		t.Run("refusals", func(t *testing.T) {
			s := s.as(t)
			expectScopeRefused(t, s.changeTrust(registry, a.ID, "registered", "ok"), "admin")
			expectFields(t, s.changeTrust(super, a.ID, "registered", ""), "reason")
			expectFields(t, s.changeTrust(super, a.ID, "registered", "   "), "reason")
			expectFields(t, s.changeTrust(super, a.ID, "root", "why not"), "trustLevel")
			expectFields(t, s.changeTrust(super, a.ID, "", "why not"), "trustLevel")
			expectFields(t, s.changeTrust(super, a.ID, "Registered", ""), "trustLevel", "reason")
			for _, to := range []string{"verified", "privileged"} {
				d := expectError(t, s.changeTrust(super, a.ID, to, "too fast"), http.StatusConflict, "trust_level_skipped")
				if d["from"] != "sandboxed" || d["to"] != to || d["next"] != "registered" {
					t.Fatalf("skip to %s: details %v", to, d)
				}
			}
			d := expectError(t, s.changeTrust(super, a.ID, "sandboxed", "again"), http.StatusConflict, "trust_level_unchanged")
			if d["from"] != "sandboxed" || d["to"] != "sandboxed" {
				t.Fatalf("same level: details %v", d)
			}
			expectError(t, s.changeTrust(super, uuid.NewString(), "registered", "ghost"), http.StatusNotFound, "not_found")
			expectError(t, s.changeTrust(super, "not-a-uuid", "registered", "ghost"), http.StatusNotFound, "not_found")
			if g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, bearer(super)...)); g["trustLevel"] != "sandboxed" {
				t.Fatalf("a refused change moved the agent: %v", g)
			}
		})

		// The ladder, then all the way down: four changes.
		steps := []struct{ from, to, reason string }{
			{"sandboxed", "registered", "passed review"},
			{"registered", "verified", "audited"},
			{"verified", "privileged", "approved by security"},
			{"privileged", "sandboxed", "misbehaved"},
		}
		t.Run("promote and demote", func(t *testing.T) {
			s := s.as(t)
			for i, st := range steps {
				if i == 1 {
					// From registered, privileged is still a skip, and the next level is verified.
					d := expectError(t, s.changeTrust(super, a.ID, "privileged", "too fast"), http.StatusConflict, "trust_level_skipped")
					if d["from"] != "registered" || d["next"] != "verified" {
						t.Fatalf("skip from registered: details %v", d)
					}
				}
				r := s.changeTrust(super, a.ID, st.to, st.reason)
				m := mustOK(t, r)
				if _, ok := m["clientSecret"]; ok {
					t.Fatalf("trust change shows a secret: %s", r.Body)
				}
				if m["id"] != a.ID || m["trustLevel"] != st.to || m["status"] != "active" {
					t.Fatalf("%s → %s: %s", st.from, st.to, r.Body)
				}
				if g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, bearer(registry)...)); g["trustLevel"] != st.to {
					t.Fatalf("stored level %v, want %s", g["trustLevel"], st.to)
				}
			}
			// The list filter sees the level.
			l := mustOK(t, s.do(http.MethodGet, agentsPath+"?trustLevel=sandboxed", nil, bearer(registry)...))
			if l["total"] != float64(1) {
				t.Fatalf("trustLevel=sandboxed: %v", l)
			}
			if l := mustOK(t, s.do(http.MethodGet, agentsPath+"?trustLevel=privileged", nil, bearer(registry)...)); l["total"] != float64(0) {
				t.Fatalf("trustLevel=privileged after the demotion: %v", l)
			}
		})

		t.Run("audit", func(t *testing.T) {
			s := s.as(t)
			audit := func(t *testing.T, query string) ([]map[string]any, float64) {
				t.Helper()
				m := mustOK(t, s.as(t).do(http.MethodGet, agentsPath+"/"+a.ID+"/audit?"+query, nil, bearer(registry)...))
				var out []map[string]any
				for _, x := range m["entries"].([]any) {
					out = append(out, x.(map[string]any))
				}
				return out, m["total"].(float64)
			}
			entries, total := audit(t, "")
			if total != float64(len(entries)) || len(entries) != len(steps)+1 {
				t.Fatalf("audit: %d entries (total %v), want %d: %v", len(entries), total, len(steps)+1, entries)
			}
			var prev time.Time
			for i, e := range entries {
				ts := isoZ(t, e["timestamp"])
				if i > 0 && ts.After(prev) {
					t.Fatalf("audit not newest first: %v after %v", ts, prev)
				}
				prev = ts
			}
			if last := entries[len(entries)-1]; last["action"] != "created" || actorOf(last) != registryID {
				t.Fatalf("oldest entry %v, want created by %s", last, registryID)
			}

			trust, total := audit(t, "action=trust_changed")
			if len(trust) != len(steps) || total != float64(len(steps)) {
				t.Fatalf("action=trust_changed: %d entries (total %v): %v", len(trust), total, trust)
			}
			for i, e := range trust {
				st := steps[len(steps)-1-i] // newest first
				d, _ := e["details"].(map[string]any)
				if e["action"] != "trust_changed" || actorOf(e) != s.AdminID || d["from"] != st.from || d["to"] != st.to || d["reason"] != st.reason {
					t.Fatalf("entry %d: %v, want %s → %s (%q) by %s", i, e, st.from, st.to, st.reason, s.AdminID)
				}
			}
			if got, total := audit(t, "action=created"); len(got) != 1 || total != 1 || got[0]["action"] != "created" {
				t.Fatalf("action=created: %v", got)
			}
			if got, total := audit(t, "action=trust_changed,created"); len(got) != len(steps)+1 || total != float64(len(steps)+1) {
				t.Fatalf("action=trust_changed,created: %v", got)
			}
			if got, total := audit(t, "action=killed"); len(got) != 0 || total != 0 {
				t.Fatalf("action=killed: %v", got)
			}
			if got, total := audit(t, "action=trust_changed&limit=1&offset=1"); len(got) != 1 || total != float64(len(steps)) || got[0]["timestamp"] != trust[1]["timestamp"] {
				t.Fatalf("second page of one: %v (total %v), want %v", got, total, trust[1])
			}

			// Dates, in UTC: every entry is from today.
			now := time.Now().UTC()
			yesterday, tomorrow := now.AddDate(0, 0, -1).Format(time.DateOnly), now.AddDate(0, 0, 1).Format(time.DateOnly)
			if got, _ := audit(t, "from="+yesterday+"&to="+tomorrow); len(got) != len(entries) {
				t.Fatalf("from yesterday to tomorrow: %d entries, want %d", len(got), len(entries))
			}
			for _, q := range []string{"from=" + tomorrow, "to=" + yesterday} {
				if got, total := audit(t, q); len(got) != 0 || total != 0 {
					t.Fatalf("%s: %v, want none", q, got)
				}
			}
			// Times: from is inclusive, to exclusive.
			mid := trust[1]["timestamp"].(string) // the promotion to privileged
			if got, _ := audit(t, "action=trust_changed&from="+url.QueryEscape(mid)); len(got) != 2 || got[1]["timestamp"] != mid {
				t.Fatalf("from=%s: %v, want the two newest changes", mid, got)
			}
			if got, _ := audit(t, "action=trust_changed&to="+url.QueryEscape(mid)); len(got) != 2 || got[0]["timestamp"] != trust[2]["timestamp"] {
				t.Fatalf("to=%s: %v, want the two oldest changes", mid, got)
			}
			for _, c := range []struct{ query, field string }{
				{"from=2024-13-01", "from"}, {"from=yesterday", "from"}, {"to=2024-02-30", "to"}, {"to=12:00", "to"},
			} {
				if d := expectError(t, s.do(http.MethodGet, agentsPath+"/"+a.ID+"/audit?"+c.query, nil, bearer(registry)...), http.StatusBadRequest, "invalid_request"); d["field"] != c.field {
					t.Fatalf("%s: details %v", c.query, d)
				}
			}
			if d := expectError(t, s.do(http.MethodGet, agentsPath+"/"+a.ID+"/audit?limit=0", nil, bearer(registry)...), http.StatusBadRequest, "invalid_request"); d["field"] != "limit" {
				t.Fatalf("limit=0: details %v", d)
			}
		})
	})
}

// Agent tokens: the extra response members, scopes from capabilities and
// trust, introspection and whoami, and existing tokens narrowed at once by
// a capability removal and a demotion.
func TestAgentTokens(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		a := s.createAgent(super, map[string]any{"name": "worker", "type": "user-delegated", "capabilities": []string{"read_users", "write_users", "delegate"}})
		caps := []string{"read_users", "write_users", "delegate"}

		// introspected asks about tok as the bootstrap admin.
		introspected := func(t *testing.T, tok, trust string, scopes, caps []string) map[string]any {
			t.Helper()
			m := s.introspect(t, tok, s.AdminID, s.AdminSecret)
			expectActive(t, m, a.ClientID)
			if m["agent_id"] != a.ID || m["trust_level"] != trust || !slices.Equal(strs(m["capabilities"]), caps) {
				t.Fatalf("introspection %v, want agent_id %s, trust_level %s, capabilities %v", m, a.ID, trust, caps)
			}
			if got, _ := m["scope"].(string); !slices.Equal(scopeSet(got), scopes) {
				t.Fatalf("introspected scope %q, want %v", got, scopes)
			}
			return m
		}
		whoami := func(t *testing.T, tok, trust string, scopes, caps []string) {
			t.Helper()
			m := mustOK(t, s.as(t).do(http.MethodGet, whoamiPath, nil, bearer(tok)...))
			if m["type"] != "agent" || m["id"] != a.ID || m["clientId"] != a.ClientID || m["name"] != "worker" || m["trustLevel"] != trust ||
				!slices.Equal(strs(m["capabilities"]), caps) || !slices.Equal(slices.Sorted(slices.Values(strs(m["scopes"]))), scopes) {
				t.Fatalf("whoami %v, want agent %s at %s with %v and scopes %v", m, a.ID, trust, caps, scopes)
			}
		}

		var sandboxed, registered string // tokens issued at each level
		t.Run("sandboxed", func(t *testing.T) {
			s := s.as(t)
			// Go's x/oauth2, HTTP Basic, no scope asked: every scope the agent may have.
			cfg := clientcredentials.Config{ClientID: a.ClientID, ClientSecret: a.ClientSecret, TokenURL: s.URL + tokenPath, AuthStyle: oauth2.AuthStyleInHeader}
			tok, err := cfg.Token(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if tok.TokenType != "Bearer" || tok.Extra("agent_id") != a.ID || tok.Extra("trust_level") != "sandboxed" || tok.Extra("scope") != "users:read" {
				t.Fatalf("token %+v: agent_id %v, trust_level %v, scope %v", tok, tok.Extra("agent_id"), tok.Extra("trust_level"), tok.Extra("scope"))
			}
			sandboxed = tok.AccessToken

			// The raw answer: the members, and no refresh token.
			r := s.agentToken(a.ClientID, a.ClientSecret, "users:read")
			tr := decodeToken(t, r)
			m := r.JSON(t)
			exactKeys(t, m, "access_token", "token_type", "expires_in", "scope", "agent_id", "trust_level")
			if tr.TokenType != "Bearer" || tr.Scope != "users:read" || m["agent_id"] != a.ID || m["trust_level"] != "sandboxed" {
				t.Fatalf("token answer: %s", r.Body)
			}
			// client_secret_post works as well.
			decodeToken(t, s.do(http.MethodPost, tokenPath, post(ccForm(""), a.ClientID, a.ClientSecret)))

			// Sandboxed: read scopes only, whatever the capabilities.
			for _, scope := range []string{"users:write", "users:read users:write", "delegations:read", "agents:read", "admin"} {
				expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, scope), http.StatusBadRequest, "invalid_scope")
			}
			expectRFC6749(t, s.agentToken(a.ClientID, "wrong-"+a.ClientSecret, ""), http.StatusUnauthorized, "invalid_client")

			introspected(t, sandboxed, "sandboxed", []string{"users:read"}, caps)
			whoami(t, sandboxed, "sandboxed", []string{"users:read"}, caps)
		})

		t.Run("registered", func(t *testing.T) {
			s := s.as(t)
			mustOK(t, s.changeTrust(super, a.ID, "registered", "reviewed"))
			r := s.agentToken(a.ClientID, a.ClientSecret, "")
			tr := decodeToken(t, r)
			if m := r.JSON(t); m["trust_level"] != "registered" || m["agent_id"] != a.ID {
				t.Fatalf("token answer after promotion: %s", r.Body)
			}
			if want := []string{"delegations:read", "users:read", "users:write"}; !slices.Equal(scopeSet(tr.Scope), want) {
				t.Fatalf("registered agent got %q, want %v", tr.Scope, want)
			}
			registered = tr.AccessToken
			decodeToken(t, s.agentToken(a.ClientID, a.ClientSecret, "users:write"))
			// Delegation writes need verified; admin scopes never come from these capabilities.
			for _, scope := range []string{"delegations:write", "users:admin", "users:write admin"} {
				expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, scope), http.StatusBadRequest, "invalid_scope")
			}
			introspected(t, registered, "registered", []string{"delegations:read", "users:read", "users:write"}, caps)
			whoami(t, registered, "registered", []string{"delegations:read", "users:read", "users:write"}, caps)
			// A token issued while sandboxed is not widened by the promotion.
			introspected(t, sandboxed, "registered", []string{"users:read"}, caps)
		})

		t.Run("capability removed", func(t *testing.T) {
			s := s.as(t)
			left := []string{"read_users", "delegate"}
			mustOK(t, s.do(http.MethodPut, agentsPath+"/"+a.ID+"/capabilities", map[string]any{"capabilities": left}, bearer(super)...))
			// The existing token loses users:write at once, and keeps the rest.
			introspected(t, registered, "registered", []string{"delegations:read", "users:read"}, left)
			whoami(t, registered, "registered", []string{"delegations:read", "users:read"}, left)
			expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, "users:write"), http.StatusBadRequest, "invalid_scope")
		})

		t.Run("demoted", func(t *testing.T) {
			s := s.as(t)
			left := []string{"read_users", "delegate"}
			mustOK(t, s.changeTrust(super, a.ID, "sandboxed", "incident"))
			// The existing token stays active with users:read only.
			introspected(t, registered, "sandboxed", []string{"users:read"}, left)
			whoami(t, registered, "sandboxed", []string{"users:read"}, left)
			r := s.agentToken(a.ClientID, a.ClientSecret, "")
			if tr := decodeToken(t, r); tr.Scope != "users:read" || r.JSON(t)["trust_level"] != "sandboxed" {
				t.Fatalf("token after demotion: %s", r.Body)
			}
			expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, "delegations:read"), http.StatusBadRequest, "invalid_scope")
		})

		t.Run("service accounts carry no agent members", func(t *testing.T) {
			s := s.as(t)
			r := s.agentToken(s.AdminID, s.AdminSecret, "users:read")
			m := r.JSON(t)
			if _, ok := m["agent_id"]; ok || r.Status != http.StatusOK {
				t.Fatalf("service-account token answer: %s", r.Body)
			}
			if _, ok := m["trust_level"]; ok {
				t.Fatalf("service-account token answer: %s", r.Body)
			}
		})
	})
}

// The kill switch: kill and recover by an admin, what each does to the
// agent's secret and tokens, and the history.
func TestAgentKillSwitch(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		_, registry := s.registryToken(s.adminToken(), "agent-registry", "agents:read", "agents:write", "users:read")
		a := s.createAgent(registry, map[string]any{"name": "rogue", "type": "autonomous", "capabilities": []string{"read_users"}})
		bystander := s.createAgent(registry, map[string]any{"name": "bystander", "type": "autonomous", "capabilities": []string{"read_users"}})
		bystanderTok := decodeToken(t, s.agentToken(bystander.ClientID, bystander.ClientSecret, "")).AccessToken

		var preKill string
		t.Run("refusals while active", func(t *testing.T) {
			s := s.as(t)
			preKill = decodeToken(t, s.agentToken(a.ClientID, a.ClientSecret, "")).AccessToken
			expectScopeRefused(t, s.killAgent(registry, a.ID, map[string]any{"reason": "x"}), "admin")
			expectScopeRefused(t, s.recoverAgent(registry, a.ID), "admin")
			expectScopeRefused(t, s.killEvents(registry, a.ID), "admin")
			expectScopeRefused(t, s.killAgent(preKill, a.ID, map[string]any{"reason": "suicide"}), "admin")
			expectFields(t, s.killAgent(super, a.ID, map[string]any{}), "reason")
			expectFields(t, s.killAgent(super, a.ID, map[string]any{"reason": "  "}), "reason")
			expectError(t, s.killAgent(super, uuid.NewString(), map[string]any{"reason": "ghost"}), http.StatusNotFound, "not_found")
			expectError(t, s.killAgent(super, "not-a-uuid", map[string]any{"reason": "ghost"}), http.StatusNotFound, "not_found")
			expectError(t, s.recoverAgent(super, a.ID), http.StatusConflict, "agent_active")
			expectError(t, s.killEvents(super, uuid.NewString()), http.StatusNotFound, "not_found")
			if m := mustOK(t, s.killEvents(super, a.ID)); len(m["events"].([]any)) != 0 || m["total"] != float64(0) {
				t.Fatalf("kill events of a never-killed agent: %v", m)
			}
			// None of this touched the agent.
			mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(preKill)...))
		})

		t.Run("kill", func(t *testing.T) {
			s := s.as(t)
			before := time.Now().Add(-time.Second)
			r := s.killAgent(super, a.ID, map[string]any{"reason": "leaked a prompt"})
			m := mustOK(t, r)
			exactKeys(t, m, "success", "agentId", "status", "killedAt", "reason")
			if m["success"] != true || m["agentId"] != a.ID || m["status"] != "killed" || m["reason"] != "leaked a prompt" {
				t.Fatalf("kill: %s", r.Body)
			}
			if k := isoZ(t, m["killedAt"]); k.Before(before) || k.After(time.Now().Add(time.Second)) {
				t.Fatalf("killedAt %v is not now", k)
			}

			// From the moment the kill answers: the token is refused and
			// inactive, the secret fails.
			expectTokenRefused(t, s, preKill)
			expectInactive(t, s.introspect(t, preKill, s.AdminID, s.AdminSecret))
			expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, ""), http.StatusUnauthorized, "invalid_client")
			expectRFC6749(t, s.do(http.MethodPost, tokenPath, post(ccForm(""), a.ClientID, a.ClientSecret)), http.StatusUnauthorized, "invalid_client")
			// The agent cannot even introspect its own token.
			expectRFC6749(t, s.do(http.MethodPost, introspectPath, url.Values{"token": {preKill}}, basic(a.ClientID, a.ClientSecret)...), http.StatusUnauthorized, "invalid_client")

			g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, bearer(registry)...))
			if g["status"] != "killed" || g["killedAt"] != m["killedAt"] {
				t.Fatalf("killed agent reads %v", g)
			}
			if l := mustOK(t, s.do(http.MethodGet, agentsPath+"?status=killed", nil, bearer(registry)...)); l["total"] != float64(1) ||
				l["agents"].([]any)[0].(map[string]any)["id"] != a.ID {
				t.Fatalf("status=killed: %v", l)
			}
			if l := mustOK(t, s.do(http.MethodGet, agentsPath+"?status=active", nil, bearer(registry)...)); l["total"] != float64(1) {
				t.Fatalf("status=active: %v", l)
			}

			d := expectError(t, s.killAgent(super, a.ID, map[string]any{"reason": "again"}), http.StatusConflict, "agent_killed")
			if d["killedAt"] != m["killedAt"] {
				t.Fatalf("second kill: details %v", d)
			}
			// Another agent is untouched.
			mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(bystanderTok)...))
		})

		var fresh string
		t.Run("recover", func(t *testing.T) {
			s := s.as(t)
			r := s.recoverAgent(super, a.ID)
			m := mustOK(t, r)
			if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("an answer with a secret has Cache-Control %q", cc)
			}
			if m["success"] != true || m["agentId"] != a.ID || m["status"] != "active" || m["clientId"] != a.ClientID {
				t.Fatalf("recover: %s", r.Body)
			}
			fresh, _ = m["clientSecret"].(string)
			if len(fresh) != 43 || fresh == a.ClientSecret {
				t.Fatalf("recover must issue a new 43-character secret, got %q", fresh)
			}
			expectError(t, s.recoverAgent(super, a.ID), http.StatusConflict, "agent_active")

			// The old secret and the pre-kill token stay dead; the new secret works.
			expectRFC6749(t, s.agentToken(a.ClientID, a.ClientSecret, ""), http.StatusUnauthorized, "invalid_client")
			expectTokenRefused(t, s, preKill)
			expectInactive(t, s.introspect(t, preKill, s.AdminID, s.AdminSecret))
			expectInactive(t, s.introspect(t, preKill, a.ClientID, fresh))
			tok := decodeToken(t, s.agentToken(a.ClientID, fresh, "")).AccessToken
			w := mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(tok)...))
			if w["id"] != a.ID || w["type"] != "agent" {
				t.Fatalf("whoami after recovery: %v", w)
			}
			if g := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID, nil, bearer(registry)...)); g["status"] != "active" || g["killedAt"] != nil || g["trustLevel"] != "sandboxed" {
				t.Fatalf("recovered agent reads %v", g)
			}
		})

		t.Run("kill events", func(t *testing.T) {
			s := s.as(t)
			m := mustOK(t, s.killEvents(super, a.ID))
			exactKeys(t, m, "events", "total", "limit", "offset")
			list, _ := m["events"].([]any)
			if len(list) != 2 || m["total"] != float64(2) {
				t.Fatalf("kill events: %v", m)
			}
			rec, killed := list[0].(map[string]any), list[1].(map[string]any)
			if rec["action"] != "recovered" || killed["action"] != "killed" {
				t.Fatalf("kill events not newest first: %v", list)
			}
			for _, e := range []map[string]any{rec, killed} {
				if actorOf(e) != s.AdminID {
					t.Fatalf("event %v, want actor %s", e, s.AdminID)
				}
				isoZ(t, e["timestamp"])
			}
			if d, _ := killed["details"].(map[string]any); d["reason"] != "leaked a prompt" {
				t.Fatalf("kill event without its reason: %v", killed)
			}
			if isoZ(t, rec["timestamp"]).Before(isoZ(t, killed["timestamp"])) {
				t.Fatalf("recovered %v before killed %v", rec["timestamp"], killed["timestamp"])
			}
			// The audit trail holds them too.
			au := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+a.ID+"/audit?action=killed,recovered", nil, bearer(registry)...))
			if au["total"] != float64(2) {
				t.Fatalf("audit of kill and recover: %v", au)
			}
		})
	})
}

// Two replicas on one PostgreSQL: a kill answered by one is in force on the
// other at once, for the agent's token (cached there) and its secret.
func TestAgentKillAcrossReplicas(t *testing.T) {
	t.Parallel()
	one, two := startReplicas(t)
	super := one.superToken()
	a := one.createAgent(super, map[string]any{"name": "replicated", "type": "autonomous", "capabilities": []string{"read_users"}})
	secret := a.ClientSecret
	const rounds = 3
	for i := range rounds {
		// Two caches the agent's client and token.
		tok := decodeToken(t, two.agentToken(a.ClientID, secret, "")).AccessToken
		for range 2 {
			if w := two.do(http.MethodGet, whoamiPath, nil, bearer(tok)...); w.Status != http.StatusOK {
				t.Fatalf("round %d: whoami on two before the kill: %s", i, describe(w))
			}
		}
		expectActive(t, two.introspect(t, tok, two.AdminID, two.AdminSecret), a.ClientID)

		if r := one.killAgent(super, a.ID, map[string]any{"reason": fmt.Sprintf("round %d", i)}); r.Status != http.StatusOK {
			t.Fatalf("round %d: kill on one: %s", i, describe(r))
		}
		if w := two.do(http.MethodGet, whoamiPath, nil, bearer(tok)...); w.Status != http.StatusUnauthorized {
			t.Fatalf("round %d: killed on one, its token works on two: %s", i, describe(w))
		}
		if m := two.introspect(t, tok, two.AdminID, two.AdminSecret); m["active"] != false {
			t.Fatalf("round %d: killed on one, its token introspects active on two: %v", i, m)
		}
		if r := two.agentToken(a.ClientID, secret, ""); r.Status != http.StatusUnauthorized || r.JSON(t)["error"] != "invalid_client" {
			t.Fatalf("round %d: killed on one, its secret works on two: %s", i, describe(r))
		}
		if i == rounds-1 {
			break
		}
		rec := one.recoverAgent(super, a.ID)
		if rec.Status != http.StatusOK {
			t.Fatalf("round %d: recover on one: %s", i, describe(rec))
		}
		old := secret
		secret = rec.JSON(t)["clientSecret"].(string)
		// Recovered on one: on two the old secret and token stay dead.
		if r := two.agentToken(a.ClientID, old, ""); r.Status != http.StatusUnauthorized {
			t.Fatalf("round %d: recovered on one, the old secret works on two: %s", i, describe(r))
		}
		if w := two.do(http.MethodGet, whoamiPath, nil, bearer(tok)...); w.Status != http.StatusUnauthorized {
			t.Fatalf("round %d: recovered on one, the pre-kill token works on two: %s", i, describe(w))
		}
	}
	// Both replicas tell the same history.
	for _, s := range []*server{one, two} {
		m := mustOK(t, s.killEvents(super, a.ID))
		if m["total"] != float64(2*rounds-1) {
			t.Fatalf("kill events on %s: %v", s.URL, m)
		}
	}
}

// A kill bites a call already under way: an agent's POST whose body is
// still arriving when the kill is answered changes nothing.
func TestKillBitesInFlight(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		ag := s.createAgent(super, map[string]any{"name": "slow-writer", "type": "service", "capabilities": []string{"read_users", "write_users"}})
		if r := s.changeTrust(super, ag.ID, "registered", "writes users"); r.Status != http.StatusOK {
			t.Fatal(describe(r))
		}
		tok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken

		body, pw := io.Pipe()
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/api/v1/m2m/users", body)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tok)
		answered := make(chan *http.Response, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				close(answered)
				return
			}
			answered <- resp
		}()
		if _, err := pw.Write([]byte(`{"email": "late@example.com",`)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the server holds the headers and has checked the token once
		mustOK(t, s.killAgent(super, ag.ID, map[string]any{"reason": "compromised mid-call"}))
		if _, err := pw.Write([]byte(`"name": "Late"}`)); err != nil {
			t.Fatal(err)
		}
		pw.Close()
		resp, ok := <-answered
		if !ok {
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		expectError(t, &response{Status: resp.StatusCode, Header: resp.Header, Body: b}, http.StatusUnauthorized, "invalid_token")
		if m := mustOK(t, s.do(http.MethodGet, "/api/v1/m2m/users?email=late@example.com", nil, bearer(super)...)); m["total"] != float64(0) {
			t.Fatalf("the killed agent's call created a user: %v", m)
		}
	})
}
