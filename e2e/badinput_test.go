package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Bad input over real HTTP on each dialect: bytes that are not UTF-8 and
// NUL characters in paths, queries, headers, JSON bodies and OAuth
// parameters, numbers beyond what PostgreSQL's numeric holds, and JSON
// nested 100,000 deep. Each is a 400 that says where, before anything is
// stored, the same on SQLite and PostgreSQL (which answered 500 for all of
// it); an agent's call or token request with such an intent header is
// refused and stays on its trail, and nothing fails to be recorded.

// badJSON sends body, as it is, as a JSON body.
func badJSON(t *testing.T, s *server, method, path, tok, body string) *response {
	t.Helper()
	return s.as(t).do(method, path, body, "Content-Type", "application/json", "Authorization", "Bearer "+tok)
}

// expectPart checks a 400 invalid_request refusing one part of a request.
func expectPart(t *testing.T, r *response, part string) map[string]any {
	t.Helper()
	d := expectError(t, r, http.StatusBadRequest, "invalid_request")
	if d["part"] != part {
		t.Fatalf("details.part %v, want %q: %s", d["part"], part, r.Body)
	}
	return d
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		dir := s.createAccount(s.adminToken(), map[string]any{"name": "badinput-directory", "scopes": dirScopes})
		dirTok := s.token(dir.ClientID, dir.ClientSecret, "")
		_, plain := s.registryToken(s.adminToken(), "badinput-reader", "users:read")
		ag := intentAgent(t, s, super, "badinput-agent", "read_users")
		agentTok := decodeToken(t, intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "", nil)).AccessToken

		t.Run("paths", func(t *testing.T) {
			for _, c := range []struct{ method, path, tok string }{
				{http.MethodGet, "/api/v1/rar/types/%FF", plain}, // any token reads the registry
				{http.MethodGet, "/api/v1/rar/types/%00", plain},
				{http.MethodGet, "/api/v1/rar/types/a%C3%28", plain},
				{http.MethodDelete, "/api/v1/m2m/roles/%FF", dirTok},
				{http.MethodGet, "/api/v1/m2m/users/%FF", dirTok},
				{http.MethodGet, "/api/v1/audit/intent/tasks/%FF", super},
				{http.MethodGet, "/api/v1/audit/intent/chains/%00", super},
				{http.MethodGet, "/api/v1/audit/intent/chains/%FF/trace", super},
				{http.MethodGet, "/api/v1/agents/%FF/audit", super},
				{http.MethodGet, "/api/v1/invites/%FF", ""},
				{http.MethodGet, "/nowhere/%00", ""},
			} {
				expectPart(t, s.as(t).do(c.method, c.path, nil, bearer(c.tok)...), "path")
			}
			// Text is fine: an unknown type with a non-ASCII name is 404.
			expectError(t, s.as(t).do(http.MethodGet, "/api/v1/rar/types/caf%C3%A9", nil, bearer(plain)...), http.StatusNotFound, "not_found")
		})

		t.Run("queries", func(t *testing.T) {
			for _, q := range []string{"intentAction=%FF", "intentInitiator=a%00", "agentClientId=%00", "agentClientId=agt_%FF"} {
				d := expectPart(t, s.as(t).do(http.MethodGet, "/api/v1/audit/intent/search?"+q, nil, bearer(super)...), "query")
				if name, _, _ := strings.Cut(q, "="); d["field"] != name {
					t.Fatalf("details.field %v, want %s", d["field"], name)
				}
			}
			expectPart(t, s.as(t).do(http.MethodGet, "/api/v1/m2m/users?q=%FF", nil, bearer(dirTok)...), "query")
			expectPart(t, s.as(t).do(http.MethodGet, "/api/v1/m2m/users?email=a%00@example.com", nil, bearer(dirTok)...), "query")
			expectPart(t, s.as(t).do(http.MethodGet, "/api/v1/agents?status=%FF", nil, bearer(super)...), "query")
			mustOK(t, s.as(t).do(http.MethodGet, "/api/v1/audit/intent/search?intentInitiator=%C3%A9", nil, bearer(super)...))
		})

		t.Run("JSON bodies", func(t *testing.T) {
			user := func(t *testing.T, body string) *response {
				return badJSON(t, s, http.MethodPost, dirUsersPath, dirTok, body)
			}
			for name, body := range map[string]string{
				"NUL in metadata":        `{"email":"nul1@example.com","metadata":{"k":"a\u0000b"}}`,
				"NUL in a metadata name": `{"email":"nul2@example.com","metadata":{"k\u0000":"b"}}`,
				"NUL deep in metadata":   `{"email":"nul3@example.com","metadata":{"a":[{"b":{"c":["\u0000"]}}]}}`,
				"NUL in a name":          `{"email":"nul4@example.com","name":"a\u0000"}`,
				"a raw 0xFF in e-mail":   "{\"email\":\"b\xff@example.com\"}",
				"a raw 0xFF in metadata": "{\"email\":\"ff@example.com\",\"metadata\":{\"k\":\"\xff\"}}",
				"an unpaired surrogate":  `{"email":"sur@example.com","name":"\ud800"}`,
				"a number beyond jsonb":  `{"email":"num@example.com","metadata":{"n":1e131072}}`,
				"a tiny number too":      `{"email":"num@example.com","metadata":{"n":1e-16384}}`,
			} {
				t.Run(name, func(t *testing.T) {
					d := expectPart(t, user(t, body), "body")
					if _, ok := d["offset"].(float64); !ok {
						t.Fatalf("details without the offset: %v", d)
					}
				})
			}
			// Nothing of it was stored.
			if _, total := dirList(t, s.as(t).do(http.MethodGet, dirUsersPath, nil, bearer(dirTok)...), "users", 50, 0); total != 0 {
				t.Fatalf("%d users stored from refused bodies", total)
			}
			// An escaped U+FFFD is a character like any other; 1e400 and
			// 1e-16383 fit, and read back as sent.
			r := user(t, `{"email":"b\uFFFD@example.com","metadata":{"n":1e400,"m":1e-16383}}`)
			var u map[string]any
			dec := json.NewDecoder(bytes.NewReader(r.Body))
			dec.UseNumber() // 1e400 is beyond float64
			if err := dec.Decode(&u); r.Status != http.StatusCreated || err != nil ||
				u["email"] != "b\uFFFD@example.com" || !bytes.Contains(r.Body, []byte(`"metadata":{"m":1e-16383,"n":1e400}`)) {
				t.Fatalf("%s (%v)", describe(r), err)
			}
			// PATCH, organizations, roles, RAR types and validation alike.
			expectPart(t, badJSON(t, s, http.MethodPatch, dirUsersPath+"/"+dirID(u), dirTok, `{"metadata":{"x":"\u0000"}}`), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, dirOrgsPath, dirTok, `{"name":"Org","metadata":{"\u0000":1}}`), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, dirOrgsPath, dirTok, `{"name":"Org","metadata":{"n":1e999999999}}`), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, dirRolesPath, dirTok, "{\"name\":\"r\xff\"}"), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, "/api/v1/rar/types", super, `{"type":"nul","schema":{"description":"\u0000"}}`), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, "/api/v1/rar/types", super, `{"type":"big","schema":{"maximum":1e999999}}`), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, "/api/v1/rar/validate", plain, `{"authorization_details":[{"type":"x","k":"\u0000"}]}`), "body")
			expectPart(t, badJSON(t, s, http.MethodPost, agentsPath, super, "{\"name\":\"\xff\",\"type\":\"service\"}"), "body")
		})

		t.Run("headers", func(t *testing.T) {
			// A credential is text identityd looks up: refused.
			r := s.as(t).do(http.MethodGet, "/api/v1/rar/types", nil, "Authorization", "Bearer "+plain+"\xff")
			if d := expectPart(t, r, "header"); d["header"] != "Authorization" {
				t.Fatalf("details.header %v, want Authorization", d["header"])
			}
			// Headers identityd does not read may carry obs-text (RFC 9110 §5.5).
			mustOK(t, s.as(t).do(http.MethodGet, "/api/v1/rar/types", nil, append(bearer(plain), "User-Agent", "Latin-1 \xe9")...))
			// A NUL in a header value never gets past net/http: 400.
			for _, h := range []string{"X-Anything", intentHReason, intentHTask} {
				r := s.raw(t, http.MethodGet, "/api/v1/m2m/whoami", nil, false, "Authorization", "Bearer "+agentTok, h, "a\x00b")
				if r.Status != http.StatusBadRequest {
					t.Fatalf("%s with NUL: %s", h, describe(r))
				}
			}
		})

		// An agent's call with a non-UTF-8 intent header is refused, and on
		// its trail (without the headers); so is its token request. Before,
		// on PostgreSQL, the call succeeded with no api_call entry, and the
		// token endpoint answered 500 with nothing recorded.
		t.Run("intent headers on API calls", func(t *testing.T) {
			for _, h := range []string{intentHReason, intentHInitiator, intentHTask, intentHAction} {
				r := intentCall(t, s, agentTok, http.MethodGet, dirUsersPath, intentHeader(h, "r\xff"))
				if d := expectError(t, r, http.StatusBadRequest, "invalid_intent_header"); d["header"] != h {
					t.Fatalf("details.header %v, want %s", d["header"], h)
				}
			}
			calls, _ := intentAwaitAudit(t, s, super, ag.ID, "action=api_call", 4)
			if len(calls) != 4 {
				t.Fatalf("%d api_call entries for 4 refused calls: %v", len(calls), calls)
			}
			for _, e := range calls {
				if e["endpoint"] != "GET "+dirUsersPath || e["status"] != float64(400) || intentOf(t, e) != nil {
					t.Fatalf("api_call entry %v, want GET %s, 400, no intent", e, dirUsersPath)
				}
			}
		})
		t.Run("intent headers at the token endpoint", func(t *testing.T) {
			r := intentTokenReq(t, s, ag.ClientID, ag.ClientSecret, "", intentHeader(intentHReason, "r\xff"))
			expectRFC6749(t, r, http.StatusBadRequest, "invalid_request")
			refused := s.auditEntries(t, super, ag.ID, "token_refused")
			if len(refused) != 1 || refused[0]["details"].(map[string]any)["error"] != "invalid_request" || intentOf(t, refused[0]) != nil {
				t.Fatalf("token_refused entries %v, want one invalid_request without intent", refused)
			}
		})

		t.Run("OAuth parameters", func(t *testing.T) {
			form := func(kv ...string) string {
				parts := []string{"grant_type=client_credentials"}
				for i := 0; i+1 < len(kv); i += 2 {
					parts = append(parts, kv[i]+"="+kv[i+1]) // as written: %00 and %FF stay escapes
				}
				return strings.Join(parts, "&")
			}
			formType := []string{"Content-Type", "application/x-www-form-urlencoded"}
			jsonType := []string{"Content-Type", "application/json"}
			basicRaw := func(id string) []string {
				return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte(id+":"+ag.ClientSecret))}
			}
			for _, c := range []struct {
				name, path, body string
				headers          []string
			}{
				{"client_id %00", tokenPath, form("client_id", "%00", "client_secret", "x"), formType},
				{"client_id %FF", tokenPath, form("client_id", "%FF", "client_secret", "x"), formType},
				{"an agent's client_id with %FF", "/oauth/token", form("client_id", ag.ClientID+"%FF", "client_secret", ag.ClientSecret), formType},
				{"scope %00", tokenPath, form("scope", "users:read%00"), append(formType, basic(ag.ClientID, ag.ClientSecret)...)},
				{"JSON client_id NUL", tokenPath, `{"grant_type":"client_credentials","client_id":"\u0000","client_secret":"x"}`, jsonType},
				{"JSON client_id 0xFF", tokenPath, "{\"grant_type\":\"client_credentials\",\"client_id\":\"" + ag.ClientID + "\xff\",\"client_secret\":\"x\"}", jsonType},
				{"JSON authorization_details NUL", tokenPath, `{"grant_type":"client_credentials","authorization_details":[{"type":"x","k":"\u0000"}]}`, append(jsonType, basic(ag.ClientID, ag.ClientSecret)...)},
				{"Basic with 0xFF", tokenPath, form(), append(formType, basicRaw(ag.ClientID+"\xff")...)},
				{"Basic with %FF", tokenPath, form(), append(formType, basicRaw(ag.ClientID+"%FF")...)},
				{"introspection token %00", "/api/v1/oauth/introspect", "token=%00", append(formType, basic(s.AdminID, s.AdminSecret)...)},
				{"revocation token %FF", "/api/v1/oauth/revoke", "token=%FF", append(formType, basic(s.AdminID, s.AdminSecret)...)},
				{"token endpoint query", tokenPath + "?x=%FF", form(), append(formType, basic(ag.ClientID, ag.ClientSecret)...)},
				{"token endpoint header", tokenPath, form(), append(formType, "Authorization", "Basic \xff")},
			} {
				t.Run(c.name, func(t *testing.T) {
					expectRFC6749(t, s.as(t).do(http.MethodPost, c.path, c.body, c.headers...), http.StatusBadRequest, "invalid_request")
				})
			}
			// authorization_details in a form: NUL and numbers out of range.
			for _, details := range []string{`[{"type":"x","k":"\u0000"}]`, `[{"type":"x","n":1e999999}]`} {
				r := s.as(t).do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "authorization_details": {details}}, basic(ag.ClientID, ag.ClientSecret)...)
				expectRFC6749(t, r, http.StatusBadRequest, "invalid_authorization_details")
			}
		})

		// JSON nested 100,000 deep, at an API route and the token endpoint,
		// several at once: 400s, and the server lives on.
		t.Run("deep nesting", func(t *testing.T) {
			deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
			var wg sync.WaitGroup
			errs := make(chan string, 40)
			for range 10 {
				wg.Go(func() {
					for _, c := range []struct{ path, body, auth string }{
						{"/api/v1/rar/validate", `{"authorization_details":` + deep + `}`, "Bearer " + plain},
						{dirUsersPath, `{"email":"deep@example.com","metadata":{"a":` + deep + `}}`, "Bearer " + dirTok},
						{dirUsersPath, deep, "Bearer " + dirTok},
						{tokenPath, `{"grant_type":"client_credentials","authorization_details":` + deep + `}`, basic(ag.ClientID, ag.ClientSecret)[1]},
					} {
						r, err := send(http.MethodPost, s.URL+c.path, strings.NewReader(c.body), "Content-Type", "application/json", "Authorization", c.auth)
						if err != nil || r.Status != http.StatusBadRequest {
							errs <- fmt.Sprintf("%s: %v %v", c.path, err, r)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Error(e)
			}
			form := url.Values{"grant_type": {"client_credentials"}, "authorization_details": {strings.Repeat("[", 16000) + strings.Repeat("]", 16000)}}
			expectRFC6749(t, s.as(t).do(http.MethodPost, tokenPath, form, basic(ag.ClientID, ag.ClientSecret)...), http.StatusBadRequest, "invalid_authorization_details")
			if r := s.as(t).do(http.MethodGet, "/health", nil); r.Status != http.StatusOK {
				t.Fatalf("health after deep bodies: %s", describe(r))
			}
		})

		// Every agent audit entry these requests called for was recorded.
		t.Run("no audit failures", func(t *testing.T) {
			samples, text := s.scrape(t)
			for _, action := range []string{"api_call", "token_refused"} {
				if !strings.Contains(text, `identityd_audit_failures_total{action="`+action+`"}`) {
					t.Fatalf("/metrics has no identityd_audit_failures_total for %s", action)
				}
				if v := value(samples, "identityd_audit_failures_total", map[string]string{"action": action}); v != 0 {
					t.Fatalf("%v %s entries failed to be recorded", v, action)
				}
			}
			if strings.Contains(s.logs.String(), `"level":"ERROR"`) {
				t.Fatalf("errors logged:\n%s", s.logs)
			}
		})
	})
}

// A RAR type whose schema applies itself to the same value again ($ref to
// itself) was accepted and then refused every entry as a "reference
// cycle"; it is refused at registration, naming the cycle. A tree's
// recursive schema is registered and used as before.
func TestRARSchemaCycles(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		for name, schema := range map[string]any{
			"itself":        map[string]any{"$ref": "#"},
			"through allOf": map[string]any{"allOf": []any{map[string]any{"$ref": "#"}}},
			"two definitions": map[string]any{"$ref": "#/$defs/a", "$defs": map[string]any{
				"a": map[string]any{"$ref": "#/$defs/b"}, "b": map[string]any{"$ref": "#/$defs/a"}}},
		} {
			t.Run(name, func(t *testing.T) {
				r := s.as(t).do(http.MethodPost, "/api/v1/rar/types", map[string]any{"type": "cyclic", "allowedActions": []string{"read"}, "schema": schema}, bearer(super)...)
				d := expectError(t, r, http.StatusBadRequest, "invalid_request")
				if f, _ := d["fields"].(map[string]any); !strings.Contains(fmt.Sprint(f["schema"]), "refers back to itself") {
					t.Fatalf("details %v, want the schema's cycle named", d)
				}
				expectError(t, s.as(t).do(http.MethodGet, "/api/v1/rar/types/cyclic", nil, bearer(super)...), http.StatusNotFound, "not_found")
			})
		}
		tree := map[string]any{"$ref": "#/$defs/node", "$defs": map[string]any{"node": map[string]any{
			"type": "object", "properties": map[string]any{"children": map[string]any{"type": "array", "items": map[string]any{"$ref": "#/$defs/node"}}}}}}
		r := s.as(t).do(http.MethodPost, "/api/v1/rar/types", map[string]any{"type": "tree", "allowedActions": []string{"read"}, "schema": tree}, bearer(super)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("a tree's schema: %s", describe(r))
		}
		validate := func(entry string) map[string]any {
			return mustOK(t, s.as(t).do(http.MethodPost, "/api/v1/rar/validate", `{"authorization_details":[`+entry+`]}`, "Content-Type", "application/json", "Authorization", "Bearer "+super))
		}
		if v := validate(`{"type":"tree","children":[{"children":[]}]}`); v["valid"] != true {
			t.Fatalf("a tree: %v", v)
		}
		if v := validate(`{"type":"tree","children":[{"children":[5]}]}`); v["valid"] != false || strings.Contains(fmt.Sprint(v["errors"]), "cycle") {
			t.Fatalf("a tree with a number for a node: %v", v)
		}
	})
}

// Every route, hosted pages and OAuth endpoints included, refuses a form
// body or query whose parameters are not text (NUL, bytes that are not
// UTF-8) with a 400 in its own audience's shape (RFC 6749, a page, the
// embedded API's, the envelope), before anything reaches
// SQL: on PostgreSQL a form client_id of %FF answered 500 at
// forgot-password, logout and sign-out. The routes are those the server
// documents, which TestOpenAPICoversRoutes holds equal to the router's:
// a new route is walked too.
func TestBadBytesEveryRoute(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		var doc struct {
			Paths map[string]map[string]any `json:"paths"`
		}
		if r := s.as(t).do(http.MethodGet, "/api/v1/openapi.json", nil); r.Status != http.StatusOK || json.Unmarshal(r.Body, &doc) != nil {
			t.Fatalf("the OpenAPI document: %s", describe(r))
		}
		for _, p := range []string{"/signin/forgot-password", "/signout", "/api/v1/oauth/logout", tokenPath, "/signin/email", "/approvals/{requestId}"} {
			if doc.Paths[p]["post"] == nil {
				t.Fatalf("POST %s is not among the documented routes", p)
			}
		}
		pathParam := regexp.MustCompile(`\{[^}]+\}`)
		// Each bad value in client_id; two of them in each other parameter.
		params := []string{"email", "token", "flow", "csrf_token", "state", "redirect_uri", "post_logout_redirect_uri", "id_token_hint", "grant_type", "%FF"}
		values := []string{"%00", "%FF", "a%C3%28", "a\xffb", "x%00y"}
		var bads []string
		for _, v := range values {
			bads = append(bads, "client_id="+v)
		}
		for i, name := range params {
			bads = append(bads, name+"="+values[i%len(values)], name+"="+values[(i+1)%len(values)])
		}
		oauthEndpoints := map[string]bool{tokenPath: true, "/oauth/token": true, "/api/v1/oauth/introspect": true, "/api/v1/oauth/revoke": true, backchannelPath: true}
		isPage := func(p string) bool {
			for _, prefix := range []string{"/signin", "/signout", "/approvals/", "/delegations/consent/", "/account/", "/api/v1/oauth/authorize", "/oauth/authorize", "/api/v1/oauth/logout", "/api/v1/embedded/auth/magic-link/verify"} {
				if strings.HasPrefix(p, prefix) {
					return true
				}
			}
			return false
		}
		walked := 0
		check := func(what string, r *response, part string) {
			t.Helper()
			walked++
			switch tpl := strings.Fields(what)[1]; {
			case r.Status != http.StatusBadRequest:
				t.Errorf("%s: %s", what, describe(r))
			case oauthEndpoints[tpl]:
				if m := r.JSON(t); m["error"] != "invalid_request" || m["error_description"] == nil || m["message"] != nil {
					t.Errorf("%s: not an RFC 6749 invalid_request: %s", what, r.Body)
				}
			case isPage(tpl):
				if !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") || !bytes.Contains(r.Body, []byte("cannot read")) {
					t.Errorf("%s: not a page: %s", what, describe(r))
				}
			case strings.HasPrefix(tpl, "/api/v1/embedded/"):
				if m := r.JSON(t); m["error"] != "invalid_request" || m["error_description"] == nil || m["message"] != nil {
					t.Errorf("%s: not the embedded API's invalid_request: %s", what, r.Body)
				}
			default:
				if m := r.JSON(t); m["error"] != "invalid_request" || m["details"].(map[string]any)["part"] != part {
					t.Errorf("%s: not the envelope's invalid_request in the %s: %s", what, part, r.Body)
				}
			}
		}
		for tpl, ops := range doc.Paths {
			path := pathParam.ReplaceAllString(tpl, "0192d8a4-5f6e-7000-8000-000000000000")
			for method := range ops {
				method = strings.ToUpper(method)
				if !slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}, method) {
					continue
				}
				// The query (which the server checked before) with one bad
				// parameter; a form body with each.
				bad := bads[walked%len(bads)]
				check(fmt.Sprintf("%s %s with %s in the query", method, tpl, bad), s.as(t).do(method, path+"?"+bad, nil), "query")
				if method == http.MethodGet {
					continue
				}
				for i, bad := range bads {
					body := "scope=openid&response_type=code&" + bad
					if i%2 == 1 {
						body = bad + "&scope=openid&response_type=code"
					}
					r := s.as(t).do(method, path, body, "Content-Type", "application/x-www-form-urlencoded")
					check(fmt.Sprintf("%s %s with %s in the form body", method, tpl, bad), r, "body")
				}
			}
		}
		if walked < 500 {
			t.Fatalf("only %d requests walked", walked)
		}
		if strings.Contains(s.logs.String(), `"level":"ERROR"`) {
			t.Fatalf("errors logged:\n%s", s.logs)
		}
	})
}
