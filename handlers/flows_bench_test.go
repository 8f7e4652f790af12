package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Benchmarks of people's flows, in process over real HTTP and a real store
// (SQLite always, PostgreSQL with TEST_DATABASE_URL): complete code flows
// with a live SSO session (authorize, code, token exchange with PKCE, ID
// token), refresh grants, and JWT access tokens. Run with
// go test -run '^$' -bench Flows -benchtime 5s ./handlers/ ; each reports
// operations per second across all goroutines (-cpu sets them).

// benchParallelism: goroutines per CPU, as many clients as a server sees.
const benchParallelism = 16

func benchDialects(b *testing.B, fn func(b *testing.B, dbURL string)) {
	urls := dbtest.URLs(b)
	names := make([]string, 0, len(urls))
	for name := range urls {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.Run(name, func(b *testing.B) { fn(b, dbtest.Like(b, urls[name])) })
	}
}

// benchClient is an HTTP client with enough idle connections for parallel
// benchmarks.
func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
}

// tokenRequest posts a form to the token endpoint as app.
func benchToken(b *testing.B, c *http.Client, s *signinServer, app *flowApp, form url.Values) map[string]any {
	req, _ := http.NewRequest(http.MethodPost, s.URL+oauth.TokenPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(app.id, app.secret)
	resp, err := c.Do(req)
	if err != nil {
		b.Error(err)
		return nil
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		b.Errorf("token endpoint: %d %v %v", resp.StatusCode, out, err)
		return nil
	}
	return out
}

func BenchmarkFlowsCode(b *testing.B) {
	for _, alg := range []string{oauth.AlgRS256, oauth.AlgES256} {
		b.Run(alg, func(b *testing.B) {
			benchDialects(b, func(b *testing.B, dbURL string) {
				s := newSigninServer(b, dbURL, nil)
				app := s.addApp(b, persistence.AppConfidential, alg, "opaque")
				who := s.signedIn(b)
				c := benchClient()
				verifier := oauth2.GenerateVerifier()
				authURL := app.cfg.AuthCodeURL("state-0123456789", oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("nonce", "nonce-0123456789"),
					oauth2.SetAuthURLParam("scope", "openid email profile"))
				ctx := context.Background()
				b.SetParallelism(benchParallelism)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						ar, err := s.provider.NewAuthorizeRequest(ctx, httptest.NewRequest(http.MethodGet, authURL, nil))
						if err != nil {
							b.Error(err)
							return
						}
						w := httptest.NewRecorder()
						s.provider.AuthorizeCode(ctx, w, ar, who)
						loc, _ := url.Parse(w.Header().Get("Location"))
						out := benchToken(b, c, s, app, url.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")},
							"redirect_uri": {testRedirect}, "code_verifier": {verifier}})
						if out["id_token"] == nil {
							b.Error("no ID token")
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "flows/s")
			})
		})
	}
}

// refreshBench runs refresh grants, each goroutine along its own chain of
// rotated tokens, for an application of alg and format with scope.
func refreshBench(b *testing.B, alg, format, scope, unit string) {
	benchDialects(b, func(b *testing.B, dbURL string) {
		s := newSigninServer(b, dbURL, nil)
		app := s.addApp(b, persistence.AppConfidential, alg, format)
		who := s.signedIn(b)
		c := benchClient()
		b.SetParallelism(benchParallelism)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			tok, _ := s.codeFlow(b, app, who, strings.Fields(scope)...)
			refresh := tok.RefreshToken
			for pb.Next() {
				out := benchToken(b, c, s, app, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}})
				if out == nil {
					return
				}
				refresh = out["refresh_token"].(string)
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	})
}

func BenchmarkFlowsRefresh(b *testing.B) {
	refreshBench(b, oauth.AlgES256, "opaque", "openid offline_access", "refreshes/s")
}

// JWT access tokens: refresh grants of an ES256 JWT application without
// openid, so that each issues one JWT access token (and a refresh token)
// and no ID token.
func BenchmarkFlowsJWTAccessTokens(b *testing.B) {
	refreshBench(b, oauth.AlgES256, oauth.FormatJWT, "email offline_access", "tokens/s")
}
