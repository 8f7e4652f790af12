package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The agent audit trail and the intent metadata over real HTTP, on each
// dialect: token_issued / token_refused / api_call entries with their
// filters, the seven X-Service-* headers (stored, or refused when
// malformed), and the admin intent queries (task, chain, trace, search).
//
// Every name here begins with "intent" so that it cannot collide with the
// agents scenarios of agents_test.go. Agents are only created, never
// changed: with PostgreSQL each change to an agent waits out the cache lease.

const (
	intentTokenPath  = "/api/v1/oauth/token"
	intentWhoamiPath = "/api/v1/m2m/whoami"
	intentSAPath     = "/api/v1/service-accounts"
	intentQueryPath  = "/api/v1/audit/intent"
)

// The intent headers, spelled as the spec spells them.
const (
	intentHTask      = "X-Service-Task-ID"
	intentHChain     = "X-Service-Chain-ID"
	intentHParent    = "X-Service-Parent-Task-ID"
	intentHAction    = "X-Service-Intent-Action"
	intentHReason    = "X-Service-Intent-Reason"
	intentHInitiator = "X-Service-Intent-Initiator"
	intentHDepth     = "X-Service-Intent-Depth"
)

// intentAgent registers an agent with these capabilities.
func intentAgent(t *testing.T, s *server, tok, name string, caps ...string) agent {
	t.Helper()
	if caps == nil {
		caps = []string{}
	}
	r := s.as(t).do(http.MethodPost, agentsPath, map[string]any{"name": name, "type": "autonomous", "capabilities": caps}, bearer(tok)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create agent: %s", describe(r))
	}
	var a agent
	if err := json.Unmarshal(r.Body, &a); err != nil || a.ID == "" || a.ClientID == "" || a.ClientSecret == "" {
		t.Fatalf("create agent: %s (%v)", r.Body, err)
	}
	return a
}

// intentHeader builds headers from pairs, adding (not setting) each, so a
// name given twice is sent twice.
func intentHeader(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// intentSend sends a request with exactly these headers (every value of
// each); body may be nil or a form.
func intentSend(t *testing.T, s *server, method, path string, form url.Values, h http.Header) *response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, s.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// intentCall is an API call with a bearer token and extra headers.
func intentCall(t *testing.T, s *server, tok, method, path string, h http.Header) *response {
	t.Helper()
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Authorization", "Bearer "+tok)
	return intentSend(t, s, method, path, nil, h)
}

// intentTokenReq is a client-credentials request (HTTP Basic) with extra
// headers; scope may be empty.
func intentTokenReq(t *testing.T, s *server, clientID, secret, scope string, h http.Header) *response {
	t.Helper()
	h = h.Clone()
	if h == nil {
		h = http.Header{}
	}
	b := basic(clientID, secret)
	h.Set(b[0], b[1])
	return intentSend(t, s, http.MethodPost, intentTokenPath, ccForm(scope), h)
}

// intentItems reads a 200 list answer: its items under key and its total.
func intentItems(t *testing.T, r *response, key string) ([]map[string]any, int) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("want 200: %s", describe(r))
	}
	m := r.JSON(t)
	raw, ok := m[key].([]any)
	if !ok {
		t.Fatalf("answer has no %q array: %s", key, r.Body)
	}
	out := make([]map[string]any, len(raw))
	for i, x := range raw {
		if out[i], ok = x.(map[string]any); !ok {
			t.Fatalf("%s[%d] is not an object: %s", key, i, r.Body)
		}
	}
	total, ok := m["total"].(float64)
	if !ok {
		t.Fatalf("answer has no total: %s", r.Body)
	}
	return out, int(total)
}

// intentAudit reads GET /agents/{id}/audit?query.
func intentAudit(t *testing.T, s *server, tok, agentID, query string) ([]map[string]any, int) {
	t.Helper()
	return intentItems(t, s.as(t).do(http.MethodGet, agentsPath+"/"+agentID+"/audit?"+query, nil, bearer(tok)...), "entries")
}

// intentAwaitAudit reads the agent's audit (query) until it holds at least
// n entries: an api_call entry is written once its answer has gone out, so
// a client can read the trail a moment before the entry is there.
func intentAwaitAudit(t *testing.T, s *server, tok, agentID, query string, n int) ([]map[string]any, int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries, total := intentAudit(t, s, tok, agentID, query)
		if total >= n || time.Now().After(deadline) {
			return entries, total
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// intentQuery reads one of the intent queries (admin token).
func intentQuery(t *testing.T, s *server, tok, pathAndQuery, key string) ([]map[string]any, int) {
	t.Helper()
	return intentItems(t, s.as(t).do(http.MethodGet, intentQueryPath+pathAndQuery, nil, bearer(tok)...), key)
}

// intentAwaitTask reads a task's entries until there are at least n.
func intentAwaitTask(t *testing.T, s *server, tok, taskID string, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries, _ := intentQuery(t, s, tok, "/tasks/"+url.PathEscape(taskID), "entries")
		if len(entries) >= n || time.Now().After(deadline) {
			return entries
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func intentActions(entries []map[string]any) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i], _ = e["action"].(string)
	}
	return out
}

// intentNewestFirst checks that timestamps never increase down the list.
func intentNewestFirst(t *testing.T, entries []map[string]any) {
	t.Helper()
	for i := 1; i < len(entries); i++ {
		if isoZ(t, entries[i]["timestamp"]).After(isoZ(t, entries[i-1]["timestamp"])) {
			t.Fatalf("entry %d (%v) is newer than entry %d (%v): not newest first", i, entries[i]["timestamp"], i-1, entries[i-1]["timestamp"])
		}
	}
}

// intentOf is the entry's intent object (nil when it has none).
func intentOf(t *testing.T, e map[string]any) map[string]any {
	t.Helper()
	v, ok := e["intent"]
	if !ok {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("intent is not an object: %v", v)
	}
	return m
}

func intentRand() string { return strings.ToLower(randomString()[:12]) }

// intentDay is the UTC date of an entry's timestamp, shifted by days.
func intentDay(t *testing.T, e map[string]any, days int) string {
	t.Helper()
	return isoZ(t, e["timestamp"]).UTC().AddDate(0, 0, days).Format(time.DateOnly)
}

// expectIntentField checks a 400 invalid_request naming the query field.
func expectIntentField(t *testing.T, r *response, field string) {
	t.Helper()
	d := expectError(t, r, http.StatusBadRequest, "invalid_request")
	if d["field"] != field {
		t.Fatalf("details.field %v, want %q: %s", d["field"], field, r.Body)
	}
}

// 1 and 2: the audit of an agent's token requests and API calls.
func TestIntentAgentAudit(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		ag := intentAgent(t, s, super, "audited", "read_users")

		// One token issued, two refused (bad secret; a scope the agent may
		// not have), in this order.
		tok := decodeToken(t, intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "users:read", nil)).AccessToken
		expectRFC6749(t, intentTokenReq(t, s, ag.ClientID, "wrong-"+ag.ClientSecret, "", nil), http.StatusUnauthorized, "invalid_client")
		expectRFC6749(t, intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "admin", nil), http.StatusBadRequest, "invalid_scope")

		all, total := intentAudit(t, s, super, ag.ID, "")
		t.Run("token requests, newest first", func(t *testing.T) {
			if got, want := intentActions(all), []string{"token_refused", "token_refused", "token_issued", "created"}; !slices.Equal(got, want) || total != 4 {
				t.Fatalf("actions %v (total %d), want %v", got, total, want)
			}
			intentNewestFirst(t, all)
			issued := all[2]
			if issued["ip"] != "127.0.0.1" {
				t.Fatalf("token_issued ip %v, want 127.0.0.1", issued["ip"])
			}
			d, _ := issued["details"].(map[string]any)
			if !slices.Equal(strs(d["scopes"]), []string{"users:read"}) || d["grantType"] != "client_credentials" {
				t.Fatalf("token_issued details %v, want scopes [users:read] and grantType client_credentials", issued["details"])
			}
			if intentOf(t, issued) != nil {
				t.Fatalf("a request without intent headers has an intent: %v", issued)
			}
			for i, code := range map[int]string{0: "invalid_scope", 1: "invalid_client"} {
				e := all[i]
				d, _ := e["details"].(map[string]any)
				if d["error"] != code || d["grantType"] != "client_credentials" || e["ip"] != "127.0.0.1" {
					t.Fatalf("token_refused %d: %v, want details.error %q, grantType client_credentials, ip 127.0.0.1", i, e, code)
				}
			}
			if actorOf(all[3]) != s.AdminID {
				t.Fatalf("created by %v, want %s", actorOf(all[3]), s.AdminID)
			}
		})
		if t.Failed() {
			return
		}

		t.Run("action filter", func(t *testing.T) {
			if e, n := intentAudit(t, s, super, ag.ID, "action=token_issued"); n != 1 || len(e) != 1 || e[0]["action"] != "token_issued" {
				t.Fatalf("action=token_issued: total %d, %v", n, intentActions(e))
			}
			e, n := intentAudit(t, s, super, ag.ID, "action=token_issued,token_refused")
			if want := []string{"token_refused", "token_refused", "token_issued"}; n != 3 || !slices.Equal(intentActions(e), want) {
				t.Fatalf("action=token_issued,token_refused: total %d, %v", n, intentActions(e))
			}
			if e, n := intentAudit(t, s, super, ag.ID, "action=api_call"); n != 0 || len(e) != 0 {
				t.Fatalf("action=api_call before any call: total %d, %v", n, intentActions(e))
			}
		})

		t.Run("from and to", func(t *testing.T) {
			at := func(i int) string { return url.QueryEscape(all[i]["timestamp"].(string)) }
			// from is inclusive, to exclusive.
			if e, n := intentAudit(t, s, super, ag.ID, "from="+at(2)); n != 3 || !slices.Equal(intentActions(e), []string{"token_refused", "token_refused", "token_issued"}) {
				t.Fatalf("from=token_issued's time: total %d, %v", n, intentActions(e))
			}
			if e, n := intentAudit(t, s, super, ag.ID, "to="+at(2)); n != 1 || e[0]["action"] != "created" {
				t.Fatalf("to=token_issued's time: total %d, %v", n, intentActions(e))
			}
			if e, n := intentAudit(t, s, super, ag.ID, "from="+at(2)+"&to="+at(1)); n != 1 || e[0]["action"] != "token_issued" {
				t.Fatalf("from issued to first refusal: total %d, %v", n, intentActions(e))
			}
			// Dates are midnight UTC.
			if _, n := intentAudit(t, s, super, ag.ID, "from="+intentDay(t, all[3], 0)); n != 4 {
				t.Fatalf("from=the day of creation: total %d, want 4", n)
			}
			if _, n := intentAudit(t, s, super, ag.ID, "to="+intentDay(t, all[3], 0)); n != 0 {
				t.Fatalf("to=the day of creation (exclusive): total %d, want 0", n)
			}
			if _, n := intentAudit(t, s, super, ag.ID, "from="+intentDay(t, all[0], 1)); n != 0 {
				t.Fatalf("from=the day after: total %d, want 0", n)
			}
			for _, c := range []struct{ query, field string }{
				{"from=yesterday", "from"},
				{"from=2026-13-01", "from"},
				{"to=2026-02-30", "to"},
				{"from=" + url.QueryEscape("2026-01-02 10:00:00"), "from"},
			} {
				expectIntentField(t, s.as(t).do(http.MethodGet, agentsPath+"/"+ag.ID+"/audit?"+c.query, nil, bearer(super)...), c.field)
			}
		})

		t.Run("pages", func(t *testing.T) {
			r := s.as(t).do(http.MethodGet, agentsPath+"/"+ag.ID+"/audit?limit=2&offset=1", nil, bearer(super)...)
			e, n := intentItems(t, r, "entries")
			m := r.JSON(t)
			if n != 4 || m["limit"] != float64(2) || m["offset"] != float64(1) || len(e) != 2 ||
				e[0]["timestamp"] != all[1]["timestamp"] || e[1]["timestamp"] != all[2]["timestamp"] {
				t.Fatalf("limit=2&offset=1: %s", r.Body)
			}
		})

		t.Run("api calls", func(t *testing.T) {
			// Two answered calls, and two refused for want of a scope.
			if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, nil); r.Status != http.StatusOK || r.JSON(t)["clientId"] != ag.ClientID {
				t.Fatalf("whoami: %s", describe(r))
			}
			expectError(t, intentCall(t, s, tok, http.MethodGet, intentSAPath, nil), http.StatusForbidden, "insufficient_scope")
			if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath+"?probe=1", nil); r.Status != http.StatusOK {
				t.Fatalf("whoami?probe=1: %s", describe(r))
			}
			r := s.as(t).do(http.MethodPost, agentsPath, map[string]any{"name": "spawn", "type": "service"}, bearer(tok)...)
			expectError(t, r, http.StatusForbidden, "insufficient_scope")

			calls, n := intentAwaitAudit(t, s, super, ag.ID, "action=api_call", 4)
			if n != 4 || len(calls) != 4 {
				t.Fatalf("api_call entries: total %d, %v", n, calls)
			}
			intentNewestFirst(t, calls)
			want := []struct {
				endpoint string
				status   float64
			}{
				{"POST /api/v1/agents", 403},
				{"GET /api/v1/m2m/whoami", 200}, // the query string is not part of the endpoint
				{"GET /api/v1/service-accounts", 403},
				{"GET /api/v1/m2m/whoami", 200},
			}
			for i, w := range want {
				e := calls[i]
				if e["action"] != "api_call" || e["endpoint"] != w.endpoint || e["status"] != w.status || e["ip"] != "127.0.0.1" {
					t.Fatalf("api_call %d: %v, want endpoint %q status %v ip 127.0.0.1", i, e, w.endpoint, w.status)
				}
				if intentOf(t, e) != nil {
					t.Fatalf("api_call %d without intent headers has an intent: %v", i, e)
				}
			}
			// The admin reading the trail is no call of the agent's.
			if _, n := intentAudit(t, s, super, ag.ID, ""); n != 8 {
				t.Fatalf("whole trail: total %d, want 8 (created, 3 token requests, 4 calls)", n)
			}
		})

		t.Run("service-account calls are no agent audit", func(t *testing.T) {
			sa := s.createAccount(super, map[string]any{"name": "intent-sa", "scopes": []string{"users:read"}})
			saTok := s.token(sa.ClientID, sa.ClientSecret, "")
			saTask, agTask := "sa-task-"+intentRand(), "agent-task-"+intentRand()
			h := intentHeader(intentHTask, saTask, intentHInitiator, "sa-initiator", intentHAction, "sa_action", intentHDepth, "0")
			if r := intentCall(t, s, saTok, http.MethodGet, intentWhoamiPath, h); r.Status != http.StatusOK {
				t.Fatalf("whoami as a service account: %s", describe(r))
			}
			// An agent call after it: once that one is recorded, the service
			// account's would have been too.
			if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, intentHeader(intentHTask, agTask)); r.Status != http.StatusOK {
				t.Fatalf("whoami as the agent: %s", describe(r))
			}
			admin := s.adminToken()
			if e := intentAwaitTask(t, s, admin, agTask, 1); len(e) != 1 || e[0]["clientId"] != ag.ClientID {
				t.Fatalf("the agent's call is not on its task: %v", e)
			}
			if e, n := intentQuery(t, s, admin, "/tasks/"+saTask, "entries"); n != 0 || len(e) != 0 {
				t.Fatalf("a service account's call is on the intent trail: %v", e)
			}
			if e, n := intentQuery(t, s, admin, "/search?intentInitiator=sa-initiator", "entries"); n != 0 || len(e) != 0 {
				t.Fatalf("a service account's call is found by search: %v", e)
			}
			if e, n := intentQuery(t, s, admin, "/search?agentClientId="+sa.ClientID, "entries"); n != 0 || len(e) != 0 {
				t.Fatalf("a service account's call is found by search: %v", e)
			}
			if _, n := intentAudit(t, s, super, ag.ID, "action=api_call"); n != 5 {
				t.Fatalf("agent api_call total %d, want 5", n)
			}
		})

		t.Run("unknown agent", func(t *testing.T) {
			expectError(t, s.as(t).do(http.MethodGet, agentsPath+"/01890000-0000-7000-8000-000000000000/audit", nil, bearer(super)...), http.StatusNotFound, "not_found")
		})
	})
}

// 3: the intent headers are stored on the entries of their request, and a
// malformed one is refused with the header's name.
func TestIntentHeaders(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		ag := intentAgent(t, s, super, "intent-headers", "read_users")
		id := intentRand()

		all := func(task, chain, parent, action, reason, initiator, depth string) http.Header {
			return intentHeader(intentHTask, task, intentHChain, chain, intentHParent, parent, intentHAction, action,
				intentHReason, reason, intentHInitiator, initiator, intentHDepth, depth)
		}
		tokH := all("tok-"+id, "chain-"+id, "parent-"+id, "get_token", "Needs to read users.", "user:alice@example.com", "0")
		tok := decodeToken(t, intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "", tokH)).AccessToken
		callH := all("call-"+id, "chain-"+id, "tok-"+id, "read.users:list/v1", "Ünïcödé reason — with punctuation; and 'quotes'.", "scheduler (nightly)", "1")
		if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, callH); r.Status != http.StatusOK {
			t.Fatalf("whoami with intent: %s", describe(r))
		}
		// Only some headers: only those are stored.
		if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, intentHeader(intentHTask, "only-"+id)); r.Status != http.StatusOK {
			t.Fatalf("whoami with a task id: %s", describe(r))
		}
		if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, intentHeader(intentHChain, "c0-"+id, intentHDepth, "0")); r.Status != http.StatusOK {
			t.Fatalf("whoami with chain and depth 0: %s", describe(r))
		}
		// The limits themselves are accepted.
		long := strings.Repeat("t", 128)
		edge := intentHeader(intentHTask, long, intentHDepth, "1000", intentHReason, strings.Repeat("r", 1024), intentHInitiator, strings.Repeat("i", 256))
		if r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, edge); r.Status != http.StatusOK {
			t.Fatalf("whoami with values at their limits: %s", describe(r))
		}

		t.Run("stored on the entries", func(t *testing.T) {
			calls, n := intentAwaitAudit(t, s, super, ag.ID, "action=api_call", 4)
			if n != 4 {
				t.Fatalf("api_call total %d, want 4", n)
			}
			issued, _ := intentAudit(t, s, super, ag.ID, "action=token_issued")
			if len(issued) != 1 {
				t.Fatalf("token_issued entries: %v", issued)
			}
			check := func(name string, e map[string]any, want map[string]any) {
				t.Helper()
				in := intentOf(t, e)
				if in == nil {
					t.Fatalf("%s: no intent: %v", name, e)
				}
				keys := make([]string, 0, len(want))
				for k := range want {
					keys = append(keys, k)
				}
				exactKeys(t, in, keys...)
				for k, v := range want {
					if in[k] != v {
						t.Fatalf("%s: intent.%s %v, want %v", name, k, in[k], v)
					}
				}
			}
			check("token_issued", issued[0], map[string]any{
				"taskId": "tok-" + id, "chainId": "chain-" + id, "parentTaskId": "parent-" + id, "intentAction": "get_token",
				"intentReason": "Needs to read users.", "intentInitiator": "user:alice@example.com", "depth": float64(0),
			})
			// Newest first: edge, chain+depth 0, task only, all seven.
			check("api_call with every header", calls[3], map[string]any{
				"taskId": "call-" + id, "chainId": "chain-" + id, "parentTaskId": "tok-" + id, "intentAction": "read.users:list/v1",
				"intentReason": "Ünïcödé reason — with punctuation; and 'quotes'.", "intentInitiator": "scheduler (nightly)", "depth": float64(1),
			})
			check("api_call with a task id", calls[2], map[string]any{"taskId": "only-" + id})
			check("api_call with chain and depth 0", calls[1], map[string]any{"chainId": "c0-" + id, "depth": float64(0)})
			check("api_call at the limits", calls[0], map[string]any{
				"taskId": long, "depth": float64(1000), "intentReason": strings.Repeat("r", 1024), "intentInitiator": strings.Repeat("i", 256),
			})
			if calls[3]["endpoint"] != "GET /api/v1/m2m/whoami" || calls[3]["status"] != float64(200) {
				t.Fatalf("api_call with intent: %v", calls[3])
			}
		})

		t.Run("malformed headers", func(t *testing.T) {
			for _, c := range []struct {
				name   string
				header string
				values []string
			}{
				{"depth negative", intentHDepth, []string{"-1"}},
				{"depth not a number", intentHDepth, []string{"abc"}},
				{"depth over 1000", intentHDepth, []string{"1001"}},
				{"depth far over", intentHDepth, []string{"99999999999999999999"}},
				{"depth fractional", intentHDepth, []string{"1.5"}},
				{"depth with a sign", intentHDepth, []string{"+1"}},
				{"depth empty", intentHDepth, []string{""}},
				{"depth twice", intentHDepth, []string{"1", "2"}},
				{"task id with a space", intentHTask, []string{"task one"}},
				{"task id of 129 characters", intentHTask, []string{strings.Repeat("t", 129)}},
				{"task id not ASCII", intentHTask, []string{"tâche"}},
				{"task id empty", intentHTask, []string{""}},
				{"task id twice", intentHTask, []string{"a", "b"}},
				{"task id twice, the same", intentHTask, []string{"a", "a"}},
				{"chain id with a semicolon", intentHChain, []string{"chain;1"}},
				{"parent task id too long", intentHParent, []string{strings.Repeat("p", 129)}},
				{"action with a quote", intentHAction, []string{`read"users`}},
				{"reason with a tab", intentHReason, []string{"why\tnot"}},
				{"reason with a C1 control", intentHReason, []string{"why\u0085not"}},
				{"reason too long", intentHReason, []string{strings.Repeat("r", 1025)}},
				{"reason twice", intentHReason, []string{"one", "two"}},
				{"initiator with a control", intentHInitiator, []string{"user\u009balice"}},
				{"initiator too long", intentHInitiator, []string{strings.Repeat("i", 257)}},
			} {
				t.Run(c.name, func(t *testing.T) {
					h := intentHeader(intentHTask, "fine-"+id, intentHDepth, "3")
					h.Del(c.header)
					for _, v := range c.values {
						h.Add(c.header, v)
					}
					r := intentCall(t, s, tok, http.MethodGet, intentWhoamiPath, h)
					d := expectError(t, r, http.StatusBadRequest, "invalid_intent_header")
					if d["header"] != c.header {
						t.Fatalf("details.header %v, want %q: %s", d["header"], c.header, r.Body)
					}
				})
			}
		})

		t.Run("malformed on an admin call too", func(t *testing.T) {
			r := intentCall(t, s, super, http.MethodGet, agentsPath, intentHeader(intentHDepth, "-1"))
			if d := expectError(t, r, http.StatusBadRequest, "invalid_intent_header"); d["header"] != intentHDepth {
				t.Fatalf("details.header %v: %s", d["header"], r.Body)
			}
		})

		// The token endpoint answers RFC 6749 errors (error and
		// error_description, never the API envelope: docs/DESIGN), a
		// malformed intent header included, and names the header.
		t.Run("malformed at the token endpoint", func(t *testing.T) {
			r := intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "", intentHeader(intentHDepth, "-1"))
			if r.Status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", r.Status, r.Body)
			}
			m := r.JSON(t)
			desc, _ := m["error_description"].(string)
			if code, _ := m["error"].(string); code == "" || desc == "" {
				t.Fatalf("token endpoint: want an RFC 6749 error (error, error_description), got %s", r.Body)
			}
			if _, ok := m["message"]; ok {
				t.Fatalf("token endpoint answered the API envelope instead of an RFC 6749 error: %s", r.Body)
			}
			if !strings.Contains(desc, intentHDepth) {
				t.Fatalf("error_description %q does not name %s", desc, intentHDepth)
			}
		})
	})
}

// 4: the admin intent queries over a chain of three hops by two agents.
func TestIntentQueries(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		admin := s.adminToken() // the admin scope alone is enough
		a := intentAgent(t, s, super, "planner", "read_users")
		b := intentAgent(t, s, super, "worker", "read_users")
		aTok := decodeToken(t, intentTokenReq(t, s, a.ClientID, a.ClientSecret, "", nil)).AccessToken
		bTok := decodeToken(t, intentTokenReq(t, s, b.ClientID, b.ClientSecret, "", nil)).AccessToken

		id := intentRand()
		chain, other := "chain-"+id, "other-"+id
		t0, t1, t2 := "t0-"+id, "t1-"+id, "t2-"+id
		hop := func(task, parent, depth, action, initiator string) http.Header {
			h := intentHeader(intentHChain, chain, intentHTask, task, intentHDepth, depth, intentHAction, action,
				intentHInitiator, initiator, intentHReason, "reason of "+task)
			if parent != "" {
				h.Set(intentHParent, parent)
			}
			return h
		}
		// Sent out of depth order: 2, 0, 1, 1.
		if r := intentCall(t, s, aTok, http.MethodGet, intentWhoamiPath, hop(t2, t1, "2", "notify", "scheduler")); r.Status != http.StatusOK {
			t.Fatalf("hop 2: %s", describe(r))
		}
		decodeToken(t, intentTokenReq(t, s, a.ClientID, a.ClientSecret, "users:read", hop(t0, "", "0", "plan", "user:alice")))
		if r := intentCall(t, s, bTok, http.MethodGet, intentWhoamiPath, hop(t1, t0, "1", "lookup_user", "user:alice")); r.Status != http.StatusOK {
			t.Fatalf("hop 1: %s", describe(r))
		}
		expectError(t, intentCall(t, s, bTok, http.MethodGet, intentSAPath, hop(t1, t0, "1", "lookup_user", "user:alice")), http.StatusForbidden, "insufficient_scope")
		// Another chain, by the first agent.
		if r := intentCall(t, s, aTok, http.MethodGet, intentWhoamiPath, intentHeader(intentHChain, other, intentHTask, "other-task-"+id,
			intentHDepth, "0", intentHAction, "plan", intentHInitiator, "user:bob")); r.Status != http.StatusOK {
			t.Fatalf("other chain: %s", describe(r))
		}
		// A call without intent headers is no part of any of it.
		if r := intentCall(t, s, aTok, http.MethodGet, intentWhoamiPath, nil); r.Status != http.StatusOK {
			t.Fatalf("plain call: %s", describe(r))
		}
		intentAwaitAudit(t, s, super, a.ID, "action=api_call", 3)
		intentAwaitAudit(t, s, super, b.ID, "action=api_call", 2)

		// checkHop compares an entry with what its request sent.
		type want struct {
			agent          agent
			task, parent   string
			depth          float64
			action, intent string
			initiator      string
			endpoint       string
			status         float64
		}
		hops := []want{
			{a, t0, "", 0, "token_issued", "plan", "user:alice", "", 0},
			{b, t1, t0, 1, "api_call", "lookup_user", "user:alice", "GET /api/v1/m2m/whoami", 200},
			{b, t1, t0, 1, "api_call", "lookup_user", "user:alice", "GET /api/v1/service-accounts", 403},
			{a, t2, t1, 2, "api_call", "notify", "scheduler", "GET /api/v1/m2m/whoami", 200},
		}
		checkHop := func(t *testing.T, i int, e map[string]any, w want) {
			t.Helper()
			keys := []string{"timestamp", "agentId", "clientId", "action", "ip", "taskId", "chainId", "depth", "intentAction",
				"intentReason", "intentInitiator", "details"}
			if w.parent != "" {
				keys = append(keys, "parentTaskId")
			}
			if w.endpoint != "" {
				keys = append(keys, "endpoint", "status")
			}
			exactKeys(t, e, keys...)
			isoZ(t, e["timestamp"])
			if e["agentId"] != w.agent.ID || e["clientId"] != w.agent.ClientID || e["action"] != w.action || e["ip"] != "127.0.0.1" ||
				e["taskId"] != w.task || e["chainId"] != chain || e["depth"] != w.depth || e["intentAction"] != w.intent ||
				e["intentReason"] != "reason of "+w.task || e["intentInitiator"] != w.initiator {
				t.Fatalf("hop %d: %v, want %+v", i, e, w)
			}
			if w.parent != "" && e["parentTaskId"] != w.parent {
				t.Fatalf("hop %d: parentTaskId %v, want %s", i, e["parentTaskId"], w.parent)
			}
			if w.endpoint != "" && (e["endpoint"] != w.endpoint || e["status"] != w.status) {
				t.Fatalf("hop %d: endpoint %v status %v, want %s %v", i, e["endpoint"], e["status"], w.endpoint, w.status)
			}
		}

		t.Run("trace", func(t *testing.T) {
			r := s.as(t).do(http.MethodGet, intentQueryPath+"/chains/"+chain+"/trace", nil, bearer(admin)...)
			got, n := intentItems(t, r, "hops")
			if m := r.JSON(t); m["chainId"] != chain {
				t.Fatalf("trace chainId %v", m["chainId"])
			}
			if n != 4 || len(got) != 4 {
				t.Fatalf("trace: total %d, %d hops: %s", n, len(got), r.Body)
			}
			for i, w := range hops {
				checkHop(t, i, got[i], w)
			}
			if d, _ := got[0]["details"].(map[string]any); !slices.Equal(strs(d["scopes"]), []string{"users:read"}) {
				t.Fatalf("the token hop's details %v", got[0]["details"])
			}
			if isoZ(t, got[2]["timestamp"]).Before(isoZ(t, got[1]["timestamp"])) {
				t.Fatalf("hops of one depth not in time order: %v then %v", got[1]["timestamp"], got[2]["timestamp"])
			}
			// limit takes the first hops.
			if e, _ := intentQuery(t, s, admin, "/chains/"+chain+"/trace?limit=2", "hops"); len(e) != 2 || e[0]["taskId"] != t0 || e[1]["endpoint"] != hops[1].endpoint {
				t.Fatalf("trace?limit=2: %v", e)
			}
			if e, n := intentQuery(t, s, admin, "/chains/no-such-chain/trace", "hops"); n != 0 || len(e) != 0 {
				t.Fatalf("unknown chain: %v", e)
			}
		})

		t.Run("chain", func(t *testing.T) {
			r := s.as(t).do(http.MethodGet, intentQueryPath+"/chains/"+chain, nil, bearer(admin)...)
			got, n := intentItems(t, r, "entries")
			if n != 4 || len(got) != 4 {
				t.Fatalf("chain: total %d: %s", n, r.Body)
			}
			for i, w := range hops {
				checkHop(t, i, got[i], w)
			}
			if e, n := intentQuery(t, s, admin, "/chains/"+other, "entries"); n != 1 || e[0]["taskId"] != "other-task-"+id {
				t.Fatalf("other chain: %v", e)
			}
		})

		t.Run("task", func(t *testing.T) {
			r := s.as(t).do(http.MethodGet, intentQueryPath+"/tasks/"+t1, nil, bearer(admin)...)
			got, n := intentItems(t, r, "entries")
			if m := r.JSON(t); m["taskId"] != t1 {
				t.Fatalf("taskId %v", m["taskId"])
			}
			if n != 2 || len(got) != 2 {
				t.Fatalf("task: total %d: %s", n, r.Body)
			}
			checkHop(t, 0, got[0], hops[1]) // oldest first
			checkHop(t, 1, got[1], hops[2])
			if e, n := intentQuery(t, s, admin, "/tasks/"+t1+"?limit=1", "entries"); n != 1 || len(e) != 1 || e[0]["status"] != float64(200) {
				t.Fatalf("task?limit=1: %v", e)
			}
			if e, _ := intentQuery(t, s, admin, "/tasks/"+t0, "entries"); len(e) != 1 || e[0]["action"] != "token_issued" {
				t.Fatalf("task of the token request: %v", e)
			}
			if e, n := intentQuery(t, s, admin, "/tasks/no-such-task", "entries"); n != 0 || len(e) != 0 {
				t.Fatalf("unknown task: %v", e)
			}
			for _, q := range []string{"limit=0", "limit=-1", "limit=abc", "limit=1001", "limit=1.5"} {
				expectIntentField(t, s.as(t).do(http.MethodGet, intentQueryPath+"/tasks/"+t1+"?"+q, nil, bearer(admin)...), "limit")
			}
			expectIntentField(t, s.as(t).do(http.MethodGet, intentQueryPath+"/chains/"+chain+"/trace?limit=0", nil, bearer(admin)...), "limit")
		})

		t.Run("search", func(t *testing.T) {
			search := func(t *testing.T, q string) ([]string, int) {
				t.Helper()
				e, n := intentQuery(t, s, admin, "/search?"+q, "entries")
				intentNewestFirst(t, e)
				return intentStrings(e, "taskId"), n
			}
			expect := func(t *testing.T, q string, want ...string) {
				t.Helper()
				got, n := search(t, q)
				if want == nil {
					want = []string{}
				}
				if !slices.Equal(got, want) || n != len(want) {
					t.Fatalf("search?%s: tasks %v (total %d), want %v", q, got, n, want)
				}
			}
			otherTask := "other-task-" + id
			// Newest first; entries without intent headers are not found.
			expect(t, "agentClientId="+a.ClientID, otherTask, t0, t2)
			expect(t, "agentClientId="+b.ClientID, t1, t1)
			expect(t, "intentAction=plan", otherTask, t0)
			expect(t, "intentAction=plan&agentClientId="+b.ClientID)
			expect(t, "intentInitiator="+url.QueryEscape("user:alice"), t1, t1, t0)
			expect(t, "intentInitiator="+url.QueryEscape("user:alice")+"&intentAction=lookup_user", t1, t1)
			expect(t, "intentInitiator=nobody")
			expect(t, "", otherTask, t1, t1, t0, t2)

			// Dates: today's (UTC) matches, to included; a past range nothing.
			e, _ := intentQuery(t, s, admin, "/search?agentClientId="+a.ClientID, "entries")
			newest, oldest := e[0], e[len(e)-1]
			expect(t, "agentClientId="+a.ClientID+"&from="+intentDay(t, oldest, 0)+"&to="+intentDay(t, newest, 0), otherTask, t0, t2)
			expect(t, "agentClientId="+a.ClientID+"&to="+intentDay(t, newest, 0), otherTask, t0, t2)
			expect(t, "agentClientId="+a.ClientID+"&from="+intentDay(t, newest, 1))
			expect(t, "agentClientId="+a.ClientID+"&to="+intentDay(t, oldest, -1))
			expect(t, "from=2000-01-01&to=2000-12-31")

			// Pages.
			r := s.as(t).do(http.MethodGet, intentQueryPath+"/search?agentClientId="+a.ClientID+"&limit=1&offset=1", nil, bearer(admin)...)
			got, n := intentItems(t, r, "entries")
			m := r.JSON(t)
			if n != 3 || len(got) != 1 || got[0]["taskId"] != t0 || m["limit"] != float64(1) || m["offset"] != float64(1) {
				t.Fatalf("limit=1&offset=1: %s", r.Body)
			}
			if got[0]["agentId"] != a.ID || got[0]["action"] != "token_issued" || got[0]["intentInitiator"] != "user:alice" {
				t.Fatalf("search entry: %v", got[0])
			}
			if e, n := intentQuery(t, s, admin, "/search?limit=2&offset=4", "entries"); n != 5 || len(e) != 1 || e[0]["taskId"] != t2 {
				t.Fatalf("limit=2&offset=4: total %d, %v", n, e)
			}

			for _, c := range []struct{ query, field string }{
				{"from=2026-13-01", "from"},
				{"from=yesterday", "from"},
				{"to=2026-02-30", "to"},
				{"to=2026-1-5", "to"},
				{"from=2026-01-05T00:00:00Z", "from"},
				{"limit=0", "limit"},
				{"limit=201", "limit"},
				{"offset=-1", "offset"},
			} {
				expectIntentField(t, s.as(t).do(http.MethodGet, intentQueryPath+"/search?"+c.query, nil, bearer(admin)...), c.field)
			}
		})

		t.Run("admin only", func(t *testing.T) {
			sa := s.createAccount(super, map[string]any{"name": "auditor", "scopes": []string{"agents:read", "agents:write"}})
			saTok := s.token(sa.ClientID, sa.ClientSecret, "")
			for _, p := range []string{"/tasks/" + t1, "/chains/" + chain, "/chains/" + chain + "/trace", "/search"} {
				for name, tok := range map[string]string{"service account without admin": saTok, "agent": bTok} {
					r := s.as(t).do(http.MethodGet, intentQueryPath+p, nil, bearer(tok)...)
					if d := expectError(t, r, http.StatusForbidden, "insufficient_scope"); d["requiredScope"] != "admin" {
						t.Fatalf("%s on %s: details %v", name, p, d)
					}
				}
				expectError(t, s.as(t).do(http.MethodGet, intentQueryPath+p, nil), http.StatusUnauthorized, "unauthorized")
			}
		})

		// A hop that states no depth cannot come before depth 0: both
		// dialects put it after the hops with a depth.
		t.Run("hop without depth", func(t *testing.T) {
			c := "nodepth-" + id
			if r := intentCall(t, s, aTok, http.MethodGet, intentWhoamiPath, intentHeader(intentHChain, c, intentHTask, "undeclared-"+id)); r.Status != http.StatusOK {
				t.Fatalf("call without depth: %s", describe(r))
			}
			if r := intentCall(t, s, aTok, http.MethodGet, intentWhoamiPath, intentHeader(intentHChain, c, intentHTask, "root-"+id, intentHDepth, "0")); r.Status != http.StatusOK {
				t.Fatalf("call at depth 0: %s", describe(r))
			}
			intentAwaitTask(t, s, admin, "root-"+id, 1)
			got, _ := intentQuery(t, s, admin, "/chains/"+c+"/trace", "hops")
			if tasks := intentStrings(got, "taskId"); !slices.Equal(tasks, []string{"root-" + id, "undeclared-" + id}) {
				t.Fatalf("trace %v: the hop without a depth is not after the hop at depth 0", tasks)
			}
		})
	})
}

// intentStrings is the string values of key in each entry.
func intentStrings(entries []map[string]any, key string) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = fmt.Sprint(e[key])
	}
	return out
}

// Naming an agent's client id is no proof of being it: an unauthenticated
// refusal goes on the agent's trail marked so, without the caller's intent
// headers, and one address writes a bounded number of them; a refusal
// after the agent authenticated keeps its intent.
func TestRefusalAudit(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		ag := intentAgent(t, s, super, "refused", "read_users")
		forged := http.Header{"X-Service-Task-Id": {"forged-task"}, "X-Service-Intent-Action": {"delete_everything"}, "X-Service-Intent-Initiator": {"the real agent"}}

		expectRFC6749(t, intentTokenReq(t, s, ag.ClientID, "guess", "", forged), http.StatusUnauthorized, "invalid_client")
		own := http.Header{"X-Service-Task-Id": {"own-task"}}
		expectRFC6749(t, intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "admin", own), http.StatusBadRequest, "invalid_scope")

		entries, _ := intentAudit(t, s, super, ag.ID, "action=token_refused")
		if len(entries) != 2 {
			t.Fatalf("refusals on the trail: %v", entries)
		}
		authed, guessed := entries[0], entries[1] // newest first
		if d := authed["details"].(map[string]any); d["authenticated"] != true || d["error"] != "invalid_scope" || intentOf(t, authed)["taskId"] != "own-task" {
			t.Fatalf("the agent's own refusal: %v", authed)
		}
		if d := guessed["details"].(map[string]any); d["authenticated"] != false || d["error"] != "invalid_client" || intentOf(t, guessed) != nil {
			t.Fatalf("a guesser's refusal: %v", guessed)
		}
		if r := s.do(http.MethodGet, "/api/v1/audit/intent/tasks/forged-task", nil, bearer(super)...); mustOK(t, r)["total"] != float64(0) {
			t.Fatalf("the forged task is on the intent trail: %s", r.Body)
		}

		// A flood of guesses from one address writes a bounded number.
		for range 60 {
			expectRFC6749(t, intentTokenReq(t, s, ag.ClientID, "guess", "", nil), http.StatusUnauthorized, "invalid_client")
		}
		if _, n := intentAudit(t, s, super, ag.ID, "action=token_refused"); n > 2+30 {
			t.Fatalf("%d refusals recorded after 61 guesses from one address; at most 30 a minute may be", n-1)
		}
		// The agent's own refusals are always recorded.
		expectRFC6749(t, intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "admin", nil), http.StatusBadRequest, "invalid_scope")
		if e, _ := intentAudit(t, s, super, ag.ID, "action=token_refused&limit=1"); e[0]["details"].(map[string]any)["authenticated"] != true {
			t.Fatalf("the agent's refusal past the guessers' budget: %v", e)
		}
	})
}
