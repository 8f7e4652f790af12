package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Disabling a person signs them out everywhere, through the admin API and
// seen by a browser and x/oauth2: the session no longer answers, the
// refresh token is refused, the access token and a token an agent
// exchanged it for are inactive, and the person's API key answers
// owner_disabled. Enabling them again brings back the key
// and nothing else: they sign in again.
func TestDisableSignsOut(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_RISK_DISABLED=all")
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read users:admin")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		app := newHostedApp(t, s, admin, "Acme Vault", redirect, map[string]any{"signInMethods": []string{"password"}})
		app.conf.Scopes = append(app.conf.Scopes, "offline_access")
		const email = "hedy@example.com"
		userID := s.createPerson(t, admin, email, resetPassword, "")
		keys := newKeyEnv(t, s)
		keys.grant(t, s, http.MethodPut)
		_, key := keys.issue(t, s, map[string]any{"name": "ci", "scopes": []string{"orders:read"}, "owner": map[string]any{"type": "user", "id": userID}})

		b := newHostedBrowser(t, s, redirect)
		page, a := b.authorize(app)
		page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
		tok, _ := b.finish(app, a, b.submit(page, "/signin/password", "", url.Values{"password": {resetPassword}}))
		// silent asks with prompt=none: a code while the browser's session
		// lives, login_required once it is gone.
		silent := func() url.Values {
			t.Helper()
			v := oauth2.GenerateVerifier()
			return b.landed(b.get(app.conf.AuthCodeURL(oauth2.GenerateVerifier(), oauth2.S256ChallengeOption(v), oauth2.SetAuthURLParam("prompt", "none"))))
		}
		// signedOut checks, when, that the browser's session, the refresh
		// token and the access token are all gone.
		signedOut := func(when string) {
			t.Helper()
			if q := silent(); q.Get("error") != "login_required" {
				t.Fatalf("%s: prompt=none answered %v", when, q)
			}
			if _, err := app.conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err == nil {
				t.Fatalf("%s: the refresh token works", when)
			}
			expectInactive(t, s.introspect(t, tok.AccessToken, app.id, app.secret))
		}
		if q := silent(); q.Get("code") == "" {
			t.Fatalf("before: the session does not answer: %v", q)
		}
		// The refresh token works before (rotated: the new pair is kept).
		refreshed, err := app.conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
		if err != nil || refreshed.RefreshToken == "" {
			t.Fatalf("before: refresh: %v %+v", err, refreshed)
		}
		tok = refreshed
		expectActive(t, s.introspect(t, tok.AccessToken, app.id, app.secret), app.id)
		if m := keys.validate(t, s, key); m["valid"] != true {
			t.Fatalf("key before: %v", m)
		}

		// An agent acting for the person with a token exchanged from
		// theirs (RFC 8693) lives no longer than the person's own.
		super := s.superToken()
		helper := s.createAgent(super, map[string]any{"name": "Filing assistant", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users"}})
		for _, lvl := range []string{"registered", "verified"} {
			if r := s.changeTrust(super, helper.ID, lvl, "reviewed"); r.Status != http.StatusOK {
				t.Fatalf("trust: %s", describe(r))
			}
		}
		ex := s.exchange(delegationForm(tok.AccessToken), basic(helper.ClientID, helper.ClientSecret)...)
		if ex.Status != http.StatusOK {
			t.Fatalf("exchange: %s", describe(ex))
		}
		acting := ex.JSON(t)["access_token"].(string)
		if m := s.introspect(t, acting, helper.ClientID, helper.ClientSecret); m["active"] != true || m["sub"] != userID {
			t.Fatalf("before: the exchanged token: %v", m)
		}

		s.setStatus(t, admin, userID, "disabled")
		signedOut("disabled")
		expectInactive(t, s.introspect(t, acting, helper.ClientID, helper.ClientSecret))
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+userID+"/sessions", nil, bearer(admin)...); r.Status != http.StatusOK || r.JSON(t)["total"] != float64(0) {
			t.Fatalf("disabled: sessions %s", describe(r))
		}
		if m := keys.validate(t, s, key); m["valid"] != false || m["reason"] != "owner_disabled" {
			t.Fatalf("key while disabled: %v", m)
		}

		s.setStatus(t, admin, userID, "active")
		signedOut("enabled again")
		if m := keys.validate(t, s, key); m["valid"] != true {
			t.Fatalf("key once enabled: %v", m)
		}
	})
}
