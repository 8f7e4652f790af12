package handlers

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// loopbackApp registers an application of type typ whose one redirect URI
// is redirect.
func (s *signinServer) loopbackApp(t *testing.T, typ, redirect string) string {
	t.Helper()
	n := extensions.Now()
	app := &persistence.Application{ID: uuid.NewString(), ClientID: "app_" + rand8(), Name: "Loopback", Type: typ,
		RedirectURIs: persistence.StringList{redirect}, SignInMethods: persistence.StringList{"password"}, MFA: persistence.JSONObject{},
		AccessTokenFormat: "opaque", IDTokenSigningAlg: oauth.AlgRS256, CreatedAt: n, UpdatedAt: n}
	if typ == persistence.AppConfidential {
		app.SecretHash, _ = s.provider.Hasher.Hash(context.Background(), []byte(oauth.NewSecret()))
	}
	if err := s.store.CreateApplication(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	return app.ClientID
}

// expectSignInPage checks an authorization request taken on to the
// hosted sign-in page: it was accepted.
func expectSignInPage(t *testing.T, p *page) {
	t.Helper()
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinPath+"?flow=") {
		t.Fatalf("not taken to the sign-in page: %d %q %s", p.status, p.location, p.body)
	}
}

// RFC 8252 §7.3 lets a native app's loopback redirect URI take any port;
// fosite applies it to every client. A confidential (web) application's
// redirect URI matches as registered, port included.
func TestLoopbackRedirectPorts(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		web := s.loopbackApp(t, persistence.AppConfidential, "http://127.0.0.1:8080/cb")
		native := s.loopbackApp(t, persistence.AppPublic, "http://127.0.0.1:8080/cb")
		ask := func(client, redirect string) *page {
			return b.do(http.MethodGet, s.authorizeURL("client_id", client, "redirect_uri", redirect), nil)
		}
		expectSignInPage(t, ask(web, "http://127.0.0.1:8080/cb"))
		for _, other := range []string{"http://127.0.0.1:9999/cb", "http://127.0.0.1/cb"} {
			expectPage(t, ask(web, other), http.StatusBadRequest, "redirect")
		}
		expectSignInPage(t, ask(native, "http://127.0.0.1:8080/cb"))
		expectSignInPage(t, ask(native, "http://127.0.0.1:51234/cb"))
		expectPage(t, ask(native, "http://127.0.0.1:51234/other"), http.StatusBadRequest, "redirect")
	})
}

// state and nonce are capped at oauth.MaxStateLength bytes, refused beyond
// before a sign-in flow is stored (sent back as invalid_request, without
// the state, where an accepted request goes on to the flow's page); a nonce shorter than the token endpoint accepts in an ID
// token is refused at once, not after the person has signed in.
func TestAuthorizeStateAndNonce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		b := s.browser(t)
		post := func(extra ...string) *page {
			q, _ := url.ParseQuery(strings.SplitN(s.authorizeURL(extra...), "?", 2)[1])
			return b.do(http.MethodPost, oauth.AuthorizePath, q)
		}
		refused := func(p *page, hint string) {
			t.Helper()
			u, err := url.Parse(p.location)
			if err != nil || p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, testRedirect+"?") ||
				u.Query().Get("error") != "invalid_request" || !strings.Contains(u.Query().Get("error_description"), hint) {
				t.Fatalf("want invalid_request (%s) sent back, got %d %q", hint, p.status, p.location)
			}
			if len(p.location) > 1024 {
				t.Fatalf("a %d-byte Location", len(p.location))
			}
		}
		long := strings.Repeat("s", oauth.MaxStateLength)
		expectSignInPage(t, post("state", long))
		expectSignInPage(t, post("nonce", long))
		p := post("state", long+"s")
		refused(p, "state")
		if u, _ := url.Parse(p.location); u.Query().Has("state") {
			t.Fatal("the refused state was sent back")
		}
		refused(post("state", strings.Repeat("s", 900<<10)), "state")
		expectError(t, post("nonce", long+"n"), "invalid_request")
		// fosite puts a nonce in an ID token only from 8 characters.
		expectError(t, post("nonce", "1234567"), "invalid_request")
		expectSignInPage(t, post("nonce", "12345678"))
		expectSignInPage(t, post("nonce", ""))

		// RP-initiated logout echoes its state too: the same cap.
		logout := func(state string) *page {
			q := url.Values{"client_id": {s.app}, "post_logout_redirect_uri": {testLogout}, "state": {state}}
			return b.do(http.MethodPost, oauth.EndSessionPath, q)
		}
		if p := logout(long); p.status != http.StatusSeeOther || p.location != testLogout+"?state="+long {
			t.Fatalf("logout with a %d-byte state: %d %q", len(long), p.status, p.location)
		}
		expectPage(t, logout(long+"s"), http.StatusBadRequest, "at most 2048 bytes")

	})
}
