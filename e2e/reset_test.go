package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Password reset over real HTTP and real SMTP (issue 13): the whole flow
// from forgot-password to the new password, every error code of the spec
// (weak_password, token_expired, invalid_token, token_used,
// too_many_attempts, rate_limit_exceeded), the same answer for an address
// without an account, and what a reset ends: every session and every
// token of the person. Links are read from the messages identityd sends to
// the SMTP server in the test.

const (
	forgotPath      = "/api/v1/auth/forgot-password"
	resetVerifyPath = "/api/v1/auth/reset-password/verify?token="
	resetPath       = "/api/v1/auth/reset-password"
	resetPagePrefix = "/signin/reset-password?token="
	resetPassword   = "correct horse battery staple"
	newPassword     = "a brand new passphrase"
)

// resetTokenIn is the token of a reset message of appName, whose link
// leads to prefix.
func resetTokenIn(t *testing.T, m sentMail, appName, prefix string) string {
	t.Helper()
	if m.Subject != "Reset your "+appName+" password" {
		t.Fatalf("subject %q, want the reset message of %s:\n%s", m.Subject, appName, m.Text)
	}
	found := linkPattern(prefix).FindString(m.Text)
	if len(found) != len(prefix)+43 { // 256 bits
		t.Fatalf("no link %s… with a 43-character token:\n%s", prefix, m.Text)
	}
	if !strings.Contains(m.HTML, `href="`+html.EscapeString(found)+`"`) {
		t.Fatalf("the HTML part has no <a href> to %s:\n%s", found, m.HTML)
	}
	return strings.TrimPrefix(found, prefix)
}

// resetCall posts a reset body and answers the response.
func (s *server) forgot(t *testing.T, clientID, email string, extra ...string) *response {
	t.Helper()
	body := map[string]any{"email": email, "clientId": clientID}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i]] = extra[i+1]
	}
	return s.do(http.MethodPost, forgotPath, body)
}

func (s *server) resetTo(t *testing.T, token, password string) *response {
	t.Helper()
	return s.do(http.MethodPost, resetPath, map[string]any{"token": token, "newPassword": password})
}

// expectEnvelope checks the spec's error body with code.
func expectEnvelope(t *testing.T, r *response, status int, code string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("want %d %s: %s", status, code, describe(r))
	}
	m := r.JSON(t)
	if m["error"] != code || m["message"] == nil {
		t.Fatalf("want %s: %s", code, describe(r))
	}
	details, ok := m["details"].(map[string]any)
	if !ok {
		t.Fatalf("no details object: %s", describe(r))
	}
	return details
}

// passwordSignIn signs email in on the hosted page with a password and
// answers the tokens (x/oauth2, ID token verified).
func passwordSignIn(t *testing.T, s *server, app hostedApp, redirect, email, password string) (*oauth2.Token, idClaims) {
	t.Helper()
	b := newHostedBrowser(t, s, redirect)
	page, a := b.authorize(app)
	page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
	expectPage(t, page, http.StatusOK, `<label for="password">Password</label>`, "Forgot password?")
	return b.finish(app, a, b.submit(page, "/signin/password", "", url.Values{"password": {password}}))
}

// passwordRefused checks that password no longer signs email in.
func passwordRefused(t *testing.T, s *server, app hostedApp, redirect, email, password string) {
	t.Helper()
	b := newHostedBrowser(t, s, redirect)
	page, _ := b.authorize(app)
	page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
	expectPage(t, b.submit(page, "/signin/password", "", url.Values{"password": {password}}), http.StatusUnauthorized, "not right")
}

func TestPasswordReset(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		// Each sign-in below is a new browser: the risk rules, which would
		// step them up, have their own tests.
		s := startLogged(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read users:admin")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		app := newHostedApp(t, s, admin, "Acme Vault", redirect, map[string]any{"signInMethods": []string{"password", "otp"}})
		app.conf.Scopes = append(app.conf.Scopes, "offline_access")
		const email = "grace@example.com"
		r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": "Grace", "password": resetPassword}, bearer(admin)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		userID := r.JSON(t)["id"].(string)

		// Two sessions (two browsers), each with a refresh token.
		var tokens []*oauth2.Token
		for range 2 {
			tok, claims := passwordSignIn(t, s, app, redirect, email, resetPassword)
			if claims.Sub != userID || tok.RefreshToken == "" {
				t.Fatalf("sign-in: sub %q, refresh %q", claims.Sub, tok.RefreshToken)
			}
			tokens = append(tokens, tok)
		}
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+userID+"/sessions", nil, bearer(admin)...); r.Status != http.StatusOK || r.JSON(t)["total"] != float64(2) {
			t.Fatalf("sessions before: %s", describe(r))
		}

		// Forgot: the same answer for the account and for an address
		// without one; only the account gets a message.
		known, unknown := s.forgot(t, app.id, email), s.forgot(t, app.id, "nobody@example.com")
		if known.Status != http.StatusOK || unknown.Status != http.StatusOK || string(known.Body) != string(unknown.Body) {
			t.Fatalf("answers differ: %s / %s", describe(known), describe(unknown))
		}
		exactKeys(t, known.JSON(t), "message")
		token := resetTokenIn(t, box.after(t, email, 0), app.name, s.URL+resetPagePrefix)
		time.Sleep(500 * time.Millisecond)
		if n := len(box.to("nobody@example.com")); n != 0 {
			t.Fatalf("%d messages to an address without an account", n)
		}

		// Verify: the masked address, the time left; not spent by reading.
		for range 2 {
			v := s.do(http.MethodGet, resetVerifyPath+url.QueryEscape(token), nil)
			m := v.JSON(t)
			if v.Status != http.StatusOK || m["valid"] != true || m["email"] != "g***@example.com" || m["expiresIn"].(float64) < 3500 || m["expiresIn"].(float64) > 3600 {
				t.Fatalf("verify: %s", describe(v))
			}
		}
		v := s.do(http.MethodGet, resetVerifyPath+"not-a-token", nil)
		if m := v.JSON(t); v.Status != http.StatusBadRequest || m["valid"] != false || m["error"] != "invalid_token" || m["error_description"] == "" {
			t.Fatalf("verify unknown: %s", describe(v))
		}

		// weak_password, twice (each an attempt), then the reset.
		for i, weak := range []string{"short", email} {
			d := expectEnvelope(t, s.resetTo(t, token, weak), http.StatusBadRequest, "weak_password")
			if d["attemptsRemaining"] != float64(2-i) {
				t.Fatalf("attempts remaining: %v", d)
			}
		}
		expectEnvelope(t, s.resetTo(t, "no-such-token", newPassword), http.StatusBadRequest, "invalid_token")
		if r := s.resetTo(t, token, newPassword); r.Status != http.StatusOK || r.JSON(t)["message"] == "" {
			t.Fatalf("reset: %s", describe(r))
		}
		expectEnvelope(t, s.resetTo(t, token, newPassword+"!"), http.StatusBadRequest, "token_used")
		if v := s.do(http.MethodGet, resetVerifyPath+url.QueryEscape(token), nil); v.Status != http.StatusBadRequest || v.JSON(t)["error"] != "token_used" {
			t.Fatalf("verify used: %s", describe(v))
		}

		// Every session ended; every refresh and access token dead.
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+userID+"/sessions", nil, bearer(admin)...); r.Status != http.StatusOK || r.JSON(t)["total"] != float64(0) {
			t.Fatalf("sessions after: %s", describe(r))
		}
		for i, tok := range tokens {
			if _, err := app.conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err == nil {
				t.Fatalf("refresh token %d still works", i)
			}
			if r := s.do(http.MethodGet, "/api/v1/oauth/userinfo", nil, bearer(tok.AccessToken)...); r.Status != http.StatusUnauthorized {
				t.Fatalf("access token %d: %s", i, describe(r))
			}
			expectInactive(t, s.introspect(t, tok.AccessToken, app.id, app.secret))
		}
		// The old password is refused, the new one signs in, to the same person.
		passwordRefused(t, s, app, redirect, email, resetPassword)
		if _, claims := passwordSignIn(t, s, app, redirect, email, newPassword); claims.Sub != userID {
			t.Fatalf("sub %q after the reset", claims.Sub)
		}

		// Three wrong attempts kill a token: too_many_attempts, even for a good password.
		n := len(box.to(email))
		s.forgot(t, app.id, email)
		token = resetTokenIn(t, box.after(t, email, n), app.name, s.URL+resetPagePrefix)
		for _, weak := range []string{"password123", "iloveyou1", "1234567"} {
			expectEnvelope(t, s.resetTo(t, token, weak), http.StatusBadRequest, "weak_password")
		}
		expectEnvelope(t, s.resetTo(t, token, "yet another good passphrase"), http.StatusBadRequest, "too_many_attempts")
		if v := s.do(http.MethodGet, resetVerifyPath+url.QueryEscape(token), nil); v.Status != http.StatusBadRequest || v.JSON(t)["error"] != "too_many_attempts" {
			t.Fatalf("verify dead: %s", describe(v))
		}

		// An hour passes (the token's expiry moved into the past in the
		// server's database stands in for the wait): token_expired.
		n = len(box.to(email))
		s.forgot(t, app.id, email)
		token = resetTokenIn(t, box.after(t, email, n), app.name, s.URL+resetPagePrefix)
		db, _, err := persistence.Open(context.Background(), s.DB)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		res, err := db.Exec(db.Rebind(`UPDATE password_resets SET expires_at = ? WHERE used_at IS NULL AND attempts = 0`), time.Now().Add(-time.Second).UTC())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%d live tokens aged, want 1", n)
		}
		expectEnvelope(t, s.resetTo(t, token, "yet another good passphrase"), http.StatusBadRequest, "token_expired")
		if v := s.do(http.MethodGet, resetVerifyPath+url.QueryEscape(token), nil); v.Status != http.StatusBadRequest || v.JSON(t)["error"] != "token_expired" {
			t.Fatalf("verify expired: %s", describe(v))
		}

		// A person without a password (invited) gets one through a reset:
		// the password identity, and a password sign-in.
		const lin = "lin@example.com"
		if r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": lin, "name": "Lin"}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		s.forgot(t, app.id, lin)
		token = resetTokenIn(t, box.after(t, lin, 0), app.name, s.URL+resetPagePrefix)
		if r := s.resetTo(t, token, newPassword); r.Status != http.StatusOK {
			t.Fatalf("reset: %s", describe(r))
		}
		passwordSignIn(t, s, app, redirect, lin, newPassword)

		// Bad requests get the envelope.
		expectEnvelope(t, s.forgot(t, "app_unknown", email), http.StatusBadRequest, "invalid_request")
		expectEnvelope(t, s.forgot(t, app.id, "not an address"), http.StatusBadRequest, "invalid_request")
		expectEnvelope(t, s.do(http.MethodPost, forgotPath, `{"email":`), http.StatusBadRequest, "invalid_json")
		expectEnvelope(t, s.do(http.MethodPost, resetPath, map[string]any{"token": token}), http.StatusBadRequest, "invalid_request")
	})
}

// The spec's limits, on a server with rate limits on: 3 requests per hour
// per e-mail address and 10 per address, X-RateLimit headers on every
// answer, 429 rate_limit_exceeded beyond; a stranger's requests do not
// keep the person from asking from their own address.
func TestPasswordResetLimits(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env("IDENTITYD_RATE_LIMITS=on")...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write")
		app := newHostedApp(t, s, admin, "Acme Vault", "http://127.0.0.1:9/callback", nil)
		const email = "target@example.com"
		if r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "password": resetPassword}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		for i := range 3 {
			r := s.forgot(t, app.id, email)
			if r.Status != http.StatusOK || r.Header.Get("X-RateLimit-Limit") != "10" || r.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(9-i) ||
				r.Header.Get("X-RateLimit-Reset") == "" {
				t.Fatalf("request %d: %s %v", i, describe(r), r.Header)
			}
		}
		r := s.forgot(t, app.id, email)
		expectEnvelope(t, r, http.StatusTooManyRequests, "rate_limit_exceeded")
		if r.Header.Get("Retry-After") == "" {
			t.Fatal("no Retry-After")
		}
		// From another address (127.0.0.2), the person still gets a link.
		other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
		raw, _ := json.Marshal(map[string]any{"email": email, "clientId": app.id})
		resp, err := other.Post(s.URL+forgotPath, "application/json", strings.NewReader(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("from another address: %d", resp.StatusCode)
		}
		box.after(t, email, 3)
		// 10 per hour per address.
		for i := 3; i < 10; i++ {
			if r := s.forgot(t, app.id, fmt.Sprintf("someone%d@example.com", i)); r.Status != http.StatusOK {
				t.Fatalf("request %d: %s", i, describe(r))
			}
		}
		expectEnvelope(t, s.forgot(t, app.id, "someone.else@example.com"), http.StatusTooManyRequests, "rate_limit_exceeded")
	})
}

// A captcha configured by the operator (a siteverify server on 127.0.0.1)
// is required and checked; an application's own reset page receives the
// link.
func TestPasswordResetCaptchaAndAppPage(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []url.Values
	verify := startSiteverify(t, func(form url.Values) bool {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, form)
		return form.Get("secret") == "siteverify-secret" && form.Get("response") == "solved-token"
	})
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env("IDENTITYD_CAPTCHA_VERIFY_URL="+verify, "IDENTITYD_CAPTCHA_SECRET=siteverify-secret")...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write")
		app := newHostedApp(t, s, admin, "Acme Vault", "https://vault.example/callback",
			map[string]any{"passwordResetUri": "https://vault.example/account/reset?from=mail"})
		const email = "ada@example.com"
		if r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "password": resetPassword}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		expectEnvelope(t, s.forgot(t, app.id, email), http.StatusBadRequest, "captcha_required")
		expectEnvelope(t, s.forgot(t, app.id, email, "captchaToken", "a-bot-guess"), http.StatusBadRequest, "captcha_failed")
		if r := s.forgot(t, app.id, email, "captchaToken", "solved-token"); r.Status != http.StatusOK {
			t.Fatalf("solved: %s", describe(r))
		}
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if last.Get("remoteip") != "127.0.0.1" || last.Get("response") != "solved-token" {
			t.Fatalf("siteverify got %v", last)
		}
		token := resetTokenIn(t, box.after(t, email, 0), app.name, "https://vault.example/account/reset?from=mail&token=")
		if r := s.resetTo(t, token, newPassword); r.Status != http.StatusOK {
			t.Fatalf("reset through the application's page: %s", describe(r))
		}
		// An application's reset page must be on one of its redirect URIs' origins.
		r := s.do(http.MethodPatch, "/api/v1/applications/"+appRecordID(t, s, admin, app.id), map[string]any{"passwordResetUri": "https://elsewhere.example/reset"}, bearer(admin)...)
		expectEnvelope(t, r, http.StatusBadRequest, "invalid_request")
	})
}

// appRecordID finds an application's record id by its client id.
func appRecordID(t *testing.T, s *server, admin, clientID string) string {
	t.Helper()
	r := s.do(http.MethodGet, "/api/v1/applications?limit=200", nil, bearer(admin)...)
	for _, a := range r.JSON(t)["applications"].([]any) {
		if m := a.(map[string]any); m["clientId"] == clientID {
			return m["id"].(string)
		}
	}
	t.Fatalf("no application %s", clientID)
	return ""
}

// startSiteverify runs a siteverify-compatible server on 127.0.0.1 that
// answers success as ok says of the posted form; answers its URL.
func startSiteverify(t *testing.T, ok func(url.Values) bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.ParseForm() != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"success": ok(r.PostForm), "error-codes": []string{}})
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String() + "/siteverify"
}

// Two replicas sharing Redis and a database share the reset limits: three
// requests for one address spread over both pass, the fourth is refused by
// either (429 rate_limit_exceeded).
func TestPasswordResetLimitsSharedThroughRedis(t *testing.T) {
	redisURL := startRedis(t)
	box := startMail(t, "", "")
	secret := randomString()
	common := box.env("IDENTITYD_RATE_LIMITS=on", "IDENTITYD_REDIS_URL="+redisURL,
		"IDENTITYD_ADMIN_CLIENT_ID=shared-admin", "IDENTITYD_ADMIN_CLIENT_SECRET="+secret, "IDENTITYD_SYSTEM_SECRET="+randomString())
	a := startLogged(t, dbtest.URLs(t)["sqlite"], common...)
	b := a.sibling(t, common...)
	admin := a.token(a.AdminID, a.AdminSecret, "admin users:write")
	app := newHostedApp(t, a, admin, "Acme Vault", "http://127.0.0.1:9/callback", nil)
	const email = "shared@example.com"
	if r := a.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "password": resetPassword}, bearer(admin)...); r.Status != http.StatusCreated {
		t.Fatalf("create person: %s", describe(r))
	}
	for i, s := range []*server{a, b, a} {
		if r := s.forgot(t, app.id, email); r.Status != http.StatusOK || r.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(9-i) {
			t.Fatalf("request %d: %s %v", i+1, describe(r), r.Header)
		}
	}
	for _, s := range []*server{b, a} {
		expectEnvelope(t, s.forgot(t, app.id, email), http.StatusTooManyRequests, "rate_limit_exceeded")
	}
	box.after(t, email, 2) // three links were sent
}
