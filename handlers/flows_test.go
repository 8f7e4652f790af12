package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"github.com/google/uuid"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// The code and refresh flows in process: a real authorization request
// answered by Provider.AuthorizeCode for a person of the directory with a
// live SSO session, the token endpoint over real HTTP, and third-party
// clients (x/oauth2, go-oidc) on the other side.

// flowApp is an application registered for a flow test.
type flowApp struct {
	id, secret string // secret: "" for a public application
	cfg        *oauth2.Config
}

// addApp registers an application: typ confidential or public, its ID
// token algorithm and access-token format.
func (s *signinServer) addApp(t testing.TB, typ, alg, format string) *flowApp {
	t.Helper()
	ctx := context.Background()
	n := extensions.Now()
	app := &persistence.Application{
		ID: uuid.NewString(), ClientID: "app_" + rand8(), Name: "Flows", Type: typ, RedirectURIs: persistence.StringList{testRedirect},
		SignInMethods: persistence.StringList{"password"}, MFA: persistence.JSONObject{}, AccessTokenFormat: format, IDTokenSigningAlg: alg,
		CreatedAt: n, UpdatedAt: n,
	}
	fa := &flowApp{id: app.ClientID}
	style := oauth2.AuthStyleInParams
	if typ == persistence.AppConfidential {
		fa.secret = oauth.NewSecret()
		app.SecretHash, _ = s.provider.Hasher.Hash(ctx, []byte(fa.secret))
		style = oauth2.AuthStyleInHeader
	}
	if err := s.store.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	fa.cfg = &oauth2.Config{ClientID: fa.id, ClientSecret: fa.secret, RedirectURL: testRedirect,
		Endpoint: oauth2.Endpoint{AuthURL: s.URL + oauth.AuthorizePath, TokenURL: s.URL + oauth.TokenPath, AuthStyle: style}}
	return fa
}

// signedIn starts an SSO session for the server's person and answers what
// an authorization carries for them.
func (s *signinServer) signedIn(t testing.TB) oauth.SignedIn {
	t.Helper()
	at := extensions.Now()
	ss := &persistence.SSOSession{ID: uuid.NewString(), TokenHash: []byte(uuid.NewString()), UserID: s.user.ID, AMR: persistence.StringList{"pwd"},
		AuthTime: at, CreatedAt: at, LastSeenAt: at, ExpiresAt: at.Add(time.Hour)}
	if err := s.store.OpenSession(context.Background(), persistence.Opening{Session: ss}); err != nil {
		t.Fatal(err)
	}
	return oauth.SignedIn{UserID: s.user.ID, Email: s.user.Email, EmailVerified: s.user.EmailVerified, Name: s.user.Name, Roles: []string{},
		SessionID: ss.ID, AuthTime: at, AMR: []string{"pwd"}}
}

// authorize sends the authorization request at authURL (as a browser
// would) to the provider, answers it for who, and returns the redirect's
// parameters.
func (s *signinServer) authorize(t testing.TB, authURL string, who oauth.SignedIn) url.Values {
	t.Helper()
	ctx := context.Background()
	r := httptest.NewRequest(http.MethodGet, authURL, nil)
	ar, err := s.provider.NewAuthorizeRequest(ctx, r)
	w := httptest.NewRecorder()
	if err != nil {
		s.provider.AuthorizeError(ctx, w, ar, err)
	} else {
		s.provider.AuthorizeCode(ctx, w, ar, who)
	}
	loc, err := url.Parse(w.Header().Get("Location"))
	if err != nil || w.Code != http.StatusSeeOther || !strings.HasPrefix(loc.String(), testRedirect+"?") {
		t.Fatalf("authorization answered %d %q %s", w.Code, w.Header().Get("Location"), w.Body)
	}
	if loc.Query().Get("iss") != s.URL {
		t.Fatalf("iss %q, want %q", loc.Query().Get("iss"), s.URL)
	}
	return loc.Query()
}

// oauthCode is the error code of a failed token request.
func oauthCode(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		return re.ErrorCode
	}
	return ""
}

func (s *signinServer) verifier(t testing.TB, app *flowApp, alg string) *oidc.IDTokenVerifier {
	t.Helper()
	p, err := oidc.NewProvider(context.Background(), s.URL)
	if err != nil {
		t.Fatal(err)
	}
	return p.Verifier(&oidc.Config{ClientID: app.id, SupportedSigningAlgs: []string{alg}})
}

// codeFlow runs the code flow with PKCE to its token response.
func (s *signinServer) codeFlow(t testing.TB, app *flowApp, who oauth.SignedIn, scope ...string) (*oauth2.Token, string) {
	t.Helper()
	app.cfg.Scopes = scope
	verifier, nonce := oauth2.GenerateVerifier(), "nonce-"+rand8()
	q := s.authorize(t, app.cfg.AuthCodeURL("state-"+rand8(), oauth2.S256ChallengeOption(verifier), oidc.Nonce(nonce)), who)
	tok, err := app.cfg.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	return tok, nonce
}

func TestCodeFlow(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		for _, alg := range []string{oauth.AlgRS256, oauth.AlgES256} {
			t.Run(alg, func(t *testing.T) {
				ctx := context.Background()
				s := newSigninServer(t, dbURL, nil)
				app := s.addApp(t, persistence.AppConfidential, alg, "opaque")
				who := s.signedIn(t)
				tok, nonce := s.codeFlow(t, app, who, "openid", "email", "profile", "roles", "offline_access")
				raw, _ := tok.Extra("id_token").(string)
				idt, err := s.verifier(t, app, alg).Verify(ctx, raw)
				if err != nil {
					t.Fatalf("ID token: %v", err)
				}
				if idt.Nonce != nonce || idt.Subject != s.user.ID || idt.VerifyAccessToken(tok.AccessToken) != nil {
					t.Fatalf("nonce %q, sub %q, at_hash %q", idt.Nonce, idt.Subject, idt.AccessTokenHash)
				}
				var claims struct {
					Email         string   `json:"email"`
					EmailVerified *bool    `json:"email_verified"`
					Name          string   `json:"name"`
					Roles         []string `json:"roles"`
					SID           string   `json:"sid"`
					AMR           []string `json:"amr"`
					AuthTime      int64    `json:"auth_time"`
				}
				if err := idt.Claims(&claims); err != nil {
					t.Fatal(err)
				}
				if claims.Email != s.user.Email || claims.EmailVerified == nil || claims.Name != "Ada" || claims.Roles == nil ||
					claims.SID != who.SessionID || !slices.Equal(claims.AMR, []string{"pwd"}) || claims.AuthTime != who.AuthTime.Unix() {
					t.Fatalf("claims %+v", claims)
				}
				if kid := jwsKid(t, raw); !slices.ContainsFunc(s.provider.Keys.PublicJWKS().Keys, func(k jose.JSONWebKey) bool { return k.KeyID == kid && k.Algorithm == alg }) {
					t.Fatalf("kid %q is not a published %s key", kid, alg)
				}
				pr, err := s.provider.Authenticate(ctx, tok.AccessToken)
				if err != nil || pr.Subject != s.user.ID || pr.SessionID != who.SessionID {
					t.Fatalf("the access token: %+v %v", pr, err)
				}

				// Refresh: rotation, a new ID token with what the directory says now.
				if _, err := s.store.UpdateUser(ctx, s.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
					u.Name = "Ada Lovelace"
					return nil, nil
				}); err != nil {
					t.Fatal(err)
				}
				old := tok.RefreshToken
				tok.Expiry = time.Now().Add(-time.Minute)
				fresh, err := app.cfg.TokenSource(ctx, tok).Token()
				if err != nil {
					t.Fatalf("refresh: %v", err)
				}
				if fresh.RefreshToken == "" || fresh.RefreshToken == old || fresh.AccessToken == tok.AccessToken {
					t.Fatal("refresh did not rotate")
				}
				idt, err = s.verifier(t, app, alg).Verify(ctx, fresh.Extra("id_token").(string))
				if err != nil || idt.Subject != s.user.ID || idt.VerifyAccessToken(fresh.AccessToken) != nil {
					t.Fatalf("refreshed ID token: %v", err)
				}
				if err := idt.Claims(&claims); err != nil || claims.Name != "Ada Lovelace" {
					t.Fatalf("refreshed name %q", claims.Name)
				}
				events, _ := s.store.ListAuthEvents(ctx, s.user.ID, persistence.Page{Limit: 50})
				if !slices.ContainsFunc(events, func(e persistence.AuthEvent) bool { return e.Type == persistence.EventTokenRefreshed }) {
					t.Fatalf("no token_refreshed event: %+v", events)
				}
			})
		}
	})
}

// jwsKid reads the kid of a compact JWS's header.
func jwsKid(t testing.TB, token string) string {
	t.Helper()
	jws, err := jose.ParseSigned(token, []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	return jws.Signatures[0].Header.KeyID
}

// postToken posts a form to the token endpoint as app and answers the
// status and the body.
func (s *signinServer) postToken(t testing.TB, app *flowApp, form url.Values) (int, map[string]any) {
	t.Helper()
	if app.secret == "" {
		form.Set("client_id", app.id)
	}
	req, _ := http.NewRequest(http.MethodPost, s.URL+oauth.TokenPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if app.secret != "" {
		req.SetBasicAuth(app.id, app.secret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func TestCodeFlowRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := newSigninServer(t, dbURL, nil)
		app := s.addApp(t, persistence.AppConfidential, oauth.AlgRS256, "opaque")
		public := s.addApp(t, persistence.AppPublic, oauth.AlgES256, "opaque")
		who := s.signedIn(t)
		app.cfg.Scopes = []string{"openid", "offline_access"}

		code := func(a *flowApp, opts ...oauth2.AuthCodeOption) string {
			return s.authorize(t, a.cfg.AuthCodeURL("state-0123456789", opts...), who).Get("code")
		}
		verifier := oauth2.GenerateVerifier()
		challenge := oauth2.S256ChallengeOption(verifier)

		t.Run("PKCE verifier missing or wrong", func(t *testing.T) {
			if _, err := app.cfg.Exchange(ctx, code(app, challenge)); oauthCode(err) != "invalid_grant" {
				t.Fatalf("missing verifier: %v", err)
			}
			if _, err := app.cfg.Exchange(ctx, code(app, challenge), oauth2.VerifierOption(oauth2.GenerateVerifier())); oauthCode(err) != "invalid_grant" {
				t.Fatalf("wrong verifier: %v", err)
			}
		})
		t.Run("plain PKCE and none at all", func(t *testing.T) {
			plain := app.cfg.AuthCodeURL("state-0123456789", oauth2.SetAuthURLParam("code_challenge", verifier), oauth2.SetAuthURLParam("code_challenge_method", "plain"))
			if q := s.authorize(t, plain, who); q.Get("error") != "invalid_request" || q.Get("code") != "" {
				t.Fatalf("plain: %v", q)
			}
			for _, a := range []*flowApp{public, app} {
				if q := s.authorize(t, a.cfg.AuthCodeURL("state-0123456789"), who); q.Get("error") != "invalid_request" || q.Get("state") != "state-0123456789" {
					t.Fatalf("%s without PKCE: %v", a.id, q)
				}
			}
		})
		t.Run("public application with PKCE", func(t *testing.T) {
			public.cfg.Scopes = []string{"openid"}
			tok, err := public.cfg.Exchange(ctx, code(public, challenge), oauth2.VerifierOption(verifier))
			if err != nil || tok.Extra("id_token") == nil {
				t.Fatalf("public exchange: %v", err)
			}
			if tok.RefreshToken != "" {
				t.Fatal("a refresh token without offline_access")
			}
		})
		t.Run("reused code revokes what it issued", func(t *testing.T) {
			c := code(app, challenge)
			tok, err := app.cfg.Exchange(ctx, c, oauth2.VerifierOption(verifier))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := app.cfg.Exchange(ctx, c, oauth2.VerifierOption(verifier)); oauthCode(err) != "invalid_grant" {
				t.Fatalf("reused code: %v", err)
			}
			if _, err := s.provider.Authenticate(ctx, tok.AccessToken); err == nil {
				t.Fatal("the access token of a replayed code still works")
			}
			if status, out := s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}}); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
				t.Fatalf("the refresh token of a replayed code: %d %v", status, out)
			}
		})
		t.Run("a code exchanged at once by many: one wins, then loses what it got", func(t *testing.T) {
			c := code(app, challenge)
			const racers = 6
			type result struct {
				tok *oauth2.Token
				err error
			}
			results := make(chan result, racers)
			for range racers {
				go func() {
					tok, err := app.cfg.Exchange(ctx, c, oauth2.VerifierOption(verifier))
					results <- result{tok, err}
				}()
			}
			var won []*oauth2.Token
			for range racers {
				r := <-results
				if r.err == nil {
					won = append(won, r.tok)
				} else if oauthCode(r.err) != "invalid_grant" {
					t.Errorf("a losing exchange: %v", r.err)
				}
			}
			if len(won) != 1 {
				t.Fatalf("%d exchanges of one code succeeded", len(won))
			}
			if _, err := s.provider.Authenticate(ctx, won[0].AccessToken); err == nil {
				t.Fatal("the winner's access token outlived the code's replay")
			}
		})
		t.Run("reused refresh token revokes the family", func(t *testing.T) {
			tok, err := app.cfg.Exchange(ctx, code(app, challenge), oauth2.VerifierOption(verifier))
			if err != nil {
				t.Fatal(err)
			}
			status, next := s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}})
			if status != http.StatusOK {
				t.Fatalf("refresh: %d %v", status, next)
			}
			if status, out := s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}}); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
				t.Fatalf("reuse: %d %v", status, out)
			}
			if status, out := s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {next["refresh_token"].(string)}}); status != http.StatusBadRequest || out["error"] != "invalid_grant" {
				t.Fatalf("the family's newest refresh token after reuse: %d %v", status, out)
			}
			for _, at := range []string{tok.AccessToken, next["access_token"].(string)} {
				if _, err := s.provider.Authenticate(ctx, at); err == nil {
					t.Fatal("an access token of the family survived the reuse")
				}
			}
			events, _ := s.store.ListAuthEvents(ctx, s.user.ID, persistence.Page{Limit: 50})
			if !slices.ContainsFunc(events, func(e persistence.AuthEvent) bool { return e.Type == persistence.EventRefreshReuse }) {
				t.Fatal("no refresh_reused event")
			}
		})
		t.Run("a refresh asking for a wider scope", func(t *testing.T) {
			tok, err := app.cfg.Exchange(ctx, code(app, challenge), oauth2.VerifierOption(verifier))
			if err != nil {
				t.Fatal(err)
			}
			// RFC 6749 §6: no scope beyond the grant; the token is not spent.
			refresh := func(scope string) (int, map[string]any) {
				return s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "scope": {scope}})
			}
			if status, out := refresh("openid offline_access email"); status != http.StatusBadRequest || out["error"] != "invalid_scope" {
				t.Fatalf("wider: %d %v", status, out)
			}
			if status, out := refresh("openid"); status != http.StatusOK || out["scope"] != "openid offline_access" {
				t.Fatalf("within the grant (answered whole): %d %v", status, out)
			}
		})
		t.Run("refresh needs offline_access", func(t *testing.T) {
			app.cfg.Scopes = []string{"openid"}
			defer func() { app.cfg.Scopes = []string{"openid", "offline_access"} }()
			tok, err := app.cfg.Exchange(ctx, code(app, challenge), oauth2.VerifierOption(verifier))
			if err != nil || tok.RefreshToken != "" {
				t.Fatalf("without offline_access: refresh token %q, %v", tok.RefreshToken, err)
			}
		})
		t.Run("wrong redirect_uri at the token endpoint", func(t *testing.T) {
			status, out := s.postToken(t, app, url.Values{"grant_type": {"authorization_code"}, "code": {code(app, challenge)},
				"redirect_uri": {"https://app.example.com/other"}, "code_verifier": {verifier}})
			if status != http.StatusBadRequest || out["error"] != "invalid_grant" {
				t.Fatalf("wrong redirect_uri: %d %v", status, out)
			}
		})
		t.Run("a code of another application", func(t *testing.T) {
			status, out := s.postToken(t, public, url.Values{"grant_type": {"authorization_code"}, "code": {code(app, challenge)},
				"redirect_uri": {testRedirect}, "code_verifier": {verifier}})
			if status != http.StatusBadRequest || out["error"] != "invalid_grant" {
				t.Fatalf("another application's code: %d %v", status, out)
			}
		})
	})
}

// A code expires (the spec's 10 minutes; shortened here).
func TestExpiredCode(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		// A provider over the same store whose codes live a second.
		short := oauth.NewProvider(oauth.Config{Issuer: s.URL, AccessTokenTTL: time.Hour, SystemSecret: []byte("a system secret for this test only"),
			CodeTTL: time.Second}, s.store, s.provider.Keys)
		app := s.addApp(t, persistence.AppConfidential, oauth.AlgRS256, "opaque")
		app.cfg.Scopes = []string{"openid"}
		verifier := oauth2.GenerateVerifier()
		r := httptest.NewRequest(http.MethodGet, app.cfg.AuthCodeURL("state-0123456789", oauth2.S256ChallengeOption(verifier)), nil)
		ar, err := short.NewAuthorizeRequest(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		short.AuthorizeCode(context.Background(), w, ar, s.signedIn(t))
		loc, _ := url.Parse(w.Header().Get("Location"))
		time.Sleep(1100 * time.Millisecond)
		if _, err := app.cfg.Exchange(context.Background(), loc.Query().Get("code"), oauth2.VerifierOption(verifier)); oauthCode(err) != "invalid_grant" {
			t.Fatalf("expired code: %v", err)
		}
	})
}

// A person's tokens die with their session, and with the person.
func TestTokensDieWithSessionAndPerson(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := newSigninServer(t, dbURL, nil)
		app := s.addApp(t, persistence.AppConfidential, oauth.AlgES256, "jwt")
		refresh := func(tok *oauth2.Token) string {
			_, out := s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}})
			e, _ := out["error"].(string)
			return e
		}

		// The session ends.
		who := s.signedIn(t)
		tok, _ := s.codeFlow(t, app, who, "openid", "offline_access")
		if _, err := s.provider.Authenticate(ctx, tok.AccessToken); err != nil {
			t.Fatal(err)
		}
		if err := s.store.EndSSOSession(ctx, who.SessionID, persistence.AuthEvent{Reason: persistence.SessionEndAdmin}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.provider.Authenticate(ctx, tok.AccessToken); err == nil {
			t.Fatal("an access token outlived its session")
		}
		if e := refresh(tok); e != "invalid_grant" {
			t.Fatalf("refresh after the session ended: %q", e)
		}

		// The person is disabled, then deleted.
		who = s.signedIn(t)
		tok, _ = s.codeFlow(t, app, who, "openid", "offline_access")
		if _, err := s.store.UpdateUser(ctx, s.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.Status = "disabled"
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if e := refresh(tok); e != "invalid_grant" {
			t.Fatalf("refresh of a disabled person: %q", e)
		}
		if err := s.store.DeleteUser(ctx, s.user.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.provider.Authenticate(ctx, tok.AccessToken); err == nil {
			t.Fatal("an access token outlived its person")
		}
		if e := refresh(tok); e != "invalid_grant" {
			t.Fatalf("refresh after the person was deleted: %q", e)
		}
	})
}

// getJSON sends a request and decodes its JSON answer.
func getJSON(t testing.TB, req *http.Request) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

func TestUserinfo(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := newSigninServer(t, dbURL, nil)
		app := s.addApp(t, persistence.AppConfidential, oauth.AlgRS256, "opaque")
		if err := s.store.CreateRole(ctx, &persistence.Role{Name: "editor", CreatedAt: extensions.Now()}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.store.AssignRole(ctx, s.user.ID, "editor", extensions.Now()); err != nil {
			t.Fatal(err)
		}
		who := s.signedIn(t)
		tok, _ := s.codeFlow(t, app, who, "openid", "email", "profile", "roles")
		get := func(token string) (*http.Response, map[string]any) {
			req, _ := http.NewRequest(http.MethodGet, s.URL+oauth.UserinfoPath, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			return getJSON(t, req)
		}
		resp, claims := get(tok.AccessToken)
		if resp.StatusCode != http.StatusOK || claims["sub"] != s.user.ID || claims["email"] != s.user.Email || claims["name"] != "Ada" ||
			claims["email_verified"] != false || len(claims["roles"].([]any)) != 1 || claims["roles"].([]any)[0] != "editor" {
			t.Fatalf("userinfo: %d %v", resp.StatusCode, claims)
		}
		// POST with the token in the form; the directory read now.
		if _, err := s.store.UpdateUser(ctx, s.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.Name = "Ada Lovelace"
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, s.URL+oauth.UserinfoPath, strings.NewReader(url.Values{"access_token": {tok.AccessToken}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if resp, claims := getJSON(t, req); resp.StatusCode != http.StatusOK || claims["name"] != "Ada Lovelace" {
			t.Fatalf("userinfo by POST: %d %v", resp.StatusCode, claims)
		}
		// Scopes release claims: email only.
		narrow, _ := s.codeFlow(t, app, who, "openid", "email")
		if _, claims := get(narrow.AccessToken); claims["email"] != s.user.Email || claims["name"] != nil || claims["roles"] != nil {
			t.Fatalf("email scope only: %v", claims)
		}

		// Refusals, with RFC 6750 challenges.
		challenge := func(resp *http.Response, status int, want string) {
			t.Helper()
			if resp.StatusCode != status || !strings.Contains(resp.Header.Get("WWW-Authenticate"), want) {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), status, want)
			}
		}
		resp, _ = get("")
		challenge(resp, http.StatusUnauthorized, `Bearer realm="identityd"`)
		resp, _ = get("not-a-token")
		challenge(resp, http.StatusUnauthorized, `error="invalid_token"`)
		noOpenID, _ := s.codeFlow(t, app, who, "email")
		resp, _ = get(noOpenID.AccessToken)
		challenge(resp, http.StatusForbidden, `error="insufficient_scope"`)
		machine := s.adminToken(t)
		resp, _ = get(machine)
		challenge(resp, http.StatusUnauthorized, `error="invalid_token"`)
		if _, err := s.store.UpdateUser(ctx, s.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.Status = "disabled"
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		resp, _ = get(tok.AccessToken)
		challenge(resp, http.StatusUnauthorized, `error="invalid_token"`)
	})
}

// adminToken is a client-credentials token of the bootstrap admin.
func (s *signinServer) adminToken(t testing.TB) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL+oauth.TokenPath, strings.NewReader("grant_type=client_credentials"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("admin-test", "an admin secret of thirty-two characters")
	resp, out := getJSON(t, req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin token: %d %v", resp.StatusCode, out)
	}
	return out["access_token"].(string)
}

func TestJWTAccessTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		for _, alg := range []string{oauth.AlgES256, oauth.AlgRS256} {
			t.Run(alg, func(t *testing.T) {
				ctx := context.Background()
				s := newSigninServer(t, dbURL, nil)
				app := s.addApp(t, persistence.AppConfidential, alg, oauth.FormatJWT)
				who := s.signedIn(t)
				tok, _ := s.codeFlow(t, app, who, "openid", "email")
				jws, err := jose.ParseSigned(tok.AccessToken, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(alg)})
				if err != nil {
					t.Fatalf("not a %s JWS: %v", alg, err)
				}
				h := jws.Signatures[0].Header
				if h.ExtraHeaders["typ"] != "at+jwt" {
					t.Fatalf("typ %v", h.ExtraHeaders["typ"])
				}
				set := s.provider.Keys.PublicJWKS()
				keys := set.Key(h.KeyID)
				if len(keys) != 1 {
					t.Fatalf("kid %q not published", h.KeyID)
				}
				payload, err := jws.Verify(keys[0].Key)
				if err != nil {
					t.Fatal(err)
				}
				var c map[string]any
				_ = json.Unmarshal(payload, &c)
				for _, name := range []string{"iss", "exp", "aud", "sub", "client_id", "iat", "jti", "scope", "sid"} {
					if c[name] == nil {
						t.Fatalf("no %s: %v", name, c)
					}
				}
				if c["iss"] != s.URL || c["sub"] != s.user.ID || c["client_id"] != app.id || c["scope"] != "openid email" || c["sid"] != who.SessionID {
					t.Fatalf("claims %v", c)
				}
				if pr, err := s.provider.Authenticate(ctx, tok.AccessToken); err != nil || pr.Subject != s.user.ID {
					t.Fatalf("Authenticate: %+v %v", pr, err)
				}
				// A payload altered under the same signature is refused.
				parts := strings.Split(tok.AccessToken, ".")
				c["scope"] = "openid email roles"
				forged, _ := json.Marshal(c)
				if _, err := s.provider.Authenticate(ctx, parts[0]+"."+base64URL(forged)+"."+parts[2]); err == nil {
					t.Fatal("a forged payload was accepted")
				}
				// Revoked: refused at once.
				req, _ := http.NewRequest(http.MethodPost, s.URL+oauth.RevokePath, strings.NewReader(url.Values{"token": {tok.AccessToken}}.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.SetBasicAuth(app.id, app.secret)
				if resp, out := getJSON(t, req); resp.StatusCode != http.StatusOK {
					t.Fatalf("revoke: %d %v", resp.StatusCode, out)
				}
				if _, err := s.provider.Authenticate(ctx, tok.AccessToken); err == nil {
					t.Fatal("a revoked JWT access token was accepted")
				}
			})
		}
	})
}

func base64URL(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func TestOpenIDDiscovery(t *testing.T) {
	s := newSigninServer(t, dbtest.URLs(t)["sqlite"], nil)
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/.well-known/openid-configuration", nil)
	_, md := getJSON(t, req)
	want := map[string]any{
		"authorization_endpoint": s.URL + oauth.AuthorizePath, "userinfo_endpoint": s.URL + oauth.UserinfoPath,
		"end_session_endpoint": s.URL + oauth.EndSessionPath, "authorization_response_iss_parameter_supported": true,
	}
	for k, v := range want {
		if md[k] != v {
			t.Fatalf("%s: %v, want %v", k, md[k], v)
		}
	}
	has := func(field string, values ...string) {
		t.Helper()
		list, _ := md[field].([]any)
		for _, v := range values {
			if !slices.Contains(list, any(v)) {
				t.Fatalf("%s lacks %s: %v", field, v, list)
			}
		}
	}
	has("response_types_supported", "code")
	has("response_modes_supported", "query", "form_post")
	has("grant_types_supported", "authorization_code", "refresh_token", "client_credentials")
	has("code_challenge_methods_supported", "S256")
	has("id_token_signing_alg_values_supported", "RS256", "ES256")
	has("subject_types_supported", "public")
	has("scopes_supported", "openid", "profile", "email", "offline_access", "roles")
	has("claims_supported", "sub", "email", "email_verified", "name", "roles", "sid", "auth_time", "nonce", "at_hash", "amr", "acr")
	has("token_endpoint_auth_methods_supported", "client_secret_basic", "client_secret_post", "none")
	if len(md["code_challenge_methods_supported"].([]any)) != 1 || len(md["response_types_supported"].([]any)) != 1 {
		t.Fatalf("more than S256 or code: %v", md)
	}
}

// Concurrent code flows and refreshes on one store all succeed.
func TestConcurrentFlows(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newSigninServer(t, dbURL, nil)
		app := s.addApp(t, persistence.AppConfidential, oauth.AlgES256, "opaque")
		who := s.signedIn(t)
		errs := make(chan error, 32)
		for range 32 {
			go func() {
				errs <- func() error {
					verifier := oauth2.GenerateVerifier()
					ar, err := s.provider.NewAuthorizeRequest(context.Background(), httptest.NewRequest(http.MethodGet,
						app.cfg.AuthCodeURL("state-0123456789", oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("scope", "openid offline_access")), nil))
					if err != nil {
						return err
					}
					w := httptest.NewRecorder()
					s.provider.AuthorizeCode(context.Background(), w, ar, who)
					loc, _ := url.Parse(w.Header().Get("Location"))
					if loc.Query().Get("code") == "" {
						return errors.New("authorization: " + loc.String())
					}
					tok, err := app.cfg.Exchange(context.Background(), loc.Query().Get("code"), oauth2.VerifierOption(verifier))
					if err != nil {
						return err
					}
					for range 5 {
						tok.Expiry = time.Now().Add(-time.Minute)
						if tok, err = app.cfg.TokenSource(context.Background(), tok).Token(); err != nil {
							return err
						}
					}
					return nil
				}()
			}()
		}
		for range 32 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A retired key stays published as long as the longest JWT access token an
// application may hold, not only the server's token lifetime.
func TestKeyWindowFollowsJWTApplications(t *testing.T) {
	ctx := context.Background()
	s := newSigninServer(t, dbtest.URLs(t)["sqlite"], nil)
	app := s.addApp(t, persistence.AppConfidential, oauth.AlgES256, oauth.FormatJWT)
	ttl := 7200
	if _, err := s.store.UpdateApplication(ctx, mustAppID(t, s, app.id), func(a *persistence.Application) error {
		a.AccessTokenTTL = &ttl
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.provider.Keys.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := s.provider.Keys.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range list {
		if k.State == oauth.KeyRetired {
			if got := k.PublishedUntil.Sub(*k.RetiredAt); got != 2*time.Hour+oauth.KeyReload {
				t.Fatalf("retired key published %s, want 2h and the reload interval", got)
			}
			return
		}
	}
	t.Fatal("no retired key")
}

func mustAppID(t testing.TB, s *signinServer, clientID string) string {
	t.Helper()
	a, err := s.store.GetApplicationByClientID(context.Background(), clientID)
	if err != nil {
		t.Fatal(err)
	}
	return a.ID
}
