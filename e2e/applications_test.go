package e2e

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence/dbtest"
)

const appsPath = "/api/v1/applications"

// appFields are the members of every application answer but create's.
var appFields = []string{"id", "clientId", "name", "type", "redirectUris", "postLogoutRedirectUris", "webOrigins", "rpId",
	"signInMethods", "mfa", "accessTokenFormat", "idTokenSigningAlg", "accessTokenTtl", "refreshTokenTtl", "adminConsole", "allowSignUp", "passwordResetUri",
	"createdAt", "updatedAt"}

// registerApp registers an application through the API and answers its
// client id and secret ("" for a public one).
func (s *server) registerApp(t *testing.T, admin string, body map[string]any) (string, string) {
	t.Helper()
	r := s.as(t).do(http.MethodPost, appsPath, body, bearer(admin)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("register application: %s", describe(r))
	}
	out := r.JSON(t)
	secret, _ := out["clientSecret"].(string)
	return out["clientId"].(string), secret
}

// clientAuth tells whether the token endpoint takes clientID and secret:
// an application authenticates there (its grants are authorization_code
// and refresh_token, so a client_credentials request it makes is then
// refused as unauthorized_client), a wrong secret is invalid_client.
func clientAuth(t *testing.T, s *server, clientID, secret string) bool {
	t.Helper()
	r := s.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(clientID, secret)...)
	switch {
	case r.Status == http.StatusUnauthorized:
		expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
		return false
	case r.Status == http.StatusBadRequest:
		expectRFC6749(t, r, http.StatusBadRequest, "unauthorized_client")
		return true
	}
	t.Fatalf("token endpoint: %s", describe(r))
	return false
}

// The applications API with an admin token over real HTTP: every
// operation, its answer's shape, the rules, and bad input.
func TestApplicationsAPI(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		auth := bearer(admin)
		total := func(t *testing.T) float64 {
			t.Helper()
			r := s.as(t).do(http.MethodGet, appsPath+"?limit=1", nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("list: %s", describe(r))
			}
			return r.JSON(t)["total"].(float64)
		}
		create := func(t *testing.T, body any) map[string]any {
			t.Helper()
			r := s.as(t).do(http.MethodPost, appsPath, body, auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(r))
			}
			return r.JSON(t)
		}

		var web map[string]any // the confidential application made first
		t.Run("create", func(t *testing.T) {
			body := map[string]any{
				"name": "Acme Notes", "type": "confidential",
				"redirectUris":           []string{"https://notes.acme.example/callback", "http://127.0.0.1:8080/cb"},
				"postLogoutRedirectUris": []string{"https://notes.acme.example/bye"},
				"webOrigins":             []string{"https://notes.acme.example", "https://app.acme.example:8443"},
				"rpId":                   "acme.example",
				"signInMethods":          []string{"password", "passkey"},
				"mfa":                    map[string]any{"policy": "required", "factors": []string{"totp", "passkey"}},
				"accessTokenFormat":      "jwt", "idTokenSigningAlg": "ES256",
				"accessTokenTtl": 600, "refreshTokenTtl": 86400, "adminConsole": true,
			}
			r := s.as(t).do(http.MethodPost, appsPath, body, auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(r))
			}
			web = r.JSON(t)
			exactKeys(t, web, append([]string{"clientSecret"}, appFields...)...)
			id, _ := web["id"].(string)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("id %q is not a UUID", id)
			}
			if loc := r.Header.Get("Location"); loc != appsPath+"/"+id {
				t.Fatalf("Location %q", loc)
			}
			if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
				t.Fatalf("an answer with a secret has Cache-Control %q", cc)
			}
			clientID, _ := web["clientId"].(string)
			secret, _ := web["clientSecret"].(string)
			if !strings.HasPrefix(clientID, "app_") || len(clientID) < len("app_")+26 || len(secret) != 43 {
				t.Fatalf("credentials %q %q", clientID, secret)
			}
			mfa, _ := web["mfa"].(map[string]any)
			if web["name"] != "Acme Notes" || web["type"] != "confidential" || web["rpId"] != "acme.example" ||
				!slices.Equal(strs(web["redirectUris"]), body["redirectUris"].([]string)) ||
				!slices.Equal(strs(web["postLogoutRedirectUris"]), body["postLogoutRedirectUris"].([]string)) ||
				!slices.Equal(strs(web["webOrigins"]), body["webOrigins"].([]string)) ||
				!slices.Equal(strs(web["signInMethods"]), []string{"password", "passkey"}) ||
				mfa["policy"] != "required" || !slices.Equal(strs(mfa["factors"]), []string{"totp", "passkey"}) ||
				web["accessTokenFormat"] != "jwt" || web["idTokenSigningAlg"] != "ES256" ||
				web["accessTokenTtl"] != float64(600) || web["refreshTokenTtl"] != float64(86400) || web["adminConsole"] != true {
				t.Fatalf("fields not as sent: %s", r.Body)
			}
			isoZ(t, web["createdAt"])
			isoZ(t, web["updatedAt"])
			// The credentials authenticate the application at once.
			if !clientAuth(t, s, clientID, secret) {
				t.Fatal("the new secret does not authenticate")
			}
		})

		t.Run("defaults", func(t *testing.T) {
			m := create(t, map[string]any{"name": "Minimal", "redirectUris": []string{"https://min.example.com/cb"}})
			mfa, _ := m["mfa"].(map[string]any)
			if m["type"] != "confidential" || m["rpId"] != "min.example.com" || m["clientSecret"] == "" ||
				!slices.Equal(strs(m["signInMethods"]), []string{"password", "otp", "magic-link"}) ||
				mfa["policy"] != "off" || len(strs(mfa["factors"])) != 0 || mfa["factors"] == nil ||
				m["accessTokenFormat"] != "opaque" || m["idTokenSigningAlg"] != "RS256" ||
				m["accessTokenTtl"] != nil || m["refreshTokenTtl"] != nil || m["adminConsole"] != false || m["allowSignUp"] != false || m["passwordResetUri"] != nil {
				t.Fatalf("defaults: %v", m)
			}
			for _, k := range []string{"postLogoutRedirectUris", "webOrigins"} {
				if l, ok := m[k].([]any); !ok || len(l) != 0 {
					t.Fatalf("%s must be an empty array: %v", k, m[k])
				}
			}
			for _, k := range []string{"accessTokenTtl", "refreshTokenTtl"} {
				if v, ok := m[k]; !ok || v != nil {
					t.Fatalf("%s must be null (the server's default): %v", k, m)
				}
			}
		})

		t.Run("public native application", func(t *testing.T) {
			r := s.as(t).do(http.MethodPost, appsPath, map[string]any{
				"name": "Acme Mobile", "type": "public", "redirectUris": []string{"com.acme.notes:/callback", "http://127.0.0.1/cb"},
			}, auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, appFields...) // no clientSecret at all
			if m["type"] != "public" || m["rpId"] != "" {
				t.Fatalf("public: %s", r.Body)
			}
			// No secret to rotate: 409.
			expectError(t, s.as(t).do(http.MethodPost, appsPath+"/"+m["id"].(string)+"/rotate", nil, auth...), http.StatusConflict, "no_secret")
			// A private-use scheme is for public applications only.
			d := expectError(t, s.as(t).do(http.MethodPost, appsPath, map[string]any{
				"name": "Web", "redirectUris": []string{"com.acme.notes:/callback"},
			}, auth...), http.StatusBadRequest, "invalid_request")
			if f, _ := d["fields"].(map[string]any); f["redirectUris[0]"] == nil {
				t.Fatalf("details %v", d)
			}
		})

		t.Run("get and list never show the secret", func(t *testing.T) {
			r := s.as(t).do(http.MethodGet, appsPath+"/"+web["id"].(string), nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("get: %s", describe(r))
			}
			g := r.JSON(t)
			exactKeys(t, g, appFields...)
			if g["clientId"] != web["clientId"] || g["createdAt"] != web["createdAt"] || g["rpId"] != "acme.example" {
				t.Fatalf("get: %s", r.Body)
			}
			// identityd's own application (made at start) comes first.
			l := s.as(t).do(http.MethodGet, appsPath+"?limit=1&offset=0", nil, auth...)
			own := l.JSON(t)["applications"].([]any)[0].(map[string]any)
			if own["clientId"] != "app_identityd" || own["type"] != "public" || strs(own["redirectUris"])[0] != s.URL+"/account/callback" {
				t.Fatalf("identityd's own application: %s", l.Body)
			}
			for _, r := range []*response{
				s.as(t).do(http.MethodPatch, appsPath+"/"+own["id"].(string), map[string]any{"name": "mine"}, auth...),
				s.as(t).do(http.MethodDelete, appsPath+"/"+own["id"].(string), nil, auth...),
			} {
				expectError(t, r, http.StatusConflict, "reserved_application")
			}
			l = s.as(t).do(http.MethodGet, appsPath+"?limit=2&offset=1", nil, auth...)
			if l.Status != http.StatusOK {
				t.Fatalf("list: %s", describe(l))
			}
			m := l.JSON(t)
			exactKeys(t, m, "applications", "total", "limit", "offset")
			page, _ := m["applications"].([]any)
			if len(page) != 2 || m["total"] != float64(4) || m["limit"] != float64(2) || m["offset"] != float64(1) {
				t.Fatalf("list: %s", l.Body)
			}
			first := page[0].(map[string]any)
			exactKeys(t, first, appFields...)
			if first["id"] != web["id"] { // oldest first
				t.Fatalf("first of the list %v, want %v", first["id"], web["id"])
			}
			if strings.Contains(string(l.Body), web["clientSecret"].(string)) {
				t.Fatal("the list shows a secret")
			}
			expectError(t, s.as(t).do(http.MethodGet, appsPath+"?limit=201", nil, auth...), http.StatusBadRequest, "invalid_request")
			expectError(t, s.as(t).do(http.MethodGet, appsPath+"/"+uuid.NewString(), nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.as(t).do(http.MethodGet, appsPath+"/not-a-uuid", nil, auth...), http.StatusNotFound, "not_found")
		})

		t.Run("patch", func(t *testing.T) {
			path := appsPath + "/" + web["id"].(string)
			r := s.as(t).do(http.MethodPatch, path, map[string]any{
				"name": "Acme Notes 2", "accessTokenTtl": nil, "mfa": map[string]any{"policy": "optional", "factors": []string{"totp"}},
				"redirectUris": []string{"https://notes.acme.example/cb2"}, "description": nil,
			}, auth...)
			expectError(t, r, http.StatusBadRequest, "invalid_request") // description is no field of an application
			r = s.as(t).do(http.MethodPatch, path, map[string]any{
				"name": "Acme Notes 2", "accessTokenTtl": nil, "mfa": map[string]any{"policy": "optional", "factors": []string{"totp"}},
				"redirectUris": []string{"https://notes.acme.example/cb2"}, "adminConsole": nil,
			}, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("patch: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, appFields...)
			mfa, _ := m["mfa"].(map[string]any)
			if m["name"] != "Acme Notes 2" || m["accessTokenTtl"] != nil || m["refreshTokenTtl"] != float64(86400) ||
				mfa["policy"] != "optional" || !slices.Equal(strs(m["redirectUris"]), []string{"https://notes.acme.example/cb2"}) ||
				m["adminConsole"] != true || m["rpId"] != "acme.example" || m["createdAt"] != web["createdAt"] {
				t.Fatalf("patched: %s", r.Body)
			}
			if isoZ(t, m["updatedAt"]).Before(isoZ(t, web["updatedAt"])) {
				t.Fatal("updatedAt went back")
			}
			// The type cannot change.
			d := expectError(t, s.as(t).do(http.MethodPatch, path, map[string]any{"type": "public"}, auth...), http.StatusBadRequest, "invalid_request")
			if d["field"] != "type" {
				t.Fatalf("details %v", d)
			}
			// Every problem at once; nothing changes.
			d = expectError(t, s.as(t).do(http.MethodPatch, path, map[string]any{
				"name": "", "webOrigins": []string{"https://elsewhere.example.org", "https://notes.acme.example/"},
				"signInMethods": []string{}, "mfa": map[string]any{"policy": "required", "factors": []string{}},
				"refreshTokenTtl": 10, "accessTokenFormat": "paseto",
			}, auth...), http.StatusBadRequest, "invalid_request")
			fields, _ := d["fields"].(map[string]any)
			for _, f := range []string{"name", "webOrigins[0]", "webOrigins[1]", "signInMethods", "mfa.factors", "refreshTokenTtl", "accessTokenFormat"} {
				if fields[f] == nil {
					t.Fatalf("%s not reported: %v", f, fields)
				}
			}
			if g := s.as(t).do(http.MethodGet, path, nil, auth...).JSON(t); g["name"] != "Acme Notes 2" {
				t.Fatalf("a refused patch changed the application: %v", g)
			}
			expectError(t, s.as(t).do(http.MethodPatch, appsPath+"/"+uuid.NewString(), map[string]any{"name": "x"}, auth...), http.StatusNotFound, "not_found")
		})

		t.Run("rotate", func(t *testing.T) {
			clientID, old := web["clientId"].(string), web["clientSecret"].(string)
			r := s.as(t).do(http.MethodPost, appsPath+"/"+web["id"].(string)+"/rotate", nil, auth...)
			if r.Status != http.StatusOK {
				t.Fatalf("rotate: %s", describe(r))
			}
			m := r.JSON(t)
			exactKeys(t, m, "clientId", "clientSecret", "rotatedAt")
			fresh, _ := m["clientSecret"].(string)
			if m["clientId"] != clientID || len(fresh) != 43 || fresh == old {
				t.Fatalf("rotate: %s", r.Body)
			}
			isoZ(t, m["rotatedAt"])
			if clientAuth(t, s, clientID, old) {
				t.Fatal("the old secret still authenticates after rotation")
			}
			if !clientAuth(t, s, clientID, fresh) {
				t.Fatal("the new secret does not authenticate")
			}
			if g := s.as(t).do(http.MethodGet, appsPath+"/"+web["id"].(string), nil, auth...).JSON(t); g["rotatedAt"] == nil {
				t.Fatalf("rotatedAt not shown: %v", g)
			}
			web["clientSecret"] = fresh
			expectError(t, s.as(t).do(http.MethodPost, appsPath+"/"+uuid.NewString()+"/rotate", nil, auth...), http.StatusNotFound, "not_found")
		})

		t.Run("bad input", func(t *testing.T) {
			before := total(t)
			for name, c := range map[string]struct {
				body, code, field, part string
			}{
				"NUL in name":           {`{"name":"a\u0000","redirectUris":["https://a.example/cb"]}`, "invalid_request", "", "body"},
				"NUL in a redirect URI": {`{"name":"a","redirectUris":["https://a.example/\u0000"]}`, "invalid_request", "", "body"},
				"raw 0xFF":              {"{\"name\":\"\xff\",\"redirectUris\":[\"https://a.example/cb\"]}", "invalid_request", "", "body"},
				"unpaired surrogate":    {`{"name":"\ud800","redirectUris":["https://a.example/cb"]}`, "invalid_request", "", "body"},
				"redirectUris a string": {`{"name":"a","redirectUris":"https://a.example/cb"}`, "invalid_request", "redirectUris", ""},
				"ttl a string":          {`{"name":"a","redirectUris":["https://a.example/cb"],"accessTokenTtl":"600"}`, "invalid_request", "accessTokenTtl", ""},
				"ttl a fraction":        {`{"name":"a","redirectUris":["https://a.example/cb"],"refreshTokenTtl":600.5}`, "invalid_request", "refreshTokenTtl", ""},
				"ttl huge":              {`{"name":"a","redirectUris":["https://a.example/cb"],"accessTokenTtl":1e30}`, "invalid_request", "accessTokenTtl", ""},
				"adminConsole a string": {`{"name":"a","redirectUris":["https://a.example/cb"],"adminConsole":"yes"}`, "invalid_request", "adminConsole", ""},
				"mfa an array":          {`{"name":"a","redirectUris":["https://a.example/cb"],"mfa":["totp"]}`, "invalid_request", "mfa", ""},
				"unknown field":         {`{"name":"a","redirectUri":["https://a.example/cb"]}`, "invalid_request", "redirectUri", ""},
				"unknown mfa field":     {`{"name":"a","redirectUris":["https://a.example/cb"],"mfa":{"policy":"off","factor":[]}}`, "invalid_request", "factor", ""},
				"not JSON":              {`{"name":`, "invalid_json", "", ""},
				"empty":                 {``, "invalid_json", "", ""},
				"two values":            {`{"name":"a"}{}`, "invalid_json", "", ""},
			} {
				t.Run(name, func(t *testing.T) {
					d := expectError(t, badJSON(t, s, http.MethodPost, appsPath, admin, c.body), http.StatusBadRequest, c.code)
					if c.field != "" && d["field"] != c.field {
						t.Fatalf("details.field %v, want %s", d["field"], c.field)
					}
					if c.part != "" && d["part"] != c.part {
						t.Fatalf("details.part %v, want %s", d["part"], c.part)
					}
				})
			}
			expectPart(t, badJSON(t, s, http.MethodPatch, appsPath+"/"+web["id"].(string), admin, `{"name":"\u0000"}`), "body")
			expectPart(t, s.as(t).do(http.MethodGet, appsPath+"/%FF", nil, auth...), "path")
			expectPart(t, s.as(t).do(http.MethodGet, appsPath+"?offset=%00", nil, auth...), "query")
			expectError(t, s.as(t).do(http.MethodPost, appsPath, url.Values{"name": {"a"}}, auth...), http.StatusUnsupportedMediaType, "unsupported_media_type")
			if after := total(t); after != before {
				t.Fatalf("refused bodies stored applications: %v before, %v after", before, after)
			}
		})

		t.Run("admin only", func(t *testing.T) {
			expectError(t, s.as(t).do(http.MethodGet, appsPath, nil), http.StatusUnauthorized, "unauthorized")
			reader := s.createAccount(admin, map[string]any{"name": "apps-reader", "scopes": []string{"users:read"}})
			tok := bearer(s.token(reader.ClientID, reader.ClientSecret, ""))
			expectError(t, s.as(t).do(http.MethodGet, appsPath, nil, tok...), http.StatusForbidden, "insufficient_scope")
			expectError(t, s.as(t).do(http.MethodPost, appsPath, map[string]any{"name": "x", "redirectUris": []string{"https://x.example/cb"}}, tok...),
				http.StatusForbidden, "insufficient_scope")
		})

		t.Run("delete", func(t *testing.T) {
			path := appsPath + "/" + web["id"].(string)
			r := s.as(t).do(http.MethodDelete, path, nil, auth...)
			if r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete: %s", describe(r))
			}
			expectError(t, s.as(t).do(http.MethodGet, path, nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.as(t).do(http.MethodDelete, path, nil, auth...), http.StatusNotFound, "not_found")
			if clientAuth(t, s, web["clientId"].(string), web["clientSecret"].(string)) {
				t.Fatal("a deleted application still authenticates")
			}
		})
	})
}
