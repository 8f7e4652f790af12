package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Fine-grained authorization over real HTTP against the built binary, with
// OpenFGA embedded in it (issue 17): models, atomic tuple writes, checks
// that follow relationships, contextual tuples, refusals of the model,
// races, and the per-application access of service accounts.

const authzAPI = "/api/v1/m2m/authz"

// docsModel: a user in a group that owns a folder that contains a
// document may view the document.
const docsModel = `model
  schema 1.1

type user

type group
  relations
    define member: [user]

type folder
  relations
    define owner: [group#member]

type document
  relations
    define parent: [folder]
    define viewer: [user] or owner from parent
`

type authzEnv struct {
	s            *server
	writer, read []string // bearer headers: authz:write, authz:check
}

func newAuthzEnv(t *testing.T, s *server) *authzEnv {
	t.Helper()
	super := s.superToken()
	w := s.createAccount(super, map[string]any{"name": "fga writer", "scopes": []string{"authz:write"}})
	c := s.createAccount(super, map[string]any{"name": "fga checker", "scopes": []string{"authz:check"}})
	return &authzEnv{s: s, writer: bearer(s.token(w.ClientID, w.ClientSecret, "")), read: bearer(s.token(c.ClientID, c.ClientSecret, ""))}
}

func tup(user, relation, object string) map[string]any {
	return map[string]any{"user": user, "relation": relation, "object": object}
}

func (e *authzEnv) check(t *testing.T, body map[string]any) bool {
	t.Helper()
	r := e.s.do(http.MethodPost, authzAPI+"/check", body, e.read...)
	if r.Status != http.StatusOK {
		t.Fatalf("check %v: %s", body, describe(r))
	}
	m := r.JSON(t)
	exactKeys(t, m, "allowed")
	return m["allowed"].(bool)
}

func (e *authzEnv) tuples(t *testing.T, query string) []string {
	t.Helper()
	var out []string
	cursor := ""
	for page := 0; ; page++ {
		q := query + "&limit=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		r := e.s.do(http.MethodGet, authzAPI+"/tuples?"+q, nil, e.writer...)
		if r.Status != http.StatusOK {
			t.Fatalf("read tuples: %s", describe(r))
		}
		m := r.JSON(t)
		for _, raw := range m["tuples"].([]any) {
			tu := raw.(map[string]any)
			isoZ(t, tu["writtenAt"])
			out = append(out, fmt.Sprintf("%s#%s@%s", tu["object"], tu["relation"], tu["user"]))
		}
		next, _ := m["nextCursor"].(string)
		if next == "" {
			break
		}
		if page > 50 {
			t.Fatal("the cursor never ends")
		}
		cursor = next
	}
	sort.Strings(out)
	return out
}

func TestAuthz(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newAuthzEnv(t, s)

		// Before any model: reads say so; checks are the engine's refusal.
		expectError(t, s.do(http.MethodGet, authzAPI+"/model", nil, e.read...), http.StatusNotFound, "model_not_found")

		// The model in the DSL, read back in both forms by a checker.
		r := s.do(http.MethodPut, authzAPI+"/model", map[string]any{"dsl": docsModel}, e.writer...)
		if r.Status != http.StatusCreated {
			t.Fatalf("write model: %s", describe(r))
		}
		first := r.JSON(t)["id"].(string)
		r = s.do(http.MethodGet, authzAPI+"/model", nil, e.read...)
		if r.Status != http.StatusOK {
			t.Fatalf("read model: %s", describe(r))
		}
		m := r.JSON(t)
		exactKeys(t, m, "id", "model", "dsl")
		if m["id"] != first || !strings.Contains(m["dsl"].(string), "define viewer: [user] or owner from parent") {
			t.Fatalf("model read back: %s", r.Body)
		}
		types := []string{}
		for _, td := range m["model"].(map[string]any)["type_definitions"].([]any) {
			types = append(types, td.(map[string]any)["type"].(string))
		}
		if !slices.Equal(types, []string{"user", "group", "folder", "document"}) || m["model"].(map[string]any)["schema_version"] != "1.1" {
			t.Fatalf("the JSON form: %v", m["model"])
		}
		// The JSON form as read is a model to write: a new version, and
		// the first is still there by id.
		r = s.do(http.MethodPut, authzAPI+"/model", m["model"], e.writer...)
		if r.Status != http.StatusCreated || r.JSON(t)["id"] == first {
			t.Fatalf("write the JSON form: %s", describe(r))
		}
		second := r.JSON(t)["id"].(string)
		if got := s.do(http.MethodGet, authzAPI+"/model", nil, e.read...).JSON(t)["id"]; got != second {
			t.Fatalf("newest model %v, want %s", got, second)
		}
		if r := s.do(http.MethodGet, authzAPI+"/model?id="+first, nil, e.read...); r.Status != http.StatusOK || r.JSON(t)["id"] != first {
			t.Fatalf("model by id: %s", describe(r))
		}
		expectError(t, s.do(http.MethodGet, authzAPI+"/model?id=01ARZ3NDEKTSV4RRFFQ69G5FAV", nil, e.read...), http.StatusNotFound, "model_not_found")
		// Models the engine or the parser refuses.
		expectError(t, s.do(http.MethodPut, authzAPI+"/model", map[string]any{"dsl": "model\n  schema 1.1\ntype document\n  relations\n    define viewer: [nobody]\n"}, e.writer...),
			http.StatusBadRequest, "authz_invalid_request")
		expectError(t, s.do(http.MethodPut, authzAPI+"/model", map[string]any{"dsl": "this is not a model"}, e.writer...), http.StatusBadRequest, "invalid_model")
		expectError(t, s.do(http.MethodPut, authzAPI+"/model", map[string]any{"schema_version": "1.1", "type_definitions": "no"}, e.writer...), http.StatusBadRequest, "invalid_model")

		// Tuples: a three-hop relationship, written in one call.
		r = s.do(http.MethodPost, authzAPI+"/tuples", map[string]any{"writes": []any{
			tup("user:anne", "member", "group:eng"),
			tup("group:eng#member", "owner", "folder:plans"),
			tup("folder:plans", "parent", "document:roadmap"),
			tup("user:carl", "viewer", "document:memo"),
		}}, e.writer...)
		if r.Status != http.StatusOK || r.JSON(t)["written"] != 4.0 {
			t.Fatalf("write tuples: %s", describe(r))
		}
		if !e.check(t, map[string]any{"user": "user:anne", "relation": "viewer", "object": "document:roadmap"}) {
			t.Fatal("anne (eng, which owns the folder holding the roadmap) may not view it")
		}
		if e.check(t, map[string]any{"user": "user:bob", "relation": "viewer", "object": "document:roadmap"}) {
			t.Fatal("bob may view the roadmap")
		}
		// Contextual tuples count for that check only.
		if !e.check(t, map[string]any{"user": "user:bob", "relation": "viewer", "object": "document:roadmap",
			"contextualTuples": []any{tup("user:bob", "member", "group:eng")}}) {
			t.Fatal("bob, a member of eng for this check, may not view the roadmap")
		}
		if e.check(t, map[string]any{"user": "user:bob", "relation": "viewer", "object": "document:roadmap"}) {
			t.Fatal("the contextual tuple was kept")
		}

		// A tuple the model refuses: 400 with the engine's reason, and
		// nothing of the call is written (the good tuple beside it neither).
		before := e.tuples(t, "")
		r = s.do(http.MethodPost, authzAPI+"/tuples", map[string]any{"writes": []any{
			tup("user:dora", "viewer", "document:roadmap"),
			tup("user:dora", "editor", "document:roadmap"),
		}}, e.writer...)
		d := expectError(t, r, http.StatusBadRequest, "authz_invalid_request")
		if reason, _ := d["reason"].(string); !strings.Contains(reason, "editor") {
			t.Fatalf("the engine's reason is missing: %s", r.Body)
		}
		expectError(t, s.do(http.MethodPost, authzAPI+"/tuples", map[string]any{"writes": []any{tup("user:dora", "viewer", "spreadsheet:q3")}}, e.writer...),
			http.StatusBadRequest, "authz_invalid_request")
		if after := e.tuples(t, ""); !slices.Equal(before, after) {
			t.Fatalf("a refused write changed the tuples: %v → %v", before, after)
		}

		// Writes and deletes in one call: atomic both ways.
		r = s.do(http.MethodPost, authzAPI+"/tuples", map[string]any{
			"writes":  []any{tup("user:dora", "viewer", "document:memo")},
			"deletes": []any{tup("user:carl", "viewer", "document:memo")},
		}, e.writer...)
		if r.Status != http.StatusOK {
			t.Fatalf("write and delete: %s", describe(r))
		}
		if got := e.tuples(t, "object=document:memo"); !slices.Equal(got, []string{"document:memo#viewer@user:dora"}) {
			t.Fatalf("after write and delete: %v", got)
		}
		r = s.do(http.MethodPost, authzAPI+"/tuples", map[string]any{
			"writes":  []any{tup("user:erin", "viewer", "document:memo")},
			"deletes": []any{tup("user:carl", "viewer", "document:memo")}, // gone already
		}, e.writer...)
		expectError(t, r, http.StatusBadRequest, "authz_invalid_request")
		if e.check(t, map[string]any{"user": "user:erin", "relation": "viewer", "object": "document:memo"}) {
			t.Fatal("a refused call wrote its writes")
		}
		if got := e.tuples(t, "object=group:eng"); !slices.Equal(got, []string{"group:eng#member@user:anne"}) {
			t.Fatalf("filter by object: %v", got)
		}

		// Batch checks and list-objects.
		r = s.do(http.MethodPost, authzAPI+"/batch-check", map[string]any{"checks": []any{
			map[string]any{"user": "user:anne", "relation": "viewer", "object": "document:roadmap"},
			map[string]any{"user": "user:dora", "relation": "viewer", "object": "document:roadmap"},
			map[string]any{"user": "user:dora", "relation": "owner", "object": "document:roadmap"},
		}}, e.read...)
		if r.Status != http.StatusOK {
			t.Fatalf("batch check: %s", describe(r))
		}
		res := r.JSON(t)["results"].([]any)
		if len(res) != 3 || res[0].(map[string]any)["allowed"] != true || res[1].(map[string]any)["allowed"] != false || res[2].(map[string]any)["error"] == nil {
			t.Fatalf("batch results: %s", r.Body)
		}
		r = s.do(http.MethodPost, authzAPI+"/list-objects", map[string]any{"user": "user:anne", "relation": "viewer", "type": "document"}, e.read...)
		if r.Status != http.StatusOK || !slices.Equal(strs(r.JSON(t)["objects"]), []string{"document:roadmap"}) {
			t.Fatalf("list objects: %s", describe(r))
		}

		// Least privilege: a checker neither writes nor reads tuples; a
		// writer does not check.
		expectError(t, s.do(http.MethodPost, authzAPI+"/tuples", map[string]any{"writes": []any{tup("user:x", "member", "group:eng")}}, e.read...), http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodGet, authzAPI+"/tuples", nil, e.read...), http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodPut, authzAPI+"/model", map[string]any{"dsl": docsModel}, e.read...), http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodPost, authzAPI+"/check", map[string]any{"user": "user:anne", "relation": "viewer", "object": "document:roadmap"}, e.writer...),
			http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodPost, authzAPI+"/check", map[string]any{"user": "user:anne", "relation": "viewer", "object": "document:roadmap"}), http.StatusUnauthorized, "unauthorized")
	})
}

// Bad input on every authz route answers the envelope, never a 500.
func TestAuthzBadInput(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newAuthzEnv(t, s)
		if r := s.do(http.MethodPut, authzAPI+"/model", map[string]any{"dsl": docsModel}, e.writer...); r.Status != http.StatusCreated {
			t.Fatalf("write model: %s", describe(r))
		}
		asJSON := []string{"Content-Type", "application/json"}
		cases := []struct {
			method, path, body string
			auth               []string
			status             int
			code               string
		}{
			{"POST", "/check", `{"user":"user:a\u0000","relation":"viewer","object":"document:x"}`, e.read, 400, "invalid_request"},
			{"POST", "/check", "{\"user\":\"user:\xff\",\"relation\":\"viewer\",\"object\":\"document:x\"}", e.read, 400, "invalid_request"},
			{"POST", "/check", `{"user":1,"relation":"viewer","object":"document:x"}`, e.read, 400, "invalid_request"},
			{"POST", "/check", `{"user":"user:a","relation":"viewer"}`, e.read, 400, "invalid_request"},
			{"POST", "/check", `{"user":"user:a","relation":"viewer","object":"document:x","extra":1}`, e.read, 400, "invalid_request"},
			{"POST", "/check", `{"user":"user with spaces","relation":"viewer","object":"document:x"}`, e.read, 400, "authz_invalid_request"},
			{"POST", "/check", `{"user":"user:` + strings.Repeat("a", 600) + `","relation":"viewer","object":"document:x"}`, e.read, 400, "authz_invalid_request"},
			{"POST", "/check", `{"user":"user:a","relation":"viewer","object":"document:x","contextualTuples":"no"}`, e.read, 400, "invalid_request"},
			{"POST", "/check", `[` + strings.Repeat(`[`, 5000) + strings.Repeat(`]`, 5000) + `]`, e.read, 400, "invalid_request"},
			{"POST", "/check", `{"user":"user:a"`, e.read, 400, "invalid_json"},
			{"POST", "/check", `{"user":"user:a","relation":"viewer","object":"document:x","context":{"a":` + strings.Repeat(`{"a":`, 3000) + `1` + strings.Repeat(`}`, 3001) + `}`, e.read, 400, "invalid_request"},
			{"POST", "/batch-check", `{"checks":[]}`, e.read, 400, "invalid_request"},
			{"POST", "/batch-check", `{"checks":[` + strings.TrimSuffix(strings.Repeat(`{"user":"user:a","relation":"viewer","object":"document:x"},`, 51), ",") + `]}`, e.read, 400, "invalid_request"},
			{"POST", "/list-objects", `{"user":"user:a","relation":"viewer"}`, e.read, 400, "invalid_request"},
			{"POST", "/list-objects", `{"user":"user:a","relation":"viewer","type":"nosuchtype"}`, e.read, 400, "authz_invalid_request"},
			{"POST", "/tuples", `{}`, e.writer, 400, "invalid_request"},
			{"POST", "/tuples", `{"writes":[{"user":"user:a","relation":"member"}]}`, e.writer, 400, "invalid_request"},
			{"POST", "/tuples", `{"writes":[` + strings.TrimSuffix(strings.Repeat(`{"user":"user:a","relation":"member","object":"group:g"},`, 101), ",") + `]}`, e.writer, 400, "invalid_request"},
			{"POST", "/tuples", `{"writes":[{"user":"user:a","relation":"member","object":"group:g"},{"user":"user:a","relation":"member","object":"group:g"}]}`, e.writer, 400, "authz_invalid_request"},
			{"POST", "/tuples", `{"deletes":[{"user":"user:a","relation":"member","object":"group:g","condition":{"name":"c"}}]}`, e.writer, 400, "invalid_request"},
			{"GET", "/tuples?cursor=not-a-cursor", "", e.writer, 400, "invalid_cursor"},
			{"GET", "/tuples?limit=0", "", e.writer, 400, "invalid_request"},
			{"GET", "/tuples?limit=x", "", e.writer, 400, "invalid_request"},
			{"GET", "/tuples?user=user:a", "", e.writer, 400, "authz_invalid_request"},
			{"GET", "/tuples?object=%FF", "", e.writer, 400, "invalid_request"},
			{"PUT", "/model", `[]`, e.writer, 400, "invalid_request"},
			{"PUT", "/model", `{"dsl":1}`, e.writer, 400, "invalid_model"},
			{"PUT", "/model", `{"dsl":"model\n  schema 1.1\n","schema_version":"1.1"}`, e.writer, 400, "invalid_model"},
			{"PUT", "/model", `{"id":"x","schema_version":"1.1","type_definitions":[]}`, e.writer, 400, "invalid_model"},
			{"PUT", "/model", `{"dsl":"a\u0000"}`, e.writer, 400, "invalid_request"},
			{"PUT", "/model", `{"dsl":"` + strings.Repeat("x", 1<<20) + `"}`, e.writer, 413, "payload_too_large"},
		}
		for _, c := range cases {
			r := s.do(c.method, authzAPI+c.path, c.body, append(slices.Clone(c.auth), asJSON...)...)
			if r.Status == http.StatusInternalServerError {
				t.Fatalf("%s %s %.80q: 500 %s", c.method, c.path, c.body, r.Body)
			}
			if r.Status != c.status {
				t.Errorf("%s %s %.80q: %s, want %d", c.method, c.path, c.body, describe(r), c.status)
				continue
			}
			expectError(t, r, c.status, c.code)
		}
		r := s.do(http.MethodPost, authzAPI+"/check", `{"user":"user:a","relation":"viewer","object":"document:x"}`, append(slices.Clone(e.read), "Content-Type", "text/plain")...)
		expectError(t, r, http.StatusUnsupportedMediaType, "unsupported_media_type")
	})
}

// Concurrent tuple and model writes: each write is whole, none is lost,
// one tuple is written once.
func TestAuthzConcurrentWrites(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newAuthzEnv(t, s)
		if r := s.do(http.MethodPut, authzAPI+"/model", map[string]any{"dsl": docsModel}, e.writer...); r.Status != http.StatusCreated {
			t.Fatalf("write model: %s", describe(r))
		}
		const n = 12
		var wg sync.WaitGroup
		distinct, same, models := make([]int, n), make([]int, n), make([]string, n)
		for i := range n {
			wg.Add(3)
			go func() {
				defer wg.Done()
				r, err := send(http.MethodPost, s.URL+authzAPI+"/tuples", strings.NewReader(fmt.Sprintf(`{"writes":[{"user":"user:u%d","relation":"member","object":"group:race"},{"user":"user:u%d","relation":"viewer","object":"document:d%d"}]}`, i, i, i)),
					append(slices.Clone(e.writer), "Content-Type", "application/json")...)
				if err == nil {
					distinct[i] = r.Status
				}
			}()
			go func() {
				defer wg.Done()
				r, err := send(http.MethodPost, s.URL+authzAPI+"/tuples", strings.NewReader(`{"writes":[{"user":"user:one","relation":"member","object":"group:contested"}]}`),
					append(slices.Clone(e.writer), "Content-Type", "application/json")...)
				if err == nil {
					same[i] = r.Status
				}
			}()
			go func() {
				defer wg.Done()
				r, err := send(http.MethodPut, s.URL+authzAPI+"/model", strings.NewReader(fmt.Sprintf(`{"dsl":%q}`, docsModel+fmt.Sprintf("\ntype extra%d\n", i))),
					append(slices.Clone(e.writer), "Content-Type", "application/json")...)
				var m map[string]any
				if err == nil && r.Status == http.StatusCreated && json.Unmarshal(r.Body, &m) == nil {
					models[i], _ = m["id"].(string)
				}
			}()
		}
		wg.Wait()
		for i := range n {
			if distinct[i] != http.StatusOK {
				t.Errorf("concurrent write %d: %d", i, distinct[i])
			}
		}
		ok := 0
		for _, st := range same {
			switch st {
			case http.StatusOK:
				ok++
			case http.StatusBadRequest, http.StatusConflict: // it exists; or, on PostgreSQL, another transaction inserted it first
			default:
				t.Errorf("a contested write answered %d", st)
			}
		}
		if ok != 1 {
			t.Errorf("one tuple written concurrently: %d successes, want 1 (%v)", ok, same)
		}
		if got := e.tuples(t, "object=group:race"); len(got) != n {
			t.Errorf("group:race has %d members, want %d", len(got), n)
		}
		if got := e.tuples(t, "object=group:contested"); len(got) != 1 {
			t.Errorf("group:contested: %v", got)
		}
		seen := map[string]bool{}
		for i, id := range models {
			if id == "" || seen[id] {
				t.Errorf("concurrent model write %d: id %q", i, id)
			}
			seen[id] = true
		}
		newest := s.do(http.MethodGet, authzAPI+"/model", nil, e.read...).JSON(t)["id"].(string)
		if !seen[newest] {
			t.Errorf("the newest model %s is none of those written", newest)
		}
	})
}
