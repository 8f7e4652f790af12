package handlers

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/uuid"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/extensions/upstream"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

const (
	testPassword = "correct horse battery"
	testRedirect = "https://app.example.com/callback"
	testLogout   = "https://app.example.com/bye"
)

// signinServer is identityd's HTTP layer on a real store, with one
// application and one person.
type signinServer struct {
	*httptest.Server
	provider  *oauth.Provider
	store     *persistence.Store
	app       string // client id
	appSecret string
	user      *persistence.User
	mails     capture // what the outbox sent
	mfa       *mfa.Service
	reset     *reset.Service
	// passkeysLater is how far the passkey service's clock runs ahead of
	// the wall clock: time passing, for ceremonies that must expire.
	passkeysLater *atomic.Int64
}

// newSigninServer builds the server; opts change the sign-in service's
// configuration (the risk engine is off unless one turns it on).
func newSigninServer(t testing.TB, dbURL string, limits *RateLimits, opts ...func(*signin.Config, *persistence.Store)) *signinServer {
	t.Helper()
	ctx := context.Background()
	store := dbtest.Store(t, dbURL)
	secret := []byte("a system secret for this test only")
	keys, err := oauth.LoadKeys(ctx, store, secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(nil)
	cfg := signin.Config{Idle: time.Hour, Max: 24 * time.Hour, Issuer: "http://" + srv.Listener.Addr().String()}
	for _, o := range opts {
		o(&cfg, store)
	}
	issuer := cfg.Issuer // an option may name the server otherwise (localhost: passkeys on the hosted page)
	provider := oauth.NewProvider(oauth.Config{Issuer: issuer, AccessTokenTTL: time.Hour, SystemSecret: secret}, store, keys)
	mails := make(capture, 100)
	outbox, err := mail.NewOutbox(store, mails, oauth.DeriveKey(secret, "mail outbox"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go outbox.Run(runCtx)
	second := mfa.New(store, secret, mfa.Config{Issuer: issuer})
	later := new(atomic.Int64)
	passkeyService, err := passkeys.New(store, passkeys.Config{Issuer: issuer, Outbox: outbox,
		Now: func() time.Time { return time.Now().UTC().Add(time.Duration(later.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Outbox, cfg.SecondFactor, cfg.PasskeyFactor = outbox, second, passkeyService.AsFactor
	svc, err := signin.New(store, secret, cfg)
	if err != nil {
		t.Fatal(err)
	}
	resets := reset.New(store, secret, reset.Config{Outbox: outbox, Issuer: issuer})
	accounts := serviceaccounts.New(store, provider.Hasher)
	if _, err := accounts.EnsureAdmin(ctx, "admin-test", "an admin secret of thirty-two characters"); err != nil {
		t.Fatal(err)
	}
	o := Options{Provider: provider, ServiceAccounts: accounts, Applications: applications.New(store, provider.Hasher), Directory: directory.New(store), RAR: rar.New(store), SignIn: svc, MFA: second, Reset: resets, CSRF: pages.NewCSRF(oauth.DeriveKey(secret, pages.PurposeCSRF)),
		Health: store.Health, Units: store.InTx, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(), RateLimits: DefaultRateLimits()}
	o.Upstream = upstream.New(store, svc, secret, upstream.Config{Issuer: issuer})
	o.Passkeys = passkeyService
	if limits != nil {
		o.RateLimits, o.LimitStore = *limits, newMemoryLimitStore()
	}
	srv.Config.Handler = New(o)
	srv.Start()
	t.Cleanup(srv.Close)

	n := extensions.Now()
	appSecret := oauth.NewSecret()
	appHash, _ := provider.Hasher.Hash(ctx, []byte(appSecret))
	app := &persistence.Application{SecretHash: appHash,
		ID: uuid.NewString(), ClientID: "app_" + strings.ToLower(rand8()), Name: "Acme Notes", Type: persistence.AppConfidential,
		RedirectURIs: persistence.StringList{testRedirect}, PostLogoutRedirectURIs: persistence.StringList{testLogout},
		SignInMethods: persistence.StringList{"password", "otp", "magic-link"}, MFA: persistence.JSONObject{},
		AccessTokenFormat: "opaque", IDTokenSigningAlg: "RS256", CreatedAt: n, UpdatedAt: n,
	}
	if err := store.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	hash, err := directory.HashPassword(testPassword)
	if err != nil {
		t.Fatal(err)
	}
	u := &persistence.User{ID: uuid.NewString(), Email: rand8() + "@example.com", Name: "Ada", Status: directory.StatusActive,
		Metadata: persistence.JSONObject{}, PasswordHash: &hash, CreatedAt: n, UpdatedAt: n}
	if err := store.CreateUser(ctx, u); err != nil {
		t.Fatal(err)
	}
	return &signinServer{Server: srv, provider: provider, store: store, app: app.ClientID, appSecret: appSecret, user: u, mails: mails, mfa: second, reset: resets, passkeysLater: later}
}

// capture is a mail sender that keeps what it is given.
type capture chan mail.Message

func (c capture) Send(_ context.Context, m mail.Message) error { c <- m; return nil }

func rand8() string { return strings.ToLower(uuid.NewString()[:8]) }

// browser is a cookie-keeping client that does not follow redirects.
type browser struct {
	t *testing.T
	s *signinServer
	c *http.Client
}

func (s *signinServer) browser(t *testing.T) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, s: s, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status   int
	header   http.Header
	body     string
	location string
}

func (b *browser) do(method, path string, form url.Values) *page {
	b.t.Helper()
	if !strings.HasPrefix(path, "http") {
		path = b.s.URL + path
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return &page{status: resp.StatusCode, header: resp.Header, body: string(raw), location: resp.Header.Get("Location")}
}

var hiddenField = regexp.MustCompile(`name="(flow|csrf_token)" value="([^"]*)"`)

// fields are a page's flow and CSRF token.
func (p *page) fields() url.Values {
	v := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(p.body, -1) {
		if v.Get(m[1]) == "" {
			v.Set(m[1], m[2])
		}
	}
	return v
}

// testVerifier is the PKCE code verifier of authorizeURL's requests.
const testVerifier = "a-code-verifier-of-forty-three-characters-or-more"

func (s *signinServer) authorizeURL(extra ...string) string {
	q := url.Values{"client_id": {s.app}, "redirect_uri": {testRedirect}, "response_type": {"code"}, "scope": {"openid email"},
		"state": {"state-0123456789"}, "nonce": {"nonce-0123456789"}, "code_challenge": {oauth2.S256ChallengeFromVerifier(testVerifier)},
		"code_challenge_method": {"S256"}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return oauth.AuthorizePath + "?" + q.Encode()
}

// expectRedirectBack checks an answer sent back to the application: to
// its redirect URI, with the state, the issuer (RFC 9207) and a code.
func expectRedirectBack(t *testing.T, p *page) url.Values {
	t.Helper()
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, testRedirect+"?") {
		t.Fatalf("not sent back: %d %q %s", p.status, p.location, p.body)
	}
	u, _ := url.Parse(p.location)
	q := u.Query()
	if q.Get("state") != "state-0123456789" {
		t.Fatalf("state %q", q.Get("state"))
	}
	if q.Get("code") == "" || q.Get("iss") == "" {
		t.Fatalf("no code or no iss: %s", p.location)
	}
	return q
}

// exchange trades a code for tokens at the token endpoint, with the PKCE
// verifier of authorizeURL, and answers the token response.
func (s *signinServer) exchange(t *testing.T, code string) map[string]any {
	t.Helper()
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {testRedirect}, "code_verifier": {testVerifier}}
	req, _ := http.NewRequest(http.MethodPost, s.URL+oauth.TokenPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(s.app, s.appSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("token exchange: %d %v %v", resp.StatusCode, out, err)
	}
	return out
}

func expectError(t *testing.T, p *page, code string) {
	t.Helper()
	u, _ := url.Parse(p.location)
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, testRedirect+"?") || u.Query().Get("error") != code ||
		u.Query().Get("state") != "state-0123456789" {
		t.Fatalf("want error %s sent back, got %d %q", code, p.status, p.location)
	}
}

func expectPage(t *testing.T, p *page, status int, text string) {
	t.Helper()
	if p.status != status || p.location != "" || !strings.Contains(p.body, text) {
		t.Fatalf("want a %d page with %q, got %d %q %s", status, text, p.status, p.location, p.body)
	}
	if csp := p.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
		p.header.Get("X-Frame-Options") != "DENY" || p.header.Get("Referrer-Policy") != "no-referrer" || p.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("page headers %v", p.header)
	}
	if strings.Contains(p.body, "<script") || strings.Contains(p.body, "style=") {
		t.Fatal("a page with script or inline style")
	}
}

// signIn takes a browser from the authorization request through the hosted
// page to the answer sent back.
func (b *browser) signIn(authorize, email, password string) *page {
	b.t.Helper()
	p := b.do(http.MethodGet, authorize, nil)
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinPath+"?flow=") {
		b.t.Fatalf("authorize did not lead to the sign-in page: %d %q %s", p.status, p.location, p.body)
	}
	form := b.do(http.MethodGet, p.location, nil)
	expectPage(b.t, form, http.StatusOK, `<label for="email">Email</label>`)
	f := form.fields()
	f.Set("email", email)
	p = b.do(http.MethodPost, signinEmailPath, f)
	if p.status != http.StatusSeeOther {
		b.t.Fatalf("e-mail step: %d %s", p.status, p.body)
	}
	form = b.do(http.MethodGet, p.location, nil)
	expectPage(b.t, form, http.StatusOK, `<label for="password">Password</label>`)
	f = form.fields()
	f.Set("password", password)
	p = b.do(http.MethodPost, signinPasswordPath, f)
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinResumePath) {
		return p
	}
	return b.do(http.MethodGet, p.location, nil)
}

func TestHostedSignIn(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)

		// prompt=none without a session: login_required, no page.
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil), "login_required")

		// login_hint pre-fills the e-mail; the page names the application.
		p := b.do(http.MethodGet, s.authorizeURL("login_hint", s.user.Email), nil)
		form := b.do(http.MethodGet, p.location, nil)
		expectPage(t, form, http.StatusOK, `value="`+s.user.Email+`"`)
		if !strings.Contains(form.body, "Acme Notes") || !strings.Contains(form.body, ">Continue</button>") || !strings.Contains(form.body, "autofocus") ||
			!strings.Contains(form.header.Get("Content-Security-Policy"), "form-action 'self' https://app.example.com;") {
			t.Fatalf("the e-mail page: %v %s", form.header, form.body)
		}

		// A wrong password: the same page, the error linked to the field.
		f := form.fields()
		f.Set("email", s.user.Email)
		p = b.do(http.MethodPost, signinEmailPath, f)
		form = b.do(http.MethodGet, p.location, nil)
		f = form.fields()
		f.Set("password", "wrong")
		p = b.do(http.MethodPost, signinPasswordPath, f)
		expectPage(t, p, http.StatusUnauthorized, signin.ErrInvalidCredentials.Message)
		if !strings.Contains(p.body, `aria-describedby="password-error"`) || !strings.Contains(p.body, `id="password-error"`) {
			t.Fatalf("error not linked to its field: %s", p.body)
		}
		// An unknown e-mail reads the same.
		other := s.browser(t).signIn(s.authorizeURL(), "nobody@example.com", "wrong")
		expectPage(t, other, http.StatusUnauthorized, signin.ErrInvalidCredentials.Message)

		// The right one: a session cookie, then the answer.
		f.Set("password", testPassword)
		p = b.do(http.MethodPost, signinPasswordPath, f)
		if p.status != http.StatusSeeOther {
			t.Fatalf("sign-in: %d %s", p.status, p.body)
		}
		cookie := p.header.Get("Set-Cookie")
		if !strings.Contains(cookie, "identityd_session=") || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Lax") || !strings.Contains(cookie, "Path=/") {
			t.Fatalf("session cookie %q", cookie)
		}
		resume := p.location
		back := expectRedirectBack(t, b.do(http.MethodGet, resume, nil))
		if back.Get("iss") != s.URL {
			t.Fatalf("iss %q", back.Get("iss"))
		}
		tokens := s.exchange(t, back.Get("code"))
		if tokens["id_token"] == nil || tokens["access_token"] == nil {
			t.Fatalf("tokens: %v", tokens)
		}
		// The flow is used once.
		expectPage(t, b.do(http.MethodGet, resume, nil), http.StatusBadRequest, "expired")

		// With the session: no page, prompt=none included.
		expectRedirectBack(t, b.do(http.MethodGet, s.authorizeURL(), nil))
		expectRedirectBack(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil))
		expectRedirectBack(t, b.do(http.MethodGet, s.authorizeURL("prompt", "consent"), nil))
		expectRedirectBack(t, b.do(http.MethodGet, s.authorizeURL("max_age", "3600"), nil))
		// prompt=login and an exceeded max_age sign in again (the e-mail
		// pre-filled); with prompt=none, max_age exceeded is login_required.
		for _, extra := range [][]string{{"prompt", "login"}, {"prompt", "select_account"}, {"max_age", "0"}} {
			time.Sleep(time.Millisecond)
			p := b.do(http.MethodGet, s.authorizeURL(extra...), nil)
			if !strings.HasPrefix(p.location, signinPath+"?flow=") {
				t.Fatalf("%v: not asked to sign in: %d %q", extra, p.status, p.location)
			}
			expectPage(t, b.do(http.MethodGet, p.location, nil), http.StatusOK, `value="`+s.user.Email+`"`)
		}
		time.Sleep(time.Millisecond)
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none", "max_age", "0"), nil), "login_required")
		// A bad id_token_hint is refused.
		expectError(t, b.do(http.MethodGet, s.authorizeURL("id_token_hint", "not.a.token"), nil), "invalid_request")

		// Sign in again through prompt=login: the old session gives way.
		again := b.signIn(s.authorizeURL("prompt", "login"), s.user.Email, testPassword)
		expectRedirectBack(t, again)
		list, _ := s.store.ListUserSSOSessions(context.Background(), s.user.ID)
		if len(list) != 1 {
			t.Fatalf("sessions after signing in again: %d", len(list))
		}
		u, _ := s.store.GetUser(context.Background(), s.user.ID)
		if u.LastSignInAt == nil {
			t.Fatal("lastSignInAt not set")
		}
	})
}

func TestAuthorizeErrors(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		// Before the client and redirect URI are verified: a page, never
		// a redirect.
		expectPage(t, b.do(http.MethodGet, s.authorizeURL("client_id", "app_unknown"), nil), http.StatusUnauthorized, "not registered")
		expectPage(t, b.do(http.MethodGet, s.authorizeURL("redirect_uri", "https://evil.example/cb"), nil), http.StatusBadRequest, "redirect")
		expectPage(t, b.do(http.MethodGet, s.authorizeURL("client_id", ""), nil), http.StatusUnauthorized, "not registered")
		expectPage(t, b.do(http.MethodGet, s.authorizeURL()+"&client_id=again", nil), http.StatusBadRequest, "repeated")
		// After: sent back with the error and state.
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none login"), nil), "invalid_request")
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "sometimes"), nil), "invalid_request")
		expectError(t, b.do(http.MethodGet, s.authorizeURL("max_age", "-1"), nil), "invalid_request")
		expectError(t, b.do(http.MethodGet, s.authorizeURL("response_type", "token"), nil), "unsupported_response_type")
		// POST works as GET (OpenID Connect Core §3.1.2.1).
		q, _ := url.ParseQuery(strings.SplitN(s.authorizeURL("prompt", "none"), "?", 2)[1])
		expectError(t, b.do(http.MethodPost, oauth.AuthorizePath, q), "login_required")
		// A form_post answer submits itself with a script: no CSP there.
		fp := b.do(http.MethodGet, s.authorizeURL("prompt", "none", "response_mode", "form_post"), nil)
		if fp.status != http.StatusOK || !strings.Contains(fp.body, `name="error"`) || fp.header.Get("Content-Security-Policy") != "" ||
			fp.header.Get("X-Frame-Options") != "DENY" {
			t.Fatalf("form_post: %d %v %s", fp.status, fp.header, fp.body)
		}
		// The alias.
		expectError(t, b.do(http.MethodGet, strings.Replace(s.authorizeURL("prompt", "none"), oauth.AuthorizePath, "/oauth/authorize", 1), nil), "login_required")
	})
}

// Every form refuses a post without its CSRF token, with another form's,
// or with one made for another browser.
func TestSigninCSRF(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b, other := s.browser(t), s.browser(t)
		p := b.do(http.MethodGet, s.authorizeURL(), nil)
		f := b.do(http.MethodGet, p.location, nil).fields()
		p2 := other.do(http.MethodGet, s.authorizeURL(), nil)
		theirs := other.do(http.MethodGet, p2.location, nil).fields()
		for name, form := range map[string]url.Values{
			"missing":             {"flow": {f.Get("flow")}, "email": {s.user.Email}},
			"wrong":               {"flow": {f.Get("flow")}, "csrf_token": {"AAAA"}, "email": {s.user.Email}},
			"another flow's":      {"flow": {f.Get("flow")}, "csrf_token": {theirs.Get("csrf_token")}, "email": {s.user.Email}},
			"not base64":          {"flow": {f.Get("flow")}, "csrf_token": {"!!"}, "email": {s.user.Email}},
			"another flow, token": {"flow": {theirs.Get("flow")}, "csrf_token": {f.Get("csrf_token")}, "email": {s.user.Email}},
		} {
			for _, path := range []string{signinEmailPath, signinPasswordPath, signinRestartPath} {
				p := b.do(http.MethodPost, path, form)
				if p.status != http.StatusForbidden || !strings.Contains(p.body, "not sent from this site") {
					t.Fatalf("%s token at %s: %d %s", name, path, p.status, p.body)
				}
			}
		}
		// Another browser posting this browser's form, token and all.
		if p := other.do(http.MethodPost, signinEmailPath, url.Values{"flow": {f.Get("flow")}, "csrf_token": {f.Get("csrf_token")}, "email": {s.user.Email}}); p.status != http.StatusForbidden {
			t.Fatalf("another browser: %d", p.status)
		}
		// The right token works.
		f.Set("email", s.user.Email)
		if p := b.do(http.MethodPost, signinEmailPath, f); p.status != http.StatusSeeOther {
			t.Fatalf("the right token: %d %s", p.status, p.body)
		}
	})
}

func TestSigninLimits(t *testing.T) {
	limits := DefaultRateLimits()
	s := newSigninServer(t, dbtest.URLs(t)["sqlite"], &limits)
	attacker := s.browser(t)
	for i := range 5 {
		p := attacker.signIn(s.authorizeURL(), s.user.Email, "wrong")
		if p.status != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d", i, p.status)
		}
	}
	p := attacker.signIn(s.authorizeURL(), s.user.Email, testPassword)
	expectPage(t, p, http.StatusTooManyRequests, "Too many sign-in attempts")
	if p.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	// The same address keeps being refused; the person, from an address
	// that has not failed, signs in (the guesser cannot lock them out).
	real := s.browser(t)
	addr := &realAddr{}
	real.c.Transport = addr
	expectRedirectBack(t, real.signIn(s.authorizeURL(), s.user.Email, testPassword))
}

// realAddr sends requests from 127.0.0.2: another address than the tests'
// 127.0.0.1.
type realAddr struct{}

func (realAddr) RoundTrip(r *http.Request) (*http.Response, error) {
	d := &http.Transport{DialContext: (&localDialer{"127.0.0.2"}).DialContext}
	return d.RoundTrip(r)
}

func TestLogout(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		expectRedirectBack(t, b.signIn(s.authorizeURL(), s.user.Email, testPassword))
		logout := func(extra ...string) string {
			q := url.Values{}
			for i := 0; i+1 < len(extra); i += 2 {
				q.Set(extra[i], extra[i+1])
			}
			return oauth.EndSessionPath + "?" + q.Encode()
		}
		// An unregistered address, or one without its application: a page.
		expectPage(t, b.do(http.MethodGet, logout("client_id", s.app, "post_logout_redirect_uri", "https://evil.example/"), nil), http.StatusBadRequest, "not registered")
		expectPage(t, b.do(http.MethodGet, logout("post_logout_redirect_uri", testLogout), nil), http.StatusBadRequest, "client_id")
		expectPage(t, b.do(http.MethodGet, logout("client_id", "app_unknown"), nil), http.StatusBadRequest, "not registered")
		expectPage(t, b.do(http.MethodGet, logout("id_token_hint", "x.y.z"), nil), http.StatusBadRequest, "id_token_hint")

		// Without a hint the person is asked.
		ask := b.do(http.MethodGet, logout("client_id", s.app, "post_logout_redirect_uri", testLogout, "state", "st"), nil)
		expectPage(t, ask, http.StatusOK, ">Sign out</button>")
		if !strings.Contains(ask.header.Get("Content-Security-Policy"), "https://app.example.com") {
			t.Fatalf("confirmation CSP %q", ask.header.Get("Content-Security-Policy"))
		}
		confirm := url.Values{"client_id": {s.app}, "post_logout_redirect_uri": {testLogout}, "state": {"st"}}
		if p := b.do(http.MethodPost, signoutPath, confirm); p.status != http.StatusForbidden {
			t.Fatalf("sign-out without its token: %d", p.status)
		}
		confirm.Set("csrf_token", ask.fields().Get("csrf_token"))
		p := b.do(http.MethodPost, signoutPath, confirm)
		if p.status != http.StatusSeeOther || p.location != testLogout+"?state=st" || !strings.Contains(p.header.Get("Set-Cookie"), "Max-Age=0") {
			t.Fatalf("sign-out: %d %q %v", p.status, p.location, p.header)
		}
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil), "login_required")
		events, _ := s.store.ListAuthEvents(context.Background(), s.user.ID, persistence.Page{Limit: 100})
		kinds := map[string]int{}
		for _, e := range events {
			kinds[e.Type+"/"+e.Reason]++
		}
		if kinds["logout/"] != 1 || kinds["session_ended/logout"] != 1 || kinds["sign_in/"] != 1 || len(kinds) != 3 {
			t.Fatalf("events %v", kinds)
		}
		// Signed out already: straight back.
		if p := b.do(http.MethodGet, logout("client_id", s.app, "post_logout_redirect_uri", testLogout), nil); p.status != http.StatusSeeOther || p.location != testLogout {
			t.Fatalf("signed out already: %d %q", p.status, p.location)
		}
	})
}

func newMemoryLimitStore() limiter.Store { return memory.NewStore() }

// localDialer dials from a given loopback address.
type localDialer struct{ ip string }

func (d *localDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(d.ip)}}).DialContext(ctx, network, addr)
}

// idToken signs an ID token as the server would, for hints.
func (s *signinServer) idToken(t *testing.T, sub, sid string) string {
	t.Helper()
	provider := s.provider
	k, ok := provider.Keys.Signer("RS256")
	if !ok {
		t.Fatal("no RS256 key")
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: k.Key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", k.KeyID))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.Signed(signer).Claims(map[string]any{"iss": provider.Issuer, "sub": sub, "aud": s.app, "sid": sid,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// id_token_hint: the session's person is answered; another person is
// login_required with prompt=none, else a fresh sign-in.
func TestIDTokenHint(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		expectRedirectBack(t, b.signIn(s.authorizeURL(), s.user.Email, testPassword))
		list, _ := s.store.ListUserSSOSessions(context.Background(), s.user.ID)
		mine, theirs := s.idToken(t, s.user.ID, list[0].ID), s.idToken(t, uuid.NewString(), "")
		expectRedirectBack(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none", "id_token_hint", mine), nil))
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none", "id_token_hint", theirs), nil), "login_required")
		if p := b.do(http.MethodGet, s.authorizeURL("id_token_hint", theirs), nil); !strings.HasPrefix(p.location, signinPath+"?flow=") {
			t.Fatalf("another person's hint: %d %q", p.status, p.location)
		}
		// Logout with the owner's hint ends the session at once.
		q := url.Values{"id_token_hint": {mine}, "post_logout_redirect_uri": {testLogout}, "state": {"s"}}
		if p := b.do(http.MethodGet, oauth.EndSessionPath+"?"+q.Encode(), nil); p.status != http.StatusSeeOther || p.location != testLogout+"?state=s" {
			t.Fatalf("logout with a hint: %d %q %s", p.status, p.location, p.body)
		}
		expectError(t, b.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil), "login_required")
	})
}

// The admin routes list and end a person's sessions.
func TestAdminSessions(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		one, two := s.browser(t), s.browser(t)
		expectRedirectBack(t, one.signIn(s.authorizeURL(), s.user.Email, testPassword))
		expectRedirectBack(t, two.signIn(s.authorizeURL(), s.user.Email, testPassword))
		api := s.browser(t)
		tok := api.do(http.MethodPost, oauth.TokenPath, url.Values{"grant_type": {"client_credentials"}, "client_id": {"admin-test"},
			"client_secret": {"an admin secret of thirty-two characters"}, "scope": {"users:admin"}})
		var token struct {
			AccessToken string `json:"access_token"`
		}
		if err := json.Unmarshal([]byte(tok.body), &token); err != nil || token.AccessToken == "" {
			t.Fatalf("token: %s", tok.body)
		}
		call := func(method, path string) *page {
			req, _ := http.NewRequest(method, s.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+token.AccessToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			return &page{status: resp.StatusCode, body: string(raw)}
		}
		path := "/api/v1/m2m/users/" + s.user.ID + "/sessions"
		p := call(http.MethodGet, path)
		var list struct {
			Sessions []map[string]any `json:"sessions"`
			Total    int              `json:"total"`
		}
		if err := json.Unmarshal([]byte(p.body), &list); err != nil || p.status != 200 || list.Total != 2 || len(list.Sessions) != 2 {
			t.Fatalf("list: %d %s", p.status, p.body)
		}
		for _, field := range []string{"id", "userId", "applicationId", "createdAt", "lastSeenAt", "expiresAt", "ip", "userAgent", "amr", "authTime"} {
			if _, ok := list.Sessions[0][field]; !ok {
				t.Fatalf("no %s in %v", field, list.Sessions[0])
			}
		}
		if p := call(http.MethodGet, path+"?limit=1&offset=1"); !strings.Contains(p.body, `"total":2`) || strings.Count(p.body, `"userId"`) != 1 {
			t.Fatalf("a page: %s", p.body)
		}
		if p := call(http.MethodDelete, path); p.status != 200 || !strings.Contains(p.body, `"ended":2`) {
			t.Fatalf("end: %d %s", p.status, p.body)
		}
		expectError(t, one.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil), "login_required")
		expectError(t, two.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil), "login_required")
		if p := call(http.MethodGet, path); !strings.Contains(p.body, `"total":0`) {
			t.Fatalf("after: %s", p.body)
		}
		for _, id := range []string{uuid.NewString(), "not-a-uuid"} {
			if p := call(http.MethodGet, "/api/v1/m2m/users/"+id+"/sessions"); p.status != 404 {
				t.Fatalf("unknown person %s: %d", id, p.status)
			}
			if p := call(http.MethodDelete, "/api/v1/m2m/users/"+id+"/sessions"); p.status != 404 {
				t.Fatalf("unknown person %s: %d", id, p.status)
			}
		}
		// Deleting the person ends their sessions too.
		expectRedirectBack(t, one.signIn(s.authorizeURL(), s.user.Email, testPassword))
		if p := call(http.MethodDelete, "/api/v1/m2m/users/"+s.user.ID); p.status != 204 {
			t.Fatalf("delete user: %d %s", p.status, p.body)
		}
		expectError(t, one.do(http.MethodGet, s.authorizeURL("prompt", "none"), nil), "login_required")
	})
}
