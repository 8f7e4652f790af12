package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// call sends a JSON request with a bearer token and answers the status and
// the decoded body.
func (s *signinServer) call(t testing.TB, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(method, s.URL+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, out := getJSON(t, req)
	return resp.StatusCode, out
}

// registerApp registers an application through the API, as an admin would,
// and answers it ready for codeFlow.
func (s *signinServer) registerApp(t testing.TB, admin string, body map[string]any) (*flowApp, string) {
	t.Helper()
	status, out := s.call(t, http.MethodPost, "/api/v1/applications", admin, body)
	if status != http.StatusCreated {
		t.Fatalf("register: %d %v", status, out)
	}
	fa := &flowApp{id: out["clientId"].(string)}
	fa.secret, _ = out["clientSecret"].(string)
	style := oauth2.AuthStyleInParams
	if fa.secret != "" {
		style = oauth2.AuthStyleInHeader
	}
	fa.cfg = &oauth2.Config{ClientID: fa.id, ClientSecret: fa.secret, RedirectURL: testRedirect,
		Endpoint: oauth2.Endpoint{AuthURL: s.URL + oauth.AuthorizePath, TokenURL: s.URL + oauth.TokenPath, AuthStyle: style}}
	return fa, "/api/v1/applications/" + out["id"].(string)
}

// What an admin does to an application reaches the tokens a person already
// holds through it, at the next call: adminConsole turned off takes the
// power of console administration from them, a rotation ends the old
// secret but not the tokens, and a deletion ends the tokens (opaque and
// JWT access tokens, refresh tokens) at once.
func TestApplicationChangesReachTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := newSigninServer(t, dbURL, nil)
		admin := s.adminToken(t)
		if _, err := s.store.UpdateUser(ctx, s.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.ConsoleAdmin = true
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ typ, format string }{
			{persistence.AppConfidential, "opaque"}, {persistence.AppConfidential, "jwt"}, {persistence.AppPublic, "jwt"},
		} {
			t.Run(c.typ+"/"+c.format, func(t *testing.T) {
				app, path := s.registerApp(t, admin, map[string]any{"name": "Console", "type": c.typ, "redirectUris": []string{testRedirect},
					"accessTokenFormat": c.format, "adminConsole": true})
				tok, _ := s.codeFlow(t, app, s.signedIn(t), "openid", "offline_access")
				asAdmin := func() int {
					status, _ := s.call(t, http.MethodGet, "/api/v1/applications", tok.AccessToken, nil)
					return status
				}
				userinfo := func() int {
					status, _ := s.call(t, http.MethodGet, oauth.UserinfoPath, tok.AccessToken, nil)
					return status
				}
				refresh := func() (int, map[string]any) {
					return s.postToken(t, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}})
				}
				patch := func(body map[string]any) {
					if status, out := s.call(t, http.MethodPatch, path, admin, body); status != http.StatusOK {
						t.Fatalf("patch %v: %d %v", body, status, out)
					}
				}
				if got := asAdmin(); got != http.StatusOK {
					t.Fatalf("an admin through an adminConsole application: %d", got)
				}
				patch(map[string]any{"adminConsole": false})
				if got := asAdmin(); got != http.StatusForbidden {
					t.Fatalf("adminConsole off, the person's token still acts as admin: %d", got)
				}
				patch(map[string]any{"adminConsole": true})
				if got := asAdmin(); got != http.StatusOK {
					t.Fatalf("adminConsole on again: %d", got)
				}

				if c.typ == persistence.AppConfidential {
					status, out := s.call(t, http.MethodPost, path+"/rotate", admin, nil)
					if status != http.StatusOK {
						t.Fatalf("rotate: %d %v", status, out)
					}
					old := app.secret
					app.secret = out["clientSecret"].(string)
					if got := userinfo(); got != http.StatusOK {
						t.Fatalf("a rotation ended an access token: %d", got)
					}
					app.secret = old
					if status, out := refresh(); status != http.StatusUnauthorized || out["error"] != "invalid_client" {
						t.Fatalf("refresh with the old secret: %d %v", status, out)
					}
					app.secret = out["clientSecret"].(string)
				}
				status, out := refresh()
				if status != http.StatusOK {
					t.Fatalf("refresh: %d %v", status, out)
				}
				tok.AccessToken, tok.RefreshToken = out["access_token"].(string), out["refresh_token"].(string)

				if status, out := s.call(t, http.MethodDelete, path, admin, nil); status != http.StatusNoContent {
					t.Fatalf("delete: %d %v", status, out)
				}
				if got := userinfo(); got != http.StatusUnauthorized {
					t.Fatalf("userinfo with a deleted application's token: %d", got)
				}
				if got := asAdmin(); got != http.StatusUnauthorized {
					t.Fatalf("the API with a deleted application's token: %d", got)
				}
				if _, err := s.provider.Authenticate(ctx, tok.AccessToken); err == nil {
					t.Fatal("a deleted application's access token authenticates")
				}
				if status, out := refresh(); status != http.StatusUnauthorized || out["error"] != "invalid_client" {
					t.Fatalf("refresh of a deleted application: %d %v", status, out)
				}
			})
		}
	})
}
