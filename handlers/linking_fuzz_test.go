package handlers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// The linking routes' JSON (initiate and verify) on a real store of each
// dialect: no input is a 5xx, every refusal is the envelope, an answer is
// initiate's or verify's shape, and both dialects answer every input
// alike (same status and code).
func FuzzLinkBodies(f *testing.F) {
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	for _, body := range []string{
		`{"email":"fuzz@example.com","newProvider":"otp","clientId":"app_fuzz"}`,
		`{"email":"fuzz@example.com","newProvider":"magic_link","clientId":"app_fuzz"}`,
		`{"email":"fuzz@example.com","newProvider":"acme-sso","clientId":"app_fuzz","pendingLink":"x"}`,
		`{"email":"fuzz@example.com","newProvider":"password","clientId":"app_fuzz"}`,
		`{"email":"nobody@example.com","newProvider":"otp","clientId":"app_fuzz"}`,
		`{"email":"fuzz@example.com","newProvider":"otp","clientId":"app_none"}`,
		`{"linkingToken":"` + strings.Repeat("A", 43) + `","verification":{"password":"p"}}`,
		`{"linkingToken":"t","verification":{"code":"123456"}}`, `{"linkingToken":"t","verification":{"code":"1","password":"p"}}`,
		`{"linkingToken":"t","verification":{}}`, `{"linkingToken":"t","verification":null}`, `{"linkingToken":"t","verification":"p"}`,
		`{"linkingToken":"` + strings.Repeat("x", 5000) + `","verification":{"code":"1"}}`,
		`{"email":"\u0000","newProvider":"otp","clientId":"app_fuzz"}`, "{\"email\":\"\xff\"}", `{"newProvider":` + deep + `}`,
		`{"unknown":1}`, `{} {}`, ``, `null`, `[]`, `{"email":1e999999}`,
	} {
		for route := range 2 {
			f.Add(uint8(route), []byte(body))
		}
	}
	urls := dbtest.URLs(f)
	var servers []*signinServer
	for _, dialect := range []string{"sqlite", "postgres"} {
		if dbURL, ok := urls[dialect]; ok {
			s := newSigninServer(f, dbURL, nil)
			// The same person and application on both: the same input is
			// the same request.
			ctx, n := context.Background(), extensions.Now()
			if err := s.store.CreateApplication(ctx, &persistence.Application{ID: uuid.NewString(), ClientID: "app_fuzz", Name: "Fuzz",
				Type: persistence.AppPublic, RedirectURIs: persistence.StringList{testRedirect}, SignInMethods: persistence.StringList{"password", "otp"},
				MFA: persistence.JSONObject{}, AccessTokenFormat: "opaque", IDTokenSigningAlg: "RS256", CreatedAt: n, UpdatedAt: n}); err != nil {
				f.Fatal(err)
			}
			if err := s.store.CreateUser(ctx, &persistence.User{ID: uuid.NewString(), Email: "fuzz@example.com", Status: directory.StatusActive,
				Metadata: persistence.JSONObject{}, PasswordHash: s.user.PasswordHash, CreatedAt: n, UpdatedAt: n}); err != nil {
				f.Fatal(err)
			}
			go func() {
				for range s.mails { // the codes of the fuzzer's initiates
				}
			}()
			servers = append(servers, s)
		}
	}
	paths := []string{LinkingPath, linkVerifyPath}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		path := paths[int(route)%len(paths)]
		var first string
		for _, s := range servers {
			in := string(body)
			req, _ := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(in))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				t.Fatalf("%s %q: %d %s", path, in, resp.StatusCode, raw)
			}
			var out map[string]any
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("%s %q: not JSON: %s", path, in, raw)
			}
			switch {
			case resp.StatusCode >= 400:
				if _, ok := out["details"].(map[string]any); !ok || out["error"] == nil || out["message"] == nil {
					t.Fatalf("%s %q: error shape %s", path, in, raw)
				}
			case path == LinkingPath:
				if out["linkingToken"] == nil || out["verificationRequired"] == nil {
					t.Fatalf("%q: %s", in, raw)
				}
			default:
				t.Fatalf("verified without a token: %q: %s", in, raw)
			}
			answer := resp.Status + " " + toJSON(out["error"])
			if first == "" {
				first = answer
			} else if answer != first {
				t.Fatalf("%s %q: the dialects differ: %s and %s", path, in, first, answer)
			}
		}
	})
}
