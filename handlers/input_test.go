package handlers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Paths, queries and header values the stores cannot hold are refused at
// the door: in the envelope, or in RFC 6749's shape at the OAuth endpoints.
func TestRequestTextRefused(t *testing.T) {
	reached := false
	h := testAPI().outer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached = true; w.WriteHeader(http.StatusNoContent) }))
	for _, tc := range []struct {
		name, target, header, value, part string
		oauth                             bool
	}{
		{"path %FF", "/api/v1/rar/types/%FF", "", "", "path", false},
		{"path %00", "/api/v1/m2m/roles/a%00b", "", "", "path", false},
		{"raw path byte", "/api/v1/rar/types/\xff", "", "", "path", false},
		{"query value", "/api/v1/audit/intent/search?intentAction=%FF", "", "", "query", false},
		{"query NUL", "/api/v1/audit/intent/search?agentClientId=%00", "", "", "query", false},
		{"query name", "/api/v1/m2m/users?%FF=1", "", "", "query", false},
		{"authorization", "/api/v1/m2m/whoami", "Authorization", "Bearer a\xff", "header", false},
		{"token endpoint query", "/api/v1/oauth/token?x=%00", "", "", "query", true},
		{"token endpoint header", "/oauth/token", "Authorization", "Basic \xff", "header", true},
		{"introspection header", "/api/v1/oauth/introspect", "Authorization", "Basic \xc3\x28", "header", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reached = false
			req := httptest.NewRequest(http.MethodPost, "http://x"+strings.Replace(tc.target, "\xff", "%FF", 1), nil)
			if strings.Contains(tc.target, "\xff") {
				req.URL.Path, req.URL.RawPath = tc.target, ""
			}
			if tc.header != "" {
				req.Header.Set(tc.header, tc.value)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var body map[string]any
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != http.StatusBadRequest || reached || body["error"] != "invalid_request" {
				t.Fatalf("%d %s (handler reached: %v)", rec.Code, rec.Body, reached)
			}
			if tc.oauth {
				if _, ok := body["error_description"].(string); !ok || body["message"] != nil {
					t.Fatalf("not an RFC 6749 error: %s", rec.Body)
				}
				return
			}
			if d, _ := body["details"].(map[string]any); d["part"] != tc.part {
				t.Fatalf("details %v, want part %q", body["details"], tc.part)
			}
		})
	}
	// Text is fine, and the intent headers are parseIntent's to refuse.
	req := httptest.NewRequest(http.MethodGet, "/api/v1/rar/types/caf%C3%A9?q=%E2%82%AC", nil)
	req.Header.Set("X-Anything", "plain, and é")
	req.Header.Set("User-Agent", "Latin-1 \xe9") // not read: RFC 9110's obs-text passes
	req.Header.Set(hReason, "r\xff")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNoContent || !reached {
		t.Fatalf("good text refused: %d %s", rec.Code, rec.Body)
	}
}

// JSON bodies: what the decoder would let through or turn into U+FFFD is
// refused, wherever it is; a 100,000-deep body is a 400 like any bad JSON.
func TestDecodeJSONRefusesText(t *testing.T) {
	for name, tc := range map[string]struct {
		body, code string
	}{
		"raw 0xFF in a value":   {"{\"email\":\"b\xff@example.com\"}", "invalid_request"},
		"raw 0xFF in a key":     {"{\"metadata\":{\"k\xff\":1}}", "invalid_request"},
		"NUL in nested value":   {`{"metadata":{"a":{"b":["x\u0000"]}}}`, "invalid_request"},
		"NUL in nested key":     {`{"metadata":{"a":{"\u0000":1}}}`, "invalid_request"},
		"unpaired surrogate":    {`{"name":"\udc00"}`, "invalid_request"},
		"number beyond numeric": {`{"metadata":{"n":1e131072}}`, "invalid_request"},
		"deep nesting":          {`{"metadata":{"a":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}}`, "invalid_json"},
		"deep nesting, broken":  {strings.Repeat("[", 100000), "invalid_json"},
	} {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
			var v struct {
				Email    string         `json:"email"`
				Name     string         `json:"name"`
				Metadata map[string]any `json:"metadata"`
			}
			err := decodeJSON(req, &v)
			ae, ok := err.(*apiError)
			if !ok || ae.Status != http.StatusBadRequest || ae.Code != tc.code {
				t.Fatalf("%v, want 400 %s", err, tc.code)
			}
			if tc.code == "invalid_request" && ae.Details["part"] != "body" {
				t.Fatalf("details %v", ae.Details)
			}
		})
	}
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"email":"b\uFFFD@example.com","metadata":{"n":1e400,"s":"\\u0000"}}`))
	var v map[string]any
	if err := decodeJSON(req, &v); err != nil {
		t.Fatalf("an escaped U+FFFD, 1e400 and an escaped backslash are text: %v", err)
	}
}

// OAuth parameters: form values, JSON members and HTTP Basic credentials.
func TestOAuthFormRefusesText(t *testing.T) {
	reached := false
	h := testAPI().outer(oauthForm(func(w http.ResponseWriter, _ *http.Request) { reached = true }))
	basic := func(id string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(id+":secret")) }
	for _, tc := range []struct{ name, contentType, body, auth string }{
		{"form %00", "application/x-www-form-urlencoded", "grant_type=client_credentials&client_id=%00&client_secret=x", ""},
		{"form %FF", "application/x-www-form-urlencoded", "grant_type=client_credentials&client_id=agt_%FF&client_secret=x", ""},
		{"form name", "application/x-www-form-urlencoded", "grant_type=client_credentials&%FF=1", ""},
		{"form raw byte", "application/x-www-form-urlencoded", "grant_type=client_credentials&scope=\xff", ""},
		{"json NUL", "application/json", `{"grant_type":"client_credentials","client_id":"\u0000"}`, ""},
		{"json raw byte", "application/json", "{\"grant_type\":\"client_credentials\",\"client_id\":\"agt_\xff\"}", ""},
		{"json unpaired surrogate", "application/json", `{"grant_type":"client_credentials","client_id":"\ud800"}`, ""},
		{"basic raw byte", "application/x-www-form-urlencoded", "grant_type=client_credentials", basic("agt_\xff")},
		{"basic %FF", "application/x-www-form-urlencoded", "grant_type=client_credentials", basic("agt_%FF")},
		{"basic %00", "application/x-www-form-urlencoded", "grant_type=client_credentials", basic("%00")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reached = false
			req := httptest.NewRequest(http.MethodPost, "/api/v1/oauth/token", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var body map[string]string
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != http.StatusBadRequest || reached || body["error"] != "invalid_request" || !rfc6749Chars(body["error_description"]) {
				t.Fatalf("%d %s (handler reached: %v)", rec.Code, rec.Body, reached)
			}
		})
	}
}

// rfc6749Chars: error_description holds %x20-21 / %x23-5B / %x5D-7E only.
func rfc6749Chars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return s != ""
}

// Every agent audit entry that cannot be recorded is counted in
// identityd_audit_failures_total (and logged): here the database refuses
// every new entry, on each dialect. A call is then refused (503) rather
// than served unaudited.
func TestAuditFailuresCounted(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		api := newFuzzAPI(t, "", dbURL)
		rec := api.send(http.MethodPost, "/api/v1/agents", "application/json", `{"name":"audited","type":"autonomous","capabilities":["read_users"]}`, "Bearer "+api.token)
		var ag struct{ ClientID, ClientSecret string }
		if err := json.Unmarshal(rec.Body.Bytes(), &ag); err != nil || ag.ClientID == "" {
			t.Fatalf("agent: %d %s", rec.Code, rec.Body)
		}
		rec = api.send(http.MethodPost, oauth.TokenPath, "application/x-www-form-urlencoded", "grant_type=client_credentials",
			"Basic "+base64.StdEncoding.EncodeToString([]byte(ag.ClientID+":"+ag.ClientSecret)))
		var tok struct {
			AccessToken string `json:"access_token"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &tok); err != nil || tok.AccessToken == "" {
			t.Fatalf("token: %d %s", rec.Code, rec.Body)
		}
		if rec := api.send(http.MethodGet, "/api/v1/m2m/whoami", "", "", "Bearer "+tok.AccessToken); rec.Code != http.StatusOK {
			t.Fatalf("whoami: %d %s", rec.Code, rec.Body)
		}

		refuseAudit(t, dbURL)
		if rec := api.send(http.MethodGet, "/api/v1/m2m/whoami", "", "", "Bearer "+tok.AccessToken); rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusInternalServerError {
			t.Fatalf("a call that cannot be audited: %d %s", rec.Code, rec.Body)
		}
		req := httptest.NewRequest(http.MethodGet, "/api/v1/m2m/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
		req.Header.Set(hDepth, "-1") // refused before its handler
		api.handler.ServeHTTP(httptest.NewRecorder(), req)
		if rec := api.send(http.MethodPost, oauth.TokenPath, "application/x-www-form-urlencoded", "grant_type=client_credentials&client_id="+ag.ClientID+"&client_secret=wrong", ""); rec.Code != http.StatusUnauthorized {
			t.Fatalf("refused token request: %d %s", rec.Code, rec.Body)
		}
		rec = api.send(http.MethodGet, "/metrics", "", "", "")
		// Three api_call entries: the served call's, then its 503's, and the
		// refused call's; one token_refused.
		for _, want := range []string{`identityd_audit_failures_total{action="api_call"} 3`, `identityd_audit_failures_total{action="token_refused"} 1`} {
			if !strings.Contains(rec.Body.String(), want) {
				t.Errorf("/metrics lacks %s:\n%s", want, grepLines(rec.Body.String(), "identityd_audit_failures_total"))
			}
		}
	})
}

// refuseAudit makes the database refuse every new agent audit entry.
func refuseAudit(t *testing.T, dbURL string) {
	t.Helper()
	db, dialect, err := persistence.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stmts := []string{`CREATE TRIGGER refuse_audit BEFORE INSERT ON agent_audit_inbox BEGIN SELECT RAISE(ABORT, 'audit refused'); END`}
	if dialect == persistence.Postgres {
		stmts = []string{`CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'audit refused'; END $$`,
			`CREATE TRIGGER refuse_audit BEFORE INSERT ON agent_audit FOR EACH ROW EXECUTE FUNCTION refuse_audit()`}
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
}

func grepLines(text, sub string) string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// The checks every request pays (path, query, form body, headers) and
// every OAuth request (its HTTP Basic credentials), on a typical token
// request.
func BenchmarkRequestText(b *testing.B) {
	body := "grant_type=client_credentials&scope=users%3Aread+users%3Awrite"
	req := httptest.NewRequest(http.MethodPost, "/api/v1/oauth/token", strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "Go-http-client/1.1",
		"Accept-Encoding": "gzip", "Accept": "application/json", "X-Request-Id": "abc-123", "Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("agt_abcdefghijklmnopqrstuvwxyz:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"))} {
		req.Header.Set(k, v)
	}
	for b.Loop() {
		req.Body = io.NopCloser(strings.NewReader(body))
		if requestTextProblem(req) != nil || basicTextProblem(req) != "" {
			b.Fatal("refused")
		}
	}
}

// A request whose client went away is not an internal error: it is answered
// 503 and logged below the error level; a cancellation that is not the
// request's own stays an internal error.
func TestAbandonedRequestNotInternalError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cancel bool
		status int
		logged bool
	}{
		{"client gone", true, http.StatusServiceUnavailable, false},
		{"not the request's", false, http.StatusInternalServerError, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			info := &requestInfo{log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))}
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), infoKey{}, info))
			defer cancel()
			if tc.cancel {
				cancel()
			}
			r := httptest.NewRequest(http.MethodGet, "/api/v1/m2m/users", nil).WithContext(ctx)
			w := httptest.NewRecorder()
			writeError(w, r, fmt.Errorf("list users: %w", context.Canceled))
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d", w.Code, tc.status)
			}
			if got := logs.Len() > 0; got != tc.logged {
				t.Fatalf("logged at error level: %v, want %v (%s)", got, tc.logged, logs.String())
			}
		})
	}
}
