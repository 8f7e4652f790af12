package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"

	"github.com/identityd/identityd/persistence/dbtest"
)

// multiFactor is the acr of a stepped-up sign-in (OpenID PAPE).
const multiFactor = "http://schemas.openid.net/pape/policies/2007/06/multi-factor"

// acrOf reads the acr claim of an ID token (verified by the caller).
func acrOf(t *testing.T, raw string) string {
	t.Helper()
	var c struct {
		ACR string `json:"acr"`
	}
	idTokenClaims(t, raw, &c)
	return c.ACR
}

// idTokenClaims reads the payload of an ID token (verified by the caller)
// into claims.
func idTokenClaims(t *testing.T, raw string, claims any) {
	t.Helper()
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", raw)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(payload, claims); err != nil {
		t.Fatalf("claims of %s: %v", payload, err)
	}
}

// MFA over real HTTP and SMTP: an application that requires a second
// factor (an e-mailed code without TOTP; TOTP or a recovery code with it),
// one that makes it optional (only people who enrolled), on the hosted
// page and through the embedded API; replayed TOTP and recovery codes.
func TestMFASignIn(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		// Every browser here is new: the device rule would step up the
		// optional application's sign-ins too (it has its own tests).
		s := startLogged(t, dbURL, append(box.env(), "IDENTITYD_RISK_DISABLED=new_device")...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		required := newHostedApp(t, s, admin, "Acme Vault", redirect, map[string]any{
			"signInMethods": []string{"password", "otp"}, "mfa": map[string]any{"policy": "required", "factors": []string{"totp", "otp"}}})
		optional := newHostedApp(t, s, admin, "Acme Notes", redirect, map[string]any{
			"signInMethods": []string{"password"}, "mfa": map[string]any{"policy": "optional"}})
		const email, password = "pat@example.com", "correct horse battery staple"
		if r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": "Pat", "password": password}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		// passwordStep signs in with the password on the hosted page and
		// answers the page after it.
		passwordStep := func(app hostedApp) (*hostedBrowser, *response, authorization) {
			b := newHostedBrowser(t, s, redirect)
			page, a := b.authorize(app)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			return b, b.submit(page, "/signin/password", "", url.Values{"password": {password}}), a
		}

		// Optional, nothing enrolled: one factor, no acr.
		b, page, a := passwordStep(optional)
		tok, c := b.finish(optional, a, page)
		if !slices.Equal(c.AMR, []string{"pwd"}) || acrOf(t, tok.Extra("id_token").(string)) != "" {
			t.Fatalf("optional without TOTP: %v", c.AMR)
		}
		user := bearer(tok.AccessToken)

		// Required, no TOTP: a code e-mailed after the password.
		n := len(box.to(email))
		b, page, a = passwordStep(required)
		expectPage(t, page, http.StatusOK, "Two-step verification", "emailed a 6-digit code", `<label for="code">Code</label>`)
		code := otpIn(t, box.after(t, email, n), required.name)
		wrong := b.submit(page, "/signin/mfa", "", url.Values{"code": {otherCode(code, 0)}})
		expectPage(t, wrong, http.StatusBadRequest, "The code is not right")
		tok, c = b.finish(required, a, b.submit(wrong, "/signin/mfa", "", url.Values{"code": {code}}))
		if !slices.Equal(c.AMR, []string{"pwd", "otp", "email", "mfa"}) || acrOf(t, tok.Extra("id_token").(string)) != multiFactor {
			t.Fatalf("required with an e-mailed code: %v", c.AMR)
		}

		// TOTP on, with the person's own token.
		r := s.as(t).do(http.MethodPost, totpPath+"/enroll", nil, user...)
		if r.Status != http.StatusOK {
			t.Fatalf("enroll: %s", describe(r))
		}
		secret := r.JSON(t)["secret"].(string)
		now, _ := totp.GenerateCode(secret, time.Now())
		r = s.as(t).do(http.MethodPost, totpPath+"/confirm", map[string]any{"code": now}, user...)
		if r.Status != http.StatusOK {
			t.Fatalf("confirm: %s", describe(r))
		}
		recovery := strs(r.JSON(t)["recoveryCodes"])

		// Optional, enrolled: TOTP. The confirming code's step is taken;
		// the next step's code is accepted (±1 step).
		b, page, a = passwordStep(optional)
		expectPage(t, page, http.StatusOK, "Two-step verification", "authenticator app")
		replay := b.submit(page, "/signin/mfa", "", url.Values{"code": {now}})
		expectPage(t, replay, http.StatusBadRequest, "not right")
		next, _ := totp.GenerateCode(secret, time.Now().Add(30*time.Second))
		tok, c = b.finish(optional, a, b.submit(replay, "/signin/mfa", "", url.Values{"code": {next}}))
		if !slices.Equal(c.AMR, []string{"pwd", "otp", "mfa"}) || acrOf(t, tok.Extra("id_token").(string)) != multiFactor {
			t.Fatalf("optional with TOTP: %v", c.AMR)
		}

		// Required, embedded: mfaRequired, then a recovery code (once).
		verifier, challenge := pkce()
		r = s.embed(t, "/password", map[string]any{"clientId": required.id, "email": email, "password": password,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		m := r.JSON(t)
		if r.Status != http.StatusOK || m["mfaRequired"] != true || m["code"] != nil || !slices.Equal(strs(m["methods"]), []string{"totp", "recovery_code"}) {
			t.Fatalf("embedded password: %s", describe(r))
		}
		handle := m["mfaSessionId"].(string)
		expectSignInError(t, s.embed(t, "/mfa/verify", map[string]any{"clientId": required.id, "mfaSessionId": handle, "method": "totp", "code": next}),
			http.StatusBadRequest, "invalid_code") // its step was taken above
		r = s.embed(t, "/mfa/verify", map[string]any{"clientId": required.id, "mfaSessionId": handle, "method": "recovery_code", "code": recovery[0]})
		if r.Status != http.StatusOK {
			t.Fatalf("mfa/verify: %s", describe(r))
		}
		_, c = codeExchanged(t, s, required.id, exchangeCode(t, s, required.id, required.secret, r.JSON(t)["code"].(string), verifier))
		if !slices.Contains(c.AMR, "mfa") || !slices.Contains(c.AMR, "pwd") {
			t.Fatalf("embedded with a recovery code: %v", c.AMR)
		}
		expectSignInError(t, s.embed(t, "/mfa/verify", map[string]any{"clientId": required.id, "mfaSessionId": handle, "method": "recovery_code", "code": recovery[1]}),
			http.StatusBadRequest, "expired_token") // the step-up is used once

		// The spent recovery code does not work again.
		_, challenge = pkce()
		r = s.embed(t, "/password", map[string]any{"clientId": required.id, "email": email, "password": password,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		handle = r.JSON(t)["mfaSessionId"].(string)
		expectSignInError(t, s.embed(t, "/mfa/verify", map[string]any{"clientId": required.id, "mfaSessionId": handle, "method": "recovery_code", "code": recovery[0]}),
			http.StatusBadRequest, "invalid_code")
	})
}
