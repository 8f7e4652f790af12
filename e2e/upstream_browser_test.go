package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The hosted page's "Continue with …" button in Chromium
// (e2e/node/upstream.browser.mjs), without JavaScript: identityd's page,
// the provider's (a second identityd) sign-in, identityd's callback, and
// the application's code, exchanged by openid-client. With
// IDENTITYD_SCREENS=1 the SQLite run photographs the e-mail step with its
// button, desktop and phone, into docs/screens.
func TestBrowserUpstream(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		up, rp := startLogged(t, dbURL), startLogged(t, dbURL)
		upAdmin := up.token(up.AdminID, up.AdminSecret, "admin users:write")
		upApp, upSecret := up.registerApp(t, upAdmin, map[string]any{"name": "identityd at rp", "redirectUris": []string{rp.URL + providerCallback},
			"signInMethods": []string{"password"}})
		port := freePort(t)
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", port)
		rpAdmin := rp.token(rp.AdminID, rp.AdminSecret, "admin")
		app, _ := rp.registerApp(t, rpAdmin, map[string]any{"name": "Acme Notes", "type": "public", "redirectUris": []string{redirect}, "allowSignUp": true})
		if r := rp.do("POST", identityProviders, map[string]any{"name": "acme-sso", "displayName": "Acme SSO", "issuer": up.URL, "clientId": upApp,
			"clientSecret": upSecret, "applications": []string{app}}, bearer(rpAdmin)...); r.Status != 201 {
			t.Fatalf("register the provider: %s", describe(r))
		}
		env := []string{"IDENTITYD_ISSUER=" + rp.URL, "UPSTREAM_ISSUER=" + up.URL, "CHROMIUM=" + chromiumPath, "CALLBACK_PORT=" + fmt.Sprint(port),
			"REDIRECT_URI=" + redirect, "CLIENT_ID=" + app, "PASSWORD=correct horse battery staple"}
		for _, device := range []string{"desktop", "phone"} {
			email := device + "@example.com"
			if r := up.do("POST", inviteUsers, map[string]any{"email": email, "name": "Grace Hopper", "password": "correct horse battery staple",
				"emailVerified": true}, bearer(upAdmin)...); r.Status != 201 {
				t.Fatalf("create person: %s", describe(r))
			}
			env = append(env, "EMAIL_"+strings.ToUpper(device)+"="+email)
			// An account with a password at rp whose address the provider
			// also verifies: the sign-in offers linking.
			linked := "link-" + email
			if r := up.do("POST", inviteUsers, map[string]any{"email": linked, "name": "Ada Lovelace", "password": "correct horse battery staple",
				"emailVerified": true}, bearer(upAdmin)...); r.Status != 201 {
				t.Fatalf("create person at the provider: %s", describe(r))
			}
			r := rp.do("POST", inviteUsers, map[string]any{"email": linked, "name": "Ada Lovelace", "password": "the account's own passphrase"},
				bearer(rp.token(rp.AdminID, rp.AdminSecret, "users:write"))...)
			if r.Status != 201 {
				t.Fatalf("create the account: %s", describe(r))
			}
			env = append(env, "LINK_EMAIL_"+strings.ToUpper(device)+"="+linked, "LINK_SUB_"+strings.ToUpper(device)+"="+r.JSON(t)["id"].(string))
		}
		env = append(env, "ACCOUNT_PASSWORD=the account's own passphrase")
		runBrowserSuite(t, dbURL, "upstream.browser.mjs", env...)
	})
}
