package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// chromiumPath is Debian's chromium, which playwright-core drives (no
// browser is ever downloaded; .ci/run installs it with apt).
const chromiumPath = "/usr/bin/chromium"

// createApp registers a public application through the API and answers its
// client id.
func (s *server) createApp(t *testing.T, name string, redirects, postLogout []string) string {
	t.Helper()
	id, _ := s.registerApp(t, s.adminToken(), map[string]any{"name": name, "type": "public", "redirectUris": redirects, "postLogoutRedirectUris": postLogout})
	return id
}

// createPerson adds a person with a password through the directory API
// and answers their id; status "disabled" disables them.
func (s *server) createPerson(t *testing.T, admin, email, password, status string) string {
	t.Helper()
	r := s.do(http.MethodPost, "/api/v1/m2m/users", map[string]any{"email": email, "name": "Ada Lovelace", "password": password}, bearer(admin)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create person: %s", describe(r))
	}
	id := r.JSON(t)["id"].(string)
	if status != "" {
		s.setStatus(t, admin, id, status)
	}
	return id
}

// setStatus sets a person's status through the directory API.
func (s *server) setStatus(t *testing.T, admin, id, status string) {
	t.Helper()
	if r := s.do(http.MethodPatch, "/api/v1/m2m/users/"+id, map[string]any{"status": status}, bearer(admin)...); r.Status != http.StatusOK {
		t.Fatalf("set status %s: %s", status, describe(r))
	}
}

// The hosted sign-in page in Chromium (e2e/node/signin.browser.mjs): e-mail
// then password then back to the application; wrong password; disabled
// person; too many attempts (a server with rate limits on); CSRF token
// missing or wrong; keyboard only; without JavaScript; the error page;
// sign-out; SSO without a page. With IDENTITYD_SCREENS=1 (make screens) the
// SQLite run saves screenshots of every step, desktop and phone, into
// docs/screens; a plain test run leaves the tree untouched.
func TestBrowserSignIn(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		limited := start(t, dbURL, "IDENTITYD_RATE_LIMITS=on")
		port := freePort(t)
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", port)
		bye := fmt.Sprintf("http://127.0.0.1:%d/signed-out", port)
		env := []string{
			"IDENTITYD_ISSUER=" + s.URL, "LIMITED_ISSUER=" + limited.URL, "CHROMIUM=" + chromiumPath,
			"CALLBACK_PORT=" + fmt.Sprint(port), "REDIRECT_URI=" + redirect, "POST_LOGOUT_URI=" + bye,
			"CLIENT_ID=" + s.createApp(t, "Acme Notes", []string{redirect}, []string{bye}),
			"OTHER_CLIENT_ID=" + s.createApp(t, "Acme Billing", []string{redirect}, []string{bye}),
			"LIMITED_CLIENT_ID=" + limited.createApp(t, "Acme Notes", []string{redirect}, []string{bye}),
			"PASSWORD=" + "correct horse battery staple",
		}
		admin, limitedAdmin := s.token(s.AdminID, s.AdminSecret, "users:write"), limited.token(limited.AdminID, limited.AdminSecret, "users:write")
		for _, who := range []string{"ada", "phone", "keys", "nojs", "csrf", "sso", "bye", "byephone"} {
			email := who + "@example.com"
			s.createPerson(t, admin, email, "correct horse battery staple", "")
			env = append(env, "EMAIL_"+strings.ToUpper(who)+"="+email)
		}
		s.createPerson(t, admin, "off@example.com", "correct horse battery staple", "disabled")
		limited.createPerson(t, limitedAdmin, "target@example.com", "correct horse battery staple", "")
		env = append(env, "EMAIL_OFF=off@example.com", "EMAIL_TARGET=target@example.com", "EMAIL_NOBODY=nobody@example.com")
		runBrowserSuite(t, dbURL, "signin.browser.mjs", env...)
	})
}
