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
// refresh token is refused, the access token is inactive, and the person's
// API key answers owner_disabled. Enabling them again brings back the key
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
		r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": "Hedy", "password": resetPassword}, bearer(admin)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		userID := r.JSON(t)["id"].(string)
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
		refreshes := func() bool {
			_, err := app.conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
			return err == nil
		}
		setStatus := func(status string) {
			t.Helper()
			if r := s.do(http.MethodPatch, "/api/v1/m2m/users/"+userID, map[string]any{"status": status}, bearer(admin)...); r.Status != http.StatusOK {
				t.Fatalf("%s: %s", status, describe(r))
			}
		}
		if q := silent(); q.Get("code") == "" || tok.RefreshToken == "" {
			t.Fatalf("before: the session does not answer (%v), or no refresh token", q)
		}
		expectActive(t, s.introspect(t, tok.AccessToken, app.id, app.secret), app.id)
		if m := keys.validate(t, s, key); m["valid"] != true {
			t.Fatalf("key before: %v", m)
		}

		setStatus("disabled")
		if q := silent(); q.Get("error") != "login_required" {
			t.Fatalf("disabled: prompt=none answered %v", q)
		}
		if refreshes() {
			t.Fatal("disabled: the refresh token still works")
		}
		expectInactive(t, s.introspect(t, tok.AccessToken, app.id, app.secret))
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+userID+"/sessions", nil, bearer(admin)...); r.Status != http.StatusOK || r.JSON(t)["total"] != float64(0) {
			t.Fatalf("disabled: sessions %s", describe(r))
		}
		if m := keys.validate(t, s, key); m["valid"] != false || m["reason"] != "owner_disabled" {
			t.Fatalf("key while disabled: %v", m)
		}

		setStatus("active")
		if q := silent(); q.Get("error") != "login_required" {
			t.Fatalf("enabled again: prompt=none answered %v", q)
		}
		if refreshes() {
			t.Fatal("enabled again: the refresh token works again")
		}
		expectInactive(t, s.introspect(t, tok.AccessToken, app.id, app.secret))
		if m := keys.validate(t, s, key); m["valid"] != true {
			t.Fatalf("key once enabled: %v", m)
		}
	})
}
