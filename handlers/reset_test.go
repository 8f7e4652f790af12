package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

var resetLink = regexp.MustCompile(`http://[^\s"]+/signin/reset-password\?token=([A-Za-z0-9_-]{43})`)

// resetToken is the token of the next reset e-mail, to s.user unless to says.
func (s *signinServer) resetToken(t *testing.T, to string) string {
	t.Helper()
	m := s.next(t)
	l := resetLink.FindStringSubmatch(m.Text)
	if m.To != to || l == nil || !strings.Contains(m.HTML, l[0]) {
		t.Fatalf("reset e-mail %+v", m)
	}
	return l[1]
}

// apiCall posts (or gets, body nil) JSON from the test address.
func (s *signinServer) apiCall(t *testing.T, method, path string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		r = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, s.URL+path, r)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header, out
}

func (s *signinServer) forgot(t *testing.T, email string) (int, http.Header, map[string]any) {
	t.Helper()
	return s.apiCall(t, http.MethodPost, forgotPasswordPath, map[string]any{"email": email, "clientId": s.app})
}

func (s *signinServer) resetWith(t *testing.T, token, password string) (int, map[string]any) {
	t.Helper()
	status, _, body := s.apiCall(t, http.MethodPost, resetPasswordPath, map[string]any{"token": token, "newPassword": password})
	return status, body
}

func expectCode(t *testing.T, status int, body map[string]any, wantStatus int, code string) {
	t.Helper()
	if status != wantStatus || body["error"] != code {
		t.Fatalf("want %d %s, got %d %v", wantStatus, code, status, body)
	}
	if _, ok := body["details"].(map[string]any); !ok {
		t.Fatalf("no details object: %v", body)
	}
}

func TestResetAPI(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		ctx := context.Background()

		// The same answer for an account and for no account; only the
		// account gets mail.
		status, _, known := s.forgot(t, s.user.Email)
		_, _, unknown := s.forgot(t, "nobody@example.com")
		if status != http.StatusOK || known["message"] != reset.Neutral || unknown["message"] != known["message"] || len(known) != 1 {
			t.Fatalf("answers %d %v %v", status, known, unknown)
		}
		token := s.resetToken(t, s.user.Email)
		select {
		case m := <-s.mails:
			t.Fatalf("mail for an unknown address: %+v", m)
		case <-time.After(300 * time.Millisecond):
		}

		// Bad requests.
		for _, body := range []map[string]any{{"email": s.user.Email}, {"clientId": s.app}, {"email": "not an address", "clientId": s.app},
			{"email": s.user.Email, "clientId": "app_none"}, {"email": s.user.Email, "clientId": s.app, "extra": 1}} {
			status, _, out := s.apiCall(t, http.MethodPost, forgotPasswordPath, body)
			if status != http.StatusBadRequest || (out["error"] != "invalid_request" && out["error"] != "invalid_json") {
				t.Fatalf("%v: %d %v", body, status, out)
			}
		}

		// Verify: the masked address and the time left; nothing spent.
		for range 2 {
			status, _, v := s.apiCall(t, http.MethodGet, resetVerifyPath+"?token="+token, nil)
			masked := s.user.Email[:1] + "***@example.com"
			if status != http.StatusOK || v["valid"] != true || v["email"] != masked || v["expiresIn"].(float64) < 3590 || v["expiresIn"].(float64) > 3600 {
				t.Fatalf("verify: %d %v", status, v)
			}
		}
		status, _, v := s.apiCall(t, http.MethodGet, resetVerifyPath+"?token=nope", nil)
		if status != http.StatusBadRequest || v["valid"] != false || v["error"] != "invalid_token" || v["error_description"] == "" {
			t.Fatalf("verify unknown: %d %v", status, v)
		}

		// A signed-in session and its refresh token, to see them die.
		b := s.browser(t)
		q := expectRedirectBack(t, b.signIn(s.authorizeURL("scope", "openid email offline_access"), s.user.Email, testPassword))
		tokens := s.exchange(t, q.Get("code"))

		// Weak passwords, each an attempt, then the reset.
		for i, pw := range []string{"short", s.user.Email} {
			st, out := s.resetWith(t, token, pw)
			expectCode(t, st, out, http.StatusBadRequest, "weak_password")
			if out["details"].(map[string]any)["attemptsRemaining"] != float64(2-i) {
				t.Fatalf("attempts remaining: %v", out)
			}
		}
		st, out := s.resetWith(t, token, "a brand new password")
		if st != http.StatusOK || out["message"] == "" {
			t.Fatalf("reset: %d %v", st, out)
		}
		st, out = s.resetWith(t, token, "a brand new password")
		expectCode(t, st, out, http.StatusBadRequest, "token_used")
		status, _, v = s.apiCall(t, http.MethodGet, resetVerifyPath+"?token="+token, nil)
		if status != http.StatusBadRequest || v["error"] != "token_used" {
			t.Fatalf("verify used: %d %v", status, v)
		}

		// The session and every token are gone; the new password works, the old does not.
		if list, err := s.store.ListUserSSOSessions(ctx, s.user.ID); err != nil || len(list) != 0 {
			t.Fatalf("sessions: %d %v", len(list), err)
		}
		if st := s.refresh(t, tokens["refresh_token"].(string)); st != http.StatusBadRequest && st != http.StatusUnauthorized {
			t.Fatalf("refresh after the reset: %d", st)
		}
		if st := s.userinfo(t, tokens["access_token"].(string)); st != http.StatusUnauthorized {
			t.Fatalf("userinfo after the reset: %d", st)
		}
		if p := s.browser(t).signIn(s.authorizeURL(), s.user.Email, testPassword); p.status != http.StatusUnauthorized {
			t.Fatalf("the old password: %d", p.status)
		}
		expectRedirectBack(t, s.browser(t).signIn(s.authorizeURL(), s.user.Email, "a brand new password"))

		// Missing members and a body that is not JSON.
		st, out = s.resetWith(t, "", "a brand new password")
		expectCode(t, st, out, http.StatusBadRequest, "invalid_request")
		status, _, out = s.apiCall(t, http.MethodPost, resetPasswordPath, map[string]any{"token": token})
		expectCode(t, status, out, http.StatusBadRequest, "invalid_request")
		st, out = s.resetWith(t, "unknown-token", "a brand new password")
		expectCode(t, st, out, http.StatusBadRequest, "invalid_token")
	})
}

// refresh uses a refresh token and answers the status.
func (s *signinServer) refresh(t *testing.T, token string) int {
	t.Helper()
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {token}}
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/api/v1/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(s.app, s.appSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// userinfo calls userinfo with an access token and answers the status.
func (s *signinServer) userinfo(t *testing.T, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/api/v1/oauth/userinfo", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestResetExpiryAndAttempts(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		ctx := context.Background()
		s.forgot(t, s.user.Email)
		token := s.resetToken(t, s.user.Email)
		for range 3 {
			st, out := s.resetWith(t, token, "password")
			expectCode(t, st, out, http.StatusBadRequest, "weak_password")
		}
		st, out := s.resetWith(t, token, "a brand new password")
		expectCode(t, st, out, http.StatusBadRequest, "too_many_attempts")

		s.forgot(t, s.user.Email)
		token = s.resetToken(t, s.user.Email)
		// An hour passes: the row's expiry moved into the past stands in for the wait.
		db, _, err := persistence.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(db.Rebind(`UPDATE password_resets SET expires_at = ? WHERE used_at IS NULL AND attempts = 0`), time.Now().Add(-time.Second).UTC()); err != nil {
			t.Fatal(err)
		}
		st, out = s.resetWith(t, token, "a brand new password")
		expectCode(t, st, out, http.StatusBadRequest, "token_expired")
		status, _, v := s.apiCall(t, http.MethodGet, resetVerifyPath+"?token="+token, nil)
		if status != http.StatusBadRequest || v["error"] != "token_expired" {
			t.Fatalf("verify expired: %d %v", status, v)
		}
	})
}

func TestResetLimits(t *testing.T) {
	limits := DefaultRateLimits()
	s := newSigninServer(t, dbtest.URLs(t)["sqlite"], &limits)
	// 3 per hour per e-mail address.
	for i := range 3 {
		status, h, _ := s.forgot(t, s.user.Email)
		if status != http.StatusOK || h.Get("X-RateLimit-Limit") != "10" || h.Get("X-RateLimit-Remaining") != string(rune('9'-i)) || h.Get("X-RateLimit-Reset") == "" {
			t.Fatalf("request %d: %d %v", i, status, h)
		}
		s.resetToken(t, s.user.Email)
	}
	status, h, out := s.forgot(t, s.user.Email)
	expectCode(t, status, out, http.StatusTooManyRequests, "rate_limit_exceeded")
	if h.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	// The person, from an address that has not asked, still can: a
	// stranger cannot lock them out.
	other := &http.Client{Transport: realAddr{}}
	raw, _ := json.Marshal(map[string]any{"email": s.user.Email, "clientId": s.app})
	resp, err := other.Post(s.URL+forgotPasswordPath, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("from another address: %d", resp.StatusCode)
	}
	s.resetToken(t, s.user.Email)
	// 10 per hour per address, whatever the addresses asked for.
	for i := 3; i < 10; i++ {
		if status, _, _ := s.forgot(t, "someone"+string(rune('a'+i))+"@example.com"); status != http.StatusOK {
			t.Fatalf("request %d: %d", i, status)
		}
	}
	status, _, out = s.forgot(t, "someone.else@example.com")
	expectCode(t, status, out, http.StatusTooManyRequests, "rate_limit_exceeded")
}

func TestResetCaptcha(t *testing.T) {
	var got url.Values
	verifier := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		got = r.PostForm
		_ = json.NewEncoder(w).Encode(map[string]any{"success": r.PostForm.Get("response") == "solved" && r.PostForm.Get("secret") == "captcha-secret"})
	}))
	t.Cleanup(verifier.Close)
	s := newSigninServer(t, dbtest.URLs(t)["sqlite"], nil)
	s.reset.SetCaptcha(&reset.Captcha{VerifyURL: verifier.URL, Secret: "captcha-secret"})
	for token, code := range map[string]string{"": "captcha_required", "wrong": "captcha_failed"} {
		status, _, out := s.apiCall(t, http.MethodPost, forgotPasswordPath, map[string]any{"email": s.user.Email, "clientId": s.app, "captchaToken": token})
		expectCode(t, status, out, http.StatusBadRequest, code)
	}
	status, _, out := s.apiCall(t, http.MethodPost, forgotPasswordPath, map[string]any{"email": s.user.Email, "clientId": s.app, "captchaToken": "solved"})
	if status != http.StatusOK || out["message"] != reset.Neutral {
		t.Fatalf("solved: %d %v", status, out)
	}
	if got.Get("remoteip") != "127.0.0.1" || got.Get("secret") != "captcha-secret" {
		t.Fatalf("siteverify got %v", got)
	}
	s.resetToken(t, s.user.Email)
}

func TestResetPages(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		pw := b.toPasswordStep(s.user.Email)
		link := regexp.MustCompile(`href="(/signin/forgot-password\?flow=[^"]+)"`).FindStringSubmatch(pw.body)
		if link == nil || !strings.Contains(pw.body, "Forgot password?") {
			t.Fatalf("no Forgot password? link: %s", pw.body)
		}
		forgot := b.do(http.MethodGet, strings.ReplaceAll(link[1], "&amp;", "&"), nil)
		expectPage(t, forgot, http.StatusOK, `<label for="email">Email</label>`)
		if !strings.Contains(forgot.body, `value="`+s.user.Email+`"`) || !strings.Contains(forgot.body, "Back to sign-in") {
			t.Fatal("the forgot page lacks the address or the way back")
		}
		f := formFields(forgot.body)
		// Without its CSRF token: refused.
		bad := url.Values{"client_id": {s.app}, "email": {s.user.Email}}
		expectPage(t, b.do(http.MethodPost, forgotPagePath, bad), http.StatusForbidden, "expired")
		expectPage(t, b.do(http.MethodPost, forgotPagePath, f), http.StatusOK, "If an account uses this e-mail address")
		token := s.resetToken(t, s.user.Email)
		f.Set("email", "nobody@example.com")
		expectPage(t, b.do(http.MethodPost, forgotPagePath, f), http.StatusOK, "If an account uses this e-mail address")
		f.Set("email", "not an address")
		expectPage(t, b.do(http.MethodPost, forgotPagePath, f), http.StatusBadRequest, "Enter an email address")

		// The application's own link to the forgot page.
		expectPage(t, b.do(http.MethodGet, forgotPagePath+"?client_id="+s.app, nil), http.StatusOK, "Email me a reset link")
		expectPage(t, b.do(http.MethodGet, forgotPagePath+"?client_id=app_none", nil), http.StatusBadRequest, "")

		// The e-mailed link, opened in another browser (the mail client's).
		other := s.browser(t)
		page := other.do(http.MethodGet, resetPagePath+"?token="+token, nil)
		expectPage(t, page, http.StatusOK, `<label for="new-password">New password</label>`)
		for _, want := range []string{`autocomplete="new-password"`, `<label for="confirm-password">Confirm new password</label>`, s.user.Email[:1] + "***@example.com"} {
			if !strings.Contains(page.body, want) {
				t.Fatalf("the reset page lacks %q", want)
			}
		}
		rf := formFields(page.body)
		rf.Set("new_password", "a brand new password")
		rf.Set("confirm_password", "another password")
		expectPage(t, other.do(http.MethodPost, resetPagePath, rf), http.StatusBadRequest, "The two passwords are not the same")
		rf.Set("new_password", "password")
		rf.Set("confirm_password", "password")
		expectPage(t, other.do(http.MethodPost, resetPagePath, rf), http.StatusBadRequest, "most common")
		// Another browser's CSRF token is refused.
		expectPage(t, b.do(http.MethodPost, resetPagePath, rf), http.StatusForbidden, "expired")
		rf.Set("new_password", "a brand new password")
		rf.Set("confirm_password", "a brand new password")
		expectPage(t, other.do(http.MethodPost, resetPagePath, rf), http.StatusOK, "Your password has been changed")
		expectPage(t, other.do(http.MethodPost, resetPagePath, rf), http.StatusBadRequest, "already used")
		expectPage(t, other.do(http.MethodGet, resetPagePath+"?token="+token, nil), http.StatusBadRequest, "already used")
		expectRedirectBack(t, s.browser(t).signIn(s.authorizeURL(), s.user.Email, "a brand new password"))
	})
}

// formFields are every hidden field of a page, and its e-mail field.
func formFields(body string) url.Values {
	v := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		v.Set(m[1], htmlUnescape(m[2]))
	}
	if m := regexp.MustCompile(`name="email"[^>]*value="([^"]*)"`).FindStringSubmatch(body); m != nil {
		v.Set("email", htmlUnescape(m[1]))
	}
	return v
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&lt;", "<", "&gt;", ">", "&#34;", `"`, "&#39;", "'").Replace(s)
}

// TestForgotPasswordTiming: a forgot-password request for an address
// without an account takes as long as one for an account, at the median,
// over 200 requests of each, in random order from eight clients at once
// (every answer is held to reset.ResponseFloor, so one client would take a
// minute). This is the one timing assertion of the suite, and it is what
// the spec's neutral answer is for: a difference would tell who has an
// account.
func TestForgotPasswordTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		drain := make(chan struct{})
		go func() { // the outbox's deliveries, as fast as they come
			for {
				select {
				case <-s.mails:
				case <-drain:
					return
				}
			}
		}()
		defer close(drain)
		call := func(client *http.Client, email string) time.Duration {
			raw, _ := json.Marshal(map[string]any{"email": email, "clientId": s.app})
			start := time.Now()
			resp, err := client.Post(s.URL+forgotPasswordPath, "application/json", bytes.NewReader(raw))
			if err != nil {
				t.Error(err)
				return 0
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			d := time.Since(start)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %d", email, resp.StatusCode)
			}
			return d
		}
		const n, workers = 200, 8
		order := make([]bool, 2*n) // true: the account's address
		for i := range order {
			order[i] = i%2 == 0
		}
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		queue := make(chan bool, len(order))
		for _, b := range order {
			queue <- b
		}
		close(queue)
		var mu sync.Mutex
		var known, unknown []time.Duration
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				client := &http.Client{}
				for account := range queue {
					email := "nobody" + string(rune('a'+w)) + "@example.com"
					if account {
						email = s.user.Email
					}
					d := call(client, email)
					mu.Lock()
					if account {
						known = append(known, d)
					} else {
						unknown = append(unknown, d)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
		k, u := median(known), median(unknown)
		diff := k - u
		if diff < 0 {
			diff = -diff
		}
		t.Logf("p50 of %d requests each: account %v, no account %v", n, k, u)
		if k < reset.ResponseFloor || u < reset.ResponseFloor {
			t.Fatalf("answered before the floor: %v %v", k, u)
		}
		// Not measurable: within a fiftieth of the median (4 ms), which
		// machine noise stays under and a missing floor does not (the
		// paths' own times differ by about 0.3 ms, a whole median apart).
		if diff > max(k, u)/50 {
			t.Fatalf("p50 differs: account %v, no account %v", k, u)
		}
	})
}

// With a captcha and its widget configured, the hosted forgot page shows
// the provider's widget, its CSP admits the provider's script and frames
// (and nothing else beyond the pages'), and the widget's field is the
// token checked; without it the form is refused with the reason.
func TestResetPageCaptchaWidget(t *testing.T) {
	verifier := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		_ = json.NewEncoder(w).Encode(map[string]any{"success": r.PostForm.Get("response") == "solved"})
	}))
	t.Cleanup(verifier.Close)
	s := newSigninServer(t, dbtest.URLs(t)["sqlite"], nil)
	widget, _ := reset.NewWidget("turnstile", "0x4AAAAAAA-site-key")
	s.reset.SetCaptcha(&reset.Captcha{VerifyURL: verifier.URL, Secret: "captcha-secret", Widget: widget})
	b := s.browser(t)
	page := b.do(http.MethodGet, forgotPagePath+"?client_id="+s.app, nil)
	csp := page.header.Get("Content-Security-Policy")
	if page.status != http.StatusOK || !strings.Contains(page.body, `<div class="field cf-turnstile" data-sitekey="0x4AAAAAAA-site-key"></div>`) ||
		!strings.Contains(page.body, `<script src="https://challenges.cloudflare.com/turnstile/v0/api.js" async defer></script>`) {
		t.Fatalf("no widget: %d %s", page.status, page.body)
	}
	for _, want := range []string{"default-src 'none'", "script-src https://challenges.cloudflare.com;", "frame-src https://challenges.cloudflare.com;", "frame-ancestors 'none'", "form-action 'self'"} {
		if !strings.Contains(csp, want) {
			t.Fatalf("CSP %q lacks %q", csp, want)
		}
	}
	f := formFields(page.body)
	f.Set("email", s.user.Email)
	if p := b.do(http.MethodPost, forgotPagePath, f); p.status != http.StatusBadRequest || !strings.Contains(p.body, "Complete the captcha") ||
		!strings.Contains(p.body, "cf-turnstile") {
		t.Fatalf("no captcha: %d %s", p.status, p.body)
	}
	f.Set("cf-turnstile-response", "solved")
	expectPage(t, b.do(http.MethodPost, forgotPagePath, f), http.StatusOK, "If an account uses this e-mail address")
	s.resetToken(t, s.user.Email)
	// Other pages keep the strict policy.
	if csp := b.do(http.MethodGet, s.authorizeURL(), nil).header.Get("Content-Security-Policy"); strings.Contains(csp, "script-src") {
		t.Fatalf("a sign-in page admits scripts: %q", csp)
	}
}
