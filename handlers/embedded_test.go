package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// call posts a JSON body to an embedded route, with headers as pairs.
func (s *signinServer) embed(t testing.TB, path string, body any, headers ...string) (int, http.Header, map[string]any) {
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case string:
		raw = []byte(b)
	default:
		raw, _ = json.Marshal(b)
	}
	req, _ := http.NewRequest(http.MethodPost, s.URL+embeddedPath+path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	out := map[string]any{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s: not JSON: %s", path, data)
		}
	}
	return resp.StatusCode, resp.Header, out
}

// expectSignInError checks an embedded refusal: status and code, with a
// description.
func expectSignInError(t *testing.T, status int, body map[string]any, wantStatus int, code string) {
	t.Helper()
	if status != wantStatus || body["error"] != code || body["error_description"] == "" {
		t.Fatalf("want %d %s, got %d %v", wantStatus, code, status, body)
	}
}

// setOrigins gives the test application web origins (and sign-up).
func (s *signinServer) setApp(t testing.TB, fn func(a *persistence.Application)) {
	t.Helper()
	ctx := context.Background()
	c, err := s.store.GetClient(ctx, s.app)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.UpdateApplication(ctx, c.(*persistence.Client).RecordID, func(a *persistence.Application) error {
		fn(a)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func (s *signinServer) embeddedExchange(t testing.TB, code, verifier string) (int, map[string]any) {
	t.Helper()
	body := map[string]any{"code": code, "client_id": s.app, "client_secret": s.appSecret}
	if verifier != "" {
		body["code_verifier"] = verifier
	}
	status, _, out := s.embed(t, "/code/exchange", body)
	return status, out
}

func TestEmbeddedPassword(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)

		status, _, out := s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": s.user.Email})
		if status != http.StatusOK || out["exists"] != true || !slices.Equal(toStrings(out["methods"]), []string{"password"}) || out["method"] != "password" || out["mfaEnabled"] != false {
			t.Fatalf("check-email of a password account: %d %v", status, out)
		}
		_, _, out = s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": lin.Email})
		if !slices.Equal(toStrings(out["methods"]), []string{"otp", "magic-link"}) || out["method"] != nil {
			t.Fatalf("check-email of a passwordless account: %v", out)
		}
		_, _, out = s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": "nobody@example.com"})
		if out["exists"] != false || len(toStrings(out["methods"])) != 0 {
			t.Fatalf("check-email of nobody: %v", out)
		}

		pk := func(m map[string]any) map[string]any {
			m["codeChallenge"], m["codeChallengeMethod"] = oauth2.S256ChallengeFromVerifier(testVerifier), "S256"
			return m
		}
		status, _, out = s.embed(t, "/password", pk(map[string]any{"clientId": s.app, "email": s.user.Email, "password": "wrong password"}))
		expectSignInError(t, status, out, http.StatusUnauthorized, "invalid_credentials")
		status, _, out = s.embed(t, "/password", pk(map[string]any{"clientId": s.app, "email": "nobody@example.com", "password": "wrong password"}))
		expectSignInError(t, status, out, http.StatusUnauthorized, "invalid_credentials")

		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)
		status, _, out = s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword})
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_request") // no PKCE
		status, _, out = s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if status != http.StatusOK || out["code"] == nil || out["expiresIn"] != 600.0 {
			t.Fatalf("password: %d %v", status, out)
		}
		code := out["code"].(string)
		status, tokens := s.embeddedExchange(t, code, testVerifier)
		if status != http.StatusOK || tokens["token_type"] != "bearer" && tokens["token_type"] != "Bearer" || tokens["refresh_token"] == nil {
			t.Fatalf("exchange: %d %v", status, tokens)
		}
		claims := idClaims(t, tokens)
		if claims["sub"] != s.user.ID || claims["aud"] == nil || !slices.Equal(amrOf(claims), []string{"pwd"}) || claims["sid"] == nil {
			t.Fatalf("claims %v", claims)
		}
		// Single use: the replay is refused (and revokes what it issued).
		status, out = s.embeddedExchange(t, code, testVerifier)
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_grant")
		// A wrong secret.
		status, _, out = s.embed(t, "/code/exchange", map[string]any{"code": code, "client_id": s.app, "client_secret": "nope"})
		expectSignInError(t, status, out, http.StatusUnauthorized, "invalid_client")
	})
}

func TestEmbeddedOTPWithPKCE(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)

		status, _, out := s.embed(t, "/otp/send", map[string]any{"clientId": s.app, "email": lin.Email})
		if status != http.StatusOK || out["success"] != true {
			t.Fatalf("send: %d %v", status, out)
		}
		code := mailedCode.FindStringSubmatch(s.next(t).Text)[1]
		wrong := "000000"
		if code == wrong {
			wrong = "000001"
		}
		status, _, out = s.embed(t, "/otp/verify", map[string]any{"clientId": s.app, "email": lin.Email, "code": wrong,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_code")
		status, _, out = s.embed(t, "/otp/verify", map[string]any{"clientId": s.app, "email": lin.Email, "code": code,
			"codeChallenge": challenge, "codeChallengeMethod": "plain"})
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_request")
		status, _, out = s.embed(t, "/otp/verify", map[string]any{"clientId": s.app, "email": lin.Email, "code": code,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if status != http.StatusOK || out["code"] == nil {
			t.Fatalf("verify: %d %v", status, out)
		}
		authCode := out["code"].(string)
		// The code is spent.
		status, _, out = s.embed(t, "/otp/verify", map[string]any{"clientId": s.app, "email": lin.Email, "code": code,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		expectSignInError(t, status, out, http.StatusBadRequest, "expired_token")

		// PKCE: no verifier, or a wrong one, is refused; the right one works.
		status, out = s.embeddedExchange(t, authCode, "")
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_grant")
	})
}

// One code sent to several verifications at once: one wins the session and
// its authorization code (written together, once), the others are told the
// code expired.
func TestEmbeddedOTPAtOnce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)
		if status, _, out := s.embed(t, "/otp/send", map[string]any{"clientId": s.app, "email": lin.Email}); status != http.StatusOK {
			t.Fatalf("send: %d %v", status, out)
		}
		code := mailedCode.FindStringSubmatch(s.next(t).Text)[1]
		type answer struct {
			status int
			out    map[string]any
		}
		answers := make([]answer, 4)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() {
				status, _, out := s.embed(t, "/otp/verify", map[string]any{"clientId": s.app, "email": lin.Email, "code": code,
					"codeChallenge": challenge, "codeChallengeMethod": "S256"})
				answers[i] = answer{status, out}
			})
		}
		wg.Wait()
		var codes []string
		for _, a := range answers {
			if a.status == http.StatusOK {
				codes = append(codes, a.out["code"].(string))
				continue
			}
			expectSignInError(t, a.status, a.out, http.StatusBadRequest, "expired_token")
		}
		if len(codes) != 1 {
			t.Fatalf("%d of %d verifications won: %v", len(codes), len(answers), answers)
		}
		if status, out := s.embeddedExchange(t, codes[0], testVerifier); status != http.StatusOK || out["access_token"] == nil {
			t.Fatalf("the winner's code: %d %v", status, out)
		}
	})
}

func TestEmbeddedPKCEVerifier(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)
		signIn := func() string {
			status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
				"codeChallenge": challenge, "codeChallengeMethod": "S256"})
			if status != http.StatusOK {
				t.Fatalf("password: %d %v", status, out)
			}
			return out["code"].(string)
		}
		status, out := s.embeddedExchange(t, signIn(), testVerifier+"x")
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_grant")
		status, tokens := s.embeddedExchange(t, signIn(), testVerifier)
		if status != http.StatusOK || tokens["id_token"] == nil {
			t.Fatalf("exchange: %d %v", status, tokens)
		}
	})
}

func toStrings(v any) []string {
	out := []string{}
	list, _ := v.([]any)
	for _, e := range list {
		out = append(out, e.(string))
	}
	return out
}

func TestEmbeddedRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		for _, tc := range []struct {
			name, path string
			body       any
			status     int
			code       string
		}{
			{"no client", "/check-email", map[string]any{"email": "a@example.com"}, 400, "invalid_request"},
			{"unknown client", "/check-email", map[string]any{"clientId": "app_nope", "email": "a@example.com"}, 400, "invalid_client"},
			{"no email", "/check-email", map[string]any{"clientId": s.app}, 400, "invalid_request"},
			{"bad email", "/check-email", map[string]any{"clientId": s.app, "email": "not an address"}, 400, "invalid_request"},
			{"no password", "/password", map[string]any{"clientId": s.app, "email": "a@example.com"}, 400, "invalid_request"},
			{"no PKCE", "/password", map[string]any{"clientId": s.app, "email": "a@example.com", "password": "x"}, 400, "invalid_request"},
			{"unknown field", "/password", map[string]any{"clientId": s.app, "email": "a@example.com", "password": "x", "admin": true}, 400, "invalid_request"},
			{"wrong type", "/password", `{"clientId": 7}`, 400, "invalid_request"},
			{"not JSON", "/password", `{"clientId":`, 400, "invalid_request"},
			{"NUL", "/password", `{"clientId": "app\u0000x", "email": "a@example.com", "password": "x"}`, 400, "invalid_request"},
			{"invalid UTF-8", "/password", "{\"clientId\": \"\xff\xfe\", \"email\": \"a@example.com\", \"password\": \"x\"}", 400, "invalid_request"},
			{"huge", "/password", `{"clientId": "` + strings.Repeat("a", 2<<20) + `"}`, 413, "invalid_request"},
			{"deep", "/password", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), 400, "invalid_request"},
			{"unknown person", "/otp/send", map[string]any{"clientId": s.app, "email": "nobody@example.com"}, 404, "user_not_found"},
			{"no code", "/otp/verify", map[string]any{"clientId": s.app, "email": s.user.Email}, 400, "invalid_request"},
			{"no code sent", "/otp/verify", map[string]any{"clientId": s.app, "email": s.user.Email, "code": "123456",
				"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"}, 400, "expired_token"},
			{"unregistered redirect", "/magic-link/send", map[string]any{"clientId": s.app, "email": s.user.Email, "redirectUri": "https://evil.example/cb"}, 400, "invalid_request"},
			{"no redirect", "/magic-link/send", map[string]any{"clientId": s.app, "email": s.user.Email}, 400, "invalid_request"},
			{"exchange without code", "/code/exchange", map[string]any{"client_id": s.app}, 400, "invalid_request"},
			{"exchange of junk", "/code/exchange", map[string]any{"code": "junk", "client_id": s.app, "client_secret": s.appSecret}, 400, "invalid_grant"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				status, _, out := s.embed(t, tc.path, tc.body)
				expectSignInError(t, status, out, tc.status, tc.code)
			})
		}

		// An account that signs in with a password: 409 with the linking hint.
		status, _, out := s.embed(t, "/otp/send", map[string]any{"clientId": s.app, "email": s.user.Email})
		if status != http.StatusConflict || out["error"] != "account_exists" || out["error_description"] == "" ||
			!slices.Equal(toStrings(out["existingIdentities"]), []string{"password"}) || out["linkingRequired"] != true ||
			out["linkingEndpoint"] != "/api/v1/auth/link/initiate" || out["suggestion"] == "" {
			t.Fatalf("account_exists: %d %v", status, out)
		}
	})
}

// Browsers are answered only for the application's web origins; servers
// (no Origin) always.
func TestEmbeddedOrigins(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		s.setApp(t, func(a *persistence.Application) { a.WebOrigins = persistence.StringList{"https://shop.example"} })
		body := map[string]any{"clientId": s.app, "email": s.user.Email}

		status, h, _ := s.embed(t, "/check-email", body, "Origin", "https://shop.example")
		if status != http.StatusOK || h.Get("Access-Control-Allow-Origin") != "https://shop.example" || !slices.Contains(h.Values("Vary"), "Origin") {
			t.Fatalf("registered origin: %d %v", status, h)
		}
		for _, bad := range []string{"https://evil.example", "https://shop.example.evil.example", "http://shop.example", "null"} {
			status, h, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword}, "Origin", bad)
			expectSignInError(t, status, out, http.StatusForbidden, "origin_not_allowed")
			if h.Get("Access-Control-Allow-Origin") != "" {
				t.Fatalf("%s allowed to read", bad)
			}
		}
		if status, _, _ := s.embed(t, "/check-email", body); status != http.StatusOK {
			t.Fatalf("a server's call: %d", status)
		}

		preflight := func(origin string) *http.Response {
			req, _ := http.NewRequest(http.MethodOptions, s.URL+embeddedPath+"/password", nil)
			req.Header.Set("Origin", origin)
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "content-type")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		if resp := preflight("https://shop.example"); resp.StatusCode != http.StatusNoContent ||
			resp.Header.Get("Access-Control-Allow-Origin") != "https://shop.example" || resp.Header.Get("Access-Control-Allow-Methods") == "" ||
			!strings.Contains(strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers")), "content-type") {
			t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
		}
		if resp := preflight("https://evil.example"); resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("foreign preflight: %d %v", resp.StatusCode, resp.Header)
		}
	})
}

func TestEmbeddedMagicLink(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)
		status, _, out := s.embed(t, "/magic-link/send", map[string]any{"clientId": s.app, "email": lin.Email, "redirectUri": testRedirect,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if status != http.StatusOK {
			t.Fatalf("send: %d %v", status, out)
		}
		link := regexp.MustCompile(`http://[^\s"]+/api/v1/embedded/auth/magic-link/verify\?token=[A-Za-z0-9_-]+`).FindString(s.next(t).Text)
		if link == "" {
			t.Fatal("no link")
		}
		b := s.browser(t)
		if p := b.do(http.MethodHead, link, nil); p.status != http.StatusOK {
			t.Fatalf("HEAD %d", p.status)
		}
		confirm := b.do(http.MethodGet, link, nil)
		expectPage(t, confirm, http.StatusOK, "Sign in as")
		form := url.Values{"token": {tokenField.FindStringSubmatch(confirm.body)[1]}, "csrf_token": {confirm.fields().Get("csrf_token")}}
		p := b.do(http.MethodPost, "/signin/magic-link", form)
		u, _ := url.Parse(p.location)
		if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, testRedirect+"?") || u.Query().Get("code") == "" || u.Query().Get("iss") != s.URL {
			t.Fatalf("confirm: %d %q %s", p.status, p.location, p.body)
		}
		status, tokens := s.embeddedExchange(t, u.Query().Get("code"), testVerifier)
		if status != http.StatusOK || idClaims(t, tokens)["sub"] != lin.ID {
			t.Fatalf("exchange: %d %v", status, tokens)
		}
		expectPage(t, b.do(http.MethodPost, "/signin/magic-link", form), http.StatusBadRequest, "expired")
	})
}
