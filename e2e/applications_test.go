package e2e

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

const appsPath = "/api/v1/applications"

// registerApp registers an application through the API and answers its
// client id and secret ("" for a public one).
func (s *server) registerApp(t *testing.T, admin string, body map[string]any) (string, string) {
	t.Helper()
	r := s.do(http.MethodPost, "/api/v1/applications", body, bearer(admin)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("register application: %s", describe(r))
	}
	out := r.JSON(t)
	secret, _ := out["clientSecret"].(string)
	return out["clientId"].(string), secret
}

// authenticates tells whether id and secret authenticate at the token
// endpoint: an application may not use client credentials, so a known
// client with the right secret is refused with unauthorized_client (400),
// a wrong secret with invalid_client (401).
func (s *server) authenticates(t *testing.T, id, secret string) bool {
	t.Helper()
	r := s.do(http.MethodPost, "/api/v1/oauth/token", url.Values{"grant_type": {"client_credentials"}, "client_id": {id}, "client_secret": {secret}})
	switch r.Status {
	case http.StatusBadRequest:
		return true
	case http.StatusUnauthorized:
		return false
	}
	t.Fatalf("token endpoint: %s", describe(r))
	return false
}

// The applications API with an admin token: every operation, defaults,
// rotation, and bad input.
func TestApplicationsAPI(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		auth := bearer(s.adminToken())

		r := s.do(http.MethodPost, appsPath, map[string]any{"name": "Acme Notes", "redirectUris": []string{"https://notes.example.com/cb"}}, auth...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create: %s", describe(r))
		}
		web := r.JSON(t)
		exactKeys(t, web, "id", "clientId", "clientSecret", "name", "type", "redirectUris", "postLogoutRedirectUris", "webOrigins", "rpId",
			"signInMethods", "mfa", "accessTokenFormat", "idTokenSigningAlg", "accessTokenTtl", "refreshTokenTtl", "adminConsole", "createdAt", "updatedAt")
		id, clientID, secret := web["id"].(string), web["clientId"].(string), web["clientSecret"].(string)
		if clientID[:4] != "app_" || len(secret) < 43 || web["type"] != "confidential" || web["rpId"] != "notes.example.com" ||
			web["accessTokenFormat"] != "opaque" || web["idTokenSigningAlg"] != "RS256" || web["accessTokenTtl"] != nil ||
			len(web["signInMethods"].([]any)) != 3 || web["mfa"].(map[string]any)["policy"] != "off" {
			t.Fatalf("defaults: %v", web)
		}
		if r.Header.Get("Location") != appsPath+"/"+id {
			t.Fatalf("Location %q", r.Header.Get("Location"))
		}
		if !s.authenticates(t, clientID, secret) || s.authenticates(t, clientID, secret+"x") {
			t.Fatal("the application's secret does not authenticate it (or a wrong one does)")
		}

		r = s.do(http.MethodPost, appsPath, map[string]any{"name": "Acme Mobile", "type": "public", "redirectUris": []string{"com.example.notes:/cb"},
			"idTokenSigningAlg": "ES256", "accessTokenFormat": "jwt", "accessTokenTtl": 600}, auth...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create public: %s", describe(r))
		}
		mobile := r.JSON(t)
		if _, has := mobile["clientSecret"]; has || mobile["rpId"] != "" || mobile["accessTokenTtl"] != float64(600) {
			t.Fatalf("public: %v", mobile)
		}

		r = s.do(http.MethodGet, appsPath+"?limit=1", nil, auth...)
		if l := r.JSON(t); r.Status != http.StatusOK || l["total"] != float64(2) || len(l["applications"].([]any)) != 1 {
			t.Fatalf("list: %s", describe(r))
		}
		r = s.do(http.MethodGet, appsPath+"/"+id, nil, auth...)
		if _, has := r.JSON(t)["clientSecret"]; r.Status != http.StatusOK || has {
			t.Fatalf("get: %s", describe(r))
		}

		r = s.do(http.MethodPatch, appsPath+"/"+mobile["id"].(string), map[string]any{"name": "Acme App", "accessTokenTtl": nil, "adminConsole": true}, auth...)
		if m := r.JSON(t); r.Status != http.StatusOK || m["name"] != "Acme App" || m["accessTokenTtl"] != nil || m["adminConsole"] != true || m["idTokenSigningAlg"] != "ES256" {
			t.Fatalf("patch: %s", describe(r))
		}
		if r := s.do(http.MethodPatch, appsPath+"/"+id, map[string]any{"type": "public"}, auth...); r.Status != http.StatusBadRequest {
			t.Fatalf("type change: %s", describe(r))
		}
		if r := s.do(http.MethodPost, appsPath+"/"+mobile["id"].(string)+"/rotate", nil, auth...); r.Status != http.StatusConflict || r.JSON(t)["error"] != "no_secret" {
			t.Fatalf("rotate a public application: %s", describe(r))
		}

		r = s.do(http.MethodPost, appsPath+"/"+id+"/rotate", nil, auth...)
		if r.Status != http.StatusOK {
			t.Fatalf("rotate: %s", describe(r))
		}
		fresh := r.JSON(t)["clientSecret"].(string)
		if s.authenticates(t, clientID, secret) || !s.authenticates(t, clientID, fresh) {
			t.Fatal("after rotation the old secret must fail at once and the new one work")
		}

		for name, body := range map[string]any{
			"no name":          map[string]any{"redirectUris": []string{"https://a.example.com/cb"}},
			"no redirect":      map[string]any{"name": "x"},
			"http redirect":    map[string]any{"name": "x", "redirectUris": []string{"http://a.example.com/cb"}},
			"NUL in name":      map[string]any{"name": "a\x00b", "redirectUris": []string{"https://a.example.com/cb"}},
			"unknown field":    map[string]any{"name": "x", "redirectUris": []string{"https://a.example.com/cb"}, "grantTypes": []string{"implicit"}},
			"wrong type":       map[string]any{"name": "x", "redirectUris": "https://a.example.com/cb"},
			"fraction ttl":     map[string]any{"name": "x", "redirectUris": []string{"https://a.example.com/cb"}, "accessTokenTtl": 60.5},
			"bad method":       map[string]any{"name": "x", "redirectUris": []string{"https://a.example.com/cb"}, "signInMethods": []string{"sms"}},
			"invalid UTF-8":    "{\"name\":\"\xff\",\"redirectUris\":[\"https://a.example.com/cb\"]}",
			"custom scheme on": map[string]any{"name": "x", "redirectUris": []string{"com.example.app:/cb"}},
		} {
			if r := s.do(http.MethodPost, appsPath, body, append(auth, "Content-Type", "application/json")...); r.Status != http.StatusBadRequest || r.JSON(t)["error"] == nil {
				t.Errorf("%s: %s", name, describe(r))
			}
		}
		other := s.createAccount(s.adminToken(), map[string]any{"name": "reader", "scopes": []string{"users:read"}})
		if r := s.do(http.MethodGet, appsPath, nil, bearer(s.token(other.ClientID, other.ClientSecret, ""))...); r.Status != http.StatusForbidden {
			t.Fatalf("without admin: %s", describe(r))
		}

		if r := s.do(http.MethodDelete, appsPath+"/"+id, nil, auth...); r.Status != http.StatusNoContent {
			t.Fatalf("delete: %s", describe(r))
		}
		if r := s.do(http.MethodGet, appsPath+"/"+id, nil, auth...); r.Status != http.StatusNotFound {
			t.Fatalf("get after delete: %s", describe(r))
		}
		if s.authenticates(t, clientID, fresh) {
			t.Fatal("a deleted application still authenticates")
		}
	})
}
