package e2e

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// GET /health answers the spec's body while the database answers.
func TestHealth(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		r := s.do(http.MethodGet, "/health", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("health: %s", describe(r))
		}
		m := r.JSON(t)
		exactKeys(t, m, "status", "version", "checks")
		if m["status"] != "ok" || m["version"] != "v1" {
			t.Fatalf("health: %s", r.Body)
		}
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("Content-Type %q", ct)
		}
		// No token needed; other methods are refused.
		expectError(t, s.do(http.MethodPost, "/health", nil), http.StatusMethodNotAllowed, "method_not_allowed")
	})
}

// /metrics: request counts and latency by route template, and tokens issued.
func TestMetrics(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"])
	admin := s.adminToken()
	a := s.createAccount(admin, map[string]any{"name": "metered", "scopes": []string{"users:read"}})
	for range 2 {
		if r := s.do(http.MethodGet, saPath+"/"+a.ID, nil, bearer(admin)...); r.Status != http.StatusOK {
			t.Fatal(describe(r))
		}
	}
	missing := uuid.NewString()
	s.do(http.MethodGet, saPath+"/"+missing, nil, bearer(admin)...)
	for range 3 {
		s.token(a.ClientID, a.ClientSecret, "")
	}
	s.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, "wrong")...)
	s.do(http.MethodGet, "/no/such/path-xyzzy", nil)

	samples, text := s.scrape(t)
	for _, typ := range []string{
		"# TYPE identityd_http_requests_total counter",
		"# TYPE identityd_http_request_duration_seconds histogram",
		"# TYPE identityd_tokens_issued_total counter",
	} {
		if !strings.Contains(text, typ) {
			t.Errorf("/metrics lacks %q", typ)
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"identityd_http_requests_total", map[string]string{"route": "/api/v1/service-accounts/{id}", "method": "GET", "status": "200"}, 2},
		{"identityd_http_requests_total", map[string]string{"route": "/api/v1/service-accounts/{id}", "method": "GET", "status": "404"}, 1},
		{"identityd_http_requests_total", map[string]string{"route": "/api/v1/service-accounts", "method": "POST", "status": "201"}, 1},
		{"identityd_http_requests_total", map[string]string{"route": "/api/v1/oauth/token", "method": "POST", "status": "200"}, 4},
		{"identityd_http_requests_total", map[string]string{"route": "/api/v1/oauth/token", "method": "POST", "status": "401"}, 1},
		{"identityd_http_request_duration_seconds_count", map[string]string{"route": "/api/v1/service-accounts/{id}", "method": "GET"}, 3},
		{"identityd_http_request_duration_seconds_bucket", map[string]string{"route": "/api/v1/service-accounts/{id}", "method": "GET", "le": "+Inf"}, 3},
		{"identityd_tokens_issued_total", map[string]string{"grant_type": "client_credentials"}, 4},
	} {
		if got := value(samples, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if sum := value(samples, "identityd_http_request_duration_seconds_sum", map[string]string{"route": "/api/v1/service-accounts/{id}", "method": "GET"}); sum <= 0 {
		t.Errorf("latency sum %v", sum)
	}
	// Labels are route templates: no raw path or id becomes a series.
	for _, leak := range []string{"path-xyzzy", a.ID, missing} {
		if strings.Contains(text, leak) {
			t.Errorf("/metrics has a label with the raw path part %q", leak)
		}
	}

	// Invented methods are answered 501 and counted under one label: a
	// series per method would grow /metrics without bound.
	_, before := s.scrape(t)
	for i := range 200 {
		method := "XMETHOD" + strings.Repeat("Z", i%50) + fmt.Sprint(i)
		r := s.do(method, saPath+"/"+a.ID, nil, bearer(admin)...)
		expectError(t, r, http.StatusNotImplemented, "not_implemented")
	}
	samples, text = s.scrape(t)
	if strings.Contains(text, "XMETHOD") {
		t.Error("/metrics has a label with an invented method")
	}
	if got := value(samples, "identityd_http_requests_total", map[string]string{"route": "unmatched", "method": "other", "status": "501"}); got != 200 {
		t.Errorf("invented methods counted %v, want 200", got)
	}
	if grew := len(text) - len(before); grew > 4000 {
		t.Errorf("/metrics grew by %d bytes for 200 invented methods", grew)
	}

	// Tokens through the alias count too; failures do not.
	for range 2 {
		decodeToken(t, s.do(http.MethodPost, "/oauth/token", post(ccForm(""), a.ClientID, a.ClientSecret)))
	}
	s.do(http.MethodPost, "/oauth/token", post(ccForm("admin"), a.ClientID, a.ClientSecret))
	samples, _ = s.scrape(t)
	if got := value(samples, "identityd_tokens_issued_total", map[string]string{"grant_type": "client_credentials"}); got != 6 {
		t.Errorf("tokens issued %v, want 6", got)
	}
	if got := value(samples, "identityd_http_requests_total", map[string]string{"route": "/oauth/token", "method": "POST", "status": "200"}); got != 2 {
		t.Errorf("alias requests %v, want 2", got)
	}
}

// X-Request-ID: echoed when plain and short, replaced otherwise, and on
// every answer.
func TestRequestID(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"])
	plain := regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	requests := []struct {
		name         string
		method, path string
		body         any
		status       int
	}{
		{"health", http.MethodGet, "/health", nil, 200},
		{"unknown route", http.MethodGet, "/nope", nil, 404},
		{"no token", http.MethodGet, saPath, nil, 401},
		{"wrong method", http.MethodPut, saPath, nil, 405},
		{"token error", http.MethodPost, tokenPath, ccForm(""), 401},
		{"metadata", http.MethodGet, "/.well-known/openid-configuration", nil, 200},
	}
	for _, c := range []struct {
		name, sent string
		echoed     bool
	}{
		{"plain", "req-123_ABC.xyz", true},
		{"uuid", uuid.NewString(), true},
		{"128 characters", strings.Repeat("a", 128), true},
		{"129 characters", strings.Repeat("a", 129), false},
		{"space", "has space", false},
		{"quote", `a"b`, false},
		{"semicolon", "a;b", false},
		{"non-ASCII", "réq", false},
		{"log injection", `x","level":"ERROR`, false},
		{"absent", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var generated []string
			for _, rq := range requests {
				var h []string
				if c.sent != "" {
					h = []string{"X-Request-ID", c.sent}
				}
				r := s.as(t).do(rq.method, rq.path, rq.body, h...)
				if r.Status != rq.status {
					t.Fatalf("%s: %s", rq.name, describe(r))
				}
				got := r.Header.Values("X-Request-ID")
				if len(got) != 1 {
					t.Fatalf("%s: X-Request-ID %q, want one", rq.name, got)
				}
				switch {
				case c.echoed && got[0] != c.sent:
					t.Fatalf("%s: X-Request-ID %q, want %q echoed", rq.name, got[0], c.sent)
				case !c.echoed && (got[0] == c.sent || !plain.MatchString(got[0])):
					t.Fatalf("%s: X-Request-ID %q for %q, want a fresh plain id", rq.name, got[0], c.sent)
				}
				generated = append(generated, got[0])
			}
			if !c.echoed {
				slices.Sort(generated)
				if len(slices.Compact(generated)) != len(requests) {
					t.Fatalf("generated ids repeat: %v", generated)
				}
			}
		})
	}
	// The id is the one the log line carries.
	s.do(http.MethodGet, "/health", nil, "X-Request-ID", "find-me-in-the-log")
	s.waitLog(t, `"request_id":"find-me-in-the-log"`)
}

// Rate limits (on): the token endpoint 30/min per client, whoami 100/min
// per client, with the X-RateLimit-* headers and a 429 in the endpoint's
// error shape.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"], "IDENTITYD_RATE_LIMITS=on")
	admin := s.adminToken()
	// On the startup tier (600 a minute), so that the route's limits are
	// the tightest (a free account's 60 a minute would come first).
	a := s.createAccount(admin, map[string]any{"name": "greedy", "scopes": []string{"users:read"}, "tier": "startup"})
	b := s.createAccount(admin, map[string]any{"name": "bystander", "scopes": []string{"users:read"}, "tier": "startup"})

	checkHeaders := func(t *testing.T, r *response, limit, remaining int) {
		t.Helper()
		if got := r.Header.Get("X-RateLimit-Limit"); got != strconv.Itoa(limit) {
			t.Fatalf("X-RateLimit-Limit %q, want %d", got, limit)
		}
		if got := r.Header.Get("X-RateLimit-Remaining"); got != strconv.Itoa(remaining) {
			t.Fatalf("X-RateLimit-Remaining %q, want %d", got, remaining)
		}
		reset, err := strconv.ParseInt(r.Header.Get("X-RateLimit-Reset"), 10, 64)
		now := time.Now().Unix()
		if err != nil || reset <= now-1 || reset > now+61 {
			t.Fatalf("X-RateLimit-Reset %q: want a Unix time in seconds within the next minute (now %d)", r.Header.Get("X-RateLimit-Reset"), now)
		}
	}
	expect429 := func(t *testing.T, r *response, limit int) {
		t.Helper()
		expectError(t, r, http.StatusTooManyRequests, "rate_limited")
		checkHeaders(t, r, limit, 0)
		retry, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if err != nil || retry < 1 || retry > 60 {
			t.Fatalf("Retry-After %q, want 1..60 seconds", r.Header.Get("Retry-After"))
		}
	}

	// The token endpoint answers its 429 as an RFC 6749 error.
	expectOAuth429 := func(t *testing.T, r *response, limit int) {
		t.Helper()
		expectRateLimited(t, r)
		checkHeaders(t, r, limit, 0)
	}

	var tokA string
	t.Run("token endpoint", func(t *testing.T) {
		s := s.as(t)
		// 30 requests, through both paths of the endpoint and both auth methods.
		for i := range 30 {
			var r *response
			switch i % 3 {
			case 0:
				r = s.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, a.ClientSecret)...)
			case 1:
				r = s.do(http.MethodPost, "/oauth/token", ccForm(""), basic(a.ClientID, a.ClientSecret)...)
			case 2:
				r = s.do(http.MethodPost, tokenPath, post(ccForm(""), a.ClientID, a.ClientSecret))
			}
			tokA = decodeToken(t, r).AccessToken
			checkHeaders(t, r, 30, 29-i)
		}
		expectOAuth429(t, s.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, a.ClientSecret)...), 30)
		expectOAuth429(t, s.do(http.MethodPost, "/oauth/token", post(ccForm(""), a.ClientID, a.ClientSecret)), 30)
		// Another client is unaffected.
		r := s.do(http.MethodPost, tokenPath, ccForm(""), basic(b.ClientID, b.ClientSecret)...)
		decodeToken(t, r)
		checkHeaders(t, r, 30, 29)
		// The limited client's tokens still work elsewhere.
		if w := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tokA)...); w.Status != http.StatusOK {
			t.Fatalf("whoami: %s", describe(w))
		}
	})

	// However the client spells its id: fosite form-decodes the Basic user
	// name (RFC 6749 §2.3.1), so "%73a_…" is the same client and the same
	// counter.
	t.Run("percent-encoded client id", func(t *testing.T) {
		encoded := "%" + strconv.FormatInt(int64(a.ClientID[0]), 16) + a.ClientID[1:]
		raw := base64.StdEncoding.EncodeToString([]byte(encoded + ":" + a.ClientSecret))
		expectOAuth429(t, s.as(t).do(http.MethodPost, tokenPath, ccForm(""), "Authorization", "Basic "+raw), 30)
	})

	t.Run("whoami", func(t *testing.T) {
		s := s.as(t)
		tokB := s.token(b.ClientID, b.ClientSecret, "")
		for i := range 100 {
			r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tokB)...)
			if r.Status != http.StatusOK {
				t.Fatalf("whoami %d: %s", i, describe(r))
			}
			checkHeaders(t, r, 100, 99-i)
		}
		expect429(t, s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tokB)...), 100)
		// Counted per client: another token of another client is fine.
		r := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tokA)...)
		if r.Status != http.StatusOK {
			t.Fatalf("other client's whoami: %s", describe(r))
		}
		if rem, _ := strconv.Atoi(r.Header.Get("X-RateLimit-Remaining")); rem < 90 {
			t.Fatalf("other client's remaining %d", rem)
		}
	})
}

var (
	bannerID     = regexp.MustCompile(`client_id:\s+(\S+)`)
	bannerSecret = regexp.MustCompile(`client_secret:\s+(\S+)`)
)

// Without configured admin credentials, a fresh database gets a generated
// admin, shown once on stderr.
func TestBootstrapAdminGenerated(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_ADMIN_CLIENT_ID=", "IDENTITYD_ADMIN_CLIENT_SECRET=")
		s.waitLog(t, "identityd listening")
		logs := s.logs.String()
		ids, secrets := bannerID.FindAllStringSubmatch(logs, -1), bannerSecret.FindAllStringSubmatch(logs, -1)
		if len(ids) != 1 || len(secrets) != 1 {
			t.Fatalf("want the generated credentials printed once, got %d ids and %d secrets:\n%s", len(ids), len(secrets), logs)
		}
		id, secret := ids[0][1], secrets[0][1]
		if len(secret) < 43 {
			t.Fatalf("generated secret %q is short", secret)
		}
		admin := s.token(id, secret, "admin")

		// One account, holding every scope the server offers, admin included.
		l := s.do(http.MethodGet, saPath, nil, bearer(admin)...).JSON(t)
		list := l["serviceAccounts"].([]any)
		if l["total"] != float64(1) || len(list) != 1 || list[0].(map[string]any)["clientId"] != id {
			t.Fatalf("accounts: %v", l)
		}
		var md struct {
			Scopes []string `json:"scopes_supported"`
		}
		_ = json.Unmarshal(s.do(http.MethodGet, "/.well-known/oauth-authorization-server", nil).Body, &md)
		got := slices.Sorted(slices.Values(strs(list[0].(map[string]any)["scopes"])))
		// scopes_supported also lists what people grant their applications.
		machine := slices.DeleteFunc(md.Scopes, func(s string) bool { return slices.Contains(persistence.ApplicationScopes, s) })
		if want := slices.Sorted(slices.Values(machine)); !slices.Contains(got, "admin") || !slices.Equal(got, want) {
			t.Fatalf("generated admin scopes %v, want every scope %v", got, want)
		}

		// Restarted: nothing printed, no second admin, the pair still works.
		s.restart()
		s.waitLog(t, "identityd listening")
		if l := s.logs.String(); bannerSecret.MatchString(l) || strings.Contains(l, secret) {
			t.Fatalf("credentials printed again after a restart:\n%s", l)
		}
		admin = s.token(id, secret, "admin")
		if l := s.do(http.MethodGet, saPath, nil, bearer(admin)...).JSON(t); l["total"] != float64(1) {
			t.Fatalf("a restart made another admin: %v", l)
		}
	})
}

// Configured admin credentials are applied at every start: a new secret
// replaces the old, lost scopes come back, and a deleted admin comes back
// without its old tokens.
func TestBootstrapAdminConfigured(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		if strings.Contains(s.logs.String(), s.AdminSecret) || bannerSecret.MatchString(s.logs.String()) {
			t.Fatal("configured admin secret printed")
		}
		oldSecret := s.AdminSecret
		oldToken := s.adminToken()
		list := s.do(http.MethodGet, saPath, nil, bearer(oldToken)...).JSON(t)
		adminID := list["serviceAccounts"].([]any)[0].(map[string]any)["id"].(string)
		// Strip the admin of its scopes.
		if r := s.do(http.MethodPatch, saPath+"/"+adminID, map[string]any{"scopes": []string{"users:read"}}, bearer(oldToken)...); r.Status != http.StatusOK {
			t.Fatalf("patch admin: %s", describe(r))
		}
		expectRFC6749(t, s.do(http.MethodPost, tokenPath, ccForm("admin"), basic(s.AdminID, oldSecret)...), http.StatusBadRequest, "invalid_scope")

		newSecret := randomString()
		s.restart("IDENTITYD_ADMIN_CLIENT_SECRET=" + newSecret)
		s.AdminSecret = newSecret

		r := s.do(http.MethodPost, tokenPath, ccForm(""), basic(s.AdminID, oldSecret)...)
		expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
		newToken := s.adminToken() // the admin scope is back
		l := s.do(http.MethodGet, saPath, nil, bearer(newToken)...).JSON(t)
		if l["total"] != float64(1) || l["serviceAccounts"].([]any)[0].(map[string]any)["id"] != adminID {
			t.Fatalf("the update made a new account: %v", l)
		}
		// Tokens outlive a restart and a secret change.
		if w := s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(oldToken)...); w.Status != http.StatusOK {
			t.Fatalf("token from before the restart: %s", describe(w))
		}
		// The same configuration again changes nothing.
		s.restart()
		s.adminToken()

		// Deleted through the API, the admin is made again at the next start,
		// as a new principal: tokens of the deleted one stay dead.
		if d := s.do(http.MethodDelete, saPath+"/"+adminID, nil, bearer(newToken)...); d.Status != http.StatusNoContent {
			t.Fatalf("delete admin: %s", describe(d))
		}
		s.restart()
		fresh := s.adminToken()
		for _, tok := range []string{oldToken, newToken} {
			expectError(t, s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tok)...), http.StatusUnauthorized, "invalid_token")
			expectInactive(t, s.introspect(t, tok, s.AdminID, s.AdminSecret))
			expectError(t, s.do(http.MethodGet, saPath, nil, bearer(tok)...), http.StatusUnauthorized, "invalid_token")
		}
		if l := s.do(http.MethodGet, saPath, nil, bearer(fresh)...).JSON(t); l["total"] != float64(1) ||
			l["serviceAccounts"].([]any)[0].(map[string]any)["id"] == adminID {
			t.Fatalf("admin after re-creation: %v", l)
		}
	})
}

// SIGTERM and SIGINT stop the server gracefully: exit status 0, "stopped".
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	for _, sig := range []os.Signal{syscall.SIGTERM, os.Interrupt} {
		t.Run(sig.String(), func(t *testing.T) {
			s := startLogged(t, dbtest.URLs(t)["sqlite"])
			s.adminToken()
			if err := s.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-s.exited:
			case <-time.After(20 * time.Second):
				t.Fatal("no exit 20s after the signal")
			}
			if s.waitErr != nil || s.cmd.ProcessState.ExitCode() != 0 {
				t.Fatalf("exit: %v\n%s", s.waitErr, s.logs)
			}
			logs := s.logs.String()
			if !strings.Contains(logs, `"msg":"shutting down"`) || !strings.Contains(logs, `"msg":"stopped"`) {
				t.Fatalf("no shutdown log lines:\n%s", logs)
			}
			if _, err := http.Get(s.URL + "/health"); err == nil {
				t.Fatal("still answering after exit")
			}
		})
	}
}

// Secrets never reach the log, at debug level, whatever the requests do
// with them.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"])
	secrets := []string{s.AdminSecret}
	admin := s.adminToken()
	secrets = append(secrets, admin)
	garbageBearer := "garbage-" + randomString()
	wrongSecret := "wrong-" + randomString()
	secrets = append(secrets, garbageBearer, wrongSecret)
	for i := range 3 {
		a := s.createAccount(admin, map[string]any{"name": fmt.Sprintf("quiet-%d", i), "scopes": []string{"users:read"}})
		secrets = append(secrets, a.ClientSecret)
		tok := s.token(a.ClientID, a.ClientSecret, "")
		rot := s.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, bearer(admin)...).JSON(t)
		secret := rot["clientSecret"].(string)
		secrets = append(secrets, tok, secret)
		// Every way a secret or token travels, right and wrong.
		jsonTok := decodeToken(t, s.do(http.MethodPost, tokenPath, map[string]any{"grant_type": "client_credentials", "client_id": a.ClientID, "client_secret": secret})).AccessToken
		postTok := decodeToken(t, s.do(http.MethodPost, "/oauth/token", post(ccForm(""), a.ClientID, secret))).AccessToken
		secrets = append(secrets, jsonTok, postTok)
		s.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, a.ClientSecret)...)     // the old secret
		s.do(http.MethodPost, tokenPath, post(ccForm(""), a.ClientID, wrongSecret))            // a wrong one
		s.do(http.MethodPost, tokenPath+"?client_secret="+url.QueryEscape(secret), ccForm("")) // in the query
		s.do(http.MethodPost, tokenPath, `{"grant_type":"client_credentials","client_secret":"`+secret+`"`, "Content-Type", "application/json")
		s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tok)...)
		s.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(garbageBearer)...)
		s.do(http.MethodGet, "/api/v1/m2m/whoami?access_token="+jsonTok, nil)
		s.introspect(t, tok, a.ClientID, secret)
		s.do(http.MethodPost, introspectPath, url.Values{"token": {postTok}}, bearer(postTok)...)
		s.do(http.MethodPost, revokePath, url.Values{"token": {tok}}, basic(a.ClientID, secret)...)
		s.do(http.MethodPost, revokePath, url.Values{"token": {postTok}}, basic(a.ClientID, wrongSecret)...)
	}
	s.do(http.MethodGet, "/health", nil, "X-Request-ID", "last-request")
	s.waitLog(t, "last-request")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	logs := s.logs.String()
	if !strings.Contains(logs, `"msg":"request"`) || !strings.Contains(logs, `"route":"/api/v1/oauth/token"`) {
		t.Fatalf("the log does not show the requests; nothing was tested:\n%s", logs)
	}
	for _, secret := range secrets {
		// A whole secret, or either half of an access token (key.signature).
		for part := range strings.SplitSeq(secret, ".") {
			if len(part) >= 16 && strings.Contains(logs, part) {
				t.Errorf("the log contains a secret or token (%.6s…)", part)
			}
		}
	}
}

// identityd migrate applies the migrations to a fresh database and exits 0;
// again, it has nothing to do; bad configuration exits 2.
func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		migrate := func(env ...string) (int, string) {
			cmd := exec.Command(binary, "migrate")
			cmd.Env = append(os.Environ(), append([]string{"IDENTITYD_LOG_LEVEL=info"}, env...)...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return exit.ExitCode(), string(out)
			} else if err != nil {
				t.Fatal(err)
			}
			return 0, string(out)
		}
		for i := range 2 {
			if code, out := migrate("IDENTITYD_DATABASE_URL=" + dbURL); code != 0 {
				t.Fatalf("migrate run %d: exit %d\n%s", i+1, code, out)
			}
		}
		// The migrated database serves.
		s := startLogged(t, dbURL)
		s.createAccount(s.adminToken(), map[string]any{"name": "after-migrate"})

		if code, out := migrate("IDENTITYD_DATABASE_URL=mysql://nope"); code != 2 || !strings.Contains(out, "IDENTITYD_DATABASE_URL") {
			t.Fatalf("bad database URL: exit %d\n%s", code, out)
		}
	})
}

// startReplicas runs two servers on one fresh PostgreSQL database, with one
// system secret and admin, and extra variables (skipping without
// TEST_DATABASE_URL).
func startReplicas(t *testing.T, extra ...string) (*server, *server) {
	t.Helper()
	pg, ok := dbtest.URLs(t)["postgres"]
	if !ok {
		t.Skip("TEST_DATABASE_URL is not set; PostgreSQL runs are skipped")
	}
	shared := append([]string{"IDENTITYD_SYSTEM_SECRET=" + randomString(), "IDENTITYD_ADMIN_CLIENT_SECRET=" + randomString()}, extra...)
	one := startLogged(t, pg, shared...)
	return one, one.sibling(t, shared...)
}

// Two replicas on one PostgreSQL database: what one changes, the other
// honours at once (cache leases and the commit wait, docs/decisions.md).
func TestReplicas(t *testing.T) {
	t.Parallel()
	one, two := startReplicas(t)
	admin := one.adminToken()
	// The commit wait makes this deterministic; a few rounds catch a regression.
	const rounds = 5

	t.Run("revocation", func(t *testing.T) {
		a := one.createAccount(admin, map[string]any{"name": "revoked-across", "scopes": []string{"users:read"}})
		for i := range rounds {
			tok := one.token(a.ClientID, a.ClientSecret, "")
			expectActive(t, two.introspect(t, tok, a.ClientID, a.ClientSecret), a.ClientID) // now cached there
			if r := one.do(http.MethodPost, revokePath, url.Values{"token": {tok}}, basic(a.ClientID, a.ClientSecret)...); r.Status != http.StatusOK {
				t.Fatalf("revoke: %s", describe(r))
			}
			if m := two.introspect(t, tok, a.ClientID, a.ClientSecret); m["active"] != false {
				t.Fatalf("round %d: revoked on one replica, still active on the other: %v", i, m)
			}
		}
	})

	t.Run("rotation", func(t *testing.T) {
		a := one.createAccount(admin, map[string]any{"name": "rotated-across"})
		secret := a.ClientSecret
		for i := range rounds {
			decodeToken(t, two.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, secret)...)) // cached there
			rot := one.do(http.MethodPost, saPath+"/"+a.ID+"/rotate", nil, bearer(admin)...).JSON(t)
			if r := two.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, secret)...); r.Status != http.StatusUnauthorized {
				t.Fatalf("round %d: old secret after rotation on the other replica: %s", i, describe(r))
			}
			secret = rot["clientSecret"].(string)
		}
	})

	t.Run("deletion", func(t *testing.T) {
		for i := range rounds {
			a := one.createAccount(admin, map[string]any{"name": fmt.Sprintf("deleted-across-%d", i), "scopes": []string{"users:read"}})
			tok := two.token(a.ClientID, a.ClientSecret, "")
			if w := two.do(http.MethodGet, "/api/v1/m2m/whoami", nil, bearer(tok)...); w.Status != http.StatusOK {
				t.Fatal(describe(w))
			}
			if d := one.do(http.MethodDelete, saPath+"/"+a.ID, nil, bearer(admin)...); d.Status != http.StatusNoContent {
				t.Fatal(describe(d))
			}
			if m := two.introspect(t, tok, two.AdminID, two.AdminSecret); m["active"] != false {
				t.Fatalf("round %d: deleted on one replica, its token active on the other: %v", i, m)
			}
			if r := two.do(http.MethodPost, tokenPath, ccForm(""), basic(a.ClientID, a.ClientSecret)...); r.Status != http.StatusUnauthorized {
				t.Fatalf("round %d: deleted on one replica, its secret works on the other: %s", i, describe(r))
			}
		}
	})

	t.Run("scope change", func(t *testing.T) {
		a := one.createAccount(admin, map[string]any{"name": "narrowed-across", "scopes": []string{"users:read", "orgs:read"}})
		for i := range rounds {
			scopes := []string{"users:read", "orgs:read"}
			if i%2 == 0 {
				scopes = []string{"orgs:read"}
			}
			decodeToken(t, two.do(http.MethodPost, tokenPath, ccForm("orgs:read"), basic(a.ClientID, a.ClientSecret)...)) // cached there
			if r := one.do(http.MethodPatch, saPath+"/"+a.ID, map[string]any{"scopes": scopes}, bearer(admin)...); r.Status != http.StatusOK {
				t.Fatal(describe(r))
			}
			r := two.do(http.MethodPost, tokenPath, ccForm("users:read"), basic(a.ClientID, a.ClientSecret)...)
			if want := map[bool]int{true: 400, false: 200}[i%2 == 0]; r.Status != want {
				t.Fatalf("round %d: scopes %v set on one replica; users:read on the other: %s", i, scopes, describe(r))
			}
		}
	})
}

// The log is JSON, one object a line, and each request's line carries its
// request id, route and principal, each member once.
func TestStructuredLogs(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"])
	admin := s.adminToken()
	a := s.createAccount(admin, map[string]any{"name": "logged"})
	s.do(http.MethodGet, saPath+"/"+a.ID, nil, append(bearer(admin), "X-Request-ID", "authenticated-call")...)
	s.do(http.MethodGet, saPath, nil, "X-Request-ID", "anonymous-call")
	s.do(http.MethodGet, "/nope", nil, "X-Request-ID", "unrouted-call")
	s.waitLog(t, "unrouted-call")

	requests := map[string]map[string]any{}
	for line := range strings.SplitSeq(strings.TrimSpace(s.logs.String()), "\n") {
		if dup := duplicateKey(line); dup != "" {
			t.Errorf("log line has member %q twice: %s", dup, line)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not a JSON object: %q", line)
		}
		if m["msg"] == "request" {
			id, _ := m["request_id"].(string)
			requests[id] = m
		}
	}
	for id, want := range map[string]map[string]any{
		"authenticated-call": {"route": "/api/v1/service-accounts/{id}", "status": float64(200), "principal": s.AdminID, "method": "GET"},
		"anonymous-call":     {"route": "/api/v1/service-accounts", "status": float64(401), "principal": "", "method": "GET"},
		"unrouted-call":      {"status": float64(404), "path": "/nope"},
	} {
		m, ok := requests[id]
		if !ok {
			t.Errorf("no request line with request_id %q", id)
			continue
		}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("request %s: %s = %v, want %v", id, k, m[k], v)
			}
		}
	}
}

// duplicateKey names a member that a JSON object line has twice, at its
// top level ("" when none).
func duplicateKey(line string) string {
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := tok.(string)
		if seen[key] {
			return key
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
	}
	return ""
}
