package handlers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/upstream"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// upstreamPair is two identityd servers: rp signs people in through op, a
// real OpenID Connect provider (identityd's own authorization endpoint,
// token endpoint, ID tokens and JWKS), on an application registered there
// for rp.
type upstreamPair struct {
	rp, op     *signinServer
	opApp      string // the application at op
	opSecret   string
	providerID string
}

func newUpstreamPair(t *testing.T, dbURL string) *upstreamPair {
	t.Helper()
	ctx := context.Background()
	op := newSigninServer(t, dbtest.Like(t, dbURL), nil)
	rp := newSigninServer(t, dbtest.Like(t, dbURL), nil)
	n := extensions.Now()
	secret := oauth.NewSecret()
	hash, _ := op.provider.Hasher.Hash(ctx, []byte(secret))
	app := &persistence.Application{SecretHash: hash, ID: uuid.NewString(), ClientID: "app_" + rand8(), Name: "RP at OP",
		Type: persistence.AppConfidential, RedirectURIs: persistence.StringList{rp.URL + upstream.CallbackPath},
		SignInMethods: persistence.StringList{"password"}, MFA: persistence.JSONObject{}, AccessTokenFormat: "opaque", IDTokenSigningAlg: "RS256",
		CreatedAt: n, UpdatedAt: n}
	if err := op.store.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	pair := &upstreamPair{rp: rp, op: op, opApp: app.ClientID, opSecret: secret}
	status, body := pair.admin(t, http.MethodPost, identityProvidersPath, map[string]any{
		"name": "acme-sso", "displayName": "Acme SSO", "issuer": op.URL, "clientId": app.ClientID, "clientSecret": secret,
		"applications": []string{rp.app},
	})
	if status != http.StatusCreated {
		t.Fatalf("register the provider: %d %v", status, body)
	}
	pair.providerID = body["id"].(string)
	return pair
}

// admin calls rp's admin API.
func (p *upstreamPair) admin(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var r *bytes.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		r = bytes.NewReader(raw)
	} else {
		r = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, p.rp.URL+path, r)
	req.Header.Set("Authorization", "Bearer "+p.rp.adminToken(t))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, out := getJSON(t, req)
	return resp.StatusCode, out
}

// opUser makes a person at op.
func (p *upstreamPair) opUser(t *testing.T, email string, verified bool) *persistence.User {
	t.Helper()
	hash, err := directory.HashPassword(testPassword)
	if err != nil {
		t.Fatal(err)
	}
	n := extensions.Now()
	u := &persistence.User{ID: uuid.NewString(), Email: email, EmailVerified: verified, Name: "Upstream " + email, Status: directory.StatusActive,
		Metadata: persistence.JSONObject{}, PasswordHash: &hash, CreatedAt: n, UpdatedAt: n}
	if err := p.op.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

// allowSignUp sets rp's application's allowSignUp.
func (p *upstreamPair) allowSignUp(t *testing.T, allow bool) {
	t.Helper()
	app, err := p.rp.store.GetApplicationByClientID(context.Background(), p.rp.app)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.rp.store.UpdateApplication(context.Background(), app.ID, func(a *persistence.Application) error {
		a.AllowSignUp = allow
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

var providerForm = regexp.MustCompile(`(?s)<form method="post" action="/signin/provider">.*?name="provider" value="([^"]*)">\s*<button type="submit" class="outline">([^<]*)</button>`)

// toUpstream takes a browser from rp's authorization request to its
// "Continue with Acme SSO" button and answers where it leads (op's
// authorization endpoint).
func (p *upstreamPair) toUpstream(t *testing.T, b *browser) string {
	t.Helper()
	pg := b.do(http.MethodGet, p.rp.authorizeURL(), nil)
	pg = b.do(http.MethodGet, pg.location, nil)
	expectPage(t, pg, http.StatusOK, "Continue with Acme SSO")
	m := providerForm.FindStringSubmatch(pg.body)
	if m == nil || m[1] != "acme-sso" {
		t.Fatalf("no provider button: %s", pg.body)
	}
	if csp := pg.header.Get("Content-Security-Policy"); !strings.Contains(csp, p.op.URL) {
		t.Fatalf("form-action does not admit the provider: %s", csp)
	}
	f := pg.fields()
	f.Set("provider", "acme-sso")
	pg = b.do(http.MethodPost, signinProviderPath, f)
	if pg.status != http.StatusSeeOther || !strings.HasPrefix(pg.location, p.op.URL+oauth.AuthorizePath+"?") {
		t.Fatalf("the button did not lead to the provider: %d %q %s", pg.status, pg.location, pg.body)
	}
	q, _ := url.Parse(pg.location)
	for _, k := range []string{"state", "nonce", "code_challenge"} {
		if len(q.Query().Get(k)) < 43 {
			t.Fatalf("%s missing or short: %s", k, pg.location)
		}
	}
	if q.Query().Get("code_challenge_method") != "S256" || q.Query().Get("redirect_uri") != p.rp.URL+upstream.CallbackPath {
		t.Fatalf("authorization request %s", pg.location)
	}
	return pg.location
}

// atUpstream signs in at op (its hosted page, a password) and answers op's
// answer: a redirect to rp's callback.
func (p *upstreamPair) atUpstream(t *testing.T, b *browser, authURL, email string) string {
	t.Helper()
	pg := b.do(http.MethodGet, authURL, nil)
	if !strings.HasPrefix(pg.location, signinPath) {
		if strings.HasPrefix(pg.location, p.rp.URL+upstream.CallbackPath) {
			return pg.location // op's session answered
		}
		t.Fatalf("op's authorize: %d %q", pg.status, pg.location)
	}
	pg = b.do(http.MethodGet, p.op.URL+pg.location, nil)
	f := pg.fields()
	f.Set("email", email)
	pg = b.do(http.MethodPost, p.op.URL+signinEmailPath, f)
	pg = b.do(http.MethodGet, p.op.URL+pg.location, nil)
	f = pg.fields()
	f.Set("password", testPassword)
	pg = b.do(http.MethodPost, p.op.URL+signinPasswordPath, f)
	pg = b.do(http.MethodGet, p.op.URL+pg.location, nil)
	if pg.status != http.StatusSeeOther || !strings.HasPrefix(pg.location, p.rp.URL+upstream.CallbackPath+"?") {
		t.Fatalf("op did not send the browser back: %d %q %s", pg.status, pg.location, pg.body)
	}
	return pg.location
}

var nextURL = regexp.MustCompile(`<a href="([^"]*)">Continue</a>`)

// callback follows op's answer to rp's callback and rp's continue page.
func (p *upstreamPair) callback(t *testing.T, b *browser, callback string) *page {
	t.Helper()
	pg := b.do(http.MethodGet, callback, nil)
	if pg.status != http.StatusOK || !strings.Contains(pg.body, `http-equiv="refresh"`) {
		return pg
	}
	m := nextURL.FindStringSubmatch(pg.body)
	next := html.UnescapeString(m[1])
	if strings.HasPrefix(next, "/") {
		next = p.rp.URL + next
	}
	if !strings.HasPrefix(next, p.rp.URL) {
		return &page{status: http.StatusSeeOther, location: next}
	}
	return b.do(http.MethodGet, next, nil)
}

// hostedSignIn is a whole hosted sign-in through the provider; it answers
// rp's last answer.
func (p *upstreamPair) hostedSignIn(t *testing.T, email string) *page {
	t.Helper()
	b := p.rp.browser(t)
	return p.callback(t, b, p.atUpstream(t, b, p.toUpstream(t, b), email))
}

// subOf trades rp's code and answers the ID token's sub.
func (p *upstreamPair) subOf(t *testing.T, pg *page) string {
	t.Helper()
	q := expectRedirectBack(t, pg)
	tok := p.rp.exchange(t, q.Get("code"))
	var claims struct {
		Sub string   `json:"sub"`
		AMR []string `json:"amr"`
	}
	parts := strings.Split(tok["id_token"].(string), ".")
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	if len(claims.AMR) != 1 || claims.AMR[0] != upstream.AMR {
		t.Fatalf("amr %v", claims.AMR)
	}
	return claims.Sub
}

func TestUpstreamHostedSignIn(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		p := newUpstreamPair(t, dbURL)
		newcomer := p.opUser(t, "new-"+rand8()+"@example.com", true)

		// No sign-up: a clear refusal on the page, nobody created.
		pg := p.hostedSignIn(t, newcomer.Email)
		expectPage(t, pg, http.StatusNotFound, "does not let new accounts sign up")
		if _, err := p.rp.store.GetUserByEmail(ctx, newcomer.Email); err == nil {
			t.Fatal("an account was created without allowSignUp")
		}

		// Sign-up allowed: the first sign-in creates the account, the
		// next finds the same person.
		p.allowSignUp(t, true)
		first := p.subOf(t, p.hostedSignIn(t, newcomer.Email))
		created, err := p.rp.store.GetUserByEmail(ctx, newcomer.Email)
		if err != nil || created.ID != first || !created.EmailVerified || created.Name != newcomer.Name {
			t.Fatalf("created %+v %v (sub %s)", created, err, first)
		}
		ids, _ := p.rp.store.UserIdentities(ctx, first)
		if len(ids) != 1 || ids[0].Provider != "acme-sso" || ids[0].Issuer != p.op.URL || ids[0].Subject != newcomer.ID {
			t.Fatalf("identities %+v", ids)
		}
		if second := p.subOf(t, p.hostedSignIn(t, newcomer.Email)); second != first {
			t.Fatalf("the second sign-in is %s, the first %s", second, first)
		}

		// check-email names the provider among the person's methods.
		status, _, out := p.rp.embed(t, "/check-email", map[string]any{"clientId": p.rp.app, "email": newcomer.Email})
		if status != http.StatusOK || !strings.Contains(toJSON(out["methods"]), "acme-sso") {
			t.Fatalf("check-email %d %v", status, out)
		}

		// The same e-mail as an account with a password: no sign-in; the
		// page offers linking with a pending link.
		pwUser := p.opUser(t, p.rp.user.Email, true)
		_ = pwUser
		pg = p.hostedSignIn(t, p.rp.user.Email)
		expectPage(t, pg, http.StatusConflict, "already exists")
		if !strings.Contains(pg.body, `action="`+LinkPagePath+`"`) || !strings.Contains(pg.body, "its password") {
			t.Fatalf("no link offer: %s", pg.body)
		}
		handle := regexp.MustCompile(`name="pending" value="([^"]+)"`).FindStringSubmatch(pg.body)
		if handle == nil {
			t.Fatalf("no pending link handle: %s", pg.body)
		}
		svc := upstream.New(p.rp.store, nil, []byte("a system secret for this test only"), upstream.Config{Issuer: p.rp.URL})
		link, err := p.rp.store.UpstreamLinkByHash(ctx, svc.LinkHandleHash(handle[1]))
		if err != nil || link.UserID != p.rp.user.ID || link.Provider != "acme-sso" || link.Issuer != p.op.URL || link.Subject != pwUser.ID ||
			!link.EmailVerified || link.ClientID != p.rp.app {
			t.Fatalf("pending link %+v %v", link, err)
		}
		if ids, _ := p.rp.store.UserIdentities(ctx, p.rp.user.ID); len(ids) != 1 || ids[0].Provider != "password" {
			t.Fatalf("bound by e-mail: %+v", ids)
		}

		// email_verified false: neither created nor offered a link.
		unverified := p.opUser(t, "unverified-"+rand8()+"@example.com", false)
		expectPage(t, p.hostedSignIn(t, unverified.Email), http.StatusForbidden, "has not verified your e-mail address")
		if _, err := p.rp.store.GetUserByEmail(ctx, unverified.Email); err == nil {
			t.Fatal("an unverified e-mail created an account")
		}
		p.opUser(t, "x"+p.rp.user.Email, false)
		if err := p.rp.store.CreateUser(ctx, &persistence.User{ID: uuid.NewString(), Email: "x" + p.rp.user.Email, Status: directory.StatusActive,
			Metadata: persistence.JSONObject{}, CreatedAt: extensions.Now(), UpdatedAt: extensions.Now()}); err != nil {
			t.Fatal(err)
		}
		pg = p.hostedSignIn(t, "x"+p.rp.user.Email)
		expectPage(t, pg, http.StatusForbidden, "has not verified your e-mail address")
		if strings.Contains(pg.body, `name="pending"`) {
			t.Fatal("an unverified e-mail was offered a link")
		}
	})
}

func TestUpstreamStateRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		p := newUpstreamPair(t, dbURL)
		p.allowSignUp(t, true)
		who := p.opUser(t, "state-"+rand8()+"@example.com", true)
		b := p.rp.browser(t)
		callback := p.atUpstream(t, b, p.toUpstream(t, b), who.Email)

		// Another browser with the right state and code: refused, and the
		// state is spent.
		other := p.rp.browser(t)
		other.do(http.MethodGet, p.rp.URL+p.rp.authorizeURL(), nil) // a browser cookie of its own
		expectPage(t, other.do(http.MethodGet, callback, nil), http.StatusBadRequest, "another browser")
		expectPage(t, b.do(http.MethodGet, callback, nil), http.StatusBadRequest, "already used")

		// A forged state, and none.
		u, _ := url.Parse(callback)
		q := u.Query()
		q.Set("state", oauth.NewSecret())
		expectPage(t, b.do(http.MethodGet, p.rp.URL+upstream.CallbackPath+"?"+q.Encode(), nil), http.StatusBadRequest, "expired")
		expectPage(t, b.do(http.MethodGet, p.rp.URL+upstream.CallbackPath+"?code=x", nil), http.StatusBadRequest, "expired")

		// A replayed callback after a good one: refused.
		b2 := p.rp.browser(t)
		callback = p.atUpstream(t, b2, p.toUpstream(t, b2), who.Email)
		expectRedirectBack(t, p.callback(t, b2, callback))
		expectPage(t, b2.do(http.MethodGet, callback, nil), http.StatusBadRequest, "already used")

		// The provider's error comes back on the flow's page.
		b3 := p.rp.browser(t)
		auth, _ := url.Parse(p.toUpstream(t, b3))
		state := auth.Query().Get("state")
		pg := b3.do(http.MethodGet, p.rp.URL+upstream.CallbackPath+"?error=access_denied&state="+url.QueryEscape(state), nil)
		expectPage(t, pg, http.StatusBadGateway, "did not confirm who you are")
		if !strings.Contains(pg.body, `<label for="email">Email</label>`) {
			t.Fatal("the refusal is not on the flow's page")
		}
	})
}

func TestUpstreamEmbedded(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		p := newUpstreamPair(t, dbURL)
		p.allowSignUp(t, true)
		verifier := oauth2.GenerateVerifier()
		start := func(name, redirect string) string {
			return p.rp.URL + embeddedPath + "/providers/" + name + "/start?" + url.Values{"clientId": {p.rp.app}, "redirectUri": {redirect},
				"codeChallenge": {oauth2.S256ChallengeFromVerifier(verifier)}, "codeChallengeMethod": {"S256"}}.Encode()
		}
		b := p.rp.browser(t)
		for _, bad := range []string{start("acme-sso", "https://evil.example/cb"), start("nope", testRedirect)} {
			if pg := b.do(http.MethodGet, bad, nil); pg.status == http.StatusSeeOther {
				t.Fatalf("%s: %d %s", bad, pg.status, pg.location)
			}
		}
		who := p.opUser(t, "embedded-"+rand8()+"@example.com", true)
		pg := b.do(http.MethodGet, start("acme-sso", testRedirect), nil)
		if pg.status != http.StatusSeeOther || !strings.HasPrefix(pg.location, p.op.URL+oauth.AuthorizePath) {
			t.Fatalf("start: %d %q %s", pg.status, pg.location, pg.body)
		}
		done := p.callback(t, b, p.atUpstream(t, b, pg.location, who.Email))
		u, _ := url.Parse(done.location)
		if !strings.HasPrefix(done.location, testRedirect+"?") || u.Query().Get("code") == "" || u.Query().Get("iss") != p.rp.URL {
			t.Fatalf("not sent back with a code: %d %q %s", done.status, done.location, done.body)
		}
		status, tok := p.rp.embeddedExchange(t, u.Query().Get("code"), verifier)
		if status != http.StatusOK || tok["id_token"] == nil {
			t.Fatalf("exchange %d %v", status, tok)
		}

		// An account with a password: the 409 of the spec, with the
		// pending link's handle.
		p.opUser(t, p.rp.user.Email, true)
		b = p.rp.browser(t)
		pg = b.do(http.MethodGet, start("acme-sso", testRedirect), nil)
		callback := p.atUpstream(t, b, pg.location, p.rp.user.Email)
		req, _ := http.NewRequest(http.MethodGet, callback, nil)
		req.Header.Set("Accept", "application/json")
		resp, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || body["error"] != "account_exists" || body["linkingRequired"] != true ||
			body["linkingEndpoint"] != LinkingPath || body["suggestion"] == "" || toJSON(body["existingIdentities"]) != `["password"]` ||
			len(body["pendingLink"].(string)) < 43 || body["provider"] != "acme-sso" {
			t.Fatalf("409: %d %v", resp.StatusCode, body)
		}
		// In a browser, the application gets the same members on its
		// redirect URI.
		b = p.rp.browser(t)
		pg = b.do(http.MethodGet, start("acme-sso", testRedirect), nil)
		b.c.Transport = acceptHTML{}
		back := p.callback(t, b, p.atUpstream(t, b, pg.location, p.rp.user.Email))
		u, _ = url.Parse(back.location)
		q := u.Query()
		if !strings.HasPrefix(back.location, testRedirect+"?") || q.Get("error") != "account_exists" || q.Get("linkingRequired") != "true" ||
			q.Get("existingIdentities") != "password" || len(q.Get("pendingLink")) < 43 || q.Get("iss") != p.rp.URL || q.Get("code") != "" {
			t.Fatalf("sent back: %d %q %s", back.status, back.location, back.body)
		}
	})
}

// acceptHTML is a transport that asks for HTML, as a browser does.
type acceptHTML struct{}

func (acceptHTML) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Accept", "text/html,application/xhtml+xml")
	return http.DefaultTransport.RoundTrip(r)
}

func TestIdentityProvidersAdmin(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		p := newUpstreamPair(t, dbURL)
		path := identityProvidersPath + "/" + p.providerID
		status, got := p.admin(t, http.MethodGet, path, nil)
		if status != http.StatusOK || got["name"] != "acme-sso" || got["clientSecret"] != nil || got["redirectUri"] != p.rp.URL+upstream.CallbackPath ||
			toJSON(got["scopes"]) != `["openid","email","profile"]` || toJSON(got["applications"]) != `["`+p.rp.app+`"]` {
			t.Fatalf("get %d %v", status, got)
		}
		bad := []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"name": "password", "displayName": "x", "issuer": p.op.URL, "clientId": "c", "clientSecret": "s"}, "name"},
			{map[string]any{"name": "a b", "displayName": "x", "issuer": p.op.URL, "clientId": "c", "clientSecret": "s"}, "name"},
			{map[string]any{"name": "ok", "displayName": "x", "issuer": "ftp://x", "clientId": "c", "clientSecret": "s"}, "issuer"},
			{map[string]any{"name": "ok", "displayName": "x", "issuer": p.op.URL, "clientId": "c"}, "clientSecret"},
			{map[string]any{"name": "ok", "displayName": "x", "issuer": p.op.URL, "clientId": "c", "clientSecret": "s", "scopes": []string{"email"}}, "scopes"},
			{map[string]any{"name": "ok", "displayName": "x", "issuer": p.op.URL, "clientId": "c", "clientSecret": "s", "applications": []string{"app_nope"}}, "applications"},
		}
		for _, c := range bad {
			status, out := p.admin(t, http.MethodPost, identityProvidersPath, c.body)
			fields, _ := out["details"].(map[string]any)["fields"].(map[string]any)
			if status != http.StatusBadRequest || out["error"] != "invalid_request" || fields[c.field] == nil {
				t.Fatalf("%v: %d %v", c.body, status, out)
			}
		}
		// Discovery that fails: a clear 400.
		status, out := p.admin(t, http.MethodPost, identityProvidersPath, map[string]any{"name": "gone", "displayName": "Gone",
			"issuer": "http://127.0.0.1:1", "clientId": "c", "clientSecret": "s"})
		if status != http.StatusBadRequest || out["error"] != "discovery_failed" || out["details"].(map[string]any)["issuer"] != "http://127.0.0.1:1" {
			t.Fatalf("discovery: %d %v", status, out)
		}
		// An issuer that names another issuer is refused too.
		status, out = p.admin(t, http.MethodPost, identityProvidersPath, map[string]any{"name": "other", "displayName": "Other",
			"issuer": p.op.URL + "/", "clientId": "c", "clientSecret": "s"})
		if status != http.StatusBadRequest || out["error"] != "discovery_failed" {
			t.Fatalf("issuer mismatch: %d %v", status, out)
		}
		status, out = p.admin(t, http.MethodPost, identityProvidersPath, map[string]any{"name": "acme-sso", "displayName": "Again",
			"issuer": p.op.URL, "clientId": "c", "clientSecret": "s"})
		if status != http.StatusConflict || out["error"] != "name_taken" {
			t.Fatalf("taken name: %d %v", status, out)
		}
		status, out = p.admin(t, http.MethodPost, identityProvidersPath, map[string]any{"name": "ACME-sso", "displayName": "Again",
			"issuer": p.op.URL, "clientId": "c", "clientSecret": "s"})
		if status != http.StatusConflict || out["error"] != "name_taken" {
			t.Fatalf("taken name in another case: %d %v", status, out)
		}
		status, out = p.admin(t, http.MethodPost, identityProvidersPath, map[string]any{"name": "x", "extra": 1})
		if status != http.StatusBadRequest {
			t.Fatalf("unknown member: %d %v", status, out)
		}
		status, out = p.admin(t, http.MethodPatch, path, map[string]any{"name": "renamed"})
		if status != http.StatusBadRequest || out["details"].(map[string]any)["fields"].(map[string]any)["name"] == nil {
			t.Fatalf("rename: %d %v", status, out)
		}
		status, out = p.admin(t, http.MethodPatch, path, map[string]any{"displayName": "Acme Login", "scopes": []string{"openid", "email"}, "applications": []string{}})
		if status != http.StatusOK || out["displayName"] != "Acme Login" || toJSON(out["applications"]) != `[]` {
			t.Fatalf("patch: %d %v", status, out)
		}
		status, out = p.admin(t, http.MethodGet, identityProvidersPath+"?limit=1", nil)
		if status != http.StatusOK || out["total"] != float64(1) || out["limit"] != float64(1) || len(out["identityProviders"].([]any)) != 1 {
			t.Fatalf("list: %d %v", status, out)
		}
		if status, out := p.admin(t, http.MethodGet, identityProvidersPath+"?limit=500", nil); status != http.StatusBadRequest {
			t.Fatalf("limit 500: %d %v", status, out)
		}
		// No application offers it now: no button, and the form refuses it.
		b := p.rp.browser(t)
		pg := b.do(http.MethodGet, p.rp.authorizeURL(), nil)
		pg = b.do(http.MethodGet, pg.location, nil)
		if strings.Contains(pg.body, "Continue with") {
			t.Fatal("a button for a provider the application does not offer")
		}
		f := pg.fields()
		f.Set("provider", "acme-sso")
		expectPage(t, b.do(http.MethodPost, signinProviderPath, f), http.StatusBadRequest, "offers no sign-in provider")
		if status, _ := p.admin(t, http.MethodDelete, path, nil); status != http.StatusNoContent {
			t.Fatalf("delete %d", status)
		}
		if status, _ := p.admin(t, http.MethodGet, path, nil); status != http.StatusNotFound {
			t.Fatalf("after delete %d", status)
		}
		if status, _ := p.admin(t, http.MethodGet, identityProvidersPath+"/not-a-uuid", nil); status != http.StatusNotFound {
			t.Fatalf("bad id %d", status)
		}
		// Only admins.
		req, _ := http.NewRequest(http.MethodGet, p.rp.URL+identityProvidersPath, nil)
		if resp, _ := getJSON(t, req); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("no token: %d", resp.StatusCode)
		}
	})
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestUpstreamStepUpAndEvents: a sign-in through a provider is every
// sign-in: the application's MFA policy steps it up (a code e-mailed, the
// first factor being no e-mail), and it is logged as one.
func TestUpstreamStepUpAndEvents(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		p := newUpstreamPair(t, dbURL)
		p.allowSignUp(t, true)
		p.rp.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": "required", "factors": []any{"otp"}}
		})
		who := p.opUser(t, "mfa-"+rand8()+"@example.com", true)
		b := p.rp.browser(t)
		pg := p.callback(t, b, p.atUpstream(t, b, p.toUpstream(t, b), who.Email))
		expectPage(t, pg, http.StatusOK, "We have emailed a 6-digit code to "+who.Email)
		code := mailedCode.FindString(p.rp.next(t).Text)
		f := pg.fields()
		f.Set("code", code)
		pg = b.do(http.MethodPost, signinMFAPath, f)
		if pg.status != http.StatusSeeOther || !strings.HasPrefix(pg.location, signinResumePath) {
			t.Fatalf("second factor: %d %q %s", pg.status, pg.location, pg.body)
		}
		q := expectRedirectBack(t, b.do(http.MethodGet, pg.location, nil))
		tok := p.rp.exchange(t, q.Get("code"))
		var claims struct {
			Sub string   `json:"sub"`
			AMR []string `json:"amr"`
			ACR string   `json:"acr"`
		}
		raw, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok["id_token"].(string), ".")[1])
		if err := json.Unmarshal(raw, &claims); err != nil {
			t.Fatal(err)
		}
		if strings.Join(claims.AMR, " ") != "fed otp email mfa" || claims.ACR == "" {
			t.Fatalf("amr %v acr %q", claims.AMR, claims.ACR)
		}
		events, err := p.rp.store.ListAuthEvents(ctx, claims.Sub, persistence.Page{Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range events {
			seen[e.Type] = true
			if e.Type == persistence.EventSignIn && (e.Data["method"] != upstream.AMR || e.SessionID == nil) {
				t.Fatalf("sign_in %+v", e)
			}
		}
		for _, typ := range []string{persistence.EventUserSignedUp, persistence.EventCodeSent, persistence.EventSignIn} {
			if !seen[typ] {
				t.Fatalf("no %s among %+v", typ, events)
			}
		}

		// Refusals are logged with their reasons.
		unverified := p.opUser(t, "unverified-"+rand8()+"@example.com", false)
		p.hostedSignIn(t, unverified.Email)
		b = p.rp.browser(t)
		b.do(http.MethodGet, p.rp.authorizeURL(), nil)
		b.do(http.MethodGet, p.rp.URL+upstream.CallbackPath+"?state=forged&code=x", nil)
		all, err := p.rp.store.ListAuthEvents(ctx, "", persistence.Page{Limit: 200})
		if err != nil {
			t.Fatal(err)
		}
		reasons := map[string]bool{}
		for _, e := range all {
			if e.Type == persistence.EventSignInFailed && e.Data["method"] == upstream.AMR {
				reasons[e.Reason] = true
			}
		}
		if !reasons[upstream.ReasonEmailUnverified] || !reasons[upstream.ReasonInvalidState] {
			t.Fatalf("failure reasons %v", reasons)
		}
	})
}

// TestOpenAPIIdentityProviders checks the upstream routes' real answers,
// successes and refusals, against openapi.json, with a second identityd as
// the provider to discover.
func TestOpenAPIIdentityProviders(t *testing.T) {
	o, _ := openAPIOptions(t)
	doc, err := libopenapi.NewDocument(openAPIDocument)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	c := &openAPIClient{t: t, h: New(o), v: v}
	op := newSigninServer(t, dbtest.URLs(t)["sqlite"], nil)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(url.QueryEscape(openAPIAdmin)+":"+url.QueryEscape(openAPIAdminSecret)))
	tok := c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic, contentType: formType, body: "grant_type=client_credentials", status: 200})
	admin := "Bearer " + tok["access_token"].(string)
	send := func(method, target, body string, status int) map[string]any {
		t.Helper()
		ct := jsonMedia
		if body == "" {
			ct = ""
		}
		return c.do(exchange{method: method, target: target, auth: admin, contentType: ct, body: body, status: status})
	}
	app := send("POST", "/api/v1/applications", `{"name":"Notes","redirectUris":["https://notes.example/callback"],"webOrigins":["https://notes.example"]}`, 201)
	appID := app["clientId"].(string)
	created := send("POST", identityProvidersPath, `{"name":"acme-sso","displayName":"Acme SSO","issuer":"`+op.URL+`","clientId":"c","clientSecret":"s","applications":["`+appID+`"]}`, 201)
	id := created["id"].(string)
	send("POST", identityProvidersPath, `{"name":"acme-sso","displayName":"Again","issuer":"`+op.URL+`","clientId":"c","clientSecret":"s"}`, 409)
	send("POST", identityProvidersPath, `{"name":"gone","displayName":"Gone","issuer":"http://127.0.0.1:1","clientId":"c","clientSecret":"s"}`, 400)
	send("POST", identityProvidersPath, `{"name":"otp","displayName":"x","issuer":"`+op.URL+`","clientId":"c","clientSecret":"s"}`, 400)
	send("GET", identityProvidersPath+"?limit=5", "", 200)
	send("GET", identityProvidersPath+"/"+id, "", 200)
	send("GET", identityProvidersPath+"/"+uuid.NewString(), "", 404)
	send("PATCH", identityProvidersPath+"/"+id, `{"displayName":"Acme Login","scopes":["openid","email"]}`, 200)

	// The embedded start route, its refusals and its preflight.
	challenge := oauth2.S256ChallengeFromVerifier(oauth2.GenerateVerifier())
	start := func(name, redirect string, status int) {
		t.Helper()
		c.do(exchange{method: "GET", target: embeddedPath + "/providers/" + name + "/start?" + url.Values{"clientId": {appID}, "redirectUri": {redirect},
			"codeChallenge": {challenge}, "codeChallengeMethod": {"S256"}}.Encode(), status: status})
	}
	start("acme-sso", "https://notes.example/callback", 303)
	start("nope", "https://notes.example/callback", 404)
	start("acme-sso", "https://evil.example/callback", 400)
	c.do(exchange{method: "OPTIONS", target: embeddedPath + "/providers/acme-sso/start", header: http.Header{"Origin": {"https://notes.example"}}, status: 204})

	// The hosted routes' refusals: a form without its CSRF token, a forged state.
	c.do(exchange{method: "POST", target: signinProviderPath, contentType: formType, body: "flow=x&csrf_token=y&provider=acme-sso", status: 403})
	c.do(exchange{method: "GET", target: upstream.CallbackPath + "?state=forged&code=x", status: 400})
	send("DELETE", identityProvidersPath+"/"+id, "", 204)
}

// TestUpstreamEmbeddedStepUpAndRefusal: the embedded start route ends a
// stepped-up sign-in on the application's redirect URI with its
// mfaSessionId (finished at /mfa/verify with the e-mailed code), and a
// refusal after the provider there with error and iss.
func TestUpstreamEmbeddedStepUpAndRefusal(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		p := newUpstreamPair(t, dbURL)
		p.allowSignUp(t, true)
		verifier := oauth2.GenerateVerifier()
		start := p.rp.URL + embeddedPath + "/providers/acme-sso/start?" + url.Values{"clientId": {p.rp.app}, "redirectUri": {testRedirect},
			"codeChallenge": {oauth2.S256ChallengeFromVerifier(verifier)}, "codeChallengeMethod": {"S256"}}.Encode()
		landed := func(b *browser, email string) url.Values {
			t.Helper()
			b.c.Transport = acceptHTML{}
			pg := b.do(http.MethodGet, start, nil)
			back := p.callback(t, b, p.atUpstream(t, b, pg.location, email))
			if !strings.HasPrefix(back.location, testRedirect+"?") {
				t.Fatalf("not sent back: %d %q %s", back.status, back.location, back.body)
			}
			u, _ := url.Parse(back.location)
			if u.Query().Get("iss") != p.rp.URL {
				t.Fatalf("no iss: %s", back.location)
			}
			return u.Query()
		}
		unverified := p.opUser(t, "unverified-"+rand8()+"@example.com", false)
		if q := landed(p.rp.browser(t), unverified.Email); q.Get("error") != "email_not_verified" || q.Get("error_description") == "" || q.Get("code") != "" {
			t.Fatalf("refusal %v", q)
		}

		p.rp.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": "required", "factors": []any{"otp"}}
		})
		who := p.opUser(t, "embedded-mfa-"+rand8()+"@example.com", true)
		q := landed(p.rp.browser(t), who.Email)
		if q.Get("mfaRequired") != "true" || q.Get("mfaSessionId") == "" || q.Get("methods") != "otp" || q.Get("code") != "" {
			t.Fatalf("step-up %v", q)
		}
		code := mailedCode.FindString(p.rp.next(t).Text)
		status, _, out := p.rp.embed(t, "/mfa/verify", map[string]any{"clientId": p.rp.app, "mfaSessionId": q.Get("mfaSessionId"), "method": "otp", "code": code})
		if status != http.StatusOK || out["code"] == nil {
			t.Fatalf("mfa/verify %d %v", status, out)
		}
		if status, tok := p.rp.embeddedExchange(t, out["code"].(string), verifier); status != http.StatusOK || tok["id_token"] == nil {
			t.Fatalf("exchange %d %v", status, tok)
		}
	})
}
