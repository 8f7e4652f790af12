package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Go's x/oauth2 gets tokens with both client authentication methods, scope
// subsets and the omitted-scope default, and sees the RFC 6749 errors.
func TestGoOAuth2ClientCredentials(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		ctx := context.Background()
		acct := s.createAccount(s.adminToken(), map[string]any{"name": "go-client", "scopes": []string{"users:read", "orgs:read"}})

		for _, style := range []oauth2.AuthStyle{oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams} {
			cfg := clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: acct.ClientSecret,
				TokenURL: s.URL + "/api/v1/oauth/token", AuthStyle: style, Scopes: []string{"users:read"}}
			tok, err := cfg.Token(ctx)
			if err != nil {
				t.Fatalf("style %v: %v", style, err)
			}
			if tok.TokenType != "Bearer" || tok.Extra("scope") != "users:read" {
				t.Fatalf("style %v: token_type %q scope %v", style, tok.TokenType, tok.Extra("scope"))
			}
			if left := time.Until(tok.Expiry); left < 3590*time.Second || left > 3600*time.Second {
				t.Fatalf("style %v: expires in %v, want about 3600s", style, left)
			}
			if tok.Extra("expires_in") != float64(3600) {
				t.Fatalf("expires_in %v, want 3600", tok.Extra("expires_in"))
			}
			// The token works on the API, through the library's transport.
			resp, err := cfg.Client(ctx).Get(s.URL + "/api/v1/m2m/whoami")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("whoami through oauth2 client: %v %v", resp, err)
			}
			resp.Body.Close()
		}

		// The alias /oauth/token, and the omitted scope granting all.
		cfg := clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: acct.ClientSecret, TokenURL: s.URL + "/oauth/token"}
		tok, err := cfg.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Fields(tok.Extra("scope").(string))
		slices.Sort(got)
		if !slices.Equal(got, []string{"orgs:read", "users:read"}) {
			t.Fatalf("omitted scope granted %v", got)
		}

		// Refusals as the library reports them.
		cases := []struct {
			name   string
			cfg    clientcredentials.Config
			code   string
			status int
		}{
			{"scope the account lacks", clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: acct.ClientSecret, Scopes: []string{"users:read", "admin"}}, "invalid_scope", 400},
			{"unknown scope", clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: acct.ClientSecret, Scopes: []string{"nope"}}, "invalid_scope", 400},
			{"wrong secret", clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: "wrong"}, "invalid_client", 401},
			{"unknown client", clientcredentials.Config{ClientID: "sa_nobody", ClientSecret: "x"}, "invalid_client", 401},
		}
		for _, c := range cases {
			c.cfg.TokenURL = s.URL + "/api/v1/oauth/token"
			c.cfg.AuthStyle = oauth2.AuthStyleInHeader
			_, err := c.cfg.Token(ctx)
			var re *oauth2.RetrieveError
			if !errors.As(err, &re) || re.ErrorCode != c.code || re.Response.StatusCode != c.status {
				t.Fatalf("%s: got %v, want %s (%d)", c.name, err, c.code, c.status)
			}
		}
	})
}

// go-oidc discovers the server from its issuer alone and fetches its keys.
func TestGoOIDCDiscovery(t *testing.T) {
	s := start(t, dbtest.URLs(t)["sqlite"])
	ctx := context.Background()
	p, err := oidc.NewProvider(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if p.Endpoint().TokenURL != s.URL+"/api/v1/oauth/token" {
		t.Fatalf("token endpoint %q", p.Endpoint().TokenURL)
	}
	var md struct {
		Issuer        string   `json:"issuer"`
		Introspection string   `json:"introspection_endpoint"`
		Revocation    string   `json:"revocation_endpoint"`
		JWKS          string   `json:"jwks_uri"`
		Grants        []string `json:"grant_types_supported"`
		AuthMethods   []string `json:"token_endpoint_auth_methods_supported"`
		Scopes        []string `json:"scopes_supported"`
	}
	if err := p.Claims(&md); err != nil {
		t.Fatal(err)
	}
	if md.Issuer != s.URL || md.Introspection != s.URL+"/api/v1/oauth/introspect" || md.Revocation != s.URL+"/api/v1/oauth/revoke" ||
		md.JWKS != s.URL+"/.well-known/jwks.json" || !slices.Equal(md.Grants, []string{"client_credentials", "urn:ietf:params:oauth:grant-type:token-exchange", "authorization_code", "refresh_token", "urn:openid:params:grant-type:ciba"}) ||
		!slices.Equal(md.AuthMethods, []string{"client_secret_basic", "client_secret_post", "none"}) || !slices.Contains(md.Scopes, "users:read") {
		t.Fatalf("metadata %+v", md)
	}
	// RFC 8414 metadata is the same document.
	a, b := s.do(http.MethodGet, "/.well-known/oauth-authorization-server", nil), s.do(http.MethodGet, "/.well-known/openid-configuration", nil)
	if a.Status != 200 || string(a.Body) != string(b.Body) {
		t.Fatalf("metadata documents differ: %d %s vs %s", a.Status, a.Body, b.Body)
	}

	// The key set has an RS256 and an ES256 key, public halves only, and
	// survives a restart unchanged.
	jwks := s.do(http.MethodGet, "/.well-known/jwks.json", nil)
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks.Body, &set); err != nil {
		t.Fatal(err)
	}
	var algs []string
	for _, k := range set.Keys {
		if !k.IsPublic() || k.Use != "sig" || k.KeyID == "" {
			t.Fatalf("key %s: public %v use %q", k.KeyID, k.IsPublic(), k.Use)
		}
		algs = append(algs, k.Algorithm)
	}
	slices.Sort(algs)
	if !slices.Equal(algs, []string{"ES256", "RS256"}) {
		t.Fatalf("algorithms %v", algs)
	}
	for _, private := range []string{`"d"`, `"p"`, `"q"`} {
		if strings.Contains(string(jwks.Body), private) {
			t.Fatalf("JWKS leaks private member %s", private)
		}
	}
	s.restart()
	if again := s.do(http.MethodGet, "/.well-known/jwks.json", nil); string(again.Body) != string(jwks.Body) {
		t.Fatal("signing keys changed across a restart")
	}
}

// Node's openid-client v6 runs its own suites against the server: discovery,
// both client authentication methods, introspection, revocation, rotation
// and deletion (e2e/node/client.test.mjs), RAR and exchange; oauth4webapi,
// the strict library under it, runs e2e/node/oauth4webapi.test.mjs.
func TestNodeOpenIDClient(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is required for the end-to-end suite (make test installs e2e/node's packages)")
	}
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		cmd := exec.Command("node", "--test")
		cmd.Dir = "node"
		cmd.Env = append(os.Environ(), "IDENTITYD_ISSUER="+s.URL, "IDENTITYD_ADMIN_CLIENT_ID="+s.AdminID, "IDENTITYD_ADMIN_CLIENT_SECRET="+s.AdminSecret)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("openid-client suite failed: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "# fail 0") || strings.Contains(string(out), "# pass 0") {
			t.Fatalf("openid-client suite ran no test or failed:\n%s", out)
		}
	})
}
