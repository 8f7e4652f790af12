package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

const (
	tokenPath      = "/api/v1/oauth/token"
	introspectPath = "/api/v1/oauth/introspect"
	revokePath     = "/api/v1/oauth/revoke"
)

// The token endpoint: form and JSON bodies, both client authentication
// methods, and every refusal with its RFC 6749 code.
func TestTokenEndpoint(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		a := s.createAccount(s.adminToken(), map[string]any{"name": "token-client", "scopes": []string{"users:read", "orgs:read"}})
		id, secret := a.ClientID, a.ClientSecret
		jsonCT := []string{"Content-Type", "application/json"}
		withJSON := func(h []string) []string { return append(slices.Clone(jsonCT), h...) }

		t.Run("accepted", func(t *testing.T) {
			seen := map[string]bool{}
			for _, c := range []struct {
				name    string
				path    string
				body    any
				headers []string
				scope   string
			}{
				{"form, basic", tokenPath, ccForm(""), basic(id, secret), "orgs:read users:read"},
				{"form, post", tokenPath, post(ccForm(""), id, secret), nil, "orgs:read users:read"},
				{"form, basic, one scope", tokenPath, ccForm("orgs:read"), basic(id, secret), "orgs:read"},
				{"form, post, scopes", tokenPath, post(ccForm("users:read orgs:read"), id, secret), nil, "orgs:read users:read"},
				{"JSON, basic", tokenPath, map[string]any{"grant_type": "client_credentials"}, basic(id, secret), "orgs:read users:read"},
				{"JSON, post", tokenPath, map[string]any{"grant_type": "client_credentials", "client_id": id, "client_secret": secret}, nil, "orgs:read users:read"},
				{"JSON, post, scope", tokenPath, map[string]any{"grant_type": "client_credentials", "client_id": id, "client_secret": secret, "scope": "users:read"}, nil, "users:read"},
				{"JSON with a null member", tokenPath, map[string]any{"grant_type": "client_credentials", "client_id": id, "client_secret": secret, "scope": nil}, nil, "orgs:read users:read"},
				{"JSON, charset", tokenPath, fmt.Sprintf(`{"grant_type":"client_credentials","client_id":%q,"client_secret":%q}`, id, secret), []string{"Content-Type", "application/json; charset=utf-8"}, "orgs:read users:read"},
				{"alias, form, basic", "/oauth/token", ccForm(""), basic(id, secret), "orgs:read users:read"},
				{"alias, JSON, post", "/oauth/token", map[string]any{"grant_type": "client_credentials", "client_id": id, "client_secret": secret}, nil, "orgs:read users:read"},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).do(http.MethodPost, c.path, c.body, c.headers...)
					tr := decodeToken(t, r)
					m := r.JSON(t)
					if _, ok := m["refresh_token"]; ok {
						t.Fatal("client credentials must not issue a refresh token")
					}
					if tr.TokenType != "Bearer" || tr.ExpiresIn != 3600 {
						t.Fatalf("token_type %q expires_in %v, want Bearer and 3600", tr.TokenType, tr.ExpiresIn)
					}
					if got := strings.Join(slices.Sorted(slices.Values(strings.Fields(tr.Scope))), " "); got != c.scope {
						t.Fatalf("scope %q, want %q", tr.Scope, c.scope)
					}
					if cc, p := r.Header.Get("Cache-Control"), r.Header.Get("Pragma"); cc != "no-store" || p != "no-cache" {
						t.Fatalf("Cache-Control %q, Pragma %q: want no-store and no-cache (RFC 6749 §5.1)", cc, p)
					}
					if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
						t.Fatalf("Content-Type %q", ct)
					}
					if seen[tr.AccessToken] {
						t.Fatal("a token was issued twice")
					}
					seen[tr.AccessToken] = true
					if w := s.as(t).do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tr.AccessToken)...); w.Status != http.StatusOK {
						t.Fatalf("issued token refused: %s", describe(w))
					}
				})
			}
		})

		t.Run("refused", func(t *testing.T) {
			for _, c := range []struct {
				name    string
				body    any
				headers []string
				status  int
				code    string
			}{
				// JSON bodies that are not one object of string members.
				{"malformed JSON", `{"grant_type":`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON array", `[{"grant_type":"client_credentials"}]`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON string", `"client_credentials"`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON null", `null`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON number", `42`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON number member", `{"grant_type":"client_credentials","scope":5}`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON array member", `{"grant_type":["client_credentials"]}`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"JSON object member", fmt.Sprintf(`{"grant_type":"client_credentials","client_id":%q,"client_secret":{"v":%q}}`, id, secret), jsonCT, 400, "invalid_request"},
				{"JSON trailing garbage", `{"grant_type":"client_credentials"} x`, withJSON(basic(id, secret)), 400, "invalid_request"},
				{"empty JSON body", ``, withJSON(basic(id, secret)), 400, "invalid_request"},
				// Grants the server does not serve, with and without credentials.
				{"password", url.Values{"grant_type": {"password"}, "username": {"u"}, "password": {"p"}}, basic(id, secret), 400, "unsupported_grant_type"},
				{"password, no client", url.Values{"grant_type": {"password"}, "username": {"u"}, "password": {"p"}}, nil, 400, "unsupported_grant_type"},
				// Grants the server offers, to people's applications only (RFC 6749 §5.2).
				{"authorization_code", url.Values{"grant_type": {"authorization_code"}, "code": {"c"}}, basic(id, secret), 400, "unauthorized_client"},
				{"refresh_token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {"r"}}, basic(id, secret), 400, "unauthorized_client"},
				{"two grant types", url.Values{"grant_type": {"client_credentials password"}}, basic(id, secret), 400, "unsupported_grant_type"},
				{"unknown grant", url.Values{"grant_type": {"urn:example:nope"}}, basic(id, secret), 400, "unsupported_grant_type"},
				{"JSON password", map[string]any{"grant_type": "password", "client_id": id, "client_secret": secret}, nil, 400, "unsupported_grant_type"},
				// A missing grant type.
				{"no grant_type", url.Values{"scope": {"users:read"}}, basic(id, secret), 400, "invalid_request"},
				{"empty grant_type", url.Values{"grant_type": {""}}, basic(id, secret), 400, "invalid_request"},
				{"JSON without grant_type", map[string]any{"client_id": id, "client_secret": secret}, nil, 400, "invalid_request"},
				{"empty form body", "", []string{"Content-Type", "application/x-www-form-urlencoded"}, 400, "invalid_request"},
				{"empty body, basic", "", append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(id, secret)...), 400, "invalid_request"},
				// Client authentication.
				{"no client credentials", ccForm(""), nil, 401, "invalid_client"},
				{"client_id without secret", url.Values{"grant_type": {"client_credentials"}, "client_id": {id}}, nil, 401, "invalid_client"},
				{"wrong secret, post", post(ccForm(""), id, secret+"x"), nil, 401, "invalid_client"},
				{"unknown client, post", post(ccForm(""), "sa_nobody", secret), nil, 401, "invalid_client"},
				{"JSON, wrong secret", map[string]any{"grant_type": "client_credentials", "client_id": id, "client_secret": "nope"}, nil, 401, "invalid_client"},
				{"client_assertion", url.Values{"grant_type": {"client_credentials"},
					"client_assertion_type": {"urn:ietf:params:oauth:client-assertion-type:jwt-bearer"}, "client_assertion": {"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."}}, nil, 401, "invalid_client"},
				{"client_assertion with client_id", url.Values{"grant_type": {"client_credentials"}, "client_id": {id},
					"client_assertion_type": {"urn:ietf:params:oauth:client-assertion-type:jwt-bearer"}, "client_assertion": {"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."}}, nil, 401, "invalid_client"},
				{"client_assertion beside a valid secret", post(url.Values{"grant_type": {"client_credentials"},
					"client_assertion_type": {"urn:ietf:params:oauth:client-assertion-type:jwt-bearer"}, "client_assertion": {"x.y.z"}}, id, secret), nil, 401, "invalid_client"},
				// Scopes.
				{"scope the account lacks", ccForm("users:read admin"), basic(id, secret), 400, "invalid_scope"},
				{"unknown scope", post(ccForm("nope"), id, secret), nil, 400, "invalid_scope"},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).do(http.MethodPost, tokenPath, c.body, c.headers...)
					expectRFC6749(t, r, c.status, c.code)
					if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
						t.Fatalf("Cache-Control %q, want no-store", cc)
					}
				})
			}
		})

		// RFC 6749 §5.2: invalid_request when the request "repeats a
		// parameter, includes multiple credentials, utilizes more than one
		// mechanism for authenticating the client".
		t.Run("repeated parameters and mixed credentials", func(t *testing.T) {
			other := s.createAccount(s.adminToken(), map[string]any{"name": "other-client", "scopes": []string{"users:read"}})
			form := []string{"Content-Type", "application/x-www-form-urlencoded"}
			for _, c := range []struct {
				name    string
				body    any
				headers []string
			}{
				{"grant_type twice", "grant_type=client_credentials&grant_type=password", append(slices.Clone(form), basic(id, secret)...)},
				{"grant_type twice, same value", "grant_type=client_credentials&grant_type=client_credentials", append(slices.Clone(form), basic(id, secret)...)},
				{"scope twice", "grant_type=client_credentials&scope=users:read&scope=admin", append(slices.Clone(form), basic(id, secret)...)},
				{"client_secret twice", url.Values{"grant_type": {"client_credentials"}, "client_id": {id}, "client_secret": {secret, "other"}}, nil},
				{"JSON member twice", `{"grant_type":"password","grant_type":"client_credentials"}`, withJSON(basic(id, secret))},
				{"Basic and body credentials of one client", post(ccForm(""), id, secret), basic(id, secret)},
				{"Basic of one client, body credentials of another", post(ccForm(""), other.ClientID, other.ClientSecret), basic(id, secret)},
			} {
				t.Run(c.name, func(t *testing.T) {
					expectRFC6749(t, s.as(t).do(http.MethodPost, tokenPath, c.body, c.headers...), http.StatusBadRequest, "invalid_request")
				})
			}
		})

		t.Run("invalid_client after Basic carries a Basic challenge", func(t *testing.T) {
			for _, h := range [][]string{basic(id, secret+"x"), basic("sa_nobody", secret)} {
				r := s.as(t).do(http.MethodPost, tokenPath, ccForm(""), h...)
				expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
				if c := r.Header.Get("WWW-Authenticate"); !strings.HasPrefix(c, "Basic ") {
					t.Fatalf("WWW-Authenticate %q, want a Basic challenge", c)
				}
			}
		})

		t.Run("GET is not allowed", func(t *testing.T) {
			for _, p := range []string{tokenPath, "/oauth/token", tokenPath + "?grant_type=client_credentials&client_id=" + id + "&client_secret=" + secret} {
				r := s.as(t).do(http.MethodGet, p, nil, basic(id, secret)...)
				if r.Status != http.StatusMethodNotAllowed || r.JSON(t)["error"] == nil {
					t.Fatalf("GET %s: %s", p, describe(r))
				}
				if strings.Contains(string(r.Body), "access_token") {
					t.Fatal("GET issued a token")
				}
			}
		})

		// The same oversize request answers the same way whether its length
		// is declared or not: an RFC 6749 error, 413.
		t.Run("oversize body", func(t *testing.T) {
			form := []byte("grant_type=client_credentials&scope=" + strings.Repeat("a", 1<<20))
			jsonBody := []byte(`{"grant_type":"client_credentials","scope":"` + strings.Repeat("a", 1<<20) + `"}`)
			for _, c := range []struct {
				name    string
				body    []byte
				ct      string
				chunked bool
			}{
				{"form, chunked", form, "application/x-www-form-urlencoded", true},
				{"JSON, chunked", jsonBody, "application/json", true},
				{"form, Content-Length", form, "application/x-www-form-urlencoded", false},
				{"JSON, Content-Length", jsonBody, "application/json", false},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.raw(t, http.MethodPost, tokenPath, c.body, c.chunked, append([]string{"Content-Type", c.ct}, basic(id, secret)...)...)
					expectRFC6749(t, r, http.StatusRequestEntityTooLarge, "invalid_request")
				})
			}
		})
	})
}

// Introspection (RFC 7662): both client authentication methods, the
// response fields, inactive tokens, and who may see whose token.
func TestIntrospection(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		a := s.createAccount(admin, map[string]any{"name": "owner", "scopes": []string{"users:read", "orgs:read"}})
		b := s.createAccount(admin, map[string]any{"name": "stranger", "scopes": []string{"orgs:read"}})
		rs := s.createAccount(admin, map[string]any{"name": "resource-server", "scopes": []string{"tokens:introspect"}})
		issued := time.Now()
		tokA := s.token(a.ClientID, a.ClientSecret, "users:read")

		t.Run("active token fields", func(t *testing.T) {
			for _, c := range []struct {
				name    string
				body    url.Values
				headers []string
			}{
				{"basic", url.Values{"token": {tokA}}, basic(a.ClientID, a.ClientSecret)},
				{"post", post(url.Values{"token": {tokA}}, a.ClientID, a.ClientSecret), nil},
				{"basic with token_type_hint", url.Values{"token": {tokA}, "token_type_hint": {"access_token"}}, basic(a.ClientID, a.ClientSecret)},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).do(http.MethodPost, introspectPath, c.body, c.headers...)
					if r.Status != http.StatusOK {
						t.Fatalf("introspect: %s", describe(r))
					}
					if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
						t.Fatalf("Cache-Control %q", cc)
					}
					m := r.JSON(t)
					if m["active"] != true || m["client_id"] != a.ClientID || m["scope"] != "users:read" || m["sub"] != a.ClientID {
						t.Fatalf("introspection %s", r.Body)
					}
					iat, _ := m["iat"].(float64)
					exp, _ := m["exp"].(float64)
					if iat < float64(issued.Unix()-1) || iat > float64(time.Now().Unix()+1) || exp != iat+3600 {
						t.Fatalf("iat %v exp %v, want now and now+3600", m["iat"], m["exp"])
					}
				})
			}
			// JSON bodies too.
			r := s.as(t).do(http.MethodPost, introspectPath, map[string]any{"token": tokA, "client_id": a.ClientID, "client_secret": a.ClientSecret})
			if r.Status != http.StatusOK || r.JSON(t)["active"] != true {
				t.Fatalf("JSON introspection: %s", describe(r))
			}
		})

		t.Run("inactive tokens", func(t *testing.T) {
			revoked := s.token(a.ClientID, a.ClientSecret, "")
			if r := s.as(t).do(http.MethodPost, revokePath, url.Values{"token": {revoked}}, basic(a.ClientID, a.ClientSecret)...); r.Status != http.StatusOK {
				t.Fatalf("revoke: %s", describe(r))
			}
			forged := tokA[:len(tokA)-2] + "AA"
			if strings.HasSuffix(tokA, "AA") {
				forged = tokA[:len(tokA)-2] + "BB"
			}
			// (An empty token is no token: invalid_request, TestOAuthRequestShapes.)
			for _, tok := range []string{revoked, forged, "garbage", "a.b", strings.Repeat("z", 4096)} {
				expectInactive(t, s.introspect(t, tok, a.ClientID, a.ClientSecret))
				expectInactive(t, s.introspect(t, tok, s.AdminID, s.AdminSecret))
			}
		})

		t.Run("client authentication", func(t *testing.T) {
			for _, c := range []struct {
				name    string
				body    url.Values
				headers []string
			}{
				{"no credentials", url.Values{"token": {tokA}}, nil},
				{"wrong secret, basic", url.Values{"token": {tokA}}, basic(a.ClientID, b.ClientSecret)},
				{"unknown client, basic", url.Values{"token": {tokA}}, basic("sa_nobody", a.ClientSecret)},
				{"wrong secret, post", post(url.Values{"token": {tokA}}, a.ClientID, "nope"), nil},
				{"client_id without secret", url.Values{"token": {tokA}, "client_id": {a.ClientID}}, nil},
				{"bearer token instead of client", url.Values{"token": {tokA}}, bearer(tokA)},
				{"admin bearer token instead of client", url.Values{"token": {tokA}}, bearer(admin)},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).do(http.MethodPost, introspectPath, c.body, c.headers...)
					expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
					if strings.Contains(string(r.Body), "active") {
						t.Fatalf("a refused caller learned about the token: %s", r.Body)
					}
				})
			}
		})

		t.Run("other clients' tokens", func(t *testing.T) {
			// A client without tokens:introspect sees another's token as inactive ...
			expectInactive(t, s.introspect(t, tokA, b.ClientID, b.ClientSecret))
			// ... but its own as active.
			tokB := s.token(b.ClientID, b.ClientSecret, "")
			expectActive(t, s.introspect(t, tokB, b.ClientID, b.ClientSecret), b.ClientID)
			// tokens:introspect and admin see every token, with its fields.
			for _, who := range []struct{ id, secret string }{{rs.ClientID, rs.ClientSecret}, {s.AdminID, s.AdminSecret}} {
				for _, tok := range []struct{ tok, owner, scope string }{{tokA, a.ClientID, "users:read"}, {tokB, b.ClientID, "orgs:read"}} {
					m := s.introspect(t, tok.tok, who.id, who.secret)
					expectActive(t, m, tok.owner)
					if m["scope"] != tok.scope || m["sub"] != tok.owner {
						t.Fatalf("%s introspecting %s's token: %v", who.id, tok.owner, m)
					}
				}
			}
			// Losing the scope loses the view.
			if r := s.as(t).do(http.MethodPatch, saPath+"/"+rs.ID, map[string]any{"scopes": []string{}}, bearer(admin)...); r.Status != http.StatusOK {
				t.Fatalf("patch: %s", describe(r))
			}
			expectInactive(t, s.introspect(t, tokA, rs.ClientID, rs.ClientSecret))
		})
	})
}

// Revocation (RFC 7009).
func TestRevocation(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		a := s.createAccount(admin, map[string]any{"name": "revoker", "scopes": []string{"users:read"}})
		b := s.createAccount(admin, map[string]any{"name": "other", "scopes": []string{"users:read"}})

		t.Run("own token", func(t *testing.T) {
			for _, c := range []struct {
				name    string
				body    func(tok string) any
				headers []string
			}{
				{"basic", func(tok string) any { return url.Values{"token": {tok}} }, basic(a.ClientID, a.ClientSecret)},
				{"post", func(tok string) any { return post(url.Values{"token": {tok}}, a.ClientID, a.ClientSecret) }, nil},
				{"with hint", func(tok string) any { return url.Values{"token": {tok}, "token_type_hint": {"access_token"}} }, basic(a.ClientID, a.ClientSecret)},
				{"with wrong hint", func(tok string) any { return url.Values{"token": {tok}, "token_type_hint": {"refresh_token"}} }, basic(a.ClientID, a.ClientSecret)},
				{"JSON", func(tok string) any {
					return map[string]any{"token": tok, "client_id": a.ClientID, "client_secret": a.ClientSecret}
				}, nil},
			} {
				t.Run(c.name, func(t *testing.T) {
					s := s.as(t)
					tok := s.token(a.ClientID, a.ClientSecret, "")
					keep := s.token(a.ClientID, a.ClientSecret, "")
					expectActive(t, s.introspect(t, tok, a.ClientID, a.ClientSecret), a.ClientID)
					r := s.do(http.MethodPost, revokePath, c.body(tok), c.headers...)
					if r.Status != http.StatusOK {
						t.Fatalf("revoke: %s", describe(r))
					}
					expectInactive(t, s.introspect(t, tok, a.ClientID, a.ClientSecret))
					expectInactive(t, s.introspect(t, tok, s.AdminID, s.AdminSecret))
					expectError(t, s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tok)...), http.StatusUnauthorized, "invalid_token")
					// Only that token.
					expectActive(t, s.introspect(t, keep, a.ClientID, a.ClientSecret), a.ClientID)
					// Again: still a success.
					if r := s.do(http.MethodPost, revokePath, c.body(tok), c.headers...); r.Status != http.StatusOK {
						t.Fatalf("second revoke: %s", describe(r))
					}
				})
			}
		})

		t.Run("unknown tokens", func(t *testing.T) {
			for _, tok := range []string{"garbage", "a.b", strings.Repeat("q", 2048)} {
				if r := s.as(t).do(http.MethodPost, revokePath, url.Values{"token": {tok}}, basic(a.ClientID, a.ClientSecret)...); r.Status != http.StatusOK {
					t.Fatalf("revoke %q: %s", tok[:min(len(tok), 10)], describe(r))
				}
			}
		})

		victim := s.token(a.ClientID, a.ClientSecret, "")
		stillActive := func(t *testing.T) {
			t.Helper()
			expectActive(t, s.introspect(t, victim, a.ClientID, a.ClientSecret), a.ClientID)
			if w := s.as(t).do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(victim)...); w.Status != http.StatusOK {
				t.Fatalf("whoami: %s", describe(w))
			}
		}

		t.Run("refused", func(t *testing.T) {
			for _, c := range []struct {
				name    string
				body    any
				headers []string
				status  int
				code    string
			}{
				{"missing token, basic", url.Values{"token_type_hint": {"access_token"}}, basic(a.ClientID, a.ClientSecret), 400, "invalid_request"},
				{"missing token, post", post(url.Values{}, a.ClientID, a.ClientSecret), nil, 400, "invalid_request"},
				{"empty body", "", append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(a.ClientID, a.ClientSecret)...), 400, "invalid_request"},
				{"another client's token", url.Values{"token": {victim}}, basic(b.ClientID, b.ClientSecret), 400, "unauthorized_client"},
				{"another client's token, post", post(url.Values{"token": {victim}}, b.ClientID, b.ClientSecret), nil, 400, "unauthorized_client"},
				{"admin revoking another's token", url.Values{"token": {victim}}, basic(s.AdminID, s.AdminSecret), 400, "unauthorized_client"},
				{"wrong secret", url.Values{"token": {victim}}, basic(a.ClientID, b.ClientSecret), 401, "invalid_client"},
				{"unknown client", url.Values{"token": {victim}}, basic("sa_nobody", a.ClientSecret), 401, "invalid_client"},
				{"wrong secret, post", post(url.Values{"token": {victim}}, a.ClientID, "nope"), nil, 401, "invalid_client"},
				{"no credentials", url.Values{"token": {victim}}, nil, 401, "invalid_client"},
				{"the token itself as bearer", url.Values{"token": {victim}}, bearer(victim), 401, "invalid_client"},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).do(http.MethodPost, revokePath, c.body, c.headers...)
					expectRFC6749(t, r, c.status, c.code)
					stillActive(t)
				})
			}
		})
	})
}

// Concurrency: many token requests at once, concurrent updates and
// rotations of one account, and a deletion racing token requests.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()

		t.Run("200 token requests across 8 accounts", func(t *testing.T) {
			var accts []account
			for i := range 8 {
				accts = append(accts, s.as(t).createAccount(admin, map[string]any{"name": fmt.Sprintf("load-%d", i), "scopes": []string{"users:read"}}))
			}
			type result struct {
				owner string
				tok   string
				err   error
			}
			results := make([]result, 200)
			var wg sync.WaitGroup
			for i := range results {
				wg.Go(func() {
					a := accts[i%len(accts)]
					var body any = ccForm("")
					h := basic(a.ClientID, a.ClientSecret)
					if i%2 == 1 { // half client_secret_post
						body, h = post(ccForm(""), a.ClientID, a.ClientSecret), nil
					}
					r, err := send(http.MethodPost, s.URL+tokenPath, strings.NewReader(body.(url.Values).Encode()), append([]string{"Content-Type", "application/x-www-form-urlencoded"}, h...)...)
					results[i].owner = a.ClientID
					if err != nil {
						results[i].err = err
						return
					}
					var tr tokenResponse
					if r.Status != http.StatusOK || json.Unmarshal(r.Body, &tr) != nil || tr.AccessToken == "" {
						results[i].err = fmt.Errorf("status %d: %s", r.Status, r.Body)
						return
					}
					results[i].tok = tr.AccessToken
				})
			}
			wg.Wait()
			seen := map[string]bool{}
			for i, r := range results {
				if r.err != nil {
					t.Fatalf("request %d: %v", i, r.err)
				}
				if seen[r.tok] {
					t.Fatalf("request %d: token issued twice", i)
				}
				seen[r.tok] = true
			}
			// Each is active, and belongs to the account that asked.
			errs := make(chan error, len(results))
			for w := range 8 {
				wg.Go(func() {
					for i := w; i < len(results); i += 8 {
						r, err := send(http.MethodPost, s.URL+introspectPath, strings.NewReader(url.Values{"token": {results[i].tok}}.Encode()),
							append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(s.AdminID, s.AdminSecret)...)...)
						if err != nil {
							errs <- err
							continue
						}
						var m map[string]any
						if json.Unmarshal(r.Body, &m) != nil || m["active"] != true || m["client_id"] != results[i].owner {
							errs <- fmt.Errorf("token %d: %s", i, describe(r))
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})

		t.Run("20 concurrent PATCHes", func(t *testing.T) {
			a := s.as(t).createAccount(admin, map[string]any{"name": "contended"})
			catalog := []string{"users:read", "users:write", "orgs:read", "orgs:write", "roles:read"}
			answers := make([]*response, 20)
			errs := make([]error, 20)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Go(func() {
					body, _ := json.Marshal(map[string]any{
						"name": fmt.Sprintf("n-%d", i), "description": fmt.Sprintf("d-%d", i),
						"scopes": []string{catalog[i%len(catalog)]}, "redirectUris": []string{fmt.Sprintf("https://c%d.example/cb", i)},
					})
					answers[i], errs[i] = send(http.MethodPatch, s.URL+saPath+"/"+a.ID, strings.NewReader(string(body)),
						append([]string{"Content-Type", "application/json"}, bearer(admin)...)...)
				})
			}
			wg.Wait()
			var latest map[string]any
			var latestAt time.Time
			for i, r := range answers {
				if errs[i] != nil || r.Status != http.StatusOK {
					t.Fatalf("PATCH %d: %v %v", i, errs[i], r)
				}
				m := r.JSON(t)
				// Each answer is one PATCH whole: its four fields go together.
				if m["name"] != fmt.Sprintf("n-%d", i) || m["description"] != fmt.Sprintf("d-%d", i) ||
					!slices.Equal(strs(m["scopes"]), []string{catalog[i%len(catalog)]}) ||
					!slices.Equal(strs(m["redirectUris"]), []string{fmt.Sprintf("https://c%d.example/cb", i)}) {
					t.Fatalf("PATCH %d answered a mixed record: %s", i, r.Body)
				}
				if at := isoZ(t, m["updatedAt"]); at.After(latestAt) {
					latest, latestAt = m, at
				}
			}
			// The stored record is the one the last writer was told about.
			g := s.as(t).do(http.MethodGet, saPath+"/"+a.ID, nil, bearer(admin)...).JSON(t)
			for _, k := range []string{"name", "description", "updatedAt"} {
				if g[k] != latest[k] {
					t.Fatalf("stored %s %v, but the latest PATCH answered %v", k, g[k], latest[k])
				}
			}
			if !slices.Equal(strs(g["scopes"]), strs(latest["scopes"])) || !slices.Equal(strs(g["redirectUris"]), strs(latest["redirectUris"])) {
				t.Fatalf("stored %v, latest answer %v", g, latest)
			}
			// And its credentials are untouched.
			s.as(t).token(a.ClientID, a.ClientSecret, "")
		})

		t.Run("concurrent rotations", func(t *testing.T) {
			a := s.as(t).createAccount(admin, map[string]any{"name": "spinning"})
			const n = 10
			answers := make([]*response, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Go(func() {
					answers[i], errs[i] = send(http.MethodPost, s.URL+saPath+"/"+a.ID+"/rotate", nil, bearer(admin)...)
				})
			}
			wg.Wait()
			var working []int
			latest, latestAt := -1, time.Time{}
			for i, r := range answers {
				if errs[i] != nil || r.Status != http.StatusOK {
					t.Fatalf("rotate %d: %v %v", i, errs[i], r)
				}
				m := r.JSON(t)
				if at := isoZ(t, m["rotatedAt"]); at.After(latestAt) {
					latest, latestAt = i, at
				}
				tr := s.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, m["clientSecret"].(string))...)
				switch tr.Status {
				case http.StatusOK:
					working = append(working, i)
				case http.StatusUnauthorized:
				default:
					t.Fatalf("token with rotated secret %d: %s", i, describe(tr))
				}
			}
			if len(working) != 1 || working[0] != latest {
				t.Fatalf("secrets that work: %v; want exactly the last rotation's (%d)", working, latest)
			}
			expectRFC6749(t, s.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, a.ClientSecret)...), http.StatusUnauthorized, "invalid_client")
			g := s.as(t).do(http.MethodGet, saPath+"/"+a.ID, nil, bearer(admin)...).JSON(t)
			if g["rotatedAt"] != answers[latest].JSON(t)["rotatedAt"] {
				t.Fatalf("stored rotatedAt %v, latest rotation said %v", g["rotatedAt"], answers[latest].JSON(t)["rotatedAt"])
			}
		})

		// A deletion racing token requests: once DELETE has answered and the
		// token requests have finished, no token of the account is active.
		t.Run("deletion racing token requests", func(t *testing.T) {
			for round := range 5 {
				a := s.as(t).createAccount(admin, map[string]any{"name": fmt.Sprintf("racing-%d", round), "scopes": []string{"users:read"}})
				var wg sync.WaitGroup
				var mu sync.Mutex
				var tokens []string
				for range 40 {
					wg.Go(func() {
						r, err := send(http.MethodPost, s.URL+tokenPath, strings.NewReader(ccForm("").Encode()),
							append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(a.ClientID, a.ClientSecret)...)...)
						var tr tokenResponse
						if err == nil && r.Status == http.StatusOK && json.Unmarshal(r.Body, &tr) == nil {
							mu.Lock()
							tokens = append(tokens, tr.AccessToken)
							mu.Unlock()
						}
					})
				}
				time.Sleep(2 * time.Millisecond)
				d := s.as(t).do(http.MethodDelete, saPath+"/"+a.ID, nil, bearer(admin)...)
				if d.Status != http.StatusNoContent {
					t.Fatalf("delete: %s", describe(d))
				}
				wg.Wait()
				for _, tok := range tokens {
					if m := s.introspect(t, tok, s.AdminID, s.AdminSecret); m["active"] != false {
						t.Fatalf("round %d: a token of the deleted account is active: %v (%d tokens issued around the delete)", round, m, len(tokens))
					}
				}
			}
		})
	})
}

// A token, a rotation and a revocation that have been answered survive the
// server being killed (no graceful shutdown): nothing is answered before it
// is committed.
func TestCrashDurability(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		system := "IDENTITYD_SYSTEM_SECRET=" + randomString()
		s := startLogged(t, dbURL, system)
		admin := s.adminToken()
		a := s.createAccount(admin, map[string]any{"name": "durable", "scopes": []string{"users:read"}})

		tokens := make([]string, 100)
		errs := make([]error, len(tokens))
		var wg sync.WaitGroup
		for i := range tokens {
			wg.Go(func() {
				r, err := send(http.MethodPost, s.URL+tokenPath, strings.NewReader(ccForm("").Encode()),
					append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(a.ClientID, a.ClientSecret)...)...)
				var tr tokenResponse
				if err == nil && (r.Status != http.StatusOK || json.Unmarshal(r.Body, &tr) != nil) {
					err = fmt.Errorf("%s", describe(r))
				}
				tokens[i], errs[i] = tr.AccessToken, err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("token %d: %v", i, err)
			}
		}
		if r := s.do(http.MethodPost, revokePath, url.Values{"token": {tokens[0]}}, basic(a.ClientID, a.ClientSecret)...); r.Status != http.StatusOK {
			t.Fatalf("revoke: %s", describe(r))
		}
		rot := s.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, bearer(admin)...).JSON(t)
		last := s.token(a.ClientID, rot["clientSecret"].(string), "")

		// Killed at once, without a chance to flush anything.
		if err := s.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-s.exited
		s.waitErr = nil // killed on purpose: the harness need not report it

		again := s.sibling(t, system, "IDENTITYD_ADMIN_CLIENT_SECRET="+s.AdminSecret)
		expectInactive(t, again.introspect(t, tokens[0], again.AdminID, again.AdminSecret))
		for i, tok := range append(tokens[1:], last) {
			if m := again.introspect(t, tok, again.AdminID, again.AdminSecret); m["active"] != true {
				t.Fatalf("token %d answered before the crash is gone after it: %v", i+1, m)
			}
		}
		expectRFC6749(t, again.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, a.ClientSecret)...), http.StatusUnauthorized, "invalid_client")
		again.token(a.ClientID, rot["clientSecret"].(string), "")
	})
}
