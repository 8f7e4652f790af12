package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The directory over the M2M API (users, organizations and their members,
// roles and their holders) over real HTTP on each dialect: every route
// with its scope, every refusal, pages and filters, idempotent role
// changes, what deletions take with them, and races on unique keys.

const (
	dirUsersPath = "/api/v1/m2m/users"
	dirOrgsPath  = "/api/v1/m2m/orgs"
	dirRolesPath = "/api/v1/m2m/roles"
)

// dirScopes are the scopes the directory routes ask for.
var dirScopes = []string{"users:read", "users:write", "users:admin", "orgs:read", "orgs:write", "roles:read", "roles:manage"}

// dirEnv is a running server and a service account holding every
// directory scope; full is a token with all of them.
type dirEnv struct {
	s                *server
	clientID, secret string
	full             string
}

func dirStart(t *testing.T, dbURL string) *dirEnv {
	t.Helper()
	s := startLogged(t, dbURL)
	a := s.createAccount(s.adminToken(), map[string]any{"name": "directory-e2e", "scopes": dirScopes, "redirectUris": []string{}})
	return &dirEnv{s: s, clientID: a.ClientID, secret: a.ClientSecret, full: s.token(a.ClientID, a.ClientSecret, "")}
}

// tokenFor is a token of the account narrowed to these scopes.
func (e *dirEnv) tokenFor(t *testing.T, scopes ...string) string {
	t.Helper()
	return e.s.as(t).token(e.clientID, e.secret, strings.Join(scopes, " "))
}

// call sends a request with the full token.
func (e *dirEnv) call(t *testing.T, method, path string, body any) *response {
	t.Helper()
	return e.s.as(t).do(method, path, body, bearer(e.full)...)
}

// dirCreated fails unless r is a 201 and returns its body.
func dirCreated(t *testing.T, r *response) map[string]any {
	t.Helper()
	if r.Status != http.StatusCreated {
		t.Fatalf("want 201: %s", describe(r))
	}
	return r.JSON(t)
}

func (e *dirEnv) createUser(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	return dirCreated(t, e.call(t, http.MethodPost, dirUsersPath, body))
}

func (e *dirEnv) createOrg(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	return dirCreated(t, e.call(t, http.MethodPost, dirOrgsPath, body))
}

func (e *dirEnv) createRole(t *testing.T, name, description string) map[string]any {
	t.Helper()
	return dirCreated(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": name, "description": description}))
}

func dirID(m map[string]any) string { id, _ := m["id"].(string); return id }

// dirList checks a list answer {key: [...], total, limit, offset} and
// returns its items and total.
func dirList(t *testing.T, r *response, key string, limit, offset int) ([]map[string]any, int) {
	t.Helper()
	m := mustOK(t, r)
	exactKeys(t, m, key, "total", "limit", "offset")
	if m["limit"] != float64(limit) || m["offset"] != float64(offset) {
		t.Fatalf("limit/offset %v/%v, want %d/%d: %s", m["limit"], m["offset"], limit, offset, r.Body)
	}
	raw, ok := m[key].([]any)
	if !ok {
		t.Fatalf("%s is not an array: %s", key, r.Body)
	}
	items := make([]map[string]any, len(raw))
	for i, x := range raw {
		if items[i], ok = x.(map[string]any); !ok {
			t.Fatalf("%s[%d] is not an object: %s", key, i, r.Body)
		}
	}
	total, ok := m["total"].(float64)
	if !ok {
		t.Fatalf("total is not a number: %s", r.Body)
	}
	return items, int(total)
}

// dirValues lists one member of each item.
func dirValues(items []map[string]any, key string) []string {
	out := make([]string, len(items))
	for i, m := range items {
		out[i], _ = m[key].(string)
	}
	return out
}

// dirRoleNames checks a {userId, roles} answer for user and returns the
// role names in order.
func dirRoleNames(t *testing.T, r *response, user string) []string {
	t.Helper()
	m := mustOK(t, r)
	exactKeys(t, m, "userId", "roles")
	if m["userId"] != user {
		t.Fatalf("userId %v, want %s", m["userId"], user)
	}
	raw, ok := m["roles"].([]any)
	if !ok {
		t.Fatalf("roles is not an array: %s", r.Body)
	}
	names := make([]string, len(raw))
	for i, x := range raw {
		role, _ := x.(map[string]any)
		exactKeys(t, role, "name", "description", "createdAt")
		isoZ(t, role["createdAt"])
		names[i], _ = role["name"].(string)
	}
	return names
}

// dirNotFound checks a 404 not_found answer.
func dirNotFound(t *testing.T, r *response) map[string]any {
	t.Helper()
	return expectError(t, r, http.StatusNotFound, "not_found")
}

// dirBadField checks a 400 invalid_request naming one field in
// details.field: a JSON body of the wrong type or with an unknown member.
func dirBadField(t *testing.T, r *response, field string) {
	t.Helper()
	d := expectError(t, r, http.StatusBadRequest, "invalid_request")
	if d["field"] != field {
		t.Fatalf("details.field %v, want %q: %s", d["field"], field, r.Body)
	}
}

func dirQuery(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return "?" + q.Encode()
}

// dirBurst sends n requests at once (released together) and returns the
// answers in order.
func dirBurst(t *testing.T, n int, req func(i int) (*response, error)) []*response {
	t.Helper()
	out := make([]*response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			out[i], errs[i] = req(i)
		}()
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return out
}

// sendJSON is a JSON request from any goroutine with the token.
func (e *dirEnv) sendJSON(method, path, tok string, body any) (*response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return send(method, e.s.URL+path, bytes.NewReader(b), "Content-Type", "application/json", "Authorization", "Bearer "+tok)
}

// dirTally counts answers by status, and fails on any answer outside want.
func dirTally(t *testing.T, rs []*response, want map[int]string) map[int]int {
	t.Helper()
	n := map[int]int{}
	for _, r := range rs {
		code, ok := want[r.Status]
		if !ok {
			t.Fatalf("unexpected answer %s", describe(r))
		}
		if code != "" {
			expectError(t, r, r.Status, code)
		}
		n[r.Status]++
	}
	return n
}

// Every directory route needs its scope: no token is 401, a token with
// every directory scope but the one needed is 403 naming it, and a token
// with only that scope is served.
func TestDirectoryScopes(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		user := dirID(e.createUser(t, map[string]any{"email": "scoped@example.com"}))
		victim := dirID(e.createUser(t, map[string]any{"email": "victim@example.com"}))
		joiner := dirID(e.createUser(t, map[string]any{"email": "joiner@example.com"}))
		org := dirID(e.createOrg(t, map[string]any{"name": "Scoped"}))
		victimOrg := dirID(e.createOrg(t, map[string]any{"name": "Victim Org"}))
		e.createRole(t, "scoped-role", "")
		e.createRole(t, "victim-role", "")
		dirCreated(t, e.call(t, http.MethodPost, dirOrgsPath+"/"+org+"/members", map[string]any{"userId": joiner}))

		// scope is the scope a route needs, or the scopes it accepts
		// ("a|b": either; the first is the one named when neither is held).
		routes := []struct {
			method, path string
			body         any
			scope        string
			want         int
		}{
			{"GET", dirUsersPath, nil, "users:read", 200},
			{"POST", dirUsersPath, map[string]any{"email": "new@example.com"}, "users:write", 201},
			{"GET", dirUsersPath + "/" + user, nil, "users:read", 200},
			{"PATCH", dirUsersPath + "/" + user, map[string]any{"name": "Scoped"}, "users:write", 200},
			{"DELETE", dirUsersPath + "/" + victim, nil, "users:admin", 204},
			{"GET", dirUsersPath + "/" + user + "/roles", nil, "roles:read|roles:manage", 200},
			{"GET", dirOrgsPath, nil, "orgs:read", 200},
			{"POST", dirOrgsPath, map[string]any{"name": "New Org"}, "orgs:write", 201},
			{"GET", dirOrgsPath + "/" + org, nil, "orgs:read", 200},
			{"PATCH", dirOrgsPath + "/" + org, map[string]any{"name": "Scoped Renamed"}, "orgs:write", 200},
			{"DELETE", dirOrgsPath + "/" + victimOrg, nil, "orgs:write", 204},
			{"GET", dirOrgsPath + "/" + org + "/members", nil, "orgs:read", 200},
			{"DELETE", dirOrgsPath + "/" + org + "/members/" + joiner, nil, "orgs:write", 204},
			{"POST", dirOrgsPath + "/" + org + "/members", map[string]any{"userId": user}, "orgs:write", 201},
			{"GET", dirRolesPath, nil, "roles:read|roles:manage", 200},
			{"POST", dirRolesPath, map[string]any{"name": "new-role"}, "roles:manage", 201},
			{"POST", dirRolesPath + "/assign", map[string]any{"userId": user, "role": "scoped-role"}, "roles:manage", 200},
			{"DELETE", dirRolesPath + "/remove", map[string]any{"userId": user, "role": "scoped-role"}, "roles:manage", 200},
			{"DELETE", dirRolesPath + "/victim-role", nil, "roles:manage", 204},
		}
		// without[scope] holds every directory scope but those accepted;
		// only[s] holds s alone.
		without, only := map[string]string{}, map[string]string{}
		for _, rt := range routes {
			accepted := strings.Split(rt.scope, "|")
			if _, ok := without[rt.scope]; !ok {
				without[rt.scope] = e.tokenFor(t, slices.DeleteFunc(slices.Clone(dirScopes), func(x string) bool { return slices.Contains(accepted, x) })...)
			}
			for _, sc := range accepted {
				if _, ok := only[sc]; !ok {
					only[sc] = e.tokenFor(t, sc)
				}
			}
		}

		t.Run("refused", func(t *testing.T) {
			s := e.s.as(t)
			for _, rt := range routes {
				t.Run(rt.method+" "+rt.path, func(t *testing.T) {
					s := s.as(t)
					r := s.do(rt.method, rt.path, rt.body)
					expectError(t, r, http.StatusUnauthorized, "unauthorized")
					if h := r.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
						t.Fatalf("401 without a Bearer challenge: %q", h)
					}
					r = s.do(rt.method, rt.path, rt.body, bearer("not-a-token")...)
					expectError(t, r, http.StatusUnauthorized, "invalid_token")
					accepted := strings.Split(rt.scope, "|")
					r = s.do(rt.method, rt.path, rt.body, bearer(without[rt.scope])...)
					expectScopeRefused(t, r, accepted[0])
					if len(accepted) > 1 {
						if got := strs(r.JSON(t)["details"].(map[string]any)["acceptedScopes"]); !slices.Equal(got, accepted) {
							t.Fatalf("details.acceptedScopes %v, want %v", got, accepted)
						}
					}
				})
			}
			// The scope is checked before the body is read.
			r := s.do(http.MethodPost, dirUsersPath, "{not json", append(bearer(only["users:read"]), "Content-Type", "application/json")...)
			expectScopeRefused(t, r, "users:write")
		})

		t.Run("nothing changed by refusals", func(t *testing.T) {
			mustOK(t, e.call(t, http.MethodGet, dirUsersPath+"/"+victim, nil))
			mustOK(t, e.call(t, http.MethodGet, dirOrgsPath+"/"+victimOrg, nil))
			if _, n := dirList(t, e.call(t, http.MethodGet, dirUsersPath, nil), "users", 50, 0); n != 3 {
				t.Fatalf("%d users after refused calls, want 3", n)
			}
			if _, n := dirList(t, e.call(t, http.MethodGet, dirRolesPath, nil), "roles", 50, 0); n != 2 {
				t.Fatalf("%d roles after refused calls, want 2", n)
			}
			items, _ := dirList(t, e.call(t, http.MethodGet, dirOrgsPath+"/"+org+"/members", nil), "members", 50, 0)
			if got := dirValues(items, "userId"); !slices.Equal(got, []string{joiner}) {
				t.Fatalf("members %v after refused calls, want only %s", got, joiner)
			}
			if names := dirRoleNames(t, e.call(t, http.MethodGet, dirUsersPath+"/"+user+"/roles", nil), user); len(names) != 0 {
				t.Fatalf("roles %v after refused calls", names)
			}
		})

		t.Run("served with the scope alone", func(t *testing.T) {
			s := e.s.as(t)
			for _, rt := range routes {
				for _, sc := range strings.Split(rt.scope, "|") {
					r := s.do(rt.method, rt.path, rt.body, bearer(only[sc])...)
					if r.Status != rt.want {
						t.Fatalf("%s %s with only %s: %s, want %d", rt.method, rt.path, sc, describe(r), rt.want)
					}
				}
			}
			dirNotFound(t, e.call(t, http.MethodGet, dirUsersPath+"/"+victim, nil))
			dirNotFound(t, e.call(t, http.MethodGet, dirOrgsPath+"/"+victimOrg, nil))
		})
	})
}

// Users: create, read, update and delete, the answer's shape, every
// refusal, and e-mail uniqueness whatever the case.
func TestDirectoryUsers(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		userKeys := []string{"id", "email", "emailVerified", "name", "firstName", "lastName", "status", "metadata",
			"hasPassword", "createdAt", "updatedAt", "lastSignInAt", "consoleAdmin"}
		const password = "correct horse battery staple"
		var ann, bob map[string]any

		t.Run("create", func(t *testing.T) {
			before := time.Now().Add(-time.Second)
			metadata := map[string]any{"plan": "pro", "seats": float64(3), "tags": []any{"a", "b"}, "nested": map[string]any{"k": "v"}}
			r := e.call(t, http.MethodPost, dirUsersPath, map[string]any{
				"email": "Ann.Lee@Example.com", "emailVerified": true, "name": "  Ann Lee  ", "firstName": "Ann", "lastName": "Lee",
				"metadata": metadata, "password": password,
			})
			ann = dirCreated(t, r)
			exactKeys(t, ann, userKeys...)
			id := dirID(ann)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("id %q is not a UUID", id)
			}
			if loc := r.Header.Get("Location"); loc != dirUsersPath+"/"+id {
				t.Fatalf("Location %q, want %s/%s", loc, dirUsersPath, id)
			}
			if ann["email"] != "Ann.Lee@Example.com" || ann["emailVerified"] != true || ann["name"] != "Ann Lee" ||
				ann["firstName"] != "Ann" || ann["lastName"] != "Lee" || ann["status"] != "active" || ann["hasPassword"] != true ||
				ann["lastSignInAt"] != nil || !reflect.DeepEqual(ann["metadata"], metadata) {
				t.Fatalf("fields not as sent (name trimmed, e-mail as written, active, hasPassword): %s", r.Body)
			}
			if c := isoZ(t, ann["createdAt"]); c.Before(before) || c.After(time.Now().Add(time.Second)) {
				t.Fatalf("createdAt %v is not now", c)
			}
			if ann["updatedAt"] != ann["createdAt"] {
				t.Fatalf("a new user's updatedAt %v differs from createdAt %v", ann["updatedAt"], ann["createdAt"])
			}
			if body := string(r.Body); strings.Contains(body, password) || strings.Contains(body, "argon2") || strings.Contains(body, `"password"`) {
				t.Fatalf("the answer shows the password or its hash: %s", body)
			}

			bob = e.createUser(t, map[string]any{"email": "bob@example.com"})
			exactKeys(t, bob, userKeys...)
			if bob["emailVerified"] != false || bob["name"] != "" || bob["firstName"] != "" || bob["lastName"] != "" ||
				bob["status"] != "active" || bob["hasPassword"] != false || bob["lastSignInAt"] != nil ||
				!reflect.DeepEqual(bob["metadata"], map[string]any{}) {
				t.Fatalf("defaults: %v", bob)
			}
		})

		t.Run("read", func(t *testing.T) {
			r := e.call(t, http.MethodGet, dirUsersPath+"/"+dirID(ann), nil)
			got := mustOK(t, r)
			if !reflect.DeepEqual(got, ann) {
				t.Fatalf("GET %v\nwant what POST answered %v", got, ann)
			}
			if strings.Contains(string(r.Body), password) || strings.Contains(string(r.Body), "argon2") {
				t.Fatalf("GET shows the password or its hash: %s", r.Body)
			}
			list := e.call(t, http.MethodGet, dirUsersPath, nil)
			if strings.Contains(string(list.Body), "argon2") {
				t.Fatalf("the list shows a password hash: %s", list.Body)
			}
			dirNotFound(t, e.call(t, http.MethodGet, dirUsersPath+"/"+uuid.NewString(), nil))
			dirNotFound(t, e.call(t, http.MethodGet, dirUsersPath+"/not-a-uuid", nil))
		})

		t.Run("e-mail taken whatever its case", func(t *testing.T) {
			for _, email := range []string{"Ann.Lee@Example.com", "ann.lee@example.com", "ANN.LEE@EXAMPLE.COM"} {
				expectError(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": email}), http.StatusConflict, "email_exists")
			}
		})

		t.Run("limits accepted", func(t *testing.T) {
			email254 := strings.Repeat("a", 64) + "@" + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
			if len(email254) != 254 {
				t.Fatalf("test address is %d long", len(email254))
			}
			u := e.createUser(t, map[string]any{
				"email": email254, "name": strings.Repeat("n", 200), "firstName": strings.Repeat("f", 100), "lastName": strings.Repeat("l", 100),
				"metadata": map[string]any{"k": strings.Repeat("m", 16384-len(`{"k":""}`))},
			})
			if u["email"] != email254 || len(u["name"].(string)) != 200 {
				t.Fatalf("limits: %v", u)
			}
			// Passwords count characters, not bytes: eight two-byte characters are enough.
			for i, pw := range []string{"12345678", "éééééééé", strings.Repeat("p", 1024)} {
				u := e.createUser(t, map[string]any{"email": fmt.Sprintf("pw%d@example.com", i), "password": pw})
				if u["hasPassword"] != true {
					t.Fatalf("password of %d characters not set: %v", len([]rune(pw)), u)
				}
			}
		})

		t.Run("bad values", func(t *testing.T) {
			email255 := strings.Repeat("a", 64) + "@" + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 62)
			ok := func(kv ...any) map[string]any {
				m := map[string]any{"email": "valid-" + strings.ToLower(randomString()[:8]) + "@example.com"}
				for i := 0; i+1 < len(kv); i += 2 {
					m[kv[i].(string)] = kv[i+1]
				}
				return m
			}
			cases := []struct {
				name   string
				body   map[string]any
				fields []string
			}{
				{"no e-mail", map[string]any{"name": "Nobody"}, []string{"email"}},
				{"empty e-mail", map[string]any{"email": ""}, []string{"email"}},
				{"not an address", map[string]any{"email": "not-an-address"}, []string{"email"}},
				{"display name", map[string]any{"email": "Ann <ann2@example.com>"}, []string{"email"}},
				{"spaces", map[string]any{"email": " ann2@example.com "}, []string{"email"}},
				{"two addresses", map[string]any{"email": "a@example.com, b@example.com"}, []string{"email"}},
				{"255 characters", map[string]any{"email": email255}, []string{"email"}},
				{"name too long", ok("name", strings.Repeat("n", 201)), []string{"name"}},
				{"control character", ok("name", "bell\u0007"), []string{"name"}},
				{"firstName too long", ok("firstName", strings.Repeat("f", 101)), []string{"firstName"}},
				{"lastName too long", ok("lastName", strings.Repeat("l", 101)), []string{"lastName"}},
				{"metadata too big", ok("metadata", map[string]any{"k": strings.Repeat("m", 16385-len(`{"k":""}`))}), []string{"metadata"}},
				{"password too short", ok("password", "1234567"), []string{"password"}},
				{"password of 7 characters in 14 bytes", ok("password", "ééééééé"), []string{"password"}},
				{"password too long", ok("password", strings.Repeat("p", 1025)), []string{"password"}},
				{"all at once", map[string]any{"email": "bad", "name": strings.Repeat("n", 201), "password": "x"}, []string{"email", "name", "password"}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					expectFields(t, e.call(t, http.MethodPost, dirUsersPath, c.body), c.fields...)
				})
			}
			if _, n := dirList(t, e.call(t, http.MethodGet, dirUsersPath+dirQuery("q", "valid-"), nil), "users", 50, 0); n != 0 {
				t.Fatalf("%d refused users were created", n)
			}
		})

		t.Run("bad bodies", func(t *testing.T) {
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": "x@example.com", "nickname": "x"}), "nickname")
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": 5}), "email")
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": "x@example.com", "emailVerified": "yes"}), "emailVerified")
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": "x@example.com", "name": 3}), "name")
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": "x@example.com", "metadata": []any{"a"}}), "metadata")
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": "x@example.com", "metadata": "text"}), "metadata")
			dirBadField(t, e.call(t, http.MethodPost, dirUsersPath, map[string]any{"email": "x@example.com", "password": 12345678}), "password")
			expectError(t, e.call(t, http.MethodPost, dirUsersPath, []any{"x@example.com"}), http.StatusBadRequest, "invalid_request")
			expectError(t, e.s.as(t).do(http.MethodPost, dirUsersPath, `{"email":`, append(bearer(e.full), "Content-Type", "application/json")...),
				http.StatusBadRequest, "invalid_json")
			expectError(t, e.s.as(t).do(http.MethodPost, dirUsersPath, `{"email":"x@example.com"}`, append(bearer(e.full), "Content-Type", "text/plain")...),
				http.StatusUnsupportedMediaType, "unsupported_media_type")
		})

		t.Run("update", func(t *testing.T) {
			path := dirUsersPath + "/" + dirID(ann)
			r := e.call(t, http.MethodPatch, path, map[string]any{"name": "Ann Q. Lee", "firstName": "Annie", "emailVerified": false})
			m := mustOK(t, r)
			exactKeys(t, m, userKeys...)
			if m["name"] != "Ann Q. Lee" || m["firstName"] != "Annie" || m["emailVerified"] != false ||
				m["lastName"] != "Lee" || m["email"] != ann["email"] || m["hasPassword"] != true || !reflect.DeepEqual(m["metadata"], ann["metadata"]) {
				t.Fatalf("PATCH changed other fields or not these: %s", r.Body)
			}
			if m["createdAt"] != ann["createdAt"] || !isoZ(t, m["updatedAt"]).After(isoZ(t, ann["createdAt"])) {
				t.Fatalf("createdAt %v/updatedAt %v after a change (created %v)", m["createdAt"], m["updatedAt"], ann["createdAt"])
			}
			if got := mustOK(t, e.call(t, http.MethodGet, path, nil)); !reflect.DeepEqual(got, m) {
				t.Fatalf("GET %v after PATCH answered %v", got, m)
			}

			// Nothing to change changes nothing.
			same := mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{}))
			if !reflect.DeepEqual(same, m) {
				t.Fatalf("empty PATCH changed the user: %v, was %v", same, m)
			}

			// Metadata is replaced, not merged.
			m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"metadata": map[string]any{"only": "this"}}))
			if !reflect.DeepEqual(m["metadata"], map[string]any{"only": "this"}) {
				t.Fatalf("metadata %v, want it replaced", m["metadata"])
			}

			// Status: active and disabled only.
			if m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"status": "disabled"})); m["status"] != "disabled" {
				t.Fatalf("status %v, want disabled", m["status"])
			}
			if m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"status": "active"})); m["status"] != "active" {
				t.Fatalf("status %v, want active", m["status"])
			}
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"status": "invited"}), "status")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"status": "gone"}), "status")

			// The e-mail: its own in another case is fine, another's is not.
			if m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"email": "ANN.LEE@example.com"})); m["email"] != "ANN.LEE@example.com" {
				t.Fatalf("email %v after changing its case", m["email"])
			}
			expectError(t, e.call(t, http.MethodPatch, path, map[string]any{"email": "BOB@example.com"}), http.StatusConflict, "email_exists")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"email": "not-an-address"}), "email")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"email": ""}), "email")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"name": strings.Repeat("n", 201)}), "name")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"metadata": map[string]any{"k": strings.Repeat("m", 16400)}}), "metadata")

			// The password is not changed here, valid or not.
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"password": "a brand new password"}), "password")
			expectFields(t, e.call(t, http.MethodPatch, dirUsersPath+"/"+dirID(bob), map[string]any{"password": "a brand new password"}), "password")
			if b := mustOK(t, e.call(t, http.MethodGet, dirUsersPath+"/"+dirID(bob), nil)); b["hasPassword"] != false {
				t.Fatalf("PATCH set a password: %v", b)
			}

			// A refused change changes nothing, not even its valid part.
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"name": "Half Done", "status": "invited"}), "status")
			expectError(t, e.call(t, http.MethodPatch, path, map[string]any{"name": "Half Done", "email": "bob@example.com"}), http.StatusConflict, "email_exists")
			if got := mustOK(t, e.call(t, http.MethodGet, path, nil)); !reflect.DeepEqual(got, m) {
				t.Fatalf("a refused PATCH changed the user: %v, was %v", got, m)
			}

			dirBadField(t, e.call(t, http.MethodPatch, path, map[string]any{"nickname": "x"}), "nickname")
			dirBadField(t, e.call(t, http.MethodPatch, path, map[string]any{"status": true}), "status")
			dirNotFound(t, e.call(t, http.MethodPatch, dirUsersPath+"/"+uuid.NewString(), map[string]any{"name": "x"}))
			dirNotFound(t, e.call(t, http.MethodPatch, dirUsersPath+"/not-a-uuid", map[string]any{"name": "x"}))
		})

		t.Run("delete", func(t *testing.T) {
			path := dirUsersPath + "/" + dirID(bob)
			if r := e.call(t, http.MethodDelete, path, nil); r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete: %s, want 204 without a body", describe(r))
			}
			dirNotFound(t, e.call(t, http.MethodGet, path, nil))
			dirNotFound(t, e.call(t, http.MethodDelete, path, nil))
			dirNotFound(t, e.call(t, http.MethodPatch, path, map[string]any{"name": "x"}))
			dirNotFound(t, e.call(t, http.MethodGet, path+"/roles", nil))
			dirNotFound(t, e.call(t, http.MethodDelete, dirUsersPath+"/not-a-uuid", nil))
			dirNotFound(t, e.call(t, http.MethodDelete, dirUsersPath+"/"+uuid.NewString(), nil))
			// The address is free again, for a new user.
			again := e.createUser(t, map[string]any{"email": "Bob@example.com"})
			if dirID(again) == dirID(bob) {
				t.Fatal("a new user has the deleted one's id")
			}
		})
	})
}

// The user list: pages, the default limit, each filter, LIKE wildcards
// taken literally, and the refusals of bad parameters.
func TestDirectoryUserList(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		bodies := []map[string]any{
			{"email": "alice@list.test", "name": "Alice Archer", "firstName": "Alice", "lastName": "Archer"},
			{"email": "bob@list.test", "name": "Bob Baker"},
			{"email": "carol_c@list.test", "name": "Carol 100% Real"},
			{"email": "dave@other.test", "firstName": "Dave", "lastName": "Danger"},
			{"email": "eve@list.test", "name": "Eve"},
			{"email": "carolxc@list.test", "name": "Carol 1000 Fake"},
			{"email": "frank@list.test", "name": "Frank", "lastName": "ARCHER"},
		}
		ids := make([]string, len(bodies))
		for i, b := range bodies {
			ids[i] = dirID(e.createUser(t, b))
		}
		mustOK(t, e.call(t, http.MethodPatch, dirUsersPath+"/"+ids[4], map[string]any{"status": "disabled"}))
		pick := func(is ...int) []string {
			out := make([]string, len(is))
			for k, i := range is {
				out[k] = ids[i]
			}
			return out
		}
		list := func(t *testing.T, limit, offset int, kv ...string) ([]string, int) {
			t.Helper()
			items, total := dirList(t, e.call(t, http.MethodGet, dirUsersPath+dirQuery(kv...), nil), "users", limit, offset)
			for _, u := range items {
				if _, ok := u["hasPassword"]; !ok || u["email"] == nil {
					t.Fatalf("list item is not a user: %v", u)
				}
			}
			return dirValues(items, "id"), total
		}

		t.Run("pages", func(t *testing.T) {
			got, total := list(t, 50, 0)
			if total != 7 || !slices.Equal(got, ids) {
				t.Fatalf("all: %v (total %d), want %v in creation order", got, total, ids)
			}
			var paged []string
			for off := 0; off < 9; off += 3 {
				page, total := list(t, 3, off, "limit", "3", "offset", fmt.Sprint(off))
				if total != 7 || len(page) != min(3, 7-off) {
					t.Fatalf("page at %d: %v (total %d)", off, page, total)
				}
				paged = append(paged, page...)
			}
			if !slices.Equal(paged, ids) {
				t.Fatalf("pages %v, want %v", paged, ids)
			}
			if got, total := list(t, 5, 10, "limit", "5", "offset", "10"); len(got) != 0 || total != 7 {
				t.Fatalf("past the end: %v (total %d)", got, total)
			}
			if got, _ := list(t, 200, 0, "limit", "200"); len(got) != 7 {
				t.Fatalf("limit 200: %d users", len(got))
			}
			if got, _ := list(t, 1, 0, "limit", "1"); !slices.Equal(got, ids[:1]) {
				t.Fatalf("limit 1: %v", got)
			}
		})

		t.Run("filters", func(t *testing.T) {
			cases := []struct {
				query []string
				want  []string
			}{
				{[]string{"email", "ALICE@LIST.TEST"}, pick(0)},
				{[]string{"email", "alice"}, nil},
				{[]string{"email", "alice@list.tes"}, nil},
				{[]string{"q", "ALICE"}, pick(0)},
				{[]string{"q", "archer"}, pick(0, 6)},
				{[]string{"q", "dAvE"}, pick(3)},
				{[]string{"q", "danger"}, pick(3)},
				{[]string{"q", "OTHER.TEST"}, pick(3)},
				{[]string{"q", "baker"}, pick(1)},
				{[]string{"q", "carol_c"}, pick(2)},
				{[]string{"q", "_"}, pick(2)},
				{[]string{"q", "100%"}, pick(2)},
				{[]string{"q", "%"}, pick(2)},
				{[]string{"q", `\`}, nil},
				{[]string{"q", "nobody"}, nil},
				{[]string{"status", "disabled"}, pick(4)},
				{[]string{"status", "active"}, pick(0, 1, 2, 3, 5, 6)},
				{[]string{"status", "invited"}, nil},
				{[]string{"q", "list.test", "status", "active"}, pick(0, 1, 2, 5, 6)},
				{[]string{"q", "carol", "email", "carolxc@list.test"}, pick(5)},
				{[]string{"email", "eve@list.test", "status", "active"}, nil},
			}
			for _, c := range cases {
				got, total := list(t, 50, 0, c.query...)
				if total != len(c.want) || !slices.Equal(got, c.want) {
					t.Fatalf("%v: %v (total %d), want %v", c.query, got, total, c.want)
				}
			}
			// total counts the filtered users, not the page.
			got, total := list(t, 2, 2, "q", "list.test", "status", "active", "limit", "2", "offset", "2")
			if total != 5 || !slices.Equal(got, pick(2, 5)) {
				t.Fatalf("filtered page: %v (total %d)", got, total)
			}
		})

		// Case-insensitive beyond ASCII, even typed as stored.
		t.Run("non-ASCII case", func(t *testing.T) {
			id := dirID(e.createUser(t, map[string]any{"email": "unal@other.test", "name": "Ünal Çelik", "lastName": "ÇELIK"}))
			for _, q := range []string{"ünal", "Ünal", "ÜNAL", "çelik", "ÇELIK"} {
				if got, total := list(t, 50, 0, "q", q); total != 1 || !slices.Equal(got, []string{id}) {
					t.Fatalf("q=%s: %v (total %d), want %s", q, got, total, id)
				}
			}
		})

		t.Run("bad parameters", func(t *testing.T) {
			for _, q := range []string{"limit=0", "limit=201", "limit=-1", "limit=abc", "limit=1.5", "offset=-1", "offset=x"} {
				expectError(t, e.call(t, http.MethodGet, dirUsersPath+"?"+q, nil), http.StatusBadRequest, "invalid_request")
			}
			expectFields(t, e.call(t, http.MethodGet, dirUsersPath+"?status=bogus", nil), "status")
			expectFields(t, e.call(t, http.MethodGet, dirUsersPath+"?status=ACTIVE", nil), "status")
			expectFields(t, e.call(t, http.MethodGet, dirUsersPath+dirQuery("q", strings.Repeat("q", 201)), nil), "q")
		})
	})
}

// Organizations: create (slugs given or derived), read, list, update,
// delete, and their refusals.
func TestDirectoryOrgs(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		orgKeys := []string{"id", "name", "slug", "metadata", "createdAt", "updatedAt"}
		var acme, globex map[string]any

		t.Run("create", func(t *testing.T) {
			before := time.Now().Add(-time.Second)
			r := e.call(t, http.MethodPost, dirOrgsPath, map[string]any{"name": "Acme Corp"})
			acme = dirCreated(t, r)
			exactKeys(t, acme, orgKeys...)
			id := dirID(acme)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("id %q is not a UUID", id)
			}
			if loc := r.Header.Get("Location"); loc != dirOrgsPath+"/"+id {
				t.Fatalf("Location %q", loc)
			}
			if acme["name"] != "Acme Corp" || acme["slug"] != "acme-corp" || !reflect.DeepEqual(acme["metadata"], map[string]any{}) {
				t.Fatalf("slug derived from the name, empty metadata: %s", r.Body)
			}
			if c := isoZ(t, acme["createdAt"]); c.Before(before) || c.After(time.Now().Add(time.Second)) || acme["updatedAt"] != acme["createdAt"] {
				t.Fatalf("times: %s", r.Body)
			}

			globex = e.createOrg(t, map[string]any{"name": "  Globex  ", "slug": "globex-2", "metadata": map[string]any{"tier": "gold"}})
			if globex["name"] != "Globex" || globex["slug"] != "globex-2" || !reflect.DeepEqual(globex["metadata"], map[string]any{"tier": "gold"}) {
				t.Fatalf("fields not as sent (name trimmed): %v", globex)
			}
			for name, slug := range map[string]string{
				"Hello,   World!! 2024": "hello-world-2024",
				"  --Edge Case--  ":     "edge-case",
				strings.Repeat("x", 70): strings.Repeat("x", 63),
			} {
				if o := e.createOrg(t, map[string]any{"name": name}); o["slug"] != slug {
					t.Fatalf("slug of %q: %v, want %q", name, o["slug"], slug)
				}
			}
			if o := e.createOrg(t, map[string]any{"name": "Max", "slug": strings.Repeat("a", 62) + "9"}); o["slug"] != strings.Repeat("a", 62)+"9" {
				t.Fatalf("a slug of 63: %v", o)
			}
		})

		t.Run("slug taken", func(t *testing.T) {
			expectError(t, e.call(t, http.MethodPost, dirOrgsPath, map[string]any{"name": "ACME corp"}), http.StatusConflict, "slug_exists")
			expectError(t, e.call(t, http.MethodPost, dirOrgsPath, map[string]any{"name": "Other", "slug": "acme-corp"}), http.StatusConflict, "slug_exists")
		})

		t.Run("bad values", func(t *testing.T) {
			cases := []struct {
				name   string
				body   map[string]any
				fields []string
			}{
				{"no name", map[string]any{"slug": "no-name"}, []string{"name"}},
				{"blank name", map[string]any{"name": "   ", "slug": "blank"}, []string{"name"}},
				{"name too long", map[string]any{"name": strings.Repeat("n", 201), "slug": "long"}, []string{"name"}},
				{"upper-case slug", map[string]any{"name": "x", "slug": "Acme"}, []string{"slug"}},
				{"leading hyphen", map[string]any{"name": "x", "slug": "-acme"}, []string{"slug"}},
				{"trailing hyphen", map[string]any{"name": "x", "slug": "acme-"}, []string{"slug"}},
				{"underscore", map[string]any{"name": "x", "slug": "ac_me"}, []string{"slug"}},
				{"empty slug", map[string]any{"name": "x", "slug": ""}, []string{"slug"}},
				{"slug of 64", map[string]any{"name": "x", "slug": strings.Repeat("a", 64)}, []string{"slug"}},
				{"no slug from the name", map[string]any{"name": "!!!"}, []string{"slug"}},
				{"metadata too big", map[string]any{"name": "x", "slug": "big", "metadata": map[string]any{"k": strings.Repeat("m", 16400)}}, []string{"metadata"}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					expectFields(t, e.call(t, http.MethodPost, dirOrgsPath, c.body), c.fields...)
				})
			}
			dirBadField(t, e.call(t, http.MethodPost, dirOrgsPath, map[string]any{"name": "x", "domain": "x.com"}), "domain")
			dirBadField(t, e.call(t, http.MethodPost, dirOrgsPath, map[string]any{"name": "x", "slug": 5}), "slug")
			dirBadField(t, e.call(t, http.MethodPost, dirOrgsPath, map[string]any{"name": "x", "metadata": []any{}}), "metadata")
		})

		t.Run("read and list", func(t *testing.T) {
			if got := mustOK(t, e.call(t, http.MethodGet, dirOrgsPath+"/"+dirID(acme), nil)); !reflect.DeepEqual(got, acme) {
				t.Fatalf("GET %v, want %v", got, acme)
			}
			dirNotFound(t, e.call(t, http.MethodGet, dirOrgsPath+"/"+uuid.NewString(), nil))
			dirNotFound(t, e.call(t, http.MethodGet, dirOrgsPath+"/not-a-uuid", nil))

			all, total := dirList(t, e.call(t, http.MethodGet, dirOrgsPath, nil), "orgs", 50, 0)
			if total != 6 || len(all) != 6 || dirID(all[0]) != dirID(acme) || dirID(all[1]) != dirID(globex) {
				t.Fatalf("list: %d of %d, want 6, oldest first", len(all), total)
			}
			for _, o := range all {
				exactKeys(t, o, orgKeys...)
			}
			var paged []string
			for off := 0; off < 6; off += 4 {
				page, total := dirList(t, e.call(t, http.MethodGet, dirOrgsPath+dirQuery("limit", "4", "offset", fmt.Sprint(off)), nil), "orgs", 4, off)
				if total != 6 {
					t.Fatalf("total %d", total)
				}
				paged = append(paged, dirValues(page, "id")...)
			}
			if !slices.Equal(paged, dirValues(all, "id")) {
				t.Fatalf("pages %v, want %v", paged, dirValues(all, "id"))
			}
			for _, q := range []string{"limit=0", "limit=201", "offset=-1"} {
				expectError(t, e.call(t, http.MethodGet, dirOrgsPath+"?"+q, nil), http.StatusBadRequest, "invalid_request")
			}
		})

		t.Run("update", func(t *testing.T) {
			path := dirOrgsPath + "/" + dirID(acme)
			m := mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"name": "Acme Corporation"}))
			exactKeys(t, m, orgKeys...)
			if m["name"] != "Acme Corporation" || m["slug"] != "acme-corp" || m["createdAt"] != acme["createdAt"] ||
				!isoZ(t, m["updatedAt"]).After(isoZ(t, acme["updatedAt"])) {
				t.Fatalf("renaming keeps the slug and moves updatedAt: %v", m)
			}
			if m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"slug": "acme"})); m["slug"] != "acme" || m["name"] != "Acme Corporation" {
				t.Fatalf("slug change: %v", m)
			}
			// The old slug is free again.
			e.createOrg(t, map[string]any{"name": "Acme Corp"})
			if m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"metadata": map[string]any{"a": "1"}})); !reflect.DeepEqual(m["metadata"], map[string]any{"a": "1"}) {
				t.Fatalf("metadata: %v", m)
			}
			if m = mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{"metadata": map[string]any{"b": "2"}})); !reflect.DeepEqual(m["metadata"], map[string]any{"b": "2"}) {
				t.Fatalf("metadata %v, want it replaced", m["metadata"])
			}
			if same := mustOK(t, e.call(t, http.MethodPatch, path, map[string]any{})); !reflect.DeepEqual(same, m) {
				t.Fatalf("empty PATCH changed the org: %v, was %v", same, m)
			}
			expectError(t, e.call(t, http.MethodPatch, path, map[string]any{"slug": "globex-2"}), http.StatusConflict, "slug_exists")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"slug": "Not A Slug"}), "slug")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"slug": ""}), "slug")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"name": " "}), "name")
			expectFields(t, e.call(t, http.MethodPatch, path, map[string]any{"name": "Fine", "slug": "-bad"}), "slug")
			dirBadField(t, e.call(t, http.MethodPatch, path, map[string]any{"domain": "x"}), "domain")
			if got := mustOK(t, e.call(t, http.MethodGet, path, nil)); !reflect.DeepEqual(got, m) {
				t.Fatalf("refused PATCHes changed the org: %v, was %v", got, m)
			}
			dirNotFound(t, e.call(t, http.MethodPatch, dirOrgsPath+"/"+uuid.NewString(), map[string]any{"name": "x"}))
			dirNotFound(t, e.call(t, http.MethodPatch, dirOrgsPath+"/not-a-uuid", map[string]any{"name": "x"}))
		})

		t.Run("delete", func(t *testing.T) {
			path := dirOrgsPath + "/" + dirID(globex)
			if r := e.call(t, http.MethodDelete, path, nil); r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete: %s, want 204 without a body", describe(r))
			}
			dirNotFound(t, e.call(t, http.MethodGet, path, nil))
			dirNotFound(t, e.call(t, http.MethodDelete, path, nil))
			dirNotFound(t, e.call(t, http.MethodPatch, path, map[string]any{"name": "x"}))
			dirNotFound(t, e.call(t, http.MethodGet, path+"/members", nil))
			dirNotFound(t, e.call(t, http.MethodDelete, dirOrgsPath+"/not-a-uuid", nil))
			if _, total := dirList(t, e.call(t, http.MethodGet, dirOrgsPath, nil), "orgs", 50, 0); total != 6 {
				t.Fatalf("total %d after deletion, want 6", total)
			}
			// The slug is free again.
			e.createOrg(t, map[string]any{"name": "Globex", "slug": "globex-2"})
		})
	})
}

// Members: add with a role, list, remove, the refusals, and what deleting
// a user or an organization does to memberships.
func TestDirectoryMembers(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		orgA := dirID(e.createOrg(t, map[string]any{"name": "Org A"}))
		orgB := dirID(e.createOrg(t, map[string]any{"name": "Org B"}))
		una := dirID(e.createUser(t, map[string]any{"email": "Una@example.com", "name": "Una"}))
		vic := dirID(e.createUser(t, map[string]any{"email": "vic@example.com", "name": "Vic"}))
		wes := dirID(e.createUser(t, map[string]any{"email": "wes@example.com"}))
		membersOf := func(org string) string { return dirOrgsPath + "/" + org + "/members" }
		members := func(t *testing.T, org string) ([]map[string]any, int) {
			t.Helper()
			return dirList(t, e.call(t, http.MethodGet, membersOf(org), nil), "members", 50, 0)
		}

		t.Run("add", func(t *testing.T) {
			before := time.Now().Add(-time.Second)
			m := dirCreated(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": una}))
			exactKeys(t, m, "userId", "email", "name", "role", "joinedAt")
			if m["userId"] != una || m["email"] != "Una@example.com" || m["name"] != "Una" || m["role"] != "member" {
				t.Fatalf("membership: %v (role member by default)", m)
			}
			if j := isoZ(t, m["joinedAt"]); j.Before(before) || j.After(time.Now().Add(time.Second)) {
				t.Fatalf("joinedAt %v is not now", j)
			}
			if m := dirCreated(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": vic, "role": "owner"})); m["role"] != "owner" {
				t.Fatalf("role %v, want owner", m["role"])
			}
			if m := dirCreated(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": wes, "role": "admin"})); m["role"] != "admin" || m["name"] != "" {
				t.Fatalf("membership: %v", m)
			}
			dirCreated(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": una, "role": "member"}))
		})

		t.Run("refusals", func(t *testing.T) {
			expectError(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": una}), http.StatusConflict, "member_exists")
			expectError(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": una, "role": "owner"}), http.StatusConflict, "member_exists")
			expectFields(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": vic, "role": "boss"}), "role")
			expectFields(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": vic, "role": "Owner"}), "role")
			expectFields(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": uuid.NewString()}), "userId")
			expectFields(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": "not-a-uuid"}), "userId")
			expectFields(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{}), "userId")
			dirNotFound(t, e.call(t, http.MethodPost, membersOf(uuid.NewString()), map[string]any{"userId": vic}))
			dirNotFound(t, e.call(t, http.MethodPost, membersOf("not-a-uuid"), map[string]any{"userId": vic}))
			dirBadField(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": vic, "since": "now"}), "since")
			dirBadField(t, e.call(t, http.MethodPost, membersOf(orgB), map[string]any{"userId": 7}), "userId")
			if _, total := members(t, orgB); total != 1 {
				t.Fatalf("org B has %d members after refusals, want 1", total)
			}
		})

		t.Run("list", func(t *testing.T) {
			items, total := members(t, orgA)
			if total != 3 || !slices.Equal(dirValues(items, "userId"), []string{una, vic, wes}) {
				t.Fatalf("members %v (total %d), want una, vic, wes in joining order", dirValues(items, "userId"), total)
			}
			if !slices.Equal(dirValues(items, "role"), []string{"member", "owner", "admin"}) {
				t.Fatalf("roles %v", dirValues(items, "role"))
			}
			for _, m := range items {
				exactKeys(t, m, "userId", "email", "name", "role", "joinedAt")
			}
			page, total := dirList(t, e.call(t, http.MethodGet, membersOf(orgA)+"?limit=2&offset=2", nil), "members", 2, 2)
			if total != 3 || !slices.Equal(dirValues(page, "userId"), []string{wes}) {
				t.Fatalf("second page %v (total %d)", dirValues(page, "userId"), total)
			}
			expectError(t, e.call(t, http.MethodGet, membersOf(orgA)+"?limit=0", nil), http.StatusBadRequest, "invalid_request")
			dirNotFound(t, e.call(t, http.MethodGet, membersOf(uuid.NewString()), nil))
			dirNotFound(t, e.call(t, http.MethodGet, membersOf("not-a-uuid"), nil))

			// A member's e-mail and name are the user's current ones.
			mustOK(t, e.call(t, http.MethodPatch, dirUsersPath+"/"+wes, map[string]any{"name": "Wes", "email": "WES@example.com"}))
			items, _ = members(t, orgA)
			if items[2]["name"] != "Wes" || items[2]["email"] != "WES@example.com" {
				t.Fatalf("member after the user's change: %v", items[2])
			}
		})

		t.Run("remove", func(t *testing.T) {
			if r := e.call(t, http.MethodDelete, membersOf(orgA)+"/"+vic, nil); r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("remove: %s, want 204 without a body", describe(r))
			}
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(orgA)+"/"+vic, nil))
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(orgB)+"/"+vic, nil)) // never a member there
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(orgA)+"/"+uuid.NewString(), nil))
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(orgA)+"/not-a-uuid", nil))
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(uuid.NewString())+"/"+una, nil))
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf("not-a-uuid")+"/"+una, nil))
			items, total := members(t, orgA)
			if total != 2 || !slices.Equal(dirValues(items, "userId"), []string{una, wes}) {
				t.Fatalf("members after removal %v (total %d)", dirValues(items, "userId"), total)
			}
			mustOK(t, e.call(t, http.MethodGet, dirUsersPath+"/"+vic, nil)) // the user stays
			// And may join again.
			dirCreated(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": vic}))
		})

		t.Run("deleting a user ends their memberships", func(t *testing.T) {
			if r := e.call(t, http.MethodDelete, dirUsersPath+"/"+una, nil); r.Status != http.StatusNoContent {
				t.Fatalf("delete user: %s", describe(r))
			}
			items, total := members(t, orgA)
			if total != 2 || !slices.Equal(dirValues(items, "userId"), []string{wes, vic}) {
				t.Fatalf("org A members %v (total %d) after deleting una", dirValues(items, "userId"), total)
			}
			if items, total := members(t, orgB); total != 0 || len(items) != 0 {
				t.Fatalf("org B members %v (total %d) after deleting una", dirValues(items, "userId"), total)
			}
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(orgB)+"/"+una, nil))
		})

		t.Run("deleting an organization ends its memberships", func(t *testing.T) {
			if r := e.call(t, http.MethodDelete, dirOrgsPath+"/"+orgA, nil); r.Status != http.StatusNoContent {
				t.Fatalf("delete org: %s", describe(r))
			}
			dirNotFound(t, e.call(t, http.MethodGet, membersOf(orgA), nil))
			dirNotFound(t, e.call(t, http.MethodDelete, membersOf(orgA)+"/"+wes, nil))
			dirNotFound(t, e.call(t, http.MethodPost, membersOf(orgA), map[string]any{"userId": wes}))
			mustOK(t, e.call(t, http.MethodGet, dirUsersPath+"/"+wes, nil)) // its members stay users
			mustOK(t, e.call(t, http.MethodGet, dirUsersPath+"/"+vic, nil))
			// And a user of a deleted organization can still be deleted.
			if r := e.call(t, http.MethodDelete, dirUsersPath+"/"+wes, nil); r.Status != http.StatusNoContent {
				t.Fatalf("delete user: %s", describe(r))
			}
		})
	})
}

// Roles: create, list, delete, assign and remove (both idempotent), a
// user's roles, the refusals, and what deletions take with them.
func TestDirectoryRoles(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		ula := dirID(e.createUser(t, map[string]any{"email": "ula@example.com"}))
		mo := dirID(e.createUser(t, map[string]any{"email": "mo@example.com"}))
		rolesOf := func(user string) string { return dirUsersPath + "/" + user + "/roles" }
		assign := func(t *testing.T, user, role string) *response {
			t.Helper()
			return e.call(t, http.MethodPost, dirRolesPath+"/assign", map[string]any{"userId": user, "role": role})
		}
		remove := func(t *testing.T, user, role string) *response {
			t.Helper()
			return e.call(t, http.MethodDelete, dirRolesPath+"/remove", map[string]any{"userId": user, "role": role})
		}
		expectMissing := func(t *testing.T, r *response, what string) {
			t.Helper()
			if d := dirNotFound(t, r); d["resource"] != what {
				t.Fatalf("details.resource %v, want %q: %s", d["resource"], what, r.Body)
			}
		}

		t.Run("create", func(t *testing.T) {
			before := time.Now().Add(-time.Second)
			r := e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": "billing.admin", "description": "Runs billing."})
			m := dirCreated(t, r)
			exactKeys(t, m, "name", "description", "createdAt")
			if m["name"] != "billing.admin" || m["description"] != "Runs billing." {
				t.Fatalf("role: %s", r.Body)
			}
			if c := isoZ(t, m["createdAt"]); c.Before(before) || c.After(time.Now().Add(time.Second)) {
				t.Fatalf("createdAt %v is not now", c)
			}
			if m := e.createRole(t, "Auditor", ""); m["description"] != "" {
				t.Fatalf("role: %v", m)
			}
			for _, name := range []string{"a", "ns:role-1_x.y", "Z" + strings.Repeat("9", 63)} {
				if m := e.createRole(t, name, strings.Repeat("d", 500)); m["name"] != name {
					t.Fatalf("role %v, want %q", m["name"], name)
				}
			}
			expectError(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": "billing.admin"}), http.StatusConflict, "role_exists")
		})

		t.Run("bad values", func(t *testing.T) {
			for _, name := range []string{"", "1role", "_role", "-role", "has space", "émile", "role/x", "role😀", "r" + strings.Repeat("x", 64), "assign", "remove"} {
				expectFields(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": name}), "name")
			}
			expectFields(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": "fine", "description": strings.Repeat("d", 501)}), "description")
			expectFields(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{}), "name")
			dirBadField(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": "fine", "scopes": []string{}}), "scopes")
			dirBadField(t, e.call(t, http.MethodPost, dirRolesPath, map[string]any{"name": 5}), "name")
			dirNotFound(t, e.call(t, http.MethodDelete, dirRolesPath+"/fine", nil))
		})

		t.Run("list", func(t *testing.T) {
			all := []string{"Auditor", "Z" + strings.Repeat("9", 63), "a", "billing.admin", "ns:role-1_x.y"}
			items, total := dirList(t, e.call(t, http.MethodGet, dirRolesPath, nil), "roles", 50, 0)
			if total != len(all) || !slices.Equal(dirValues(items, "name"), all) {
				t.Fatalf("roles %v (total %d), want %v by name", dirValues(items, "name"), total, all)
			}
			for _, r := range items {
				exactKeys(t, r, "name", "description", "createdAt")
			}
			page, total := dirList(t, e.call(t, http.MethodGet, dirRolesPath+"?limit=2&offset=2", nil), "roles", 2, 2)
			if total != len(all) || !slices.Equal(dirValues(page, "name"), all[2:4]) {
				t.Fatalf("page %v (total %d), want %v", dirValues(page, "name"), total, all[2:4])
			}
			for _, q := range []string{"limit=0", "limit=201", "offset=-1"} {
				expectError(t, e.call(t, http.MethodGet, dirRolesPath+"?"+q, nil), http.StatusBadRequest, "invalid_request")
			}
		})

		t.Run("assign", func(t *testing.T) {
			if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(ula), nil), ula); len(got) != 0 {
				t.Fatalf("a new user holds %v", got)
			}
			first := assign(t, ula, "billing.admin")
			if got := dirRoleNames(t, first, ula); !slices.Equal(got, []string{"billing.admin"}) {
				t.Fatalf("roles after assign %v", got)
			}
			role := first.JSON(t)["roles"].([]any)[0].(map[string]any)
			if role["description"] != "Runs billing." {
				t.Fatalf("assigned role %v", role)
			}
			// Again: the same answer.
			again := assign(t, ula, "billing.admin")
			if !reflect.DeepEqual(mustOK(t, again), first.JSON(t)) {
				t.Fatalf("second assign %s, first %s", again.Body, first.Body)
			}
			if got := dirRoleNames(t, assign(t, ula, "Auditor"), ula); !slices.Equal(got, []string{"Auditor", "billing.admin"}) {
				t.Fatalf("roles %v, want both by name", got)
			}
			if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(ula), nil), ula); !slices.Equal(got, []string{"Auditor", "billing.admin"}) {
				t.Fatalf("GET roles %v", got)
			}
			if got := dirRoleNames(t, assign(t, mo, "Auditor"), mo); !slices.Equal(got, []string{"Auditor"}) {
				t.Fatalf("mo's roles %v", got)
			}

			expectMissing(t, assign(t, uuid.NewString(), "Auditor"), "user")
			expectMissing(t, assign(t, "not-a-uuid", "Auditor"), "user")
			expectMissing(t, assign(t, ula, "no-such-role"), "role")
			expectMissing(t, assign(t, ula, "auditor"), "role") // names are exact
			expectMissing(t, assign(t, uuid.NewString(), "no-such-role"), "user")
			expectFields(t, e.call(t, http.MethodPost, dirRolesPath+"/assign", map[string]any{}), "userId", "role")
			dirBadField(t, e.call(t, http.MethodPost, dirRolesPath+"/assign", map[string]any{"userId": ula, "role": "Auditor", "orgId": "x"}), "orgId")
			dirBadField(t, e.call(t, http.MethodPost, dirRolesPath+"/assign", map[string]any{"userId": ula, "role": []string{"Auditor"}}), "role")
			dirNotFound(t, e.call(t, http.MethodGet, rolesOf(uuid.NewString()), nil))
			dirNotFound(t, e.call(t, http.MethodGet, rolesOf("not-a-uuid"), nil))
			if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(ula), nil), ula); !slices.Equal(got, []string{"Auditor", "billing.admin"}) {
				t.Fatalf("roles %v after refusals", got)
			}
		})

		t.Run("remove", func(t *testing.T) {
			if got := dirRoleNames(t, remove(t, ula, "billing.admin"), ula); !slices.Equal(got, []string{"Auditor"}) {
				t.Fatalf("roles after remove %v", got)
			}
			// Again, and a role never held: nothing to do, the same answer.
			if got := dirRoleNames(t, remove(t, ula, "billing.admin"), ula); !slices.Equal(got, []string{"Auditor"}) {
				t.Fatalf("roles after a second remove %v", got)
			}
			if got := dirRoleNames(t, remove(t, ula, "a"), ula); !slices.Equal(got, []string{"Auditor"}) {
				t.Fatalf("roles after removing one not held %v", got)
			}
			expectMissing(t, remove(t, ula, "no-such-role"), "role")
			expectMissing(t, remove(t, uuid.NewString(), "Auditor"), "user")
			expectMissing(t, remove(t, "not-a-uuid", "Auditor"), "user")
			dirBadField(t, e.call(t, http.MethodDelete, dirRolesPath+"/remove", map[string]any{"userId": ula, "role": "Auditor", "x": 1}), "x")
			if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(mo), nil), mo); !slices.Equal(got, []string{"Auditor"}) {
				t.Fatalf("another user's roles changed: %v", got)
			}
		})

		t.Run("deleting a role takes its assignments", func(t *testing.T) {
			e.createRole(t, "temp", "first")
			assign(t, ula, "temp")
			assign(t, mo, "temp")
			if r := e.call(t, http.MethodDelete, dirRolesPath+"/temp", nil); r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete role: %s, want 204 without a body", describe(r))
			}
			dirNotFound(t, e.call(t, http.MethodDelete, dirRolesPath+"/temp", nil))
			for _, u := range []string{ula, mo} {
				if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(u), nil), u); !slices.Equal(got, []string{"Auditor"}) {
					t.Fatalf("roles %v after deleting temp", got)
				}
			}
			expectMissing(t, assign(t, ula, "temp"), "role")
			// A new role of the same name is not held by the old holders.
			if m := e.createRole(t, "temp", "second"); m["description"] != "second" {
				t.Fatalf("re-created role %v", m)
			}
			for _, u := range []string{ula, mo} {
				if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(u), nil), u); !slices.Equal(got, []string{"Auditor"}) {
					t.Fatalf("a re-created role came back to a holder of the old one: %v", got)
				}
			}
			items, _ := dirList(t, e.call(t, http.MethodGet, dirRolesPath, nil), "roles", 50, 0)
			if !slices.Contains(dirValues(items, "name"), "temp") {
				t.Fatal("re-created role not listed")
			}
		})

		t.Run("deleting a user takes their roles", func(t *testing.T) {
			if r := e.call(t, http.MethodDelete, dirUsersPath+"/"+mo, nil); r.Status != http.StatusNoContent {
				t.Fatalf("delete user: %s", describe(r))
			}
			dirNotFound(t, e.call(t, http.MethodGet, rolesOf(mo), nil))
			expectMissing(t, assign(t, mo, "Auditor"), "user")
			expectMissing(t, remove(t, mo, "Auditor"), "user")
			// The role stays, and can be deleted.
			if r := e.call(t, http.MethodDelete, dirRolesPath+"/Auditor", nil); r.Status != http.StatusNoContent {
				t.Fatalf("delete role: %s", describe(r))
			}
			if got := dirRoleNames(t, e.call(t, http.MethodGet, rolesOf(ula), nil), ula); len(got) != 0 {
				t.Fatalf("ula's roles %v after deleting Auditor", got)
			}
		})
	})
}

// Races on unique keys: of concurrent writes that cannot all succeed,
// exactly one does and the rest are refused cleanly; idempotent ones all
// succeed.
func TestDirectoryConcurrency(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		e := dirStart(t, dbURL)
		const n = 8

		t.Run("same e-mail", func(t *testing.T) {
			rs := dirBurst(t, n, func(i int) (*response, error) {
				email := "race@example.com"
				switch i % 3 {
				case 1:
					email = "RACE@example.com"
				case 2:
					email = "Race@Example.COM"
				}
				return e.sendJSON(http.MethodPost, dirUsersPath, e.full, map[string]any{"email": email})
			})
			if c := dirTally(t, rs, map[int]string{201: "", 409: "email_exists"}); c[201] != 1 {
				t.Fatalf("%d users created with one address, want 1", c[201])
			}
			if _, total := dirList(t, e.call(t, http.MethodGet, dirUsersPath+"?email=race@example.com", nil), "users", 50, 0); total != 1 {
				t.Fatalf("%d users with the address", total)
			}
		})

		t.Run("same slug", func(t *testing.T) {
			rs := dirBurst(t, n, func(i int) (*response, error) {
				return e.sendJSON(http.MethodPost, dirOrgsPath, e.full, map[string]any{"name": fmt.Sprintf("Race Org%s", strings.Repeat("!", i))})
			})
			if c := dirTally(t, rs, map[int]string{201: "", 409: "slug_exists"}); c[201] != 1 {
				t.Fatalf("%d organizations created with one slug, want 1", c[201])
			}
		})

		t.Run("same role name", func(t *testing.T) {
			rs := dirBurst(t, n, func(int) (*response, error) {
				return e.sendJSON(http.MethodPost, dirRolesPath, e.full, map[string]any{"name": "racer"})
			})
			if c := dirTally(t, rs, map[int]string{201: "", 409: "role_exists"}); c[201] != 1 {
				t.Fatalf("%d roles created with one name, want 1", c[201])
			}
		})

		user := dirID(e.createUser(t, map[string]any{"email": "member@example.com"}))
		org := dirID(e.createOrg(t, map[string]any{"name": "Members Race"}))

		t.Run("same membership", func(t *testing.T) {
			rs := dirBurst(t, n, func(i int) (*response, error) {
				return e.sendJSON(http.MethodPost, dirOrgsPath+"/"+org+"/members", e.full, map[string]any{"userId": user, "role": dirMemberRole(i)})
			})
			if c := dirTally(t, rs, map[int]string{201: "", 409: "member_exists"}); c[201] != 1 {
				t.Fatalf("%d memberships created, want 1", c[201])
			}
			if _, total := dirList(t, e.call(t, http.MethodGet, dirOrgsPath+"/"+org+"/members", nil), "members", 50, 0); total != 1 {
				t.Fatalf("%d members", total)
			}
		})

		t.Run("same assignment", func(t *testing.T) {
			rs := dirBurst(t, n, func(int) (*response, error) {
				return e.sendJSON(http.MethodPost, dirRolesPath+"/assign", e.full, map[string]any{"userId": user, "role": "racer"})
			})
			for _, r := range rs {
				if got := dirRoleNames(t, r, user); !slices.Equal(got, []string{"racer"}) {
					t.Fatalf("roles %v", got)
				}
			}
			rs = dirBurst(t, n, func(int) (*response, error) {
				return e.sendJSON(http.MethodDelete, dirRolesPath+"/remove", e.full, map[string]any{"userId": user, "role": "racer"})
			})
			for _, r := range rs {
				if got := dirRoleNames(t, r, user); len(got) != 0 {
					t.Fatalf("roles %v after concurrent removals", got)
				}
			}
		})

		t.Run("changing to the same e-mail", func(t *testing.T) {
			ids := make([]string, n)
			for i := range ids {
				ids[i] = dirID(e.createUser(t, map[string]any{"email": fmt.Sprintf("mover%d@example.com", i)}))
			}
			rs := dirBurst(t, n, func(i int) (*response, error) {
				return e.sendJSON(http.MethodPatch, dirUsersPath+"/"+ids[i], e.full, map[string]any{"email": "target@example.com"})
			})
			if c := dirTally(t, rs, map[int]string{200: "", 409: "email_exists"}); c[200] != 1 {
				t.Fatalf("%d users moved to one address, want 1", c[200])
			}
			if _, total := dirList(t, e.call(t, http.MethodGet, dirUsersPath+"?email=TARGET@example.com", nil), "users", 50, 0); total != 1 {
				t.Fatalf("%d users with the address", total)
			}
		})
	})
}

// dirMemberRole cycles through the organization roles.
func dirMemberRole(i int) string { return []string{"owner", "admin", "member"}[i%3] }
