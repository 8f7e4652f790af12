package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence/dbtest"
)

const saPath = "/api/v1/service-accounts"

// The service-accounts API with an admin token: every operation, its
// answer's shape, and every kind of bad input.
func TestServiceAccountsAPI(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		auth := bearer(admin)

		// total is the number of accounts the list reports.
		total := func(t *testing.T) float64 {
			t.Helper()
			r := s.as(t).do(http.MethodGet, saPath+"?limit=1", nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("list: %s", describe(r))
			}
			return r.JSON(t)["total"].(float64)
		}

		t.Run("create", func(t *testing.T) {
			s := s.as(t)
			before := time.Now().Add(-time.Second)
			body := map[string]any{
				"name": "billing", "description": "Bills customers.",
				"scopes":       []string{"users:read", "orgs:read"},
				"redirectUris": []string{"https://app.example.com/cb", "http://127.0.0.1:8080/cb", "http://localhost/cb", "http://[::1]:9/cb"},
			}
			r := s.do(http.MethodPost, saPath, body, auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, "id", "clientId", "clientSecret", "name", "description", "scopes", "redirectUris", "createdAt", "updatedAt", "tier")
			if m["tier"] != "free" { // the default tier (issue 18)
				t.Fatalf("tier %v", m["tier"])
			}
			id, _ := m["id"].(string)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("id %q is not a UUID", id)
			}
			if loc := r.Header.Get("Location"); loc != saPath+"/"+id {
				t.Fatalf("Location %q, want %s/%s", loc, saPath, id)
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Fatalf("Content-Type %q", ct)
			}
			if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("an answer with a secret has Cache-Control %q, want no-store", cc)
			}
			clientID, _ := m["clientId"].(string)
			secret, _ := m["clientSecret"].(string)
			if !strings.HasPrefix(clientID, "sa_") || len(clientID) <= len("sa_") {
				t.Fatalf("clientId %q lacks the sa_ prefix", clientID)
			}
			if len(secret) < 43 {
				t.Fatalf("clientSecret %q is shorter than 43 characters (256 bits)", secret)
			}
			if m["name"] != "billing" || m["description"] != "Bills customers." ||
				!slices.Equal(strs(m["scopes"]), []string{"users:read", "orgs:read"}) ||
				!slices.Equal(strs(m["redirectUris"]), body["redirectUris"].([]string)) {
				t.Fatalf("fields not as sent: %s", r.Body)
			}
			created := isoZ(t, m["createdAt"])
			if created.Before(before) || created.After(time.Now().Add(time.Second)) {
				t.Fatalf("createdAt %v is not now", created)
			}
			isoZ(t, m["updatedAt"])

			// The credentials work at once, with the scopes given.
			tr := decodeToken(t, s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(clientID, secret)...))
			if got := strings.Fields(tr.Scope); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"orgs:read", "users:read"}) {
				t.Fatalf("token scope %q", tr.Scope)
			}

			// Another account gets other credentials; optional fields default.
			o := s.do(http.MethodPost, saPath, map[string]any{"name": "minimal"}, auth...)
			if o.Status != http.StatusCreated {
				t.Fatalf("create minimal: %s", describe(o))
			}
			om := o.JSON(t)
			if om["clientId"] == clientID || om["clientSecret"] == secret || om["id"] == id {
				t.Fatalf("second account reuses credentials: %s", o.Body)
			}
			if om["description"] != "" || len(strs(om["scopes"])) != 0 || len(strs(om["redirectUris"])) != 0 {
				t.Fatalf("defaults: %s", o.Body)
			}
			if _, ok := om["scopes"].([]any); !ok {
				t.Fatalf("scopes must be an empty array, not %v", om["scopes"])
			}

			// The JSON media type with parameters is the JSON media type.
			if r := s.do(http.MethodPost, saPath, `{"name":"charset"}`, append(auth, "Content-Type", "application/json; charset=utf-8")...); r.Status != http.StatusCreated {
				t.Fatalf("application/json; charset=utf-8: %s", describe(r))
			}
		})

		t.Run("duplicates are removed", func(t *testing.T) {
			s := s.as(t)
			a := s.do(http.MethodPost, saPath, map[string]any{
				"name":         "dupes",
				"scopes":       []string{"users:read", "orgs:read", "users:read", "orgs:read"},
				"redirectUris": []string{"https://a.example/cb", "https://a.example/cb"},
			}, auth...)
			if a.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(a))
			}
			m := a.JSON(t)
			if !slices.Equal(strs(m["scopes"]), []string{"users:read", "orgs:read"}) || !slices.Equal(strs(m["redirectUris"]), []string{"https://a.example/cb"}) {
				t.Fatalf("duplicates kept: %s", a.Body)
			}
			g := s.do(http.MethodGet, saPath+"/"+m["id"].(string), nil, auth...).JSON(t)
			if !slices.Equal(strs(g["scopes"]), []string{"users:read", "orgs:read"}) {
				t.Fatalf("stored scopes %v", g["scopes"])
			}
		})

		t.Run("get never shows the secret", func(t *testing.T) {
			s := s.as(t)
			a := s.createAccount(admin, map[string]any{"name": "getter", "description": "d", "scopes": []string{"roles:read"}, "redirectUris": []string{"https://g.example/cb"}})
			r := s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("get: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, "id", "clientId", "name", "description", "scopes", "redirectUris", "createdAt", "updatedAt", "tier")
			if strings.Contains(string(r.Body), a.ClientSecret) {
				t.Fatal("GET shows the client secret")
			}
			if m["id"] != a.ID || m["clientId"] != a.ClientID || m["name"] != "getter" || m["description"] != "d" ||
				!slices.Equal(strs(m["scopes"]), []string{"roles:read"}) || !slices.Equal(strs(m["redirectUris"]), []string{"https://g.example/cb"}) {
				t.Fatalf("get: %s", r.Body)
			}
			isoZ(t, m["createdAt"])
		})

		t.Run("list", func(t *testing.T) {
			s := s.as(t)
			for i := range 5 {
				s.createAccount(admin, map[string]any{"name": fmt.Sprintf("list-%d", i)})
			}
			r := s.do(http.MethodGet, saPath, nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("list: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, "serviceAccounts", "total", "limit", "offset")
			if m["limit"] != float64(50) || m["offset"] != float64(0) {
				t.Fatalf("default page: limit %v offset %v", m["limit"], m["offset"])
			}
			all := m["serviceAccounts"].([]any)
			n := int(m["total"].(float64))
			if n != len(all) || n < 7 {
				t.Fatalf("total %d, %d items", n, len(all))
			}
			// Oldest first: the bootstrap admin, and the five just made last, in order.
			var ids, names []string
			var prev time.Time
			for _, x := range all {
				sa := x.(map[string]any)
				if _, ok := sa["clientSecret"]; ok {
					t.Fatal("list shows a client secret")
				}
				c := isoZ(t, sa["createdAt"])
				if c.Before(prev) {
					t.Fatalf("list not ordered by createdAt: %v after %v", c, prev)
				}
				prev = c
				ids = append(ids, sa["id"].(string))
				names = append(names, sa["name"].(string))
			}
			if all[0].(map[string]any)["clientId"] != s.AdminID {
				t.Fatalf("first account is %v, want the bootstrap admin", all[0])
			}
			if !slices.Equal(names[n-5:], []string{"list-0", "list-1", "list-2", "list-3", "list-4"}) {
				t.Fatalf("newest names %v", names[n-5:])
			}

			// Pages of two walk the same order, with the same total.
			var paged []string
			for off := 0; off < n; off += 2 {
				p := s.do(http.MethodGet, fmt.Sprintf("%s?limit=2&offset=%d", saPath, off), nil, auth...)
				pm := p.JSON(t)
				if p.Status != http.StatusOK || pm["total"] != float64(n) || pm["limit"] != float64(2) || pm["offset"] != float64(off) {
					t.Fatalf("page at %d: %s", off, describe(p))
				}
				items := pm["serviceAccounts"].([]any)
				if want := min(2, n-off); len(items) != want {
					t.Fatalf("page at %d has %d items, want %d", off, len(items), want)
				}
				for _, x := range items {
					paged = append(paged, x.(map[string]any)["id"].(string))
				}
			}
			if !slices.Equal(paged, ids) {
				t.Fatalf("paged order %v, want %v", paged, ids)
			}

			// Past the end: an empty array, the same total; the limits' edges.
			for _, q := range []string{fmt.Sprintf("offset=%d", n), "offset=1000000"} {
				p := s.do(http.MethodGet, saPath+"?"+q, nil, auth...)
				pm := p.JSON(t)
				if items, ok := pm["serviceAccounts"].([]any); p.Status != http.StatusOK || !ok || len(items) != 0 || pm["total"] != float64(n) {
					t.Fatalf("%s: %s", q, describe(p))
				}
			}
			for _, q := range []string{"limit=1", "limit=200"} {
				if p := s.do(http.MethodGet, saPath+"?"+q, nil, auth...); p.Status != http.StatusOK {
					t.Fatalf("%s: %s", q, describe(p))
				}
			}
		})

		t.Run("list rejects bad paging", func(t *testing.T) {
			for _, c := range []struct{ query, field string }{
				{"limit=0", "limit"}, {"limit=201", "limit"}, {"limit=abc", "limit"}, {"limit=-1", "limit"}, {"limit=1.5", "limit"},
				{"offset=-1", "offset"}, {"offset=abc", "offset"}, {"offset=2.5", "offset"},
			} {
				t.Run(c.query, func(t *testing.T) {
					d := expectError(t, s.as(t).do(http.MethodGet, saPath+"?"+c.query, nil, auth...), http.StatusBadRequest, "invalid_request")
					if d["field"] != c.field {
						t.Fatalf("details %v, want field %q", d, c.field)
					}
				})
			}
		})

		t.Run("patch", func(t *testing.T) {
			s := s.as(t)
			a := s.createAccount(admin, map[string]any{"name": "patchy", "description": "before", "scopes": []string{"users:read"}, "redirectUris": []string{"https://p.example/cb"}})
			orig := s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...).JSON(t)
			want := map[string]any{"name": "patchy", "description": "before", "scopes": []string{"users:read"}, "redirectUris": []string{"https://p.example/cb"}}
			for _, c := range []struct {
				name  string
				patch map[string]any
			}{
				{"name", map[string]any{"name": "renamed"}},
				{"description", map[string]any{"description": "after"}},
				{"scopes", map[string]any{"scopes": []string{"orgs:read", "roles:read"}}},
				{"redirectUris", map[string]any{"redirectUris": []string{"https://q.example/cb", "http://localhost:3000/cb"}}},
				{"empty description", map[string]any{"description": ""}},
				{"nothing", map[string]any{}},
			} {
				r := s.do(http.MethodPatch, saPath+"/"+a.ID, c.patch, auth...)
				if r.Status != http.StatusOK {
					t.Fatalf("%s: %s", c.name, describe(r))
				}
				for k, v := range c.patch {
					want[k] = v
				}
				for _, got := range []map[string]any{r.JSON(t), s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...).JSON(t)} {
					if _, ok := got["clientSecret"]; ok {
						t.Fatalf("%s: PATCH answer shows the secret", c.name)
					}
					if got["id"] != a.ID || got["clientId"] != a.ClientID || got["createdAt"] != orig["createdAt"] ||
						got["name"] != want["name"] || got["description"] != want["description"] ||
						!slices.Equal(strs(got["scopes"]), want["scopes"].([]string)) ||
						!slices.Equal(strs(got["redirectUris"]), want["redirectUris"].([]string)) {
						t.Fatalf("%s: record %v, want %v", c.name, got, want)
					}
					if isoZ(t, got["updatedAt"]).Before(isoZ(t, orig["updatedAt"])) {
						t.Fatalf("%s: updatedAt went back", c.name)
					}
				}
			}
			// The new scopes govern new tokens at once; the secret is unchanged.
			if r := s.do(http.MethodPost, "/api/v1/oauth/token", ccForm("users:read"), basic(a.ClientID, a.ClientSecret)...); r.Status != http.StatusBadRequest {
				t.Fatalf("token for a scope patched away: %s", describe(r))
			}
			decodeToken(t, s.do(http.MethodPost, "/api/v1/oauth/token", ccForm("roles:read"), basic(a.ClientID, a.ClientSecret)...))

			// Bad patches are refused and change nothing.
			before := s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...).Body
			for _, c := range []struct {
				name, body, field string
			}{
				{"blank name", `{"name":"  "}`, "name"},
				{"unknown scope", `{"scopes":["nope"]}`, "scopes[0]"},
				{"bad redirect", `{"redirectUris":["http://evil.example/cb"]}`, "redirectUris[0]"},
			} {
				d := expectError(t, s.do(http.MethodPatch, saPath+"/"+a.ID, c.body, auth...), http.StatusBadRequest, "invalid_request")
				if f, _ := d["fields"].(map[string]any); f[c.field] == nil {
					t.Fatalf("%s: details %v do not name %s", c.name, d, c.field)
				}
			}
			for _, c := range []struct{ name, body, code string }{
				{"wrong type", `{"scopes":"orgs:read"}`, "invalid_request"},
				{"unknown field", `{"clientSecret":"mine"}`, "invalid_request"},
				{"malformed", `{"name":`, "invalid_json"},
				{"empty", ``, "invalid_json"},
			} {
				expectError(t, s.do(http.MethodPatch, saPath+"/"+a.ID, c.body, append(auth, "Content-Type", "application/json")...), http.StatusBadRequest, c.code)
			}
			if after := s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...).Body; string(after) != string(before) {
				t.Fatalf("a refused PATCH changed the record:\n%s\n%s", before, after)
			}
		})

		t.Run("delete", func(t *testing.T) {
			s := s.as(t)
			a := s.createAccount(admin, map[string]any{"name": "doomed", "scopes": []string{"users:read"}})
			n := total(t)
			r := s.do(http.MethodDelete, saPath+"/"+a.ID, nil, auth...)
			if r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete: %s", describe(r))
			}
			if total(t) != n-1 {
				t.Fatal("the list still counts the deleted account")
			}
			expectError(t, s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, saPath+"/"+a.ID, nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodPatch, saPath+"/"+a.ID, map[string]any{"name": "x"}, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, auth...), http.StatusNotFound, "not_found")
			expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(a.ClientID, a.ClientSecret)...), http.StatusUnauthorized, "invalid_client")
		})

		t.Run("rotate", func(t *testing.T) {
			s := s.as(t)
			a := s.createAccount(admin, map[string]any{"name": "rotor"})
			before := time.Now().Add(-time.Second)
			r := s.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("rotate: %s", describe(r))
			}
			if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("an answer with a secret has Cache-Control %q, want no-store", cc)
			}
			m := r.JSON(t)
			exactKeys(t, m, "clientId", "clientSecret", "rotatedAt")
			secret, _ := m["clientSecret"].(string)
			if m["clientId"] != a.ClientID || len(secret) < 43 || secret == a.ClientSecret {
				t.Fatalf("rotate answer %s", r.Body)
			}
			rotated := isoZ(t, m["rotatedAt"])
			if rotated.Before(before) || rotated.After(time.Now().Add(time.Second)) {
				t.Fatalf("rotatedAt %v is not now", rotated)
			}
			g := s.do(http.MethodGet, saPath+"/"+a.ID, nil, auth...)
			if strings.Contains(string(g.Body), secret) {
				t.Fatal("GET shows the rotated secret")
			}
			if gm := g.JSON(t); gm["rotatedAt"] != m["rotatedAt"] {
				t.Fatalf("GET rotatedAt %v, rotate said %v", gm["rotatedAt"], m["rotatedAt"])
			}
			// A second rotation gives yet another secret.
			again := s.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, auth...).JSON(t)
			if again["clientSecret"] == secret || again["clientSecret"] == a.ClientSecret {
				t.Fatal("a rotation repeated a secret")
			}
		})

		t.Run("unknown and malformed ids", func(t *testing.T) {
			for _, id := range []string{uuid.NewString(), "nope", "123", "sa_abc", strings.Repeat("a", 300)} {
				for _, c := range []struct {
					method, suffix string
					body           any
				}{
					{http.MethodGet, "", nil}, {http.MethodPatch, "", map[string]any{"name": "x"}},
					{http.MethodDelete, "", nil}, {http.MethodPost, "/rotate", nil},
				} {
					t.Run(c.method+" "+id[:min(len(id), 12)]+c.suffix, func(t *testing.T) {
						expectError(t, s.as(t).do(c.method, saPath+"/"+id+c.suffix, c.body, auth...), http.StatusNotFound, "not_found")
					})
				}
			}
		})

		t.Run("validation", func(t *testing.T) {
			n := total(t)
			for _, c := range []struct {
				name   string
				body   map[string]any
				fields []string
			}{
				{"missing name", map[string]any{"description": "x"}, []string{"name"}},
				{"null name", map[string]any{"name": nil}, []string{"name"}},
				{"empty name", map[string]any{"name": ""}, []string{"name"}},
				{"blank name", map[string]any{"name": " \t "}, []string{"name"}},
				{"name too long", map[string]any{"name": strings.Repeat("n", 201)}, []string{"name"}},
				{"control character in name", map[string]any{"name": "a\x01b"}, []string{"name"}},
				{"description too long", map[string]any{"name": "x", "description": strings.Repeat("d", 2001)}, []string{"description"}},
				{"unknown scope", map[string]any{"name": "x", "scopes": []string{"users:read", "nope"}}, []string{"scopes[1]"}},
				{"empty scope", map[string]any{"name": "x", "scopes": []string{""}}, []string{"scopes[0]"}},
				{"unknown scope after a duplicate", map[string]any{"name": "x", "scopes": []string{"users:read", "users:read", "nope"}}, []string{"scopes[2]"}},
				{"relative redirect", map[string]any{"name": "x", "redirectUris": []string{"/callback"}}, []string{"redirectUris[0]"}},
				{"redirect with fragment", map[string]any{"name": "x", "redirectUris": []string{"https://a.example/cb#frag"}}, []string{"redirectUris[0]"}},
				{"redirect with userinfo", map[string]any{"name": "x", "redirectUris": []string{"https://user:pw@a.example/cb"}}, []string{"redirectUris[0]"}},
				{"http on a public host", map[string]any{"name": "x", "redirectUris": []string{"http://a.example/cb"}}, []string{"redirectUris[0]"}},
				{"ftp redirect", map[string]any{"name": "x", "redirectUris": []string{"ftp://a.example/cb"}}, []string{"redirectUris[0]"}},
				{"every bad redirect at once", map[string]any{"name": "x", "redirectUris": []string{
					"https://ok.example/cb", "/callback", "https://a.example/cb#f", "https://u@a.example/cb", "http://a.example/cb", "ftp://a.example/cb",
				}}, []string{"redirectUris[1]", "redirectUris[2]", "redirectUris[3]", "redirectUris[4]", "redirectUris[5]"}},
				{"every field at once", map[string]any{"name": "", "scopes": []string{"nope"}, "redirectUris": []string{"ftp://a.example"}}, []string{"name", "scopes[0]", "redirectUris[0]"}},
			} {
				t.Run(c.name, func(t *testing.T) {
					d := expectError(t, s.as(t).do(http.MethodPost, saPath, c.body, auth...), http.StatusBadRequest, "invalid_request")
					fields, _ := d["fields"].(map[string]any)
					var got []string
					for k, v := range fields {
						if msg, _ := v.(string); msg == "" {
							t.Fatalf("field %s has no message: %v", k, d)
						}
						got = append(got, k)
					}
					slices.Sort(got)
					if want := slices.Sorted(slices.Values(c.fields)); !slices.Equal(got, want) {
						t.Fatalf("details.fields names %v, want %v", got, want)
					}
				})
			}
			if total(t) != n {
				t.Fatal("a refused create made an account")
			}
		})

		t.Run("malformed bodies", func(t *testing.T) {
			n := total(t)
			for _, c := range []struct {
				name, body, code, field string
			}{
				{"scopes not an array", `{"name":"x","scopes":"users:read"}`, "invalid_request", "scopes"},
				{"name not a string", `{"name":5}`, "invalid_request", "name"},
				{"description not a string", `{"name":"x","description":true}`, "invalid_request", "description"},
				{"redirectUris an object", `{"name":"x","redirectUris":{}}`, "invalid_request", "redirectUris"},
				{"unknown field", `{"name":"x","color":"blue"}`, "invalid_request", "color"},
				{"secret may not be chosen", `{"name":"x","clientSecret":"mine"}`, "invalid_request", "clientSecret"},
				{"malformed JSON", `{"name":"x"`, "invalid_json", ""},
				{"not JSON", `name=x`, "invalid_json", ""},
				{"empty body", ``, "invalid_json", ""},
				{"whitespace only", " \n ", "invalid_json", ""},
				{"array body", `[{"name":"x"}]`, "invalid_request", ""},
				{"string body", `"x"`, "invalid_request", ""},
				{"null body", `null`, "invalid_request", ""},
				{"trailing garbage", `{"name":"x"} garbage`, "invalid_json", ""},
				{"two objects", `{"name":"x"}{"name":"y"}`, "invalid_json", ""},
				{"trailing brace", `{"name":"x"}}`, "invalid_json", ""},
			} {
				t.Run(c.name, func(t *testing.T) {
					d := expectError(t, s.as(t).do(http.MethodPost, saPath, c.body, append(auth, "Content-Type", "application/json")...), http.StatusBadRequest, c.code)
					if c.field != "" && d["field"] != c.field {
						t.Fatalf("details %v, want field %q", d, c.field)
					}
				})
			}
			if total(t) != n {
				t.Fatal("a malformed create made an account")
			}
		})

		t.Run("body size", func(t *testing.T) {
			n := total(t)
			big := []byte(`{"name":"big","description":"` + strings.Repeat("d", 1<<20) + `"}`)
			headers := append([]string{"Content-Type", "application/json"}, auth...)
			for _, chunked := range []bool{false, true} {
				r := s.raw(t, http.MethodPost, saPath, big, chunked, headers...)
				d := expectError(t, r, http.StatusRequestEntityTooLarge, "payload_too_large")
				if d["maxBytes"] != float64(1<<20) {
					t.Fatalf("chunked %v: details %v", chunked, d)
				}
			}
			// Just under the limit the body is read, and judged on its fields.
			under := []byte(`{"name":"big","description":"` + strings.Repeat("d", 1<<20-100) + `"}`)
			for _, chunked := range []bool{false, true} {
				d := expectError(t, s.raw(t, http.MethodPost, saPath, under, chunked, headers...), http.StatusBadRequest, "invalid_request")
				if f, _ := d["fields"].(map[string]any); f["description"] == nil {
					t.Fatalf("details %v", d)
				}
			}
			if total(t) != n {
				t.Fatal("an oversize create made an account")
			}
		})

		t.Run("content type", func(t *testing.T) {
			for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "garbage/"} {
				t.Run(ct, func(t *testing.T) {
					expectError(t, s.as(t).do(http.MethodPost, saPath, `{"name":"x"}`, append(auth, "Content-Type", ct)...), http.StatusUnsupportedMediaType, "unsupported_media_type")
					expectError(t, s.as(t).do(http.MethodPatch, saPath+"/"+uuid.NewString(), `{"name":"x"}`, append(auth, "Content-Type", ct)...), http.StatusUnsupportedMediaType, "unsupported_media_type")
				})
			}
		})

		t.Run("routes", func(t *testing.T) {
			for _, c := range []struct {
				method, path string
				status       int
				code         string
			}{
				{http.MethodGet, "/api/v1/nope", http.StatusNotFound, "not_found"},
				{http.MethodGet, "/nope", http.StatusNotFound, "not_found"},
				{http.MethodGet, "/api/v1/service-accounts/" + uuid.NewString() + "/nope", http.StatusNotFound, "not_found"},
				{http.MethodPut, saPath, http.StatusMethodNotAllowed, "method_not_allowed"},
				{http.MethodDelete, saPath, http.StatusMethodNotAllowed, "method_not_allowed"},
				{http.MethodPut, saPath + "/" + uuid.NewString(), http.StatusMethodNotAllowed, "method_not_allowed"},
				{http.MethodGet, saPath + "/" + uuid.NewString() + "/rotate", http.StatusMethodNotAllowed, "method_not_allowed"},
			} {
				t.Run(c.method+" "+c.path, func(t *testing.T) {
					// With and without a token: routing comes first.
					expectError(t, s.as(t).do(c.method, c.path, nil, auth...), c.status, c.code)
					expectError(t, s.as(t).do(c.method, c.path, nil), c.status, c.code)
				})
			}
		})

		// RFC 9110 §15.5.6: a 405 response MUST carry Allow with the
		// methods the resource supports.
		t.Run("405 lists the allowed methods", func(t *testing.T) {
			for _, c := range []struct {
				method, path string
				allow        []string
			}{
				{http.MethodPut, saPath, []string{"GET", "POST"}},
				{http.MethodPut, saPath + "/" + uuid.NewString(), []string{"DELETE", "GET", "PATCH"}},
				{http.MethodGet, "/api/v1/oauth/token", []string{"POST"}},
			} {
				r := s.as(t).do(c.method, c.path, nil, auth...)
				var got []string
				for _, v := range r.Header.Values("Allow") {
					for m := range strings.SplitSeq(v, ",") {
						if m = strings.TrimSpace(m); m != "" && m != "HEAD" && m != "OPTIONS" {
							got = append(got, m)
						}
					}
				}
				slices.Sort(got)
				if r.Status != http.StatusMethodNotAllowed || !slices.Equal(got, c.allow) {
					t.Errorf("%s %s: %d with Allow %q, want 405 with Allow %v", c.method, c.path, r.Status, r.Header.Values("Allow"), c.allow)
				}
			}
		})
	})
}

// Authentication of API calls (RFC 6750): the three kinds of refusal, and
// whoami for any valid token.
func TestAPIAuthentication(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		victim := s.createAccount(admin, map[string]any{"name": "victim", "scopes": []string{"users:read", "tokens:introspect"}})
		user := s.token(victim.ClientID, victim.ClientSecret, "")
		adminWithoutAdmin := s.token(s.AdminID, s.AdminSecret, "users:read orgs:read")

		// A well-formed token the server never issued: a real one, altered.
		forged := user[:len(user)-2] + "AA"
		if strings.HasSuffix(user, "AA") {
			forged = user[:len(user)-2] + "BB"
		}

		routes := []struct {
			method, path string
			body         any
		}{
			{http.MethodGet, saPath, nil},
			{http.MethodPost, saPath, map[string]any{"name": "intruder"}},
			{http.MethodGet, saPath + "/" + victim.ID, nil},
			{http.MethodPatch, saPath + "/" + victim.ID, map[string]any{"name": "pwned"}},
			{http.MethodDelete, saPath + "/" + victim.ID, nil},
			{http.MethodPost, saPath + "/" + victim.ID + "/rotate", nil},
		}
		for _, rt := range routes {
			t.Run(rt.method+" "+rt.path, func(t *testing.T) {
				s := s.as(t)
				for _, h := range [][]string{nil, {"Authorization", ""}, {"Authorization", "Bearer"}, {"Authorization", "Bearer "}, basic(s.AdminID, s.AdminSecret), {"Authorization", "Token " + admin}} {
					r := s.do(rt.method, rt.path, rt.body, h...)
					expectError(t, r, http.StatusUnauthorized, "unauthorized")
					if got := r.Header.Values("WWW-Authenticate"); len(got) != 1 || got[0] != `Bearer realm="identityd"` {
						t.Fatalf("Authorization %q: WWW-Authenticate %q, want exactly Bearer realm=\"identityd\"", h, got)
					}
				}
				for _, tok := range []string{"garbage", forged, "a.b", strings.Repeat("x", 5000)} {
					r := s.do(rt.method, rt.path, rt.body, bearer(tok)...)
					expectError(t, r, http.StatusUnauthorized, "invalid_token")
					if h := r.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer ") || !strings.Contains(h, `error="invalid_token"`) {
						t.Fatalf("WWW-Authenticate %q lacks error=\"invalid_token\"", h)
					}
				}
				for _, tok := range []string{user, adminWithoutAdmin} {
					r := s.do(rt.method, rt.path, rt.body, bearer(tok)...)
					if d := expectError(t, r, http.StatusForbidden, "insufficient_scope"); d["requiredScope"] != "admin" {
						t.Fatalf("details %v, want requiredScope admin", d)
					}
					if h := r.Header.Get("WWW-Authenticate"); !strings.Contains(h, `error="insufficient_scope"`) {
						t.Fatalf("WWW-Authenticate %q lacks error=\"insufficient_scope\"", h)
					}
				}
			})
		}
		// None of it changed anything.
		g := s.do(http.MethodGet, saPath+"/"+victim.ID, nil, bearer(admin)...).JSON(t)
		if g["name"] != "victim" {
			t.Fatalf("victim changed: %v", g)
		}
		l := s.do(http.MethodGet, saPath, nil, bearer(admin)...).JSON(t)
		if l["total"] != float64(2) {
			t.Fatalf("accounts: %v", l["total"])
		}
		decodeToken(t, s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(victim.ClientID, victim.ClientSecret)...))

		t.Run("whoami", func(t *testing.T) {
			s := s.as(t)
			acct := s.createAccount(admin, map[string]any{"name": "who", "scopes": []string{"users:read", "orgs:read", "roles:read"}})
			for _, c := range []struct {
				scope string
				want  []string
			}{
				{"orgs:read", []string{"orgs:read"}},
				{"users:read roles:read", []string{"roles:read", "users:read"}},
				{"", []string{"orgs:read", "roles:read", "users:read"}},
			} {
				before := time.Now()
				tok := s.token(acct.ClientID, acct.ClientSecret, c.scope)
				for _, scheme := range []string{"Bearer ", "bearer "} {
					r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, "Authorization", scheme+tok)
					if r.Status != http.StatusOK {
						t.Fatalf("whoami: %s", describe(r))
					}
					m := r.JSON(t)
					exactKeys(t, m, "sub", "id", "clientId", "name", "type", "scopes", "expiresAt")
					got := strs(m["scopes"])
					slices.Sort(got)
					if m["id"] != acct.ID || m["sub"] != acct.ClientID || m["clientId"] != acct.ClientID || m["name"] != "who" || m["type"] != "service_account" || !slices.Equal(got, c.want) {
						t.Fatalf("whoami for scope %q: %s", c.scope, r.Body)
					}
					exp := isoZ(t, m["expiresAt"])
					if exp.Before(before.Add(3599*time.Second)) || exp.After(time.Now().Add(3601*time.Second)) {
						t.Fatalf("expiresAt %v, want an hour from now", exp)
					}
				}
			}
			// The admin's own token, and refusals.
			if m := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(admin)...).JSON(t); m["clientId"] != s.AdminID || !slices.Equal(strs(m["scopes"]), []string{"admin"}) {
				t.Fatalf("admin whoami: %v", m)
			}
			r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil)
			expectError(t, r, http.StatusUnauthorized, "unauthorized")
			if h := r.Header.Get("WWW-Authenticate"); h != `Bearer realm="identityd"` {
				t.Fatalf("WWW-Authenticate %q", h)
			}
			r = s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(forged)...)
			expectError(t, r, http.StatusUnauthorized, "invalid_token")
			if h := r.Header.Get("WWW-Authenticate"); !strings.Contains(h, `error="invalid_token"`) {
				t.Fatalf("WWW-Authenticate %q", h)
			}
		})
	})
}

// A token stops working when it expires: whoami refuses it and
// introspection calls it inactive.
func TestExpiredToken(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_ACCESS_TOKEN_TTL=1")
		admin := s.adminToken()
		acct := s.createAccount(admin, map[string]any{"name": "short-lived", "scopes": []string{"users:read"}})
		r := s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(acct.ClientID, acct.ClientSecret)...)
		tr := decodeToken(t, r)
		if tr.ExpiresIn != 1 {
			t.Fatalf("expires_in %v, want 1", tr.ExpiresIn)
		}
		// Valid at first (so that what follows tests expiry, nothing else).
		w := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tr.AccessToken)...)
		if w.Status != http.StatusOK {
			t.Fatalf("fresh token refused: %s", describe(w))
		}
		expectActive(t, s.introspect(t, tr.AccessToken, acct.ClientID, acct.ClientSecret), acct.ClientID)

		time.Sleep(time.Until(isoZ(t, w.JSON(t)["expiresAt"])) + 250*time.Millisecond)

		w = s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tr.AccessToken)...)
		expectError(t, w, http.StatusUnauthorized, "invalid_token")
		if h := w.Header.Get("WWW-Authenticate"); !strings.Contains(h, `error="invalid_token"`) {
			t.Fatalf("WWW-Authenticate %q", h)
		}
		expectInactive(t, s.introspect(t, tr.AccessToken, acct.ClientID, acct.ClientSecret))
		expectInactive(t, s.introspect(t, tr.AccessToken, s.AdminID, s.AdminSecret))
		// Revoking an expired token is a success (RFC 7009 §2.2).
		if r := s.do(http.MethodPost, "/api/v1/oauth/revoke", url.Values{"token": {tr.AccessToken}}, basic(acct.ClientID, acct.ClientSecret)...); r.Status != http.StatusOK {
			t.Fatalf("revoke expired: %s", describe(r))
		}
	})
}

// Rotation and deletion bite at once: the old secret, the deleted account's
// credentials and tokens all fail; tokens from before a rotation live on.
func TestCredentialLifecycle(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		a := s.createAccount(admin, map[string]any{"name": "lifecycle", "scopes": []string{"users:read"}})
		tokBefore := s.token(a.ClientID, a.ClientSecret, "")

		rot := s.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, bearer(admin)...).JSON(t)
		newSecret := rot["clientSecret"].(string)

		// The old secret fails at once, both ways, with a Basic challenge for Basic.
		r := s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(a.ClientID, a.ClientSecret)...)
		expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
		if h := r.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Basic ") {
			t.Fatalf("invalid_client after Basic: WWW-Authenticate %q, want a Basic challenge", h)
		}
		expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/token", post(ccForm(""), a.ClientID, a.ClientSecret)), http.StatusUnauthorized, "invalid_client")
		expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/introspect", url.Values{"token": {tokBefore}}, basic(a.ClientID, a.ClientSecret)...), http.StatusUnauthorized, "invalid_client")
		expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/revoke", url.Values{"token": {tokBefore}}, basic(a.ClientID, a.ClientSecret)...), http.StatusUnauthorized, "invalid_client")

		// The new one works both ways.
		tokAfter := decodeToken(t, s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(a.ClientID, newSecret)...)).AccessToken
		decodeToken(t, s.do(http.MethodPost, "/api/v1/oauth/token", post(ccForm(""), a.ClientID, newSecret)))

		// Tokens from before the rotation keep working.
		if w := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tokBefore)...); w.Status != http.StatusOK {
			t.Fatalf("pre-rotation token refused: %s", describe(w))
		}
		expectActive(t, s.introspect(t, tokBefore, a.ClientID, newSecret), a.ClientID)

		// Deletion: tokens inactive, refused by whoami, credentials fail.
		if d := s.do(http.MethodDelete, saPath+"/"+a.ID, nil, bearer(admin)...); d.Status != http.StatusNoContent {
			t.Fatalf("delete: %s", describe(d))
		}
		for _, tok := range []string{tokBefore, tokAfter} {
			expectInactive(t, s.introspect(t, tok, s.AdminID, s.AdminSecret))
			w := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tok)...)
			expectError(t, w, http.StatusUnauthorized, "invalid_token")
		}
		for _, secret := range []string{newSecret, a.ClientSecret} {
			expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/token", ccForm(""), basic(a.ClientID, secret)...), http.StatusUnauthorized, "invalid_client")
			expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/token", post(ccForm(""), a.ClientID, secret)), http.StatusUnauthorized, "invalid_client")
		}
		expectRFC6749(t, s.do(http.MethodPost, "/api/v1/oauth/introspect", url.Values{"token": {tokAfter}}, basic(a.ClientID, newSecret)...), http.StatusUnauthorized, "invalid_client")
	})
}
