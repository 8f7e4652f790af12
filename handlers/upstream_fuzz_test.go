package handlers

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// The identity providers' admin JSON (create and PATCH) driven through the
// real routes on a real store of each dialect, with a real OpenID Connect
// issuer to discover ({issuer} in an input) and a real application
// ({app}): no input is a 5xx, every refusal is the envelope, and both
// dialects answer every input alike.
func FuzzIdentityProviderBodies(f *testing.F) {
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	for _, body := range []string{
		`{"name":"acme-sso","displayName":"Acme SSO","issuer":"{issuer}","clientId":"c","clientSecret":"s","applications":["{app}"]}`,
		`{"name":"google","displayName":"Google","issuer":"{issuer}","clientId":"c","clientSecret":"s","scopes":["openid","email"]}`,
		`{"displayName":"Renamed","scopes":["openid"],"applications":[]}`,
		`{"issuer":"{issuer}/"}`, `{"issuer":"https://127.0.0.1:1"}`, `{"issuer":"http://example.com"}`, `{"issuer":"{issuer}?q=1"}`,
		`{"name":"password","displayName":"x","issuer":"{issuer}","clientId":"c","clientSecret":"s"}`,
		`{"name":"a b"}`, `{"name":""}`, `{"name":"` + strings.Repeat("a", 65) + `"}`, `{"name":"\u0000"}`,
		`{"displayName":"\u0000"}`, "{\"displayName\":\"\xff\"}", `{"clientSecret":""}`,
		`{"scopes":["openid","a b"]}`, `{"scopes":"openid"}`, `{"scopes":[1]}`, `{"scopes":null}`,
		`{"applications":["app_nope"]}`, `{"applications":[null]}`, `{"applications":` + deep + `}`,
		`{"unknown":1}`, `{} {}`, ``, `null`, `[]`, `{"name":"a","name":"b"}`, `{"name":1e999999}`,
	} {
		for route := range 2 {
			f.Add(uint8(route), []byte(body))
		}
	}
	urls := dbtest.URLs(f)
	type side struct {
		dialect string
		rp, op  *signinServer
		token   string
		id      string
	}
	var sides []*side
	for _, dialect := range []string{"sqlite", "postgres"} {
		dbURL, ok := urls[dialect]
		if !ok {
			continue
		}
		s := &side{dialect: dialect, rp: newSigninServer(f, dbURL, nil), op: newSigninServer(f, dbtest.Like(f, dbURL), nil)}
		s.token = s.rp.adminToken(f)
		n := extensions.Now()
		p := &persistence.IdentityProvider{ID: uuid.NewString(), Name: "fixed", DisplayName: "Fixed", Issuer: s.op.URL, ClientID: "c",
			ClientSecretSealed: []byte("x"), Scopes: []string{"openid"}, Applications: []string{}, CreatedAt: n, UpdatedAt: n}
		if err := s.rp.store.CreateIdentityProvider(context.Background(), p); err != nil {
			f.Fatal(err)
		}
		s.id = p.ID
		sides = append(sides, s)
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		var first *httptest.ResponseRecorder
		for _, s := range sides {
			in := strings.NewReplacer("{issuer}", s.op.URL, "{app}", s.rp.app).Replace(string(body))
			method, path := http.MethodPost, identityProvidersPath
			if route%2 == 1 {
				method, path = http.MethodPatch, identityProvidersPath+"/"+s.id
			}
			req, _ := http.NewRequest(method, s.rp.URL+path, bytes.NewReader([]byte(in)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+s.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			rec.Code = resp.StatusCode
			_, _ = rec.Body.ReadFrom(resp.Body)
			resp.Body.Close()
			if rec.Code >= 500 {
				t.Fatalf("%s %.200q on %s: %d %s", method, in, s.dialect, rec.Code, rec.Body)
			}
			if rec.Code >= 400 {
				checkErrorShape(t, false, rec)
			}
			if rec.Code < 300 && strings.Contains(rec.Body.String(), "clientSecret") {
				t.Fatalf("the secret's member in an answer: %s", rec.Body)
			}
			if first == nil {
				first = rec
			} else if rec.Code != first.Code {
				t.Fatalf("%s %.200q: %s answered %d %s, %s %d %s", method, body, s.dialect, rec.Code, rec.Body, sides[0].dialect, first.Code, first.Body)
			}
		}
	})
}
