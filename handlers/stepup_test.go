package handlers

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/extensions/risk"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// enrolTOTP turns TOTP on for a person: it answers the secret and the
// recovery codes.
func (s *signinServer) enrolTOTP(t *testing.T, userID string) (string, []string) {
	t.Helper()
	ctx := context.Background()
	e, err := s.mfa.Enroll(ctx, userID)
	if err != nil {
		t.Fatal(err)
	}
	code, _ := totp.GenerateCode(e.Secret, time.Now())
	codes, err := s.mfa.Confirm(ctx, userID, code, mfa.Origin{})
	if err != nil {
		t.Fatal(err)
	}
	return e.Secret, codes
}

// nextStepCode is the TOTP code of the next 30-second step: newer than
// the one the enrolment spent, and within the ±1 step accepted.
func nextStepCode(t *testing.T, secret string) string {
	t.Helper()
	code, err := totp.GenerateCode(secret, time.Now().Add(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return code
}

func (s *signinServer) requireMFA(t *testing.T, policy string) {
	s.setApp(t, func(a *persistence.Application) { a.MFA = persistence.JSONObject{"policy": policy, "factors": []any{}} })
}

// passwordThenMFA signs the test person in with the password on the
// hosted page and answers the second-factor page.
func (b *browser) passwordThenMFA() *page {
	b.t.Helper()
	pw := b.toPasswordStep(b.s.user.Email)
	f := pw.fields()
	f.Set("password", testPassword)
	p := b.do(http.MethodPost, signinPasswordPath, f)
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinPath+"?flow=") {
		b.t.Fatalf("password with MFA: %d %q %s", p.status, p.location, p.body)
	}
	page := b.do(http.MethodGet, p.location, nil)
	expectPage(b.t, page, http.StatusOK, "Two-step verification")
	return page
}

func TestHostedMFARequired(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		s.requireMFA(t, signin.MFARequired)

		// No TOTP: a code by e-mail.
		b := s.browser(t)
		page := b.passwordThenMFA()
		if !strings.Contains(page.body, "emailed a 6-digit code") {
			t.Fatal("the e-mailed code is not announced")
		}
		code := mailedCode.FindStringSubmatch(s.next(t).Text)[1]
		f := page.fields()
		f.Set("code", "000000")
		if code == "000000" {
			f.Set("code", "000001")
		}
		expectPage(t, b.do(http.MethodPost, signinMFAPath, f), http.StatusBadRequest, "The code is not right")
		f.Set("code", code)
		p := b.do(http.MethodPost, signinMFAPath, f)
		if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinResumePath) {
			t.Fatalf("second factor: %d %s", p.status, p.body)
		}
		q := expectRedirectBack(t, b.do(http.MethodGet, p.location, nil))
		claims := idClaims(t, s.exchange(t, q.Get("code")))
		if !slices.Equal(amrOf(claims), []string{"pwd", "otp", "email", "mfa"}) || claims["acr"] != signin.ACRMultiFactor {
			t.Fatalf("claims %v", claims)
		}

		// With TOTP: a recovery code works once.
		_, recovery := s.enrolTOTP(t, s.user.ID)
		b = s.browser(t)
		page = b.passwordThenMFA()
		if !strings.Contains(page.body, "authenticator app") {
			t.Fatal("TOTP is not asked for")
		}
		f = page.fields()
		f.Set("code", recovery[0])
		p = b.do(http.MethodPost, signinMFAPath, f)
		q = expectRedirectBack(t, b.do(http.MethodGet, p.location, nil))
		if claims := idClaims(t, s.exchange(t, q.Get("code"))); !slices.Contains(amrOf(claims), "mfa") {
			t.Fatalf("claims %v", claims)
		}
		b = s.browser(t)
		f = b.passwordThenMFA().fields()
		f.Set("code", recovery[0])
		expectPage(t, b.do(http.MethodPost, signinMFAPath, f), http.StatusBadRequest, "")
	})
}

// optional: only people who enrolled are stepped up.
func TestHostedMFAOptional(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		s.requireMFA(t, signin.MFAOptional)
		b := s.browser(t)
		q := expectRedirectBack(t, b.signIn(s.authorizeURL(), s.user.Email, testPassword))
		if claims := idClaims(t, s.exchange(t, q.Get("code"))); !slices.Equal(amrOf(claims), []string{"pwd"}) || claims["acr"] != nil {
			t.Fatalf("without TOTP: %v", claims)
		}
		secret, _ := s.enrolTOTP(t, s.user.ID)
		b = s.browser(t)
		f := b.passwordThenMFA().fields()
		f.Set("code", nextStepCode(t, secret))
		p := b.do(http.MethodPost, signinMFAPath, f)
		q = expectRedirectBack(t, b.do(http.MethodGet, p.location, nil))
		if claims := idClaims(t, s.exchange(t, q.Get("code"))); !slices.Equal(amrOf(claims), []string{"pwd", "otp", "mfa"}) {
			t.Fatalf("with TOTP: %v", claims)
		}
	})
}

func TestEmbeddedMFA(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		s.requireMFA(t, signin.MFARequired)
		secret, _ := s.enrolTOTP(t, s.user.ID)
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)

		_, _, out := s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": s.user.Email})
		if out["mfaEnabled"] != true {
			t.Fatalf("check-email: %v", out)
		}
		status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if status != http.StatusOK || out["mfaRequired"] != true || out["code"] != nil ||
			!slices.Equal(toStrings(out["methods"]), []string{"totp", "recovery_code"}) {
			t.Fatalf("password: %d %v", status, out)
		}
		handle := out["mfaSessionId"].(string)
		verify := func(method, code string) (int, map[string]any) {
			status, _, out := s.embed(t, "/mfa/verify", map[string]any{"clientId": s.app, "mfaSessionId": handle, "method": method, "code": code})
			return status, out
		}
		status, out = verify("otp", "123456")
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_request")
		status, out = verify("totp", "12345")
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_code")
		status, _, out = s.embed(t, "/mfa/verify", map[string]any{"clientId": s.app, "mfaSessionId": handle + "x", "method": "totp", "code": "123456"})
		expectSignInError(t, status, out, http.StatusBadRequest, "expired_token")

		status, out = verify("totp", nextStepCode(t, secret))
		if status != http.StatusOK || out["code"] == nil {
			t.Fatalf("verify: %d %v", status, out)
		}
		status, tokens := s.embeddedExchange(t, out["code"].(string), testVerifier)
		if status != http.StatusOK {
			t.Fatalf("exchange: %d %v", status, tokens)
		}
		claims := idClaims(t, tokens)
		if !slices.Equal(amrOf(claims), []string{"pwd", "otp", "mfa"}) || claims["acr"] != signin.ACRMultiFactor {
			t.Fatalf("claims %v", claims)
		}
		// The step-up is used once.
		status, out = verify("totp", nextStepCode(t, secret))
		expectSignInError(t, status, out, http.StatusBadRequest, "expired_token")
	})
}

// A sign-in from a device the person has not used is stepped up, whatever
// the application's policy; the rule is on the auth event log.
func TestRiskStepUp(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil, func(c *signin.Config, store *persistence.Store) {
			c.Risk = risk.New(store, []byte("a system secret for this test only"), risk.DefaultConfig(), nil)
		})
		// The first sign-in ever: nothing to compare with.
		home := s.browser(t)
		expectRedirectBack(t, home.signIn(s.authorizeURL(), s.user.Email, testPassword))
		// The same device again: no step-up.
		p := home.do(http.MethodGet, s.authorizeURL("prompt", "login"), nil)
		form := home.do(http.MethodGet, p.location, nil)
		f := form.fields()
		f.Set("email", s.user.Email)
		p = home.do(http.MethodPost, signinEmailPath, f)
		f = home.do(http.MethodGet, p.location, nil).fields()
		f.Set("password", testPassword)
		if p = home.do(http.MethodPost, signinPasswordPath, f); !strings.HasPrefix(p.location, signinResumePath) {
			t.Fatalf("a known device was stepped up: %d %q", p.status, p.location)
		}

		// Another device: an e-mailed code.
		away := s.browser(t)
		page := away.passwordThenMFA()
		if !strings.Contains(page.body, "emailed a 6-digit code") {
			t.Fatal("no e-mailed code on a new device")
		}
		code := mailedCode.FindStringSubmatch(s.next(t).Text)[1]
		f = page.fields()
		f.Set("code", code)
		p = away.do(http.MethodPost, signinMFAPath, f)
		q := expectRedirectBack(t, away.do(http.MethodGet, p.location, nil))
		if claims := idClaims(t, s.exchange(t, q.Get("code"))); !slices.Contains(amrOf(claims), "mfa") {
			t.Fatalf("claims %v", claims)
		}
		var n int
		events, err := s.store.ListAuthEvents(context.Background(), s.user.ID, persistence.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if e.Type == persistence.EventRiskTriggered && e.Reason == risk.RuleNewDevice {
				n++
			}
		}
		if n == 0 {
			t.Fatal("no risk_triggered new_device event")
		}
	})
}

// A required second factor the person does not have (the application
// accepts TOTP only) refuses the sign-in: no session, mfa_required.
func TestMFARequiredUnavailable(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		s.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": signin.MFARequired, "factors": []any{"totp"}}
		})
		b := s.browser(t)
		f := b.toPasswordStep(s.user.Email).fields()
		f.Set("password", testPassword)
		p := b.do(http.MethodPost, signinPasswordPath, f)
		expectPage(t, p, http.StatusForbidden, "requires a second factor")
		if strings.Contains(p.header.Get("Set-Cookie"), "identityd_session=") {
			t.Fatal("a session without the required factor")
		}
		status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
			"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"})
		expectSignInError(t, status, out, http.StatusForbidden, "mfa_required")
	})
}
