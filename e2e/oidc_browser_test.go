package e2e

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// OpenID Connect with openid-client v6 and the hosted page in Chromium
// (e2e/node/oidc.browser.mjs): code + PKCE for a confidential application,
// prompt=none into a public one, userinfo, refresh rotation and reuse, a
// console administrator acting as admin through an adminConsole
// application only, RP-initiated logout, and an invited person signing in
// with login_hint before the application accepts the invite.
func TestOpenIDClientSignIn(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("Debian's chromium is required at %s (apt-get install chromium)", chromiumPath)
	}
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		// The suite reuses a rotated refresh token at once: no grace window
		// (TestRefreshRetries has it).
		s := start(t, dbURL, box.env("IDENTITYD_REFRESH_REUSE_GRACE=0")...)
		port := freePort(t)
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", port)
		bye := fmt.Sprintf("http://127.0.0.1:%d/signed-out", port)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write roles:manage")
		webID, webSecret := s.registerApp(t, admin, map[string]any{"name": "Acme Notes", "redirectUris": []string{redirect}, "postLogoutRedirectUris": []string{bye}})
		pubID, _ := s.registerApp(t, admin, map[string]any{"name": "Acme Mobile", "type": "public", "redirectUris": []string{redirect},
			"postLogoutRedirectUris": []string{bye}, "idTokenSigningAlg": "ES256", "accessTokenFormat": "jwt"})
		consoleID, consoleSecret := s.registerApp(t, admin, map[string]any{"name": "Acme Console", "redirectUris": []string{redirect}, "adminConsole": true})
		const email, password = "ada@example.com", "correct horse battery staple"
		r := s.do(http.MethodPost, "/api/v1/m2m/users", map[string]any{"email": email, "name": "Ada Lovelace", "password": password}, bearer(admin)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		userID := r.JSON(t)["id"].(string)
		for _, role := range []string{"editor", "admin"} {
			if r := s.do(http.MethodPost, "/api/v1/m2m/roles", map[string]any{"name": role}, bearer(admin)...); r.Status != http.StatusCreated {
				t.Fatalf("create role: %s", describe(r))
			}
			if r := s.do(http.MethodPost, "/api/v1/m2m/roles/assign", map[string]any{"userId": userID, "role": role}, bearer(admin)...); r.Status != http.StatusOK {
				t.Fatalf("assign role: %s", describe(r))
			}
		}
		if r := s.do(http.MethodPut, "/api/v1/m2m/users/"+userID+"/console-admin", nil, bearer(admin)...); r.Status != http.StatusOK {
			t.Fatalf("console administration: %s", describe(r))
		}

		// An existing person invited by a service account (the invite flow):
		// the e-mailed link, then the application's sign-in with login_hint.
		const invitee = "grace@example.com"
		if r := s.do(http.MethodPost, "/api/v1/m2m/users", map[string]any{"email": invitee, "name": "Grace Hopper", "password": password}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create invitee: %s", describe(r))
		}
		backend := s.createAccount(admin, map[string]any{"name": "notes-backend", "scopes": []string{"users:invite"}, "redirectUris": []string{redirect}})
		inviter := inviter{account: backend, tok: s.token(backend.ClientID, backend.ClientSecret, "")}
		accept := fmt.Sprintf("http://127.0.0.1:%d/accept", port)
		if r := invite(t, s, inviter.tok, map[string]any{"email": invitee, "redirect_uri": redirect, "invite_accept_uri": accept, "app_name": "Acme Notes"}); r.Status != http.StatusCreated {
			t.Fatalf("invite: %s", describe(r))
		}
		link := parseInvite(t, box.waitFor(t, invitee, 10*time.Second).Raw, s.URL).Link
		runBrowserSuite(t, dbURL, "oidc.browser.mjs", "IDENTITYD_ISSUER="+s.URL, "CHROMIUM="+chromiumPath, "CALLBACK_PORT="+fmt.Sprint(port),
			"REDIRECT_URI="+redirect, "POST_LOGOUT_URI="+bye, "WEB_CLIENT_ID="+webID, "WEB_CLIENT_SECRET="+webSecret,
			"PUBLIC_CLIENT_ID="+pubID, "EMAIL="+email, "PASSWORD="+password, "USER_ID="+userID,
			"CONSOLE_CLIENT_ID="+consoleID, "CONSOLE_CLIENT_SECRET="+consoleSecret, "ADMIN_TOKEN="+admin,
			"INVITE_LINK="+link, "INVITE_EMAIL="+invitee, "INVITE_ACCEPT_URI="+accept, "INVITER_TOKEN="+inviter.tok)
	})
}
