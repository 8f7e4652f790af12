package handlers

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func testAPI() *api {
	return &api{log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: NewMetrics()}
}

// /health: 200 with every part ok on a working store; 503 naming the
// database when it does not answer (here a real store whose pool is
// closed), and "draining" once shutdown has begun.
func TestHealth(t *testing.T) {
	a := testAPI()
	dir := t.TempDir()
	db, dialect, err := persistence.Open(context.Background(), "sqlite://"+dir+"/h.db")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := persistence.Migrate(context.Background(), db.DB, dialect); err != nil {
		t.Fatal(err)
	}
	store, err := persistence.New(context.Background(), db, dialect, "")
	if err != nil {
		t.Fatal(err)
	}
	a.storeHealth, a.draining = store.Health, &atomic.Bool{}
	check := func(want int, body string) {
		t.Helper()
		rec := httptest.NewRecorder()
		a.health(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
		if rec.Code != want || strings.TrimSpace(rec.Body.String()) != body {
			t.Fatalf("health: %d %s, want %d %s", rec.Code, rec.Body, want, body)
		}
	}
	check(http.StatusOK, `{"checks":{"database":"ok","writes":"ok"},"status":"ok","version":"v1"}`)
	a.draining.Store(true)
	check(http.StatusServiceUnavailable, `{"status":"draining","version":"v1"}`)
	a.draining.Store(false)
	store.Close()
	check(http.StatusServiceUnavailable, `{"checks":{"database":"unavailable","writes":"ok"},"status":"unavailable","version":"v1"}`)
}

// A panic becomes a 500 envelope that says nothing of the cause, and the
// request id is still on the response.
func TestPanicRecovery(t *testing.T) {
	a := testAPI()
	h := a.outer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("secret internals") }))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	req.Header.Set("X-Request-ID", "abc-123")
	h.ServeHTTP(rec, req)
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "secret") || !strings.Contains(rec.Body.String(), `"error":"internal_error"`) {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if rec.Header().Get("X-Request-ID") != "abc-123" {
		t.Fatalf("request id %q", rec.Header().Get("X-Request-ID"))
	}
}

func TestRequestIDValidation(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc-123_X.y": true, "": false, "has space": false, strings.Repeat("a", 129): false, "a\nb": false, "é": false,
	} {
		if validRequestID(id) != ok {
			t.Errorf("validRequestID(%q) = %v", id, !ok)
		}
	}
}

func TestJSONToForm(t *testing.T) {
	cases := []struct {
		body string
		want url.Values
		err  bool
	}{
		{`{"grant_type":"client_credentials","scope":"a b"}`, url.Values{"grant_type": {"client_credentials"}, "scope": {"a b"}}, false},
		{`{"authorization_details":[{"type":"x", "actions":["read"]}]}`, url.Values{"authorization_details": {`[{"type":"x","actions":["read"]}]`}}, false},
		{`{"scope":null}`, url.Values{}, false},
		{`{"scope":5}`, nil, true},
		{`{"scope":["a"]}`, nil, true},
		{`{"authorization_details":"[]"}`, url.Values{"authorization_details": {"[]"}}, false},
		{`[]`, nil, true},
		{`null`, nil, true},
		{`{"a":"b"`, nil, true},
		{`"x"`, nil, true},
	}
	for _, c := range cases {
		got, err := jsonToForm([]byte(c.body))
		if (err != nil) != c.err {
			t.Errorf("%s: err %v", c.body, err)
			continue
		}
		if !c.err && got.Encode() != c.want.Encode() {
			t.Errorf("%s: got %v, want %v", c.body, got, c.want)
		}
	}
}

// The JSON token body is attacker input: it must never panic, and what it
// yields must be plain form values that PostgreSQL's text holds (checked
// there when TEST_DATABASE_URL is set).
func FuzzJSONToForm(f *testing.F) {
	for _, s := range []string{
		`{"grant_type":"client_credentials","client_id":"sa_x","client_secret":"s"}`,
		`{"authorization_details":[{"type":"payment","amount":{"value":"45.00","currency":"EUR"}}]}`,
		`{"scope":"\u0000\ud800"}`, `{}`, `[[[[[[[[`, `{"a":{"b":{"c":[1,2,{"d":null}]}}}`,
		`{"client_id":"\u0000"}`, "{\"client_id\":\"\xff\"}", `{"scope":"\udc00"}`, `{"audience":["a","\u0000"]}`,
		`{"authorization_details":[{"k":"\u0000","n":1e131072}]}`, `{"authorization_details":` + strings.Repeat("[", 20000) + `}`,
	} {
		f.Add([]byte(s))
	}
	pg := dbtest.Postgres(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		form, err := jsonToForm(body)
		if err == nil && form == nil {
			t.Fatal("nil form without error")
		}
		for name, values := range form {
			for _, v := range append(values, name) {
				if _, err := pgExec(pg, `SELECT $1::text`, v); err != nil {
					t.Fatalf("a form value PostgreSQL cannot hold: %q (%v)", v, err)
				}
			}
		}
	})
}

// decodeJSON reads attacker input: what it accepts is one JSON text that
// PostgreSQL's jsonb holds (checked there when TEST_DATABASE_URL is set).
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"name":"x","scopes":["users:read"],"redirectUris":["https://a.example/cb"]}`, `{"name":5}`, `{"x":1}`, `{} {}`, ``, `{"name":"\ud800"}`,
		`{"name":"\u0000"}`, "{\"name\":\"\xff\"}", `{"name":"x","description":"\uFFFD"}`, `{"name":"` + strings.Repeat("[", 100) + `"}`} {
		f.Add(s)
	}
	pg := dbtest.Postgres(f)
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		var v serviceAccountBody
		err := decodeJSON(req, &v)
		var ae *apiError
		if err != nil && !errors.As(err, &ae) {
			t.Fatalf("decode error is not a public error: %v", err)
		}
		if ae != nil && (ae.Status < 400 || ae.Status > 499) {
			t.Fatalf("status %d for bad input", ae.Status)
		}
		if err == nil {
			if _, err := pgExec(pg, `SELECT $1::jsonb`, body); err != nil {
				t.Fatalf("accepted a body that jsonb refuses: %v", err)
			}
		}
	})
}

func TestLoggablePath(t *testing.T) {
	for in, want := range map[string]string{
		"/invites/abc":                     "/invites/{token}",
		"/invites/abc/":                    "/invites/{token}/",
		"/api/v1/invites/abc":              "/api/v1/invites/{token}",
		"/api/v1/m2m/invites/abc/accept":   "/api/v1/m2m/invites/{token}/accept",
		"/invites/":                        "/invites/",
		"/api/v1/m2m/users/invite":         "/api/v1/m2m/users/invite",
		"/api/v1/agents/123":               "/api/v1/agents/123",
		"/invites//abc":                    "/invites/{token}",
		"//invites/abc":                    "/invites/{token}",
		"/api/v1//invites/abc":             "/api/v1/invites/{token}",
		"/api/v1/m2m//invites//abc/accept": "/api/v1/m2m/invites/{token}/accept",
		"/invites/./abc":                   "/invites/{token}",
		"/x/../invites/abc":                "/invites/{token}",
		"/INVITES/abc":                     "/INVITES/{token}",
		"/api/v1/Invites/abc":              "/api/v1/Invites/{token}",
		"":                                 "/",
	} {
		if got := loggablePath(in); got != want {
			t.Errorf("loggablePath(%q) = %q, want %q", in, got, want)
		}
	}
}
