package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

var (
	mailedCode = regexp.MustCompile(`\b(\d{6})\b`)
	mailedLink = regexp.MustCompile(`http://[^\s"]+/signin/magic-link\?token=[A-Za-z0-9_-]+`)
	tokenField = regexp.MustCompile(`name="token" value="([^"]*)"`)
)

// next is the next message the outbox sent.
func (s *signinServer) next(t *testing.T) mail.Message {
	t.Helper()
	select {
	case m := <-s.mails:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message sent")
		return mail.Message{}
	}
}

// passwordless adds a person without a password.
func (s *signinServer) passwordless(t testing.TB) *persistence.User {
	t.Helper()
	n := extensions.Now()
	u := &persistence.User{ID: uuid.NewString(), Email: rand8() + "@example.com", Name: "Lin", Status: directory.StatusActive,
		Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
	if err := s.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

// toPasswordStep takes a browser to the password page for email.
func (b *browser) toPasswordStep(email string) *page {
	b.t.Helper()
	p := b.do(http.MethodGet, b.s.authorizeURL(), nil)
	form := b.do(http.MethodGet, p.location, nil)
	f := form.fields()
	f.Set("email", email)
	p = b.do(http.MethodPost, signinEmailPath, f)
	page := b.do(http.MethodGet, p.location, nil)
	expectPage(b.t, page, http.StatusOK, `<label for="password">Password</label>`)
	return page
}

// choose posts a method's alternative form from a page.
func (b *browser) choose(from *page, method string) *page {
	b.t.Helper()
	f := from.fields()
	f.Set("method", method)
	p := b.do(http.MethodPost, signinMethodPath, f)
	if p.status != http.StatusSeeOther {
		b.t.Fatalf("choosing %s: %d %s", method, p.status, p.body)
	}
	return b.do(http.MethodGet, p.location, nil)
}

// idClaims decodes an ID token's payload (its signature is checked by the
// flow tests).
func idClaims(t *testing.T, tokens map[string]any) map[string]any {
	t.Helper()
	parts := strings.Split(tokens["id_token"].(string), ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	return claims
}

func amrOf(claims map[string]any) []string {
	var out []string
	for _, v := range claims["amr"].([]any) {
		out = append(out, v.(string))
	}
	return out
}

func TestHostedOTP(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)
		b := s.browser(t)
		pw := b.toPasswordStep(lin.Email)
		for _, label := range []string{"Email me a code", "Email me a link"} {
			if !strings.Contains(pw.body, label) {
				t.Fatalf("no %q on the password page", label)
			}
		}
		otp := b.choose(pw, "otp")
		expectPage(t, otp, http.StatusOK, `<label for="code">Code</label>`)
		if !strings.Contains(otp.body, `autocomplete="one-time-code"`) || !strings.Contains(otp.body, "Sign in with a password") {
			t.Fatal("the code page lacks its autocomplete or the password alternative")
		}
		m := s.next(t)
		code := mailedCode.FindStringSubmatch(m.Text)[1]

		// No CSRF token, or another's: refused before any check.
		f := otp.fields()
		f.Set("code", code)
		bad := url.Values{"flow": {f.Get("flow")}, "code": {code}}
		expectPage(t, b.do(http.MethodPost, signinOTPPath, bad), http.StatusForbidden, "expired")

		wrong := "000000"
		if code == wrong {
			wrong = "000001"
		}
		f.Set("code", wrong)
		expectPage(t, b.do(http.MethodPost, signinOTPPath, f), http.StatusBadRequest, "The code is not right")
		f.Set("code", code)
		p := b.do(http.MethodPost, signinOTPPath, f)
		if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinResumePath) {
			t.Fatalf("right code: %d %s", p.status, p.body)
		}
		q := expectRedirectBack(t, b.do(http.MethodGet, p.location, nil))
		claims := idClaims(t, s.exchange(t, q.Get("code")))
		if claims["sub"] != lin.ID || !slices.Equal(amrOf(claims), []string{"otp", "email"}) {
			t.Fatalf("claims %v", claims)
		}
		// The code is spent: a second post of the same form finds no step.
		if p := b.do(http.MethodPost, signinOTPPath, f); p.status < 400 {
			t.Fatalf("a spent code: %d", p.status)
		}
	})
}

// A person who signs in with a password asks for a code: the page looks
// the same, and the mail says why no code came.
func TestHostedOTPForPasswordAccount(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		expectPage(t, b.choose(b.toPasswordStep(s.user.Email), "otp"), http.StatusOK, `<label for="code">Code</label>`)
		m := s.next(t)
		if mailedCode.MatchString(m.Text) || !strings.Contains(m.Text, "signs in another way (password)") {
			t.Fatalf("notice %q", m.Text)
		}
	})
}

func TestHostedMagicLink(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)
		b := s.browser(t)
		sent := b.choose(b.toPasswordStep(lin.Email), "magic-link")
		expectPage(t, sent, http.StatusOK, "we have sent one")
		link := mailedLink.FindString(s.next(t).Text)
		if link == "" {
			t.Fatal("no link")
		}

		// A scanner's HEAD and GET spend nothing.
		scanner := s.browser(t)
		if p := scanner.do(http.MethodHead, link, nil); p.status != http.StatusOK {
			t.Fatalf("HEAD: %d", p.status)
		}
		expectPage(t, scanner.do(http.MethodGet, link, nil), http.StatusOK, "Sign in as")

		confirm := b.do(http.MethodGet, link, nil)
		expectPage(t, confirm, http.StatusOK, "Sign in as <strong>"+lin.Email+"</strong>")
		form := url.Values{"token": {tokenField.FindStringSubmatch(confirm.body)[1]}, "csrf_token": {confirm.fields().Get("csrf_token")}}
		// The scanner's page token is no good in this browser.
		expectPage(t, b.do(http.MethodPost, link[:strings.Index(link, "?")], url.Values{"token": form["token"],
			"csrf_token": {scanner.do(http.MethodGet, link, nil).fields().Get("csrf_token")}}), http.StatusForbidden, "expired")

		p := b.do(http.MethodPost, link[:strings.Index(link, "?")], form)
		if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinResumePath) {
			t.Fatalf("confirm: %d %s", p.status, p.body)
		}
		q := expectRedirectBack(t, b.do(http.MethodGet, p.location, nil))
		claims := idClaims(t, s.exchange(t, q.Get("code")))
		if claims["sub"] != lin.ID || !slices.Equal(amrOf(claims), []string{"email"}) {
			t.Fatalf("claims %v", claims)
		}
		// Used once.
		expectPage(t, b.do(http.MethodPost, link[:strings.Index(link, "?")], form), http.StatusBadRequest, "expired")
		expectPage(t, b.do(http.MethodGet, link, nil), http.StatusBadRequest, "expired")
	})
}

// A link opened on another device signs that browser in and continues the
// application's authorization there.
func TestHostedMagicLinkOtherBrowser(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		lin := s.passwordless(t)
		desk := s.browser(t)
		desk.choose(desk.toPasswordStep(lin.Email), "magic-link")
		link := mailedLink.FindString(s.next(t).Text)

		phone := s.browser(t)
		confirm := phone.do(http.MethodGet, link, nil)
		form := url.Values{"token": {tokenField.FindStringSubmatch(confirm.body)[1]}, "csrf_token": {confirm.fields().Get("csrf_token")}}
		p := phone.do(http.MethodPost, link[:strings.Index(link, "?")], form)
		if p.status != http.StatusSeeOther {
			t.Fatalf("confirm: %d %s", p.status, p.body)
		}
		q := expectRedirectBack(t, phone.do(http.MethodGet, p.location, nil))
		if claims := idClaims(t, s.exchange(t, q.Get("code"))); claims["sub"] != lin.ID {
			t.Fatalf("claims %v", claims)
		}
	})
}
