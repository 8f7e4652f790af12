package e2e

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence/dbtest"
)

const (
	identityProviders = "/api/v1/identity-providers"
	providerCallback  = "/signin/provider/callback"
)

// upstreamSetup is two identityd servers: rp signs people in through up, a
// real OpenID Connect provider (a second identityd), where an application
// is registered for rp.
type upstreamSetup struct {
	t          *testing.T
	up, rp     *server
	upAdmin    string
	rpAdmin    string
	upApp      hostedApp // rp's application at up
	app        hostedApp // the application people sign in to, at rp (allowSignUp)
	closed     hostedApp // another at rp, without sign-up
	redirect   string
	providerID string
}

func newUpstreamSetup(t *testing.T, dbURL string) *upstreamSetup {
	t.Helper()
	// Each sign-in here is a new browser: the new-device rule would step
	// every returning person up, on both servers.
	u := &upstreamSetup{t: t, up: startLogged(t, dbURL, "IDENTITYD_RISK_DISABLED=new_device"), rp: startLogged(t, dbURL, "IDENTITYD_RISK_DISABLED=new_device")}
	u.upAdmin = u.up.token(u.up.AdminID, u.up.AdminSecret, "admin users:write users:read")
	u.rpAdmin = u.rp.token(u.rp.AdminID, u.rp.AdminSecret, "admin users:write users:read")
	u.upApp = newHostedApp(t, u.up, u.upAdmin, "identityd at rp", u.rp.URL+providerCallback, map[string]any{"signInMethods": []string{"password"}})
	u.redirect = fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
	u.app = newHostedApp(t, u.rp, u.rpAdmin, "Acme Notes", u.redirect, map[string]any{"signInMethods": []string{"password", "otp"}, "allowSignUp": true})
	u.closed = newHostedApp(t, u.rp, u.rpAdmin, "Acme Closed", u.redirect, map[string]any{"signInMethods": []string{"password"}})
	r := u.rp.do(http.MethodPost, identityProviders, map[string]any{
		"name": "acme-sso", "displayName": "Acme SSO", "issuer": u.up.URL, "clientId": u.upApp.id, "clientSecret": u.upApp.secret,
		"applications": []string{u.app.id, u.closed.id},
	}, bearer(u.rpAdmin)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("register the provider: %s", describe(r))
	}
	m := r.JSON(t)
	if _, ok := m["clientSecret"]; ok || strings.Contains(string(r.Body), u.upApp.secret) {
		t.Fatalf("the client secret came back: %s", r.Body)
	}
	if m["redirectUri"] != u.rp.URL+providerCallback {
		t.Fatalf("redirectUri %v", m["redirectUri"])
	}
	u.providerID = m["id"].(string)
	return u
}

// person makes a person with a password at s.
func (u *upstreamSetup) person(s *server, admin, email string, verified bool) string {
	u.t.Helper()
	r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": "Grace Hopper", "password": "correct horse battery staple",
		"emailVerified": verified}, bearer(admin)...)
	if r.Status != http.StatusCreated {
		u.t.Fatalf("create person: %s", describe(r))
	}
	return r.JSON(u.t)["id"].(string)
}

// on is b at another server (the same cookie jar).
func on(b *hostedBrowser, s *server) *hostedBrowser {
	return &hostedBrowser{t: b.t, s: s, c: b.c, redirect: b.redirect}
}

var continueLink = regexp.MustCompile(`<a href="([^"]*)">Continue</a>`)

// followRefresh follows a page that moves on by meta refresh (the callback's).
func followRefresh(b *hostedBrowser, r *response) *response {
	b.t.Helper()
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `http-equiv="refresh"`) {
		return r
	}
	m := continueLink.FindStringSubmatch(string(r.Body))
	if m == nil {
		b.t.Fatalf("a refresh page without its link: %s", r.Body)
	}
	next := html.UnescapeString(m[1])
	if strings.HasPrefix(next, "/") {
		next = b.s.URL + next
	}
	if strings.HasPrefix(next, b.redirect) { // the application's: do not fetch
		return &response{Status: http.StatusSeeOther, Header: http.Header{"Location": {next}}}
	}
	return b.get(next)
}

// atUpstream signs email in on up's hosted page (the browser is there).
func (u *upstreamSetup) atUpstream(b *hostedBrowser, page *response, email string) *response {
	u.t.Helper()
	ub := on(b, u.up)
	expectPage(u.t, page, http.StatusOK, `<label for="email">Email</label>`, "identityd at rp")
	page = ub.submit(page, "/signin/email", "", url.Values{"email": {email}})
	return ub.submit(page, "/signin/password", "", url.Values{"password": {"correct horse battery staple"}})
}

// hosted is a hosted sign-in to app through the provider, up to rp's last
// answer before the application; it answers that answer and the
// authorization.
func (u *upstreamSetup) hosted(app hostedApp, email string) (*hostedBrowser, *response, authorization) {
	u.t.Helper()
	b := newHostedBrowser(u.t, u.rp, u.redirect)
	page, a := b.authorize(app)
	expectPage(u.t, page, http.StatusOK, "Continue with Acme SSO")
	page = b.submit(page, "/signin/provider", "", nil)
	return b, followRefresh(b, u.atUpstream(b, page, email)), a
}

func TestUpstreamProviders(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		u := newUpstreamSetup(t, dbURL)
		rp, up := u.rp, u.up
		rpUsers := rp.token(rp.AdminID, rp.AdminSecret, "users:read users:write")
		exists := func(email string) bool {
			m := rp.do(http.MethodGet, inviteUsers+"?email="+url.QueryEscape(email), nil, bearer(rpUsers)...).JSON(t)
			return m["total"] != 0.0
		}

		t.Run("admin: discovery refused, bad input, list", func(t *testing.T) {
			r := rp.do(http.MethodPost, identityProviders, map[string]any{"name": "nowhere", "displayName": "Nowhere",
				"issuer": fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), "clientId": "c", "clientSecret": "s"}, bearer(u.rpAdmin)...)
			if d := expectError(t, r, http.StatusBadRequest, "discovery_failed"); d["reason"] == nil {
				t.Fatalf("no reason: %s", r.Body)
			}
			r = rp.do(http.MethodPost, identityProviders, map[string]any{"name": "otp", "displayName": "", "issuer": "ftp://x", "clientId": "c"},
				bearer(u.rpAdmin)...)
			fields := expectError(t, r, http.StatusBadRequest, "invalid_request")["fields"].(map[string]any)
			for _, f := range []string{"name", "displayName", "issuer", "clientSecret"} {
				if fields[f] == nil {
					t.Fatalf("%s not refused: %s", f, r.Body)
				}
			}
			r = rp.do(http.MethodGet, identityProviders+"?limit=10", nil, bearer(u.rpAdmin)...)
			if m := r.JSON(t); r.Status != http.StatusOK || m["total"] != 1.0 || strings.Contains(string(r.Body), u.upApp.secret) {
				t.Fatalf("list: %s", describe(r))
			}
			users := rp.token(rp.AdminID, rp.AdminSecret, "users:read")
			expectError(t, rp.do(http.MethodGet, identityProviders, nil, bearer(users)...), http.StatusForbidden, "insufficient_scope")
		})

		var first string
		t.Run("a first sign-in creates the account, the next finds the same person", func(t *testing.T) {
			email := "grace@example.com"
			upSub := u.person(up, u.upAdmin, email, true)
			if exists(email) {
				t.Fatal("exists before")
			}
			b, r, a := u.hosted(u.app, email)
			_, claims := b.finish(u.app, a, r)
			if claims.Email != email || len(claims.AMR) != 1 || claims.AMR[0] != "fed" {
				t.Fatalf("claims %+v", claims)
			}
			first = claims.Sub
			if !exists(email) || first == upSub {
				t.Fatal("no account, or the upstream's sub was taken as ours")
			}
			b, r, a = u.hosted(u.app, email)
			if _, again := b.finish(u.app, a, r); again.Sub != first {
				t.Fatalf("second sign-in sub %s, first %s", again.Sub, first)
			}
			// check-email lists the provider.
			m := rp.embed(t, "/check-email", map[string]any{"clientId": u.app.id, "email": email}).JSON(t)
			if !strings.Contains(fmt.Sprint(m["methods"]), "acme-sso") {
				t.Fatalf("check-email %v", m)
			}
		})

		t.Run("the embedded start route ends at the application with a code for the same person", func(t *testing.T) {
			verifier, challenge := pkce()
			b := newHostedBrowser(t, rp, u.redirect)
			start := rp.URL + "/api/v1/embedded/auth/providers/acme-sso/start?" + url.Values{"clientId": {u.app.id}, "redirectUri": {u.redirect},
				"codeChallenge": {challenge}, "codeChallengeMethod": {"S256"}}.Encode()
			q := b.landed(followRefresh(b, u.atUpstream(b, b.get(start), "grace@example.com")))
			if q.Get("iss") != rp.URL || q.Get("code") == "" {
				t.Fatalf("answer %v", q)
			}
			_, claims := codeExchanged(t, rp, u.app.id, exchangeCode(t, rp, u.app.id, u.app.secret, q.Get("code"), verifier))
			if claims.Sub != first {
				t.Fatalf("embedded sub %s, hosted %s", claims.Sub, first)
			}
			expectSignInError(t, b.get(rp.URL+"/api/v1/embedded/auth/providers/nope/start?"+url.Values{"clientId": {u.app.id},
				"redirectUri": {u.redirect}, "codeChallenge": {challenge}, "codeChallengeMethod": {"S256"}}.Encode()), http.StatusNotFound, "unknown_provider")
		})

		t.Run("sign-up refused where the application does not allow it", func(t *testing.T) {
			email := "newcomer@example.com"
			u.person(up, u.upAdmin, email, true)
			_, r, _ := u.hosted(u.closed, email)
			expectPage(t, r, http.StatusNotFound, "does not let new accounts sign up")
			if exists(email) {
				t.Fatal("created without allowSignUp")
			}
		})

		t.Run("the e-mail of a password account: linking, never a sign-in", func(t *testing.T) {
			email := "ada@example.com"
			rp.createPerson(t, rpUsers, email, "another password entirely", "")
			u.person(up, u.upAdmin, email, true)
			_, r, _ := u.hosted(u.app, email)
			expectPage(t, r, http.StatusConflict, "already exists", "Link to my account", `name="pending"`, "its password")
			if r.Header.Get("Location") != "" {
				t.Fatal("signed in")
			}
			// The embedded route: the spec's 409.
			_, challenge := pkce()
			b := newHostedBrowser(t, rp, u.redirect)
			start := rp.URL + "/api/v1/embedded/auth/providers/acme-sso/start?" + url.Values{"clientId": {u.app.id}, "redirectUri": {u.redirect},
				"codeChallenge": {challenge}, "codeChallengeMethod": {"S256"}}.Encode()
			r = u.atUpstream(b, b.get(start), email)
			m := expectSignInError(t, r, http.StatusConflict, "account_exists")
			if m["linkingRequired"] != true || m["linkingEndpoint"] != "/api/v1/auth/link/initiate" || m["suggestion"] == "" ||
				fmt.Sprint(m["existingIdentities"]) != "[password]" || len(fmt.Sprint(m["pendingLink"])) < 43 || m["provider"] != "acme-sso" {
				t.Fatalf("409 body %s", r.Body)
			}
		})

		t.Run("email_verified false upstream never creates nor links by e-mail", func(t *testing.T) {
			email := "unverified@example.com"
			u.person(up, u.upAdmin, email, false)
			_, r, _ := u.hosted(u.app, email)
			expectPage(t, r, http.StatusForbidden, "has not verified your e-mail address")
			if exists(email) {
				t.Fatal("an unverified e-mail created an account")
			}
			taken := "taken@example.com"
			rp.createPerson(t, rpUsers, taken, "another password entirely", "")
			u.person(up, u.upAdmin, taken, false)
			_, r, _ = u.hosted(u.app, taken)
			expectPage(t, r, http.StatusForbidden, "has not verified your e-mail address")
			if strings.Contains(string(r.Body), `name="pending"`) {
				t.Fatal("offered a link")
			}
		})

		t.Run("a replayed or forged state, and a nonce of another request, are refused", func(t *testing.T) {
			email := "state@example.com"
			u.person(up, u.upAdmin, email, true)
			b := newHostedBrowser(t, rp, u.redirect)
			page, _ := b.authorize(u.app)
			// Stop at the provider's redirect back: no following.
			b.c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
				if strings.HasPrefix(req.URL.String(), rp.URL+providerCallback) {
					return http.ErrUseLastResponse
				}
				return nil
			}
			r := u.atUpstream(b, b.submit(page, "/signin/provider", "", nil), email)
			callback := r.Header.Get("Location")
			if !strings.HasPrefix(callback, rp.URL+providerCallback+"?") {
				t.Fatalf("no callback: %s", describe(r))
			}
			// Another browser cannot use it (and spends it).
			other := newHostedBrowser(t, rp, u.redirect)
			other.authorize(u.app)
			expectPage(t, other.get(callback), http.StatusBadRequest, "another browser")
			expectPage(t, b.get(callback), http.StatusBadRequest, "already used")
			cb, _ := url.Parse(callback)
			q := cb.Query()
			q.Set("state", oauth2.GenerateVerifier())
			expectPage(t, b.get(rp.URL+providerCallback+"?"+q.Encode()), http.StatusBadRequest, "expired")

			// A good one, then replayed.
			b.c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
				if strings.HasPrefix(req.URL.String(), rp.URL+providerCallback) || strings.HasPrefix(req.URL.String(), u.redirect) {
					return http.ErrUseLastResponse
				}
				return nil
			}
			page, _ = b.authorize(u.app)
			r = b.submit(page, "/signin/provider", "", nil) // the provider's session answers at once
			callback = r.Header.Get("Location")
			if r = followRefresh(b, b.get(callback)); r.Status != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), u.redirect) {
				t.Fatalf("sign-in: %s", describe(r))
			}
			expectPage(t, b.get(callback), http.StatusBadRequest, "already used")

			// The provider asked with another nonce than the one identityd
			// sent (a code injected from another request): the ID token's
			// nonce does not match.
			b = newHostedBrowser(t, rp, u.redirect)
			page, _ = b.authorize(u.app)
			b.c.CheckRedirect = func(req *http.Request, via []*http.Request) error { return http.ErrUseLastResponse }
			r = b.submit(page, "/signin/provider", "", nil)
			auth, _ := url.Parse(r.Header.Get("Location"))
			aq := auth.Query()
			if !strings.HasPrefix(auth.String(), up.URL) || len(aq.Get("nonce")) < 43 {
				t.Fatalf("to the provider: %s", auth)
			}
			aq.Set("nonce", oauth2.GenerateVerifier())
			auth.RawQuery = aq.Encode()
			b.c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
				if strings.HasPrefix(req.URL.String(), rp.URL+providerCallback) {
					return http.ErrUseLastResponse
				}
				return nil
			}
			r = u.atUpstream(b, b.get(auth.String()), email)
			if !strings.HasPrefix(r.Header.Get("Location"), rp.URL+providerCallback) {
				t.Fatalf("provider: %s %s", describe(r), r.Header.Get("Location"))
			}
			expectPage(t, b.get(r.Header.Get("Location")), http.StatusBadGateway, "did not confirm who you are")
		})
	})
}
