package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Passkeys in Debian's Chromium with a virtual authenticator (CDP
// WebAuthn; e2e/node/passkeys.browser.mjs). identityd is named
// http://localhost:PORT, so that its hosted page may run ceremonies under
// the applications' rpId, localhost; the application's own page is
// served by the Node suite at a web origin of the application
// (http://localhost:APP_PORT), and a stranger's page at another port.
// The suite registers passkeys from the application's page with a token
// of a hosted password sign-in, signs in on the hosted page (the button,
// and the passkey as the second factor an application requires) and
// through the API (discoverable and e-mail first), renames and deletes,
// and checks each refusal's passkey_failed. The server's ceremonies live
// passkeyTimeout, which the suite waits out once for an expired one; at
// the end this test reads the reasons the server logged for each refusal. With IDENTITYD_SCREENS=1 the SQLite run
// photographs the hosted passkey steps, desktop and phone.
func TestBrowserPasskeys(t *testing.T) {
	const passkeyTimeout = 10 * time.Second
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_RISK_DISABLED=all")
		issuer := strings.Replace(s.URL, "127.0.0.1", "localhost", 1)
		// Same port, named localhost; ceremonies live passkeyTimeout, which
		// the suite waits out once.
		s.restart("IDENTITYD_ISSUER="+issuer, fmt.Sprintf("IDENTITYD_PASSKEY_TIMEOUT=%d", int(passkeyTimeout/time.Second)))
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write")
		appPort, otherPort, callbackPort := freePort(t), freePort(t), freePort(t)
		appOrigin := fmt.Sprintf("http://localhost:%d", appPort)
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", callbackPort)
		app := func(name string, extra map[string]any) string {
			body := map[string]any{"name": name, "type": "public", "redirectUris": []string{redirect}, "webOrigins": []string{appOrigin},
				"rpId": "localhost", "signInMethods": []string{"password", "passkey"}}
			for k, v := range extra {
				body[k] = v
			}
			id, _ := s.registerApp(t, admin, body)
			return id
		}
		env := []string{
			"IDENTITYD_ISSUER=" + issuer, "CHROMIUM=" + chromiumPath, "CALLBACK_PORT=" + fmt.Sprint(callbackPort), "REDIRECT_URI=" + redirect,
			"APP_PORT=" + fmt.Sprint(appPort), "OTHER_PORT=" + fmt.Sprint(otherPort), "PASSWORD=" + resetPassword,
			"CLIENT_ID=" + app("Acme Notes", nil),
			"VAULT_CLIENT_ID=" + app("Acme Vault", map[string]any{"mfa": map[string]any{"policy": "required", "factors": []string{"passkey"}}}),
			"PASSKEY_TIMEOUT_MS=" + fmt.Sprint(passkeyTimeout.Milliseconds()),
		}
		for _, who := range []string{"main", "other", "clone"} {
			email := who + "@example.com"
			s.createPerson(t, admin, email, resetPassword, "")
			env = append(env, "EMAIL_"+strings.ToUpper(who)+"="+email)
		}
		runBrowserSuite(t, dbURL, "passkeys.browser.mjs", env...)

		// Each refusal was the one meant: the reasons the server logged.
		time.Sleep(100 * time.Millisecond) // the log pipe lags a little
		reasons := map[string]int{}
		for line := range strings.SplitSeq(s.logs.String(), "\n") {
			var l struct{ Msg, Reason string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "passkey verification failed" {
				reasons[l.Reason]++
			}
		}
		for reason, least := range map[string]int{
			"duplicate_credential": 1, // registered twice
			"unknown_challenge":    2, // the replay, the reused challenge
			"expired_challenge":    1,
			"verification":         2, // the stranger's origin, no user verification
			"clone":                1, // the counter that went backwards
			"revoked_credential":   1, // the clone's passkey, after
			"unknown_credential":   2, // a passkey the server never saw, on the hosted page
		} {
			if reasons[reason] < least {
				t.Errorf("the server logged %d refusals %s, want at least %d (all: %v)", reasons[reason], reason, least, reasons)
			}
		}
	})
}
