package handlers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/google/uuid"
	"github.com/gorilla/mux"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	validatorErrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/analytics"
	"github.com/identityd/identityd/extensions/apikeys"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/extensions/ciba"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/extensions/jit"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/extensions/upstream"
	"github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/extensions/webhooks"
	"github.com/identityd/identityd/extensions/workload"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// The OpenAPI document (openapi.json) is written by hand. These tests keep
// it a valid OpenAPI 3.1 document, keep it listing exactly the routes the
// router has, and hold it to what the handlers answer.

// openAPIMethods are the operations an OpenAPI path item may hold.
var openAPIMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// openAPIJSON is the document decoded as plain JSON.
func openAPIJSON(t testing.TB) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatalf("openapi.json is not JSON: %v", err)
	}
	return doc
}

// TestOpenAPIDocument validates the document as OpenAPI 3.1 (libopenapi
// builds the model, every $ref resolved; libopenapi-validator checks it
// against the OpenAPI 3.1 schema), compiles every schema in it as a JSON
// Schema 2020-12, and checks what the project asks of each operation.
func TestOpenAPIDocument(t *testing.T) {
	doc, err := libopenapi.NewDocument(openAPIDocument)
	if err != nil {
		t.Fatalf("libopenapi cannot read openapi.json: %v", err)
	}
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Fatalf("openapi is %q, want 3.1.0", v)
	}
	v, errs := validator.NewValidator(doc) // builds the model: unresolvable references fail here
	if len(errs) > 0 {
		t.Fatalf("building the OpenAPI model: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("openapi.json: %s: %s (line %d, column %d)", e.Message, e.Reason, e.SpecLine, e.SpecCol)
			for _, s := range e.SchemaValidationErrors {
				t.Errorf("  at %s (%s): %s", s.FieldPath, s.KeywordLocation, s.Reason)
			}
		}
	}

	// Every schema, wherever it is, is a JSON Schema 2020-12 (the OpenAPI
	// 3.1 schema does not look inside them).
	tree, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPIDocument))
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://identityd.invalid/openapi.json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(base, tree); err != nil {
		t.Fatal(err)
	}
	pointers := schemaPointers(tree, "")
	if len(pointers) < 100 {
		t.Fatalf("found only %d schemas", len(pointers))
	}
	for _, p := range pointers {
		if _, err := c.Compile(base + "#" + p); err != nil {
			t.Errorf("schema %s: %v", p, err)
		}
	}

	// Each operation: a unique operationId, a tag, a summary, an answer,
	// and a protected one says what it answers a missing or weak token.
	ids := map[string]string{}
	for path, item := range openAPIJSON(t)["paths"].(map[string]any) {
		for method, raw := range item.(map[string]any) {
			if !slices.Contains(openAPIMethods, method) {
				continue
			}
			op := raw.(map[string]any)
			name := strings.ToUpper(method) + " " + path
			id, _ := op["operationId"].(string)
			if id == "" {
				t.Errorf("%s: no operationId", name)
			} else if other, dup := ids[id]; dup {
				t.Errorf("%s: operationId %q is %s's too", name, id, other)
			}
			ids[id] = name
			if tags, _ := op["tags"].([]any); len(tags) != 1 {
				t.Errorf("%s: want one tag, have %v", name, op["tags"])
			}
			if s, _ := op["summary"].(string); s == "" {
				t.Errorf("%s: no summary", name)
			}
			responses, _ := op["responses"].(map[string]any)
			answered := false
			for code := range responses {
				answered = answered || code[0] == '2' || code[0] == '3'
			}
			if !answered {
				t.Errorf("%s: no success response", name)
			}
			security, present := op["security"].([]any)
			if !present {
				t.Errorf("%s: no security requirement (public operations say [])", name)
			}
			for _, req := range security {
				if _, bearer := req.(map[string]any)["bearerAuth"]; bearer && !strings.HasPrefix(path, "/api/v1/oauth/") {
					for _, code := range []string{"401", "403", "429"} {
						if _, ok := responses[code]; !ok {
							t.Errorf("%s: a protected operation without a %s response", name, code)
						}
					}
				}
			}
		}
	}
}

// schemaPointers returns the JSON pointer of every schema in the document:
// the values of "schema" members and of components/schemas. (A schema's
// own subschemas are compiled with it.)
func schemaPointers(v any, at string) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			p := at + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
			switch {
			case at == "/components/schemas":
				out = append(out, p)
				continue
			case k == "schema" && !strings.HasSuffix(at, "/properties"):
				out = append(out, p)
				continue
			case k == "example" || k == "examples":
				continue // values, not schemas
			}
			out = append(out, schemaPointers(child, p)...)
		}
	case []any:
		for i, child := range v {
			out = append(out, schemaPointers(child, at+"/"+strconv.Itoa(i))...)
		}
	}
	sort.Strings(out)
	return out
}

// routeVar is a gorilla/mux path variable with its pattern, {name:pattern}.
var routeVar = regexp.MustCompile(`\{([^{}:]+):[^{}]*\}`)

// TestOpenAPICoversRoutes walks the router New builds: every route and
// method it registers must be in openapi.json, and every path and method
// of openapi.json must be registered. HEAD (answered as GET where
// registered) is left out. A prefix route (PathPrefix) stands for the
// paths under it: each documented path under it must document its methods
// (the sign-in pages' static assets have none documented). When this
// fails after you added a route, document it in openapi.json (and
// docs/api.md).
func TestOpenAPICoversRoutes(t *testing.T) {
	o, _ := openAPIOptions(t)
	_, router := newRouter(o)
	registered := map[string]bool{}   // "method /path"
	prefixes := map[string][]string{} // path prefix: its methods
	err := router.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil {
			return nil // a route without a path (none today)
		}
		tpl = routeVar.ReplaceAllString(tpl, "{$1}")
		methods, err := route.GetMethods()
		if err != nil {
			t.Errorf("route %s matches every method; register its methods", tpl)
			return nil
		}
		re, err := route.GetPathRegexp()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range methods {
			switch {
			case m == http.MethodHead:
			case !strings.HasSuffix(re, "$"): // PathPrefix
				prefixes[tpl] = append(prefixes[tpl], strings.ToLower(m))
			default:
				registered[strings.ToLower(m)+" "+tpl] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(registered) < 90 {
		t.Fatalf("the walk found only %d routes", len(registered))
	}
	documented := map[string]bool{}
	for path, item := range openAPIJSON(t)["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			if slices.Contains(openAPIMethods, method) && method != "head" {
				documented[method+" "+path] = true
			}
		}
	}
	covered := func(route string) bool { // by a prefix route
		method, path, _ := strings.Cut(route, " ")
		for prefix, methods := range prefixes {
			if strings.HasPrefix(path, prefix) && slices.Contains(methods, method) {
				return true
			}
		}
		return false
	}
	for prefix, methods := range prefixes {
		for _, m := range methods {
			for _, d := range sortedKeys(documented) {
				method, path, _ := strings.Cut(d, " ")
				if strings.HasPrefix(path, prefix) && method != m && !documented[m+" "+path] {
					t.Errorf("the router answers %s on every path under %s; document it on %s", strings.ToUpper(m), prefix, path)
				}
			}
		}
	}
	for _, r := range sortedKeys(registered) {
		if !documented[r] {
			t.Errorf("the router has %s; document it in handlers/openapi.json and docs/api.md", upperMethod(r))
		}
	}
	for _, d := range sortedKeys(documented) {
		if !registered[d] && !covered(d) {
			t.Errorf("openapi.json documents %s, which the router does not have", upperMethod(d))
		}
	}
}

// upperMethod writes "get /x" as "GET /x".
func upperMethod(route string) string {
	method, path, _ := strings.Cut(route, " ")
	return strings.ToUpper(method) + " " + path
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIServed: GET and HEAD answer the embedded document, public and
// cacheable, and a client holding it revalidates with If-None-Match.
func TestOpenAPIServed(t *testing.T) {
	o, _ := openAPIOptions(t)
	h := New(o)
	serve := func(method string, header http.Header) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/api/v1/openapi.json", nil)
		for k, v := range header {
			req.Header[k] = v
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	get := serve(http.MethodGet, nil)
	if get.Code != http.StatusOK || !bytes.Equal(get.Body.Bytes(), openAPIDocument) {
		t.Fatalf("GET: %d, %d bytes", get.Code, get.Body.Len())
	}
	for name, want := range map[string]string{"Content-Type": "application/json", "Cache-Control": "public, max-age=300", "ETag": openAPIETag} {
		if got := get.Header().Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	head := serve(http.MethodHead, nil)
	if head.Code != http.StatusOK || head.Body.Len() != 0 || head.Header().Get("Content-Length") != strconv.Itoa(len(openAPIDocument)) {
		t.Errorf("HEAD: %d, %d bytes, Content-Length %q", head.Code, head.Body.Len(), head.Header().Get("Content-Length"))
	}
	if rec := serve(http.MethodGet, http.Header{"If-None-Match": {openAPIETag}}); rec.Code != http.StatusNotModified || rec.Body.Len() != 0 {
		t.Errorf("If-None-Match: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	if rec := serve(http.MethodGet, http.Header{"If-None-Match": {`"another"`}}); rec.Code != http.StatusOK {
		t.Errorf("If-None-Match of another version: %d", rec.Code)
	}
	if rec := serve(http.MethodPost, nil); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", rec.Code)
	}
}

// openAPIMails keeps the messages the outbox sends.
type openAPIMails struct {
	mu   sync.Mutex
	sent []mail.Message
}

func (m *openAPIMails) Send(_ context.Context, msg mail.Message) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = append(m.sent, msg)
	return nil
}

func (m *openAPIMails) last() (mail.Message, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.sent) == 0 {
		return mail.Message{}, false
	}
	return m.sent[len(m.sent)-1], true
}

const openAPIAdmin, openAPIAdminSecret = "openapi-admin", "an admin secret for the OpenAPI tests"

// openAPIOptions wires the whole API as identityd serves it, on a fresh
// SQLite store, with a bootstrap admin holding every scope.
func openAPIOptions(t testing.TB) (Options, *openAPIMails) {
	t.Helper()
	o, mails, _ := openAPIOptionsOn(t, dbtest.URLs(t)["sqlite"], "http://identityd.test")
	return o, mails
}

// openAPIOptionsOn is openAPIOptions on the database at dbURL (either
// dialect), naming itself issuer, with its store.
func openAPIOptionsOn(t testing.TB, dbURL, issuer string) (Options, *openAPIMails, *persistence.Store) {
	t.Helper()
	ctx := context.Background()
	store := dbtest.Store(t, dbURL)
	secret := []byte("a system secret for the OpenAPI tests")
	keys, err := oauth.LoadKeys(ctx, store, secret)
	if err != nil {
		t.Fatal(err)
	}
	details, federation := rar.New(store), workload.New(store)
	provider := oauth.NewProvider(oauth.Config{Issuer: issuer, AccessTokenTTL: time.Hour, SystemSecret: secret,
		Details: details, Federation: federation, Delegation: agents.Delegation{}, MaxDelegation: 5}, store, keys)
	accounts := serviceaccounts.New(store, provider.Hasher)
	if _, err := accounts.EnsureAdmin(ctx, openAPIAdmin, openAPIAdminSecret); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mails := &openAPIMails{}
	outbox, err := mail.NewOutbox(store, mails, oauth.DeriveKey(secret, "mail outbox"), log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go outbox.Run(runCtx)
	sign, err := signin.New(store, secret, signin.Config{Idle: time.Hour, Max: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keys2, err := passkeys.New(store, passkeys.Config{Issuer: issuer, Outbox: outbox})
	if err != nil {
		t.Fatal(err)
	}
	approvals := hitl.New(store)
	store.RouteWebhooks(webhooks.Routes())
	hooks := webhooks.New(store, secret, webhooks.Config{})
	return Options{Passkeys: keys2, Provider: provider, ServiceAccounts: accounts, Applications: applications.New(store, provider.Hasher),
		Agents: agents.New(store, provider.Hasher), RAR: details, Workload: federation, Directory: directory.New(store),
		Invites: invites.New(store, secret, outbox, issuer, time.Hour), SignIn: sign, MFA: mfa.New(store, secret, mfa.Config{Issuer: issuer}),
		Reset: reset.New(store, secret, reset.Config{Outbox: outbox, Issuer: issuer}), CSRF: pages.NewCSRF(oauth.DeriveKey(secret, pages.PurposeCSRF)),
		Health: store.Health, Units: store.InTx, Logger: log, Metrics: NewMetrics(), RateLimits: DefaultRateLimits(),
		Upstream: upstream.New(store, sign, secret, upstream.Config{Issuer: issuer}), HITL: approvals, JIT: jit.New(store, approvals),
		CIBA:          ciba.New(store, ciba.Config{Hasher: oauth.NewHasher(secret, ciba.PurposeAuthReqID), Details: details, DefaultLifetime: time.Hour, MaxLifetime: 30 * 24 * time.Hour}),
		AccountSealer: oauth.NewSealer(secret, PurposeAccountState), Webhooks: hooks,
		Authz: dbtest.Engine(t, dbURL, store), Analytics: analytics.New(store), APIKeys: apikeys.New(store, secret), Usage: usage.NewCounter(store)}, mails, store
}

// openAPIClient sends requests to the handler and checks each exchange
// against the document.
type openAPIClient struct {
	t *testing.T
	h http.Handler
	v validator.Validator
}

// exchange is one request and the answer expected.
type exchange struct {
	method, target string
	auth           string // the Authorization header
	contentType    string
	body           string
	header         http.Header
	status         int  // expected
	invalid        bool // the request breaks the document on purpose: check the answer only
}

// do sends the request, insists on its status, and validates the request
// (unless invalid) and the response against the document. It returns the
// decoded JSON body (nil for none).
func (c *openAPIClient) do(x exchange) map[string]any {
	c.t.Helper()
	newRequest := func() *http.Request {
		var body io.Reader
		if x.body != "" {
			body = strings.NewReader(x.body)
		}
		req := httptest.NewRequest(x.method, x.target, body)
		if x.auth != "" {
			req.Header.Set("Authorization", x.auth)
		}
		if x.contentType != "" {
			req.Header.Set("Content-Type", x.contentType)
		}
		for k, v := range x.header {
			req.Header[k] = v
		}
		return req
	}
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, newRequest())
	if rec.Code != x.status {
		c.t.Fatalf("%s %s: %d %s, want %d", x.method, x.target, rec.Code, rec.Body, x.status)
	}
	resp := rec.Result()
	resp.Body = io.NopCloser(bytes.NewReader(rec.Body.Bytes()))
	check := newRequest() // the validator reads the body again
	var ok bool
	var errs []*validatorErrors.ValidationError
	if x.invalid {
		ok, errs = c.v.ValidateHttpResponse(check, resp)
	} else {
		ok, errs = c.v.ValidateHttpRequestResponse(check, resp)
	}
	if !ok {
		for _, e := range errs {
			c.t.Errorf("%s %s answered %d: %s: %s", x.method, x.target, rec.Code, e.Message, e.Reason)
			for _, f := range e.SchemaValidationErrors {
				c.t.Errorf("    %s: %s", f.FieldPath, f.Reason)
			}
		}
		c.t.Logf("the answer: %s", rec.Body)
	}
	var out map[string]any
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && rec.Body.Len() > 0 {
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			c.t.Fatalf("%s %s: %v", x.method, x.target, err)
		}
	}
	return out
}

const jsonMedia = "application/json"

// TestOpenAPIAnswers drives the API through its main routes, successes and
// refusals, and checks every request and answer against the document: the
// schemas must describe what the handlers really send.
func TestOpenAPIAnswers(t *testing.T) {
	o, mails := openAPIOptions(t)
	doc, err := libopenapi.NewDocument(openAPIDocument)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	c := &openAPIClient{t: t, h: New(o), v: v}
	basic := func(id, secret string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(url.QueryEscape(id)+":"+url.QueryEscape(secret)))
	}
	token := func(auth, form string) string {
		t.Helper()
		out := c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: auth, contentType: formType, body: form, status: 200})
		return "Bearer " + out["access_token"].(string)
	}
	admin := token(basic(openAPIAdmin, openAPIAdminSecret), "grant_type=client_credentials")
	get := func(target, auth string, status int) map[string]any {
		t.Helper()
		return c.do(exchange{method: "GET", target: target, auth: auth, status: status})
	}
	send := func(method, target, auth, body string, status int) map[string]any {
		t.Helper()
		ct := jsonMedia
		if body == "" {
			ct = ""
		}
		return c.do(exchange{method: method, target: target, auth: auth, contentType: ct, body: body, status: status})
	}
	str := func(m map[string]any, k string) string {
		t.Helper()
		s, ok := m[k].(string)
		if !ok {
			t.Fatalf("no %q in %v", k, m)
		}
		return s
	}

	// Public reads.
	get("/health", "", 200)
	get("/.well-known/openid-configuration", "", 200)
	get("/.well-known/oauth-authorization-server", "", 200)
	get("/.well-known/jwks.json", "", 200)
	get("/api/v1/openapi.json", "", 200)
	get("/metrics", "", 200)
	get("/api/v1/invites/no-such-token", "", 404)
	get("/invites/no-such-token", "", 404)

	// OAuth endpoints: JSON and form bodies, refusals.
	c.do(exchange{method: "POST", target: "/oauth/token", contentType: jsonMedia, status: 200,
		body: `{"grant_type":"client_credentials","client_id":"` + openAPIAdmin + `","client_secret":"` + openAPIAdminSecret + `","scope":"users:read"}`})
	c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic(openAPIAdmin, "wrong"), contentType: formType, body: "grant_type=client_credentials", status: 401})
	c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: formType, body: "grant_type=password", status: 400, invalid: true})
	c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: formType, body: "grant_type=client_credentials&scope=nope", status: 400})
	c.do(exchange{method: "POST", target: "/api/v1/oauth/introspect", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: formType,
		body: "token=" + strings.TrimPrefix(admin, "Bearer "), status: 200})
	c.do(exchange{method: "POST", target: "/api/v1/oauth/introspect", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: formType, body: "token=unknown", status: 200})
	c.do(exchange{method: "POST", target: "/api/v1/oauth/introspect", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: formType, body: "scope=x", status: 400, invalid: true})
	spare := token(basic(openAPIAdmin, openAPIAdminSecret), "grant_type=client_credentials&scope=users:read")
	c.do(exchange{method: "POST", target: "/api/v1/oauth/revoke", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: formType,
		body: "token=" + strings.TrimPrefix(spare, "Bearer "), status: 200})
	c.do(exchange{method: "GET", target: "/api/v1/oauth/userinfo", status: 401, invalid: true})
	get("/api/v1/oauth/userinfo", admin, 401) // not a person's token

	// The envelope's refusals.
	c.do(exchange{method: "GET", target: "/api/v1/service-accounts", status: 401, invalid: true})
	get("/api/v1/service-accounts", "Bearer not-a-token", 401)
	c.do(exchange{method: "GET", target: "/api/v1/service-accounts?limit=0", auth: admin, status: 400, invalid: true})
	c.do(exchange{method: "POST", target: "/api/v1/service-accounts", auth: admin, contentType: jsonMedia, body: `{"name":`, status: 400, invalid: true})
	c.do(exchange{method: "POST", target: "/api/v1/service-accounts", auth: admin, contentType: "text/plain", body: `{"name":"x"}`, status: 415, invalid: true})
	c.do(exchange{method: "POST", target: "/api/v1/service-accounts", auth: admin, contentType: jsonMedia, body: `{"name":"x","scope":["a"]}`, status: 400, invalid: true})

	// Service accounts.
	sa := send("POST", "/api/v1/service-accounts", admin, `{"name":"billing","description":"Billing","scopes":["users:read","users:invite","orgs:read"],"redirectUris":["https://billing.example/callback"]}`, 201)
	saID := str(sa, "id")
	get("/api/v1/service-accounts?limit=10&offset=0", admin, 200)
	get("/api/v1/service-accounts/"+saID, admin, 200)
	send("PATCH", "/api/v1/service-accounts/"+saID, admin, `{"description":"Billing backend"}`, 200)
	rotated := send("POST", "/api/v1/service-accounts/"+saID+"/rotate", admin, "", 200)
	billing := token(basic(str(sa, "clientId"), str(rotated, "clientSecret")), "grant_type=client_credentials")
	get("/api/v1/service-accounts", billing, 403)
	get("/api/v1/service-accounts/not-a-uuid", admin, 404)

	// Applications and keys.
	app := send("POST", "/api/v1/applications", admin, `{"name":"Acme Notes","redirectUris":["https://notes.example/callback"],"mfa":{"policy":"optional","factors":["totp"]},"accessTokenTtl":900}`, 201)
	appID := str(app, "id")
	get("/api/v1/applications", admin, 200)
	get("/api/v1/applications/"+appID, admin, 200)
	send("PATCH", "/api/v1/applications/"+appID, admin, `{"accessTokenTtl":null,"webOrigins":["https://notes.example"]}`, 200)
	appSecret := str(send("POST", "/api/v1/applications/"+appID+"/rotate", admin, "", 200), "clientSecret")
	public := send("POST", "/api/v1/applications", admin, `{"name":"Acme Mobile","type":"public","redirectUris":["com.example.notes:/callback"]}`, 201)
	send("POST", "/api/v1/applications/"+str(public, "id")+"/rotate", admin, "", 409)
	send("PATCH", "/api/v1/applications/"+appID, admin, `{"type":"public"}`, 400)
	send("DELETE", "/api/v1/applications/"+str(public, "id"), admin, "", 204)
	get("/api/v1/keys", admin, 200)
	send("POST", "/api/v1/keys/rotate", admin, "", 200)

	// Agents, their token, their intent trail.
	agent := send("POST", "/api/v1/agents", admin, `{"name":"triage","type":"autonomous","description":"Ticket triage","capabilities":["read_users","read_tickets"]}`, 201)
	agentID := str(agent, "id")
	get("/api/v1/agents?status=active&trustLevel=sandboxed&type=autonomous", admin, 200)
	get("/api/v1/agents/"+agentID, admin, 200)
	send("PATCH", "/api/v1/agents/"+agentID, admin, `{"description":"Triages tickets"}`, 200)
	get("/api/v1/agents/"+agentID+"/capabilities", admin, 200)
	send("PUT", "/api/v1/agents/"+agentID+"/capabilities", admin, `{"capabilities":["read_users","read_tickets","write_users"]}`, 200)
	send("POST", "/api/v1/agents/"+agentID+"/trust", admin, `{"trustLevel":"registered","reason":"reviewed"}`, 200)
	send("POST", "/api/v1/agents/"+agentID+"/trust", admin, `{"trustLevel":"privileged","reason":"hurry"}`, 409)
	agentToken := c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic(str(agent, "clientId"), str(agent, "clientSecret")),
		contentType: formType, body: "grant_type=client_credentials", status: 200,
		header: http.Header{"X-Service-Task-Id": {"task-1"}, "X-Service-Chain-Id": {"chain-1"}, "X-Service-Intent-Depth": {"0"}}})
	if agentToken["agent_id"] != agentID || agentToken["trust_level"] != "registered" {
		t.Fatalf("agent token: %v", agentToken)
	}
	agentBearer := "Bearer " + agentToken["access_token"].(string)
	c.do(exchange{method: "GET", target: "/api/v1/m2m/whoami", auth: agentBearer, status: 200,
		header: http.Header{"X-Service-Task-Id": {"task-2"}, "X-Service-Chain-Id": {"chain-1"}, "X-Service-Parent-Task-Id": {"task-1"},
			"X-Service-Intent-Depth": {"1"}, "X-Service-Intent-Action": {"read_profile"}, "X-Service-Intent-Initiator": {"user:ada"}, "X-Service-Intent-Reason": {"a ticket"}}})
	get("/api/v1/m2m/orgs", agentBearer, 403) // no orgs:read
	c.do(exchange{method: "GET", target: "/api/v1/m2m/whoami", auth: agentBearer, header: http.Header{"X-Service-Intent-Depth": {"deep"}}, status: 400, invalid: true})
	get("/api/v1/agents/"+agentID+"/audit?action=api_call,token_issued&from=2020-01-01&limit=5", admin, 200)
	get("/api/v1/audit/intent/tasks/task-2", admin, 200)
	get("/api/v1/audit/intent/chains/chain-1?limit=10", admin, 200)
	get("/api/v1/audit/intent/chains/chain-1/trace", admin, 200)
	get("/api/v1/audit/intent/search?agentClientId="+str(agent, "clientId")+"&from=2020-01-01&to=2999-12-31", admin, 200)
	send("POST", "/api/v1/agents/"+agentID+"/kill", admin, `{"reason":"suspicious"}`, 200)
	get("/api/v1/m2m/whoami", agentBearer, 401)
	send("POST", "/api/v1/agents/"+agentID+"/kill", admin, `{"reason":"again"}`, 409)
	send("POST", "/api/v1/agents/"+agentID+"/recover", admin, "", 200)
	send("POST", "/api/v1/agents/"+agentID+"/recover", admin, `{"reason":"cleared"}`, 409)
	get("/api/v1/agents/"+agentID+"/kill-events", admin, 200)

	// Rich authorization requests.
	send("POST", "/api/v1/rar/types", admin, `{"type":"payment_initiation","displayName":"Payment","allowedActions":["initiate","status"],"allowedLocations":["https://bank.example/payments"],
		"readOnlyActions":["status"],"requiredCapabilities":["read_users"],"schema":{"type":"object","required":["amount"],"properties":{"amount":{"type":"string"}}}}`, 201)
	send("POST", "/api/v1/rar/types", admin, `{"type":"payment_initiation","schema":{"type":"object"}}`, 409)
	get("/api/v1/rar/types", admin, 200)
	get("/api/v1/rar/types/payment_initiation", billing, 200)
	send("PUT", "/api/v1/rar/types/payment_initiation", admin, `{"allowedActions":["initiate","status"],"schema":{"type":"object"}}`, 200)
	send("POST", "/api/v1/rar/validate", billing, `{"authorization_details":[{"type":"payment_initiation","actions":["initiate"]}]}`, 200)
	send("POST", "/api/v1/rar/validate", billing, `{"authorization_details":[{"type":"unknown"}]}`, 200)
	c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic(openAPIAdmin, openAPIAdminSecret), contentType: jsonMedia, status: 200,
		body: `{"grant_type":"client_credentials","scope":"users:read","authorization_details":[{"type":"payment_initiation","actions":["status"]}]}`})
	get("/.well-known/openid-configuration", "", 200) // now with authorization_details_types_supported
	send("DELETE", "/api/v1/rar/types/payment_initiation", admin, "", 204)

	// Workload identity.
	issuer := send("POST", "/api/v1/workload-identity/issuers", admin, `{"name":"prod","issuerUrl":"https://k8s.example","jwksUri":"https://k8s.example/openid/v1/jwks",
		"platform":"kubernetes","allowedAudiences":["identityd"],"allowedSubjects":["system:serviceaccount:agents:*"]}`, 201)
	issuerID := str(issuer, "id")
	get("/api/v1/workload-identity/issuers", admin, 200)
	get("/api/v1/workload-identity/issuers/"+issuerID, admin, 200)
	send("PATCH", "/api/v1/workload-identity/issuers/"+issuerID, admin, `{"maxTokenAgeSeconds":600}`, 200)
	mapping := send("POST", "/api/v1/workload-identity/mappings", admin, `{"issuerId":"`+issuerID+`","agentClientId":"`+str(agent, "clientId")+`","subjectPattern":"system:serviceaccount:agents:triage","scopes":["users:read"]}`, 201)
	get("/api/v1/workload-identity/mappings?issuerId="+issuerID, admin, 200)
	get("/api/v1/workload-identity/mappings/"+str(mapping, "id"), admin, 200)
	send("DELETE", "/api/v1/workload-identity/issuers/"+issuerID, admin, "", 409)
	send("DELETE", "/api/v1/workload-identity/mappings/"+str(mapping, "id"), admin, "", 204)
	send("DELETE", "/api/v1/workload-identity/issuers/"+issuerID, admin, "", 204)

	// The directory.
	get("/api/v1/m2m/whoami", admin, 200)
	user := send("POST", "/api/v1/m2m/users", admin, `{"email":"ada@example.com","name":"Ada Lovelace","firstName":"Ada","lastName":"Lovelace","metadata":{"team":"engines"},"password":"correct horse battery"}`, 201)
	userID := str(user, "id")
	send("POST", "/api/v1/m2m/users", admin, `{"email":"ADA@example.com"}`, 409)
	get("/api/v1/m2m/users?q=ada&status=active", admin, 200)
	get("/api/v1/m2m/users/"+userID, admin, 200)
	send("PATCH", "/api/v1/m2m/users/"+userID, admin, `{"emailVerified":true}`, 200)
	get("/api/v1/m2m/users/"+userID+"/sessions", admin, 200)
	send("DELETE", "/api/v1/m2m/users/"+userID+"/sessions", admin, "", 200)
	org := send("POST", "/api/v1/m2m/orgs", admin, `{"name":"Analytical Engines"}`, 201)
	orgID := str(org, "id")
	get("/api/v1/m2m/orgs", admin, 200)
	get("/api/v1/m2m/orgs/"+orgID, admin, 200)
	send("PATCH", "/api/v1/m2m/orgs/"+orgID, admin, `{"metadata":{"tier":"gold"}}`, 200)
	send("POST", "/api/v1/m2m/orgs/"+orgID+"/members", admin, `{"userId":"`+userID+`","role":"owner"}`, 201)
	send("POST", "/api/v1/m2m/orgs/"+orgID+"/members", admin, `{"userId":"`+userID+`"}`, 409)
	get("/api/v1/m2m/orgs/"+orgID+"/members", admin, 200)
	send("DELETE", "/api/v1/m2m/orgs/"+orgID+"/members/"+userID, admin, "", 204)
	send("POST", "/api/v1/m2m/roles", admin, `{"name":"support","description":"Support staff"}`, 201)
	get("/api/v1/m2m/roles", admin, 200)
	send("POST", "/api/v1/m2m/roles/assign", admin, `{"userId":"`+userID+`","role":"support"}`, 200)
	send("POST", "/api/v1/m2m/roles/assign", admin, `{"userId":"`+userID+`","role":"nobody"}`, 404)
	get("/api/v1/m2m/users/"+userID+"/roles", admin, 200)
	send("PUT", "/api/v1/m2m/users/"+userID+"/console-admin", admin, "", 200)
	send("DELETE", "/api/v1/m2m/users/"+userID+"/console-admin", admin, "", 200)
	send("PUT", "/api/v1/m2m/users/"+uuid.NewString()+"/console-admin", admin, "", 404)
	send("DELETE", "/api/v1/m2m/roles/remove", admin, `{"userId":"`+userID+`","role":"support"}`, 200)
	send("DELETE", "/api/v1/m2m/roles/support", admin, "", 204)
	send("DELETE", "/api/v1/m2m/orgs/"+orgID, admin, "", 204)

	// Invites: made and consumed by the service account.
	invite := send("POST", "/api/v1/m2m/users/invite", billing, `{"email":"grace@example.com","redirect_uri":"https://billing.example/callback","app_name":"Billing","first_name":"Grace","metadata":{"plan":"pro"}}`, 201)
	send("POST", "/api/v1/m2m/users/invite", admin, `{"email":"grace@example.com","redirect_uri":"https://billing.example/callback"}`, 400) // not the admin's redirect URI
	var link string
	for deadline := time.Now().Add(5 * time.Second); link == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m, ok := mails.last(); ok {
			link = regexp.MustCompile(`/invites/[A-Za-z0-9_-]+`).FindString(m.Text)
		}
	}
	if link == "" {
		t.Fatal("the invite's e-mail never came")
	}
	inviteToken := strings.TrimPrefix(link, "/invites/")
	get("/api/v1/invites/"+inviteToken, "", 200)
	get(link, "", 303)
	send("POST", "/api/v1/m2m/invites/"+inviteToken+"/accept", admin, "", 403)
	accepted := send("POST", "/api/v1/m2m/invites/"+inviteToken+"/accept", billing, "", 200)
	if accepted["invite_id"] != invite["invite_id"] {
		t.Fatalf("accepted %v", accepted)
	}
	send("POST", "/api/v1/m2m/invites/"+inviteToken+"/accept", billing, "", 404)

	// The embedded sign-in API: a person signs in with a password from the
	// application's page, its backend exchanges the code.
	appClient, origin := str(app, "clientId"), http.Header{"Origin": {"https://notes.example"}}
	verifier := oauth.NewSecret()
	sum := sha256.Sum256([]byte(verifier))
	challenge := base64.RawURLEncoding.EncodeToString(sum[:])
	embedded := func(path, body string, header http.Header, status int) map[string]any {
		t.Helper()
		return c.do(exchange{method: "POST", target: "/api/v1/embedded/auth" + path, contentType: jsonMedia, body: body, header: header, status: status})
	}
	embedded("/check-email", `{"clientId":"`+appClient+`","email":"ada@example.com"}`, origin, 200)
	embedded("/check-email", `{"clientId":"`+appClient+`","email":"ada@example.com"}`, http.Header{"Origin": {"https://elsewhere.example"}}, 403)
	embedded("/check-email", `{"clientId":"app_nobody","email":"ada@example.com"}`, nil, 400)
	embedded("/password", `{"clientId":"`+appClient+`","email":"ada@example.com","password":"wrong password","codeChallenge":"`+challenge+`","codeChallengeMethod":"S256"}`, origin, 401)
	signedIn := embedded("/password", `{"clientId":"`+appClient+`","email":"ada@example.com","password":"correct horse battery","codeChallenge":"`+challenge+`","codeChallengeMethod":"S256"}`, origin, 200)
	tokens := embedded("/code/exchange", `{"code":"`+str(signedIn, "code")+`","client_id":"`+appClient+`","client_secret":"`+appSecret+`","code_verifier":"`+verifier+`"}`, nil, 200)
	c.do(exchange{method: "OPTIONS", target: "/api/v1/embedded/auth/password", header: origin, status: 204})
	person := "Bearer " + str(tokens, "access_token")
	get("/api/v1/oauth/userinfo", person, 200)
	get("/api/v1/m2m/whoami", person, 200)

	// A person's second factor, and a machine's token refused there.
	send("POST", "/api/v1/auth/mfa/totp/enroll", person, "", 200)
	send("POST", "/api/v1/auth/mfa/totp/confirm", person, `{"code":"000000"}`, 400)
	send("DELETE", "/api/v1/auth/mfa/totp", person, `{"code":"000000"}`, 404)
	send("POST", "/api/v1/auth/mfa/totp/enroll", admin, "", 403)

	// Passkeys: registered with the person's token, listed, renamed, a
	// sign-in (the API's and the embedded one's), deleted.
	send("PATCH", "/api/v1/applications/"+appID, admin, `{"rpId":"notes.example","signInMethods":["password","otp","magic-link","passkey"]}`, 200)
	rp := virtualwebauthn.RelyingParty{ID: "notes.example", Name: "Acme Notes", Origin: "https://notes.example"}
	authenticator := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(userID)})
	cred := newPasskeyCredential()
	passkey := func(method, path, auth, body string, status int) map[string]any {
		t.Helper()
		return c.do(exchange{method: method, target: "/api/v1/auth/webauthn" + path, auth: auth, contentType: jsonMedia, body: body, header: origin, status: status})
	}
	optionsOf := func(out map[string]any) string {
		raw, _ := json.Marshal(out["options"])
		return string(raw)
	}
	begun := passkey("POST", "/register/begin", person, `{"clientId":"`+appClient+`","name":"Laptop"}`, 200)
	creation, err := virtualwebauthn.ParseAttestationOptions(optionsOf(begun))
	if err != nil {
		t.Fatal(err)
	}
	registered := passkey("POST", "/register/finish", person, `{"clientId":"`+appClient+`","credential":`+virtualwebauthn.CreateAttestationResponse(rp, authenticator, cred, *creation)+`}`, 200)
	passkey("POST", "/register/finish", person, `{"clientId":"`+appClient+`","credential":`+virtualwebauthn.CreateAttestationResponse(rp, authenticator, cred, *creation)+`}`, 400)
	passkey("POST", "/register/begin", admin, `{"clientId":"`+appClient+`"}`, 403)
	c.do(exchange{method: "GET", target: "/api/v1/auth/webauthn/credentials", auth: person, header: origin, status: 200})
	passkey("PUT", "/credentials/"+str(registered, "id"), person, `{"name":"Office"}`, 200)
	passkey("PUT", "/credentials/"+uuid.NewString(), person, `{"name":"Office"}`, 404)
	request, err := virtualwebauthn.ParseAssertionOptions(optionsOf(passkey("POST", "/authenticate/begin", "", `{"clientId":"`+appClient+`"}`, 200)))
	if err != nil {
		t.Fatal(err)
	}
	cred.Counter = 1
	passkey("POST", "/authenticate/finish", "", `{"clientId":"`+appClient+`","credential":`+virtualwebauthn.CreateAssertionResponse(rp, authenticator, cred, *request)+`}`, 200)
	passkey("POST", "/authenticate/finish", "", `{"clientId":"`+appClient+`","credential":`+virtualwebauthn.CreateAssertionResponse(rp, authenticator, cred, *request)+`}`, 400)
	c.do(exchange{method: "OPTIONS", target: "/api/v1/auth/webauthn/credentials", header: origin, status: 204})
	request, err = virtualwebauthn.ParseAssertionOptions(optionsOf(embedded("/passkey/begin", `{"clientId":"`+appClient+`","email":"ada@example.com"}`, origin, 200)))
	if err != nil {
		t.Fatal(err)
	}
	cred.Counter = 2
	embedded("/passkey/finish", `{"clientId":"`+appClient+`","credential":`+virtualwebauthn.CreateAssertionResponse(rp, authenticator, cred, *request)+`,"codeChallenge":"`+challenge+`","codeChallengeMethod":"S256"}`, origin, 200)
	embedded("/passkey/finish", `{"clientId":"`+appClient+`","credential":`+virtualwebauthn.CreateAssertionResponse(rp, authenticator, cred, *request)+`,"codeChallenge":"`+challenge+`","codeChallengeMethod":"S256"}`, origin, 400)
	passkey("DELETE", "/credentials/"+str(registered, "id"), person, "", 204)
	// A replayed code is refused, and revokes what it issued (RFC 6749 §4.1.2).
	embedded("/code/exchange", `{"code":"`+str(signedIn, "code")+`","client_id":"`+appClient+`","client_secret":"`+appSecret+`","code_verifier":"`+verifier+`"}`, nil, 400)
	get("/api/v1/oauth/userinfo", person, 401)

	// Webhooks (no dispatcher runs here: messages stay pending).
	send("POST", "/api/v1/webhooks", admin, `{"url":"http://hooks.example/in","eventTypes":["user.deleted"]}`, 400)
	send("POST", "/api/v1/webhooks", admin, `{"url":"https://10.0.0.1/in","eventTypes":["user.deleted"]}`, 400)
	c.do(exchange{method: "POST", target: "/api/v1/webhooks", auth: admin, contentType: jsonMedia, body: `{"url":"https://hooks.example/in","eventTypes":["user.nope"]}`, status: 400, invalid: true})
	hook := send("POST", "/api/v1/webhooks", admin, `{"url":"https://hooks.example/in","description":"CRM","eventTypes":["user.deleted","user.created"]}`, 201)
	hookID := str(hook, "id")
	get("/api/v1/webhooks?limit=10", admin, 200)
	get("/api/v1/webhooks/event-types", admin, 200)
	get("/api/v1/webhooks/"+hookID, admin, 200)
	get("/api/v1/webhooks/"+uuid.NewString(), admin, 404)
	send("PATCH", "/api/v1/webhooks/"+hookID, admin, `{"enabled":false}`, 200)
	send("POST", "/api/v1/webhooks/"+hookID+"/test", admin, "", 409)
	send("PATCH", "/api/v1/webhooks/"+hookID, admin, `{"enabled":true,"description":"CRM sync"}`, 200)
	send("POST", "/api/v1/webhooks/"+hookID+"/rotate-secret", admin, "", 200)
	probe := send("POST", "/api/v1/webhooks/"+hookID+"/test", admin, "", 202)
	get("/api/v1/webhooks/"+hookID+"/deliveries?status=pending", admin, 200)
	get("/api/v1/webhooks/"+hookID+"/deliveries?status=lost", admin, 400)
	get("/api/v1/webhooks/"+hookID+"/deliveries/"+str(probe, "id"), admin, 200)
	send("POST", "/api/v1/webhooks/"+hookID+"/deliveries/"+str(probe, "id")+"/redeliver", admin, "", 202)
	send("POST", "/api/v1/webhooks/"+hookID+"/deliveries/"+uuid.NewString()+"/redeliver", admin, "", 404)

	// Deletions.
	send("DELETE", "/api/v1/m2m/users/"+userID, admin, "", 204)
	send("DELETE", "/api/v1/agents/"+agentID, admin, "", 204)
	send("DELETE", "/api/v1/applications/"+appID, admin, "", 204)
	send("DELETE", "/api/v1/service-accounts/"+saID, admin, "", 204)
	get("/api/v1/service-accounts/"+saID, admin, 404)
	if list := get("/api/v1/webhooks/"+hookID+"/deliveries", admin, 200); list["total"] != float64(2) {
		t.Fatalf("the user's deletion was not queued for the webhook: %v", list)
	}
	send("DELETE", "/api/v1/webhooks/"+hookID, admin, "", 204)
}
