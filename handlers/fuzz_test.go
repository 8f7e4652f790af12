package handlers

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/extensions/workload"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence/dbtest"
)

// fuzzAPI is the whole HTTP API, wired as identityd serves it, on one
// dialect's store, with an admin token holding every scope and records for
// the routes that name one.
type fuzzAPI struct {
	dialect string
	handler http.Handler
	basic   string // the admin's HTTP Basic credentials
	token   string
	ids     map[string]string // {user}, {org}, {type}
}

const fuzzAdmin, fuzzSecret = "fuzz-admin", "a fuzzing admin's secret, long enough"

func newFuzzAPI(tb testing.TB, dialect, dbURL string) *fuzzAPI {
	tb.Helper()
	ctx := context.Background()
	store := dbtest.Store(tb, dbURL)
	secret := []byte("a system secret for fuzzing only")
	keys, err := oauth.LoadKeys(ctx, store, secret)
	if err != nil {
		tb.Fatal(err)
	}
	details, federation := rar.New(store), workload.New(store)
	provider := oauth.NewProvider(oauth.Config{Issuer: "http://fuzz", AccessTokenTTL: time.Hour, SystemSecret: secret,
		Details: details, Federation: federation, Delegation: agents.Delegation{}, MaxDelegation: 5}, store, keys)
	accounts := serviceaccounts.New(store, provider.Hasher)
	if _, err := accounts.EnsureAdmin(ctx, fuzzAdmin, fuzzSecret); err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	outbox, err := mail.NewOutbox(store, mail.LogSender{Log: log}, oauth.DeriveKey(secret, "mail outbox"), log)
	if err != nil {
		tb.Fatal(err)
	}
	f := &fuzzAPI{dialect: dialect, ids: map[string]string{},
		basic: "Basic " + base64.StdEncoding.EncodeToString([]byte(fuzzAdmin+":"+url.QueryEscape(fuzzSecret)))}
	f.handler = New(Options{Provider: provider, ServiceAccounts: accounts, Applications: applications.New(store, provider.Hasher), Agents: agents.New(store, provider.Hasher), RAR: details,
		Workload: federation, Directory: directory.New(store), Invites: invites.New(store, secret, outbox, "http://fuzz", time.Hour),
		Health: store.Health, Units: store.InTx, Logger: log, Metrics: NewMetrics(), RateLimits: DefaultRateLimits()})

	rec := f.send(http.MethodPost, oauth.TokenPath, "application/x-www-form-urlencoded", "grant_type=client_credentials", f.basic)
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &tok); err != nil || tok.AccessToken == "" {
		tb.Fatalf("admin token: %d %s", rec.Code, rec.Body)
	}
	f.token = tok.AccessToken
	for key, c := range map[string]struct{ path, body, field string }{
		"{user}": {"/api/v1/m2m/users", `{"email":"fuzz@example.com","name":"Fuzz"}`, "id"},
		"{org}":  {"/api/v1/m2m/orgs", `{"name":"Fuzz"}`, "id"},
		"{type}": {"/api/v1/rar/types", `{"type":"fuzz","allowedActions":["read"],"schema":{"type":"object"}}`, "type"},
	} {
		rec := f.send(http.MethodPost, c.path, "application/json", c.body, "Bearer "+f.token)
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != http.StatusCreated {
			tb.Fatalf("%s: %d %s", c.path, rec.Code, rec.Body)
		}
		f.ids[key], _ = out[c.field].(string)
	}
	return f
}

func (f *fuzzAPI) send(method, path, contentType, body, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", auth)
	rec := httptest.NewRecorder()
	f.handler.ServeHTTP(rec, req)
	return rec
}

// fuzzRoutes are the routes that read a JSON body; {user}, {org} and
// {type} name records made at the start. Routes whose success waits out a
// cache lease on PostgreSQL (agent and account changes) are left out, to
// keep each input quick; their bodies go through the same decodeJSON.
var fuzzRoutes = []struct{ method, path string }{
	{http.MethodPost, "/api/v1/m2m/users"},
	{http.MethodPatch, "/api/v1/m2m/users/{user}"},
	{http.MethodPost, "/api/v1/m2m/orgs"},
	{http.MethodPatch, "/api/v1/m2m/orgs/{org}"},
	{http.MethodPost, "/api/v1/m2m/orgs/{org}/members"},
	{http.MethodPost, "/api/v1/m2m/roles"},
	{http.MethodPost, "/api/v1/m2m/roles/assign"},
	{http.MethodPost, "/api/v1/rar/types"},
	{http.MethodPost, "/api/v1/rar/validate"},
	{http.MethodPost, "/api/v1/service-accounts"},
	{http.MethodPost, "/api/v1/applications"},
	{http.MethodPost, "/api/v1/agents"},
	{http.MethodPost, "/api/v1/workload-identity/issuers"},
	{http.MethodPost, "/api/v1/workload-identity/mappings"},
	{http.MethodPost, "/api/v1/m2m/users/invite"},
	{http.MethodPost, oauth.TokenPath}, // a JSON token request, as the admin
}

// pgExec runs a statement on db, when there is one.
func pgExec(db *sql.DB, query string, args ...any) (sql.Result, error) {
	if db == nil {
		return nil, nil
	}
	return db.ExecContext(context.Background(), query, args...)
}

var errorCode = regexp.MustCompile(`^[a-z][a-z_]*$`)

// The JSON API's decoders (decodeJSON and what the routes do with what it
// gives them, and the token endpoint's JSON form) driven through real routes
// on a real store of each dialect: no input is a 5xx, every refusal has its
// endpoint's error shape, and both dialects answer every input alike.
func FuzzAPIBodies(f *testing.F) {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	for _, body := range []string{
		`{"email":"a@example.com","name":"A","metadata":{"k":"v","n":1.50}}`,
		`{"name":"Org","slug":"org","metadata":{}}`,
		`{"name":"reader","description":"reads"}`,
		`{"userId":"x","role":"reader"}`,
		`{"type":"t1","allowedActions":["read"],"schema":{"type":"object","properties":{"a":{"$ref":"#"}}}}`,
		`{"type":"t2","schema":{"$ref":"#"}}`,
		`{"authorization_details":[{"type":"fuzz","actions":["read"]}]}`,
		`{"name":"svc","scopes":["users:read"]}`,
		`{"name":"web","redirectUris":["https://a.example/cb"],"webOrigins":["https://a.example"],"mfa":{"policy":"required","factors":["totp"]},"accessTokenTtl":600}`,
		`{"name":"bot","type":"autonomous","capabilities":["read_users"]}`,
		`{"grant_type":"client_credentials","scope":"users:read"}`,
		`{"grant_type":"client_credentials","authorization_details":[{"type":"fuzz","n":1e400}]}`,
		// NUL, in values, names and deep in metadata.
		`{"email":"n@example.com","metadata":{"k":"a\u0000b"}}`,
		`{"name":"O","metadata":{"a":{"b":[{"\u0000":1}]}}}`,
		`{"grant_type":"client_credentials","client_id":"\u0000"}`,
		`{"authorization_details":[{"type":"fuzz","x\u0000":1}]}`,
		// Bytes that are not UTF-8, and unpaired surrogates.
		"{\"email\":\"b\xff@example.com\"}",
		"{\"name\":\"\xc3\x28\",\"metadata\":{\"\xed\xa0\x80\":1}}",
		"{\"grant_type\":\"client_credentials\",\"scope\":\"\xff\"}",
		`{"name":"\ud800x","metadata":{"k":"\udfff"}}`,
		`{"email":"ok\uFFFD@example.com"}`,
		// Deep nesting.
		deep,
		`{"metadata":{"a":` + deep + `}}`,
		`{"authorization_details":` + deep + `}`,
		`{"name":"O","metadata":` + strings.Repeat(`{"a":`, 5000) + `1` + strings.Repeat(`}`, 5000) + `}`,
		// Huge numbers.
		`{"name":"O","metadata":{"n":1e999999999}}`,
		`{"name":"O","metadata":{"n":1e131072,"m":1e-16384}}`,
		`{"name":"O","metadata":{"n":1` + strings.Repeat("0", 140000) + `}}`,
		`{"name":"O","metadata":{"n":-0.` + strings.Repeat("0", 20000) + `1}}`,
		`{"type":"t3","schema":{"maximum":1e131071}}`,
		`{"name":5e999999}`,
		`{"limit":1e400}`,
		// Duplicate names, trailing data and other malformations.
		`{"name":"a","name":"b","metadata":{"k":1,"k":2}}`,
		`{"email":"d@example.com","email":"e@example.com"}`,
		`{"grant_type":"client_credentials","grant_type":"client_credentials"}`,
		`{} {}`, ``, `null`, `[]`, `"x"`, `{"name":}`, `{"unknown":1}`,
	} {
		for r := range fuzzRoutes {
			f.Add(uint8(r), []byte(body))
		}
	}
	urls := dbtest.URLs(f)
	apis := []*fuzzAPI{newFuzzAPI(f, "sqlite", urls["sqlite"])}
	if pg, ok := urls["postgres"]; ok {
		apis = append(apis, newFuzzAPI(f, "postgres", pg))
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		var first *httptest.ResponseRecorder
		for _, api := range apis {
			path, auth := rt.path, "Bearer "+api.token
			for k, v := range api.ids {
				path = strings.ReplaceAll(path, k, v)
			}
			if rt.path == oauth.TokenPath {
				auth = api.basic
			}
			rec := api.send(rt.method, path, "application/json", string(body), auth)
			if rec.Code >= 500 {
				t.Fatalf("%s %s %s on %s: %d %s", rt.method, rt.path, body, api.dialect, rec.Code, rec.Body)
			}
			if rec.Code >= 400 {
				checkErrorShape(t, rt.path == oauth.TokenPath, rec)
			}
			if first == nil {
				first = rec
			} else if rec.Code != first.Code {
				t.Fatalf("%s %s %.200q: %s answered %d %s, sqlite %d %s", rt.method, rt.path, body, api.dialect, rec.Code, rec.Body, first.Code, first.Body)
			}
		}
	})
}

// checkErrorShape: RFC 6749's error and error_description at the token
// endpoint, else the envelope, with a stable snake_case code.
func checkErrorShape(t *testing.T, oauthEndpoint bool, rec *httptest.ResponseRecorder) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("%d: not a JSON object: %s", rec.Code, rec.Body)
	}
	code, _ := m["error"].(string)
	if !errorCode.MatchString(code) {
		t.Fatalf("%d: error code %q: %s", rec.Code, code, rec.Body)
	}
	if oauthEndpoint {
		if d, _ := m["error_description"].(string); d == "" || m["message"] != nil {
			t.Fatalf("%d: not an RFC 6749 error: %s", rec.Code, rec.Body)
		}
		return
	}
	_, hasDetails := m["details"].(map[string]any)
	if msg, _ := m["message"].(string); msg == "" || !hasDetails || len(m) != 3 {
		t.Fatalf("%d: not the envelope: %s", rec.Code, rec.Body)
	}
}
