package handlers

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence/dbtest"
)

// noFollow is a client that keeps cookies and does not follow redirects.
func noFollow() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// FuzzAuthorizeRequest sends arbitrary query strings to the authorization
// endpoint: it never fails inside, and it only ever redirects to the
// registered redirect URI or to the hosted sign-in page.
func FuzzAuthorizeRequest(f *testing.F) {
	s := newSigninServer(f, dbtest.URLs(f)["sqlite"], nil)
	valid := strings.SplitN(s.authorizeURL(), "?", 2)[1]
	for _, seed := range []string{
		valid, valid + "&prompt=none", valid + "&prompt=login%20consent", valid + "&max_age=0", valid + "&max_age=-1",
		valid + "&id_token_hint=a.b.c", valid + "&login_hint=%00", valid + "&redirect_uri=https://evil.example/",
		valid + "&response_type=token", valid + "&request_uri=https://evil.example/r", valid + "&request=e30.e30.",
		"client_id=" + s.app, "", "%zz", "client_id=" + s.app + "&client_id=x", valid + "&response_mode=form_post",
	} {
		f.Add(seed)
	}
	c := noFollow()
	f.Fuzz(func(t *testing.T, query string) {
		resp, err := c.Get(s.URL + oauth.AuthorizePath + "?" + query)
		if err != nil {
			return // not a request net/http will send
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%q: %d %s", query, resp.StatusCode, body)
		}
		if loc := resp.Header.Get("Location"); loc != "" && !strings.HasPrefix(loc, testRedirect+"?") && !strings.HasPrefix(loc, signinPath+"?flow=") {
			t.Fatalf("%q: redirected to %q", query, loc)
		}
		formPost := strings.Contains(string(body), `action="`+testRedirect+`"`) // submits itself: no CSP (answerHeaders)
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") && resp.Header.Get("Content-Security-Policy") == "" && !formPost {
			t.Fatalf("%q: a page without CSP", query)
		}
	})
}

// FuzzSigninForms posts arbitrary bodies to the sign-in forms of a live
// flow in a browser holding its cookie: never an internal failure, never
// a session without the right password, never a redirect off the pages.
func FuzzSigninForms(f *testing.F) {
	s := newSigninServer(f, dbtest.URLs(f)["sqlite"], nil)
	c := noFollow()
	resp, err := c.Get(s.URL + s.authorizeURL())
	if err != nil {
		f.Fatal(err)
	}
	resp.Body.Close()
	form, err := c.Get(s.URL + resp.Header.Get("Location"))
	if err != nil {
		f.Fatal(err)
	}
	raw, _ := io.ReadAll(form.Body)
	form.Body.Close()
	good := (&page{body: string(raw)}).fields()
	good.Set("email", "nobody@example.com")
	for _, seed := range []string{
		good.Encode(), good.Encode() + "&password=x", good.Encode() + "&email=" + url.QueryEscape(s.user.Email),
		"flow=" + good.Get("flow"), "csrf_token=" + good.Get("csrf_token"), "", "%zz", "flow=../../x&csrf_token=AAAA",
		good.Encode() + "&email=%00", good.Encode() + "&email=" + strings.Repeat("a", 300) + "@example.com",
	} {
		for path := range 6 {
			f.Add(path, seed)
		}
	}
	f.Add(3, good.Encode()+"&method=otp")
	f.Add(4, good.Encode()+"&code=123456")
	f.Add(5, "token=abc&csrf_token="+good.Get("csrf_token"))
	paths := []string{signinEmailPath, signinPasswordPath, signinRestartPath, signinMethodPath, signinOTPPath, signin.MagicLinkPath}
	f.Fuzz(func(t *testing.T, which int, body string) {
		path := paths[(which%len(paths)+len(paths))%len(paths)]
		req, _ := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, out)
		}
		if loc := resp.Header.Get("Location"); loc != "" && !strings.HasPrefix(loc, signinPath) {
			t.Fatalf("%s %q: redirected to %q", path, body, loc)
		}
		if strings.Contains(resp.Header.Get("Set-Cookie"), "identityd_session=") && !strings.Contains(body, "password="+url.QueryEscape(testPassword)) {
			t.Fatalf("%s %q: a session without the password", path, body)
		}
	})
}

// FuzzEmbedded posts arbitrary bodies to every embedded sign-in route:
// never an internal failure, always the sign-in error shape or a success,
// and never a code without the right password.
func FuzzEmbedded(f *testing.F) {
	s := newSigninServer(f, dbtest.URLs(f)["sqlite"], nil)
	paths := []string{"/check-email", "/password", "/otp/send", "/otp/verify", "/magic-link/send", "/mfa/verify", "/code/exchange"}
	for i := range paths {
		for _, seed := range []string{
			`{"clientId":"` + s.app + `","email":"` + s.user.Email + `"}`,
			`{"clientId":"` + s.app + `","email":"` + s.user.Email + `","password":"x","codeChallenge":"` + strings.Repeat("a", 43) + `","codeChallengeMethod":"S256"}`,
			`{"clientId":"` + s.app + `","email":"a@example.com","code":"123456"}`,
			`{"clientId":"` + s.app + `","email":"a@example.com","redirectUri":"` + testRedirect + `"}`,
			`{"code":"x","client_id":"` + s.app + `","client_secret":"y"}`,
			`{"clientId":"` + s.app + `","mfaSessionId":"x","method":"totp","code":"123456"}`,
			``, `{}`, `[]`, `null`, `{"clientId":null}`, `{"clientId":"` + s.app + `","email":"\u0000"}`, `{"clientId":{"a":1}}`,
		} {
			f.Add(i, seed)
		}
	}
	f.Fuzz(func(t *testing.T, which int, body string) {
		path := paths[(which%len(paths)+len(paths))%len(paths)]
		req, _ := http.NewRequest(http.MethodPost, s.URL+embeddedPath+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, raw)
		}
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %q: not JSON: %s", path, body, raw)
		}
		if resp.StatusCode >= 400 && (out["error"] == nil || out["error_description"] == nil) {
			t.Fatalf("%s %q: error shape %s", path, body, raw)
		}
		if out["code"] != nil && !strings.Contains(body, testPassword) {
			t.Fatalf("%s %q: a code without the password", path, body)
		}
	})
}
