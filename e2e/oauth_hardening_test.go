package e2e

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The OAuth endpoints as an attacker and a strict client see them: who may
// introspect, what failed authentications cost and whom, and the RFC 6749
// shape of every answer.

// at is s as seen from another loopback address: its requests come from ip
// (every 127.0.0.0/8 address reaches a server on 127.0.0.1).
func (s *server) at(ip string) *server {
	c := *s
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext}
	s.t.Cleanup(tr.CloseIdleConnections)
	c.client = &http.Client{Transport: tr}
	return &c
}

// descriptionChars are the characters RFC 6749 §5.2 allows in
// error_description: %x20-21 / %x23-5B / %x5D-7E.
var descriptionChars = regexp.MustCompile(`^[\x20-\x21\x23-\x5B\x5D-\x7E]+$`)

// expectRateLimited checks an OAuth endpoint's 429: an RFC 6749 error with
// the spec's rate_limited code and a Retry-After.
func expectRateLimited(t *testing.T, r *response) {
	t.Helper()
	expectRFC6749(t, r, http.StatusTooManyRequests, "rate_limited")
	if retry, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || retry < 1 || retry > 60 {
		t.Fatalf("Retry-After %q, want 1..60 seconds", r.Header.Get("Retry-After"))
	}
}

// Introspection decides from the client that authenticated, never from an
// access token sent beside unchecked credentials: fosite would take an
// access_token parameter (body or query) as the caller's credential, and the
// permission check then trusted the Basic user name.
func TestIntrospectionAuthenticatesItsCaller(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		victim := s.createAccount(admin, map[string]any{"name": "victim", "scopes": []string{"users:read"}})
		attacker := s.createAccount(admin, map[string]any{"name": "attacker", "scopes": []string{"orgs:read"}})
		tokV := s.token(victim.ClientID, victim.ClientSecret, "users:read")
		tokA := s.token(attacker.ClientID, attacker.ClientSecret, "")

		for _, c := range []struct {
			name    string
			path    string
			body    any
			headers []string
		}{
			{"access_token in the body, admin's id with a wrong secret", introspectPath,
				url.Values{"token": {tokV}, "access_token": {tokA}}, basic(s.AdminID, "wrong")},
			{"access_token in the query, admin's id with a wrong secret", introspectPath + "?access_token=" + url.QueryEscape(tokA),
				url.Values{"token": {tokV}}, basic(s.AdminID, "wrong")},
			{"access_token in the body, admin's id without a secret", introspectPath,
				url.Values{"token": {tokV}, "access_token": {tokA}}, basic(s.AdminID, "")},
			{"access_token and body credentials with a wrong secret", introspectPath,
				url.Values{"token": {tokV}, "access_token": {tokA}, "client_id": {s.AdminID}, "client_secret": {"wrong"}}, nil},
			{"access_token alone", introspectPath, url.Values{"token": {tokV}, "access_token": {tokA}}, nil},
			{"JSON body", introspectPath,
				map[string]any{"token": tokV, "access_token": tokA, "client_id": s.AdminID, "client_secret": "wrong"}, nil},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := s.as(t).do(http.MethodPost, c.path, c.body, c.headers...)
				expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
				if strings.Contains(string(r.Body), "active") || strings.Contains(string(r.Body), "users:read") {
					t.Fatalf("a caller that did not authenticate learned about the token: %s", r.Body)
				}
				if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Basic ") {
					t.Fatalf("WWW-Authenticate %q, want a Basic challenge", r.Header.Get("WWW-Authenticate"))
				}
			})
		}

		t.Run("an access_token parameter adds no permission", func(t *testing.T) {
			admin := s.adminToken()
			for _, extra := range []string{tokA, admin} {
				r := s.as(t).do(http.MethodPost, introspectPath, url.Values{"token": {tokV}, "access_token": {extra}}, basic(attacker.ClientID, attacker.ClientSecret)...)
				expectInactive(t, mustOK(t, r))
			}
			expectActive(t, s.introspect(t, tokV, s.AdminID, s.AdminSecret), victim.ClientID)
		})
	})
}

// Failed authentications cost the guesser: counted per address and per
// claimed client in a budget of their own, while the real client,
// authenticating from elsewhere, keeps getting tokens; an authenticated
// client's requests count against its own limit only.
func TestAuthenticationFailureLimits(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_RATE_LIMITS=on")
		admin := s.adminToken()
		victim := s.createAccount(admin, map[string]any{"name": "victim", "scopes": []string{"users:read"}})
		other := s.createAccount(admin, map[string]any{"name": "other", "scopes": []string{"users:read"}})
		home := s.at("127.0.0.3") // where the real client runs
		issued := 0               // tokens the real client got
		realGrant := func(t *testing.T, from *server) {
			t.Helper()
			decodeToken(t, from.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(victim.ClientID, victim.ClientSecret)...))
			issued++
		}
		guess := func(t *testing.T, from *server, id, secret string) *response {
			t.Helper()
			return from.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(id, secret)...)
		}

		t.Run("guessing from one address", func(t *testing.T) {
			guesser := s.at("127.0.0.2")
			for i := range 40 {
				r := guess(t, guesser, victim.ClientID, fmt.Sprintf("guess-%d", i))
				if i < 30 {
					expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
				} else {
					expectRateLimited(t, r)
				}
				if i%4 == 0 {
					realGrant(t, home) // during the flood
				}
			}
			// The spent address is refused outright: the right secret would
			// tell a guess from a hit.
			expectRateLimited(t, guess(t, guesser, victim.ClientID, victim.ClientSecret))
			realGrant(t, home)
		})

		t.Run("a new client id per request", func(t *testing.T) {
			guesser := s.at("127.0.0.4")
			for i := range 31 {
				r := guesser.as(t).do(http.MethodPost, tokenPath, post(ccForm(""), "sa_"+randomString(), "guess"))
				if i < 30 {
					expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
				} else {
					expectRateLimited(t, r)
				}
			}
		})

		// The victim's failure budget is spent (above): an address that fails
		// for it once is refused the next time, and the real client, which
		// has not failed, goes on, from a new address too.
		t.Run("guessing from many addresses", func(t *testing.T) {
			for i := range 5 {
				guesser := s.at(fmt.Sprintf("127.0.1.%d", i+1))
				expectRFC6749(t, guess(t, guesser, victim.ClientID, "guess"), http.StatusUnauthorized, "invalid_client")
				expectRateLimited(t, guess(t, guesser, victim.ClientID, "guess again"))
				// Another client's budget is its own.
				expectRFC6749(t, guess(t, guesser, other.ClientID, "guess"), http.StatusUnauthorized, "invalid_client")
			}
			realGrant(t, s.at("127.0.0.5"))
			realGrant(t, home)
		})

		t.Run("introspection and revocation failures share the budget", func(t *testing.T) {
			guesser := s.at("127.0.0.6")
			tok := s.token(other.ClientID, other.ClientSecret, "")
			for i := range 30 {
				path := introspectPath
				if i%2 == 1 {
					path = revokePath
				}
				r := guesser.as(t).do(http.MethodPost, path, url.Values{"token": {tok}}, basic("sa_nobody", fmt.Sprint(i))...)
				expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
			}
			for _, path := range []string{introspectPath, revokePath} {
				expectRateLimited(t, guesser.as(t).do(http.MethodPost, path, url.Values{"token": {tok}}, basic(other.ClientID, other.ClientSecret)...))
			}
			expectRateLimited(t, guess(t, guesser, other.ClientID, other.ClientSecret))
			expectActive(t, s.introspect(t, tok, other.ClientID, other.ClientSecret), other.ClientID)
		})

		t.Run("failed bearer authentications", func(t *testing.T) {
			guesser := s.at("127.0.0.7")
			for i := range 30 {
				r := guesser.as(t).do(http.MethodGet, whoamiPath, nil, bearer(fmt.Sprintf("forged-%d", i))...)
				expectError(t, r, http.StatusUnauthorized, "invalid_token")
			}
			for _, tok := range []string{"forged", admin} {
				r := guesser.as(t).do(http.MethodGet, whoamiPath, nil, bearer(tok)...)
				expectError(t, r, http.StatusTooManyRequests, "rate_limited")
				if r.Header.Get("Retry-After") == "" {
					t.Fatalf("429 without Retry-After: %v", r.Header)
				}
			}
			// Other addresses are unaffected.
			mustOK(t, s.as(t).do(http.MethodGet, whoamiPath, nil, bearer(admin)...))
		})

		// The token limit counts the real client's own requests alone: the
		// guesses above took nothing from it.
		t.Run("authenticated requests count per client", func(t *testing.T) {
			for issued < 30 {
				realGrant(t, s.at("127.0.0.8"))
			}
			r := guess(t, home, victim.ClientID, victim.ClientSecret)
			expectRateLimited(t, r)
			if r.Header.Get("X-RateLimit-Limit") != "30" || r.Header.Get("X-RateLimit-Remaining") != "0" {
				t.Fatalf("headers %v", r.Header)
			}
			decodeToken(t, s.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(other.ClientID, other.ClientSecret)...))
		})
	})
}

// multipartBody is a multipart/form-data body of these fields.
func multipartBody(t *testing.T, fields url.Values) (string, []string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for k, vs := range fields {
		for _, v := range vs {
			if err := w.WriteField(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String(), []string{"Content-Type", w.FormDataContentType()}
}

// The shape of requests and answers at the OAuth endpoints: form encoding
// only, empty parameters as omitted ones (RFC 6749 §3.2), error_description
// in RFC 6749 §5.2 characters, RFC 6749 errors for 405, revocation's
// challenge, introspection without a token, one audience per value (RFC
// 8693 §2.1), and discovery without empty optional arrays.
func TestOAuthRequestShapes(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		a := s.createAccount(super, map[string]any{"name": "shapes", "scopes": []string{"users:read", "orgs:read"}})
		tok := s.token(a.ClientID, a.ClientSecret, "")

		t.Run("multipart and other media types are refused", func(t *testing.T) {
			fields := url.Values{"grant_type": {"client_credentials", "client_credentials"}, "client_id": {a.ClientID},
				"client_secret": {a.ClientSecret}, "token": {tok}}
			body, ct := multipartBody(t, fields)
			for _, path := range []string{tokenPath, "/oauth/token", introspectPath, revokePath} {
				for _, h := range [][]string{ct, {"Content-Type", "text/plain"}} {
					plain := body
					if h[1] == "text/plain" {
						plain = post(url.Values{"grant_type": {"client_credentials"}, "token": {tok}}, a.ClientID, a.ClientSecret).Encode()
					}
					r := s.as(t).do(http.MethodPost, path, plain, h...)
					expectRFC6749(t, r, http.StatusBadRequest, "invalid_request")
				}
			}
			expectActive(t, s.introspect(t, tok, a.ClientID, a.ClientSecret), a.ClientID)
		})

		t.Run("empty parameters are omitted", func(t *testing.T) {
			form := "grant_type=client_credentials&client_secret=&resource=&authorization_details=&audience=&actor_token=&scope="
			r := s.as(t).do(http.MethodPost, tokenPath, form, append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(a.ClientID, a.ClientSecret)...)...)
			if got := scopeSet(decodeToken(t, r).Scope); !slices.Equal(got, []string{"orgs:read", "users:read"}) {
				t.Fatalf("scope %v", got)
			}
			r = s.as(t).do(http.MethodPost, tokenPath, map[string]any{"grant_type": "client_credentials", "client_secret": "", "resource": "", "authorization_details": ""}, basic(a.ClientID, a.ClientSecret)...)
			decodeToken(t, r)
			r = s.as(t).do(http.MethodPost, introspectPath, url.Values{"token": {tok}, "client_secret": {""}, "token_type_hint": {""}}, basic(a.ClientID, a.ClientSecret)...)
			expectActive(t, mustOK(t, r), a.ClientID)
			spare := s.token(a.ClientID, a.ClientSecret, "")
			r = s.as(t).do(http.MethodPost, revokePath, url.Values{"token": {spare}, "client_secret": {""}}, basic(a.ClientID, a.ClientSecret)...)
			if r.Status != http.StatusOK {
				t.Fatalf("revoke: %s", describe(r))
			}
			// An empty value beside a real one is no repetition.
			r = s.as(t).do(http.MethodPost, tokenPath, "grant_type=client_credentials&scope=&scope=users:read",
				append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(a.ClientID, a.ClientSecret)...)...)
			if got := decodeToken(t, r).Scope; got != "users:read" {
				t.Fatalf("scope %q", got)
			}
		})

		t.Run("error_description characters", func(t *testing.T) {
			const odd = "n\"a\\m\ne\u00a7\u00e9\x01"
			formCT := []string{"Content-Type", "application/x-www-form-urlencoded"}
			jsonCT := []string{"Content-Type", "application/json"}
			for _, c := range []struct {
				name    string
				path    string
				body    any
				headers []string
			}{
				{"repeated parameter", tokenPath, url.Values{"grant_type": {"client_credentials"}, odd: {"a", "b"}}.Encode(), append(slices.Clone(formCT), basic(a.ClientID, a.ClientSecret)...)},
				{"repeated plain parameter", tokenPath, "grant_type=client_credentials&grant_type=password", append(slices.Clone(formCT), basic(a.ClientID, a.ClientSecret)...)},
				{"repeated JSON member", tokenPath, `{"grant_type":"client_credentials","n\"a\\m\ne\u00a7":"a","n\"a\\m\ne\u00a7":"b"}`, append(slices.Clone(jsonCT), basic(a.ClientID, a.ClientSecret)...)},
				{"JSON member of the wrong type", tokenPath, `{"grant_type":"client_credentials","n\"a\\m\ne\u00a7":5}`, append(slices.Clone(jsonCT), basic(a.ClientID, a.ClientSecret)...)},
				{"scope the client lacks", tokenPath, ccForm("users:read " + odd), basic(a.ClientID, a.ClientSecret)},
				{"scope with a newline", tokenPath, ccForm("users:read\nadmin"), basic(a.ClientID, a.ClientSecret)},
				{"unsupported grant type", tokenPath, url.Values{"grant_type": {odd}}, basic(a.ClientID, a.ClientSecret)},
				{"unknown client", tokenPath, post(ccForm(""), odd, "x"), nil},
				{"undecodable Basic", introspectPath, url.Values{"token": {tok}}, []string{"Authorization", "Basic " + "JXp6OiV6eg=="}},
				{"exchange with a bad resource", tokenPath, delegationForm(tok, "resource", odd), basic(a.ClientID, a.ClientSecret)},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).do(http.MethodPost, c.path, c.body, c.headers...)
					if r.Status < 400 || r.Status > 499 {
						t.Fatalf("want a 4xx: %s", describe(r))
					}
					d, _ := r.JSON(t)["error_description"].(string)
					if !descriptionChars.MatchString(d) {
						t.Fatalf("error_description %q has characters RFC 6749 §5.2 does not allow", d)
					}
				})
			}
		})

		t.Run("405 is an RFC 6749 error", func(t *testing.T) {
			for _, path := range []string{tokenPath, "/oauth/token", introspectPath, revokePath} {
				for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
					r := s.as(t).do(m, path, nil, basic(a.ClientID, a.ClientSecret)...)
					expectRFC6749(t, r, http.StatusMethodNotAllowed, "invalid_request")
					if r.Header.Get("Allow") != "POST" {
						t.Fatalf("%s %s: Allow %q", m, path, r.Header.Get("Allow"))
					}
				}
			}
		})

		t.Run("revocation's 401s carry a challenge", func(t *testing.T) {
			for _, c := range []struct {
				body    url.Values
				headers []string
			}{
				{url.Values{"token": {tok}}, nil},
				{post(url.Values{"token": {tok}}, a.ClientID, "wrong"), nil},
				{url.Values{"token": {tok}}, basic(a.ClientID, "wrong")},
			} {
				r := s.as(t).do(http.MethodPost, revokePath, c.body, c.headers...)
				expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
				if !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Basic ") {
					t.Fatalf("WWW-Authenticate %q, want a Basic challenge", r.Header.Get("WWW-Authenticate"))
				}
			}
		})

		t.Run("introspection without a token", func(t *testing.T) {
			for _, body := range []url.Values{{"token_type_hint": {"access_token"}}, {"token": {""}, "scope": {"users:read"}}} {
				expectRFC6749(t, s.as(t).do(http.MethodPost, introspectPath, body, basic(a.ClientID, a.ClientSecret)...), http.StatusBadRequest, "invalid_request")
			}
		})

		t.Run("one audience value is one audience", func(t *testing.T) {
			actor := s.createAgent(super, map[string]any{"name": "audience-actor", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users"}})
			for _, level := range []string{"registered", "verified"} {
				mustOK(t, s.as(t).changeTrust(super, actor.ID, level, "audience test"))
			}
			as := basic(actor.ClientID, actor.ClientSecret)
			for _, c := range []struct {
				form url.Values
				want []string
			}{
				{delegationForm(tok, "audience", "urn:example:one two"), []string{"urn:example:one two"}},
				{delegationForm(tok, "audience", "https://a.example", "audience", "https://b.example"), []string{"https://a.example", "https://b.example"}},
				{delegationForm(tok, "audience", "", "actor_token", "", "actor_token_type", ""), nil},
			} {
				m := exchanged(t, s.as(t).exchange(c.form, as...))
				in := s.introspect(t, m["access_token"].(string), s.AdminID, s.AdminSecret)
				if got := strs(in["aud"]); !slices.Equal(got, c.want) && len(got)+len(c.want) > 0 {
					t.Fatalf("%v: aud %q, want %q", c.form, in["aud"], c.want)
				}
			}
		})

		t.Run("discovery omits empty optional arrays", func(t *testing.T) {
			for _, doc := range []string{"/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"} {
				md := mustOK(t, s.as(t).do(http.MethodGet, doc, nil))
				for k, v := range md {
					if list, ok := v.([]any); ok && len(list) == 0 && k != "response_types_supported" {
						t.Fatalf("%s: %s is an empty array", doc, k)
					}
				}
				if got := strs(md["authorization_details_types_supported"]); !slices.Equal(got, []string{"hitl_approval"}) {
					t.Fatalf("%s lists %v with no type registered, want only the built-in hitl_approval", doc, got)
				}
			}
		})
	})
}
