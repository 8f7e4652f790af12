package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Token exchange (RFC 8693) over real HTTP, in both of its forms:
//
//   - workload identity federation: a Kubernetes-style platform issuer runs
//     inside the test (keys, a JWKS on 127.0.0.1), its service-account
//     tokens are exchanged, without a client secret, for tokens of the
//     agent their subject maps to;
//   - agent-to-agent delegation: a verified agent holding a2a_exchange
//     exchanges another principal's identityd token for one of its own,
//     whose act claim says who acts for whom.
//
// With PostgreSQL every change to an agent or issuer waits out the cache
// lease, so the scenarios make few changes; the three tests run in
// parallel, their subtests in order.

const (
	issuersPath     = "/api/v1/workload-identity/issuers"
	mappingsPath    = "/api/v1/workload-identity/mappings"
	grantExchange   = "urn:ietf:params:oauth:grant-type:token-exchange"
	typeJWT         = "urn:ietf:params:oauth:token-type:jwt"
	typeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
)

// platform is a Kubernetes API server's service-account token issuer in
// miniature: one signing key at a time, its public half served as a JWKS on
// 127.0.0.1, and tokens signed with it.
type platform struct {
	srv          *httptest.Server
	mu           sync.Mutex
	key          any // *rsa.PrivateKey or *ecdsa.PrivateKey
	kid          string
	alg          jose.SignatureAlgorithm
	fetches      atomic.Int64
	cacheControl string // of the JWKS answer
	redirectTo   string // when set, the JWKS answers 302 there
}

const platformJWKSPath = "/openid/v1/jwks" // where Kubernetes serves it

func newPlatform(t *testing.T, alg jose.SignatureAlgorithm) *platform {
	t.Helper()
	p := &platform{}
	p.rotate(t, alg)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+platformJWKSPath, func(w http.ResponseWriter, r *http.Request) {
		p.fetches.Add(1)
		p.mu.Lock()
		if p.redirectTo != "" {
			to := p.redirectTo
			p.mu.Unlock()
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		if p.cacheControl != "" {
			w.Header().Set("Cache-Control", p.cacheControl)
		}
		var pub any
		switch k := p.key.(type) {
		case *rsa.PrivateKey:
			pub = &k.PublicKey
		case *ecdsa.PrivateKey:
			pub = &k.PublicKey
		}
		set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: p.kid, Algorithm: string(p.alg), Use: "sig"}}}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(set)
	})
	p.srv = httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(p.srv.Close)
	return p
}

// rotate replaces the signing key with a new one under a new kid; the JWKS
// serves only the new key from then on.
func (p *platform) rotate(t *testing.T, alg jose.SignatureAlgorithm) {
	t.Helper()
	var key any
	var err error
	switch alg {
	case jose.ES256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.RS256:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	default:
		t.Fatalf("no key for %s", alg)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.key, p.alg, p.kid = key, alg, uuid.NewString()
	p.mu.Unlock()
}

func (p *platform) URL() string { return p.srv.URL }

// claims are a projected service-account token's claims for namespace ns
// and account name, valid now for ten minutes; edit changes them.
func (p *platform) claims(ns, name string, edit ...func(map[string]any)) map[string]any {
	now := time.Now()
	c := map[string]any{
		"iss": p.URL(),
		"sub": "system:serviceaccount:" + ns + ":" + name,
		"aud": []string{"https://kubernetes.default.svc", "identityd"},
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"exp": now.Add(10 * time.Minute).Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      ns,
			"serviceaccount": map[string]any{"name": name, "uid": uuid.NewString()},
			"pod":            map[string]any{"name": name + "-7c9d8f6b5-x2x4q", "uid": uuid.NewString()},
		},
	}
	for _, e := range edit {
		e(c)
	}
	return c
}

// sign makes a compact JWS of claims with the current key and its kid.
func (p *platform) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	p.mu.Lock()
	key, alg, kid := p.key, p.alg, p.kid
	p.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rawJWT assembles a token with any header (alg none, HS256) and signature.
func rawJWT(header, claims map[string]any, sig []byte) string {
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	return enc(header) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// tamperSig changes one character in the middle of a token's signature.
func tamperSig(token string) string {
	dot := strings.LastIndexByte(token, '.')
	i := dot + (len(token)-dot)/2
	c := byte('A')
	if token[i] == 'A' {
		c = 'B'
	}
	return token[:i] + string(c) + token[i+1:]
}

// issuerFor is the registration body of p as a Kubernetes issuer.
func issuerFor(p *platform, maxAge int) map[string]any {
	return map[string]any{
		"name": "prod cluster", "issuerUrl": p.URL(), "jwksUri": p.URL() + platformJWKSPath, "platform": "kubernetes",
		"allowedAudiences": []string{"identityd"}, "allowedSubjects": []string{"system:serviceaccount:prod:*"},
		"maxTokenAgeSeconds": maxAge,
	}
}

func (s *server) createIssuer(admin string, body map[string]any) map[string]any {
	s.t.Helper()
	r := s.do(http.MethodPost, issuersPath, body, bearer(admin)...)
	if r.Status != http.StatusCreated {
		s.t.Fatalf("create issuer: %s", describe(r))
	}
	return r.JSON(s.t)
}

func (s *server) createMapping(admin string, body map[string]any) map[string]any {
	s.t.Helper()
	r := s.do(http.MethodPost, mappingsPath, body, bearer(admin)...)
	if r.Status != http.StatusCreated {
		s.t.Fatalf("create mapping: %s", describe(r))
	}
	return r.JSON(s.t)
}

// fedForm is a federation exchange of a platform token; kv adds parameters
// (in pairs, repeatable).
func fedForm(subjectToken string, kv ...string) url.Values {
	f := url.Values{"grant_type": {grantExchange}, "subject_token": {subjectToken}, "subject_token_type": {typeJWT}}
	for i := 0; i+1 < len(kv); i += 2 {
		f.Add(kv[i], kv[i+1])
	}
	return f
}

// delegationForm is an exchange of an identityd access token; kv as above.
func delegationForm(subjectToken string, kv ...string) url.Values {
	f := url.Values{"grant_type": {grantExchange}, "subject_token": {subjectToken}, "subject_token_type": {typeAccessToken}}
	for i := 0; i+1 < len(kv); i += 2 {
		f.Add(kv[i], kv[i+1])
	}
	return f
}

func (s *server) exchange(form url.Values, headers ...string) *response {
	s.t.Helper()
	return s.do(http.MethodPost, tokenPath, form, headers...)
}

// expectExchangeError checks an RFC 6749 error whose error_description says says.
func expectExchangeError(t *testing.T, r *response, status int, code, says string) {
	t.Helper()
	expectRFC6749(t, r, status, code)
	if d, _ := r.JSON(t)["error_description"].(string); !strings.Contains(d, says) {
		t.Fatalf("error_description %q does not say %q", d, says)
	}
}

// exchanged checks a successful exchange answer and returns it.
func exchanged(t *testing.T, r *response) map[string]any {
	t.Helper()
	m := mustOK(t, r)
	if tok, _ := m["access_token"].(string); tok == "" || m["issued_token_type"] != typeAccessToken || m["token_type"] != "Bearer" {
		t.Fatalf("exchange answer: %s", r.Body)
	}
	if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("token answer with Cache-Control %q, want no-store", cc)
	}
	return m
}

// auditEntries lists an agent's audit entries of one action, newest first.
func (s *server) auditEntries(t *testing.T, admin, agentID, action string) []map[string]any {
	t.Helper()
	m := mustOK(t, s.as(t).do(http.MethodGet, agentsPath+"/"+agentID+"/audit?limit=200&action="+action, nil, bearer(admin)...))
	var out []map[string]any
	for _, e := range m["entries"].([]any) {
		out = append(out, e.(map[string]any))
	}
	return out
}

// The admin API of issuers and mappings, with every refusal, and discovery.
func TestWorkloadIdentityAdmin(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		auth := bearer(super)
		_, other := s.registryToken(s.adminToken(), "not-an-admin", "agents:read", "agents:write", "users:read", "tokens:introspect")

		t.Run("discovery", func(t *testing.T) {
			for _, doc := range []string{"/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"} {
				md := mustOK(t, s.as(t).do(http.MethodGet, doc, nil))
				if g := strs(md["grant_types_supported"]); !slices.Contains(g, grantExchange) || !slices.Contains(g, "client_credentials") {
					t.Fatalf("%s grant_types_supported %v", doc, g)
				}
			}
		})

		body := func(edit func(map[string]any)) map[string]any {
			b := map[string]any{
				"name": "prod cluster", "issuerUrl": "https://oidc.prod.example/cluster", "jwksUri": "https://oidc.prod.example/cluster/openid/v1/jwks",
				"platform": "kubernetes", "allowedAudiences": []string{"identityd", "identityd"}, "allowedSubjects": []string{"system:serviceaccount:prod:*"},
			}
			if edit != nil {
				edit(b)
			}
			return b
		}
		var first, second map[string]any
		t.Run("create issuer", func(t *testing.T) {
			s := s.as(t)
			before := time.Now().Add(-time.Second)
			r := s.do(http.MethodPost, issuersPath, body(nil), auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create: %s", describe(r))
			}
			first = r.JSON(t)
			exactKeys(t, first, "id", "name", "issuerUrl", "jwksUri", "platform", "allowedAudiences", "allowedSubjects", "maxTokenAgeSeconds", "createdAt", "updatedAt")
			id, _ := first["id"].(string)
			if _, err := uuid.Parse(id); err != nil {
				t.Fatalf("id %q is not a UUID", id)
			}
			if loc := r.Header.Get("Location"); loc != issuersPath+"/"+id {
				t.Fatalf("Location %q", loc)
			}
			if first["name"] != "prod cluster" || first["issuerUrl"] != "https://oidc.prod.example/cluster" || first["platform"] != "kubernetes" ||
				first["jwksUri"] != "https://oidc.prod.example/cluster/openid/v1/jwks" ||
				!slices.Equal(strs(first["allowedAudiences"]), []string{"identityd"}) ||
				!slices.Equal(strs(first["allowedSubjects"]), []string{"system:serviceaccount:prod:*"}) {
				t.Fatalf("issuer not as sent (audiences deduplicated): %s", r.Body)
			}
			if first["maxTokenAgeSeconds"] != float64(3600) {
				t.Fatalf("maxTokenAgeSeconds defaults to %v, want 3600", first["maxTokenAgeSeconds"])
			}
			if c := isoZ(t, first["createdAt"]); c.Before(before) || c.After(time.Now().Add(time.Second)) {
				t.Fatalf("createdAt %v is not now", c)
			}
			isoZ(t, first["updatedAt"])

			// The other platforms, the bounds of the age, http on loopback.
			second = s.createIssuer(super, body(func(b map[string]any) {
				b["name"], b["platform"], b["maxTokenAgeSeconds"] = "workers", "gcp", 86400
				b["issuerUrl"], b["jwksUri"] = "http://127.0.0.1:9/issuer", "http://localhost:9/jwks"
			}))
			if second["maxTokenAgeSeconds"] != float64(86400) || second["platform"] != "gcp" {
				t.Fatalf("second issuer: %v", second)
			}
			for i, p := range []string{"aws", "azure"} {
				created := s.createIssuer(super, body(func(b map[string]any) {
					b["platform"], b["maxTokenAgeSeconds"] = p, 1
					b["issuerUrl"] = "https://" + p + ".example/" + string(rune('a'+i))
				}))
				if r := s.do(http.MethodDelete, issuersPath+"/"+created["id"].(string), nil, auth...); r.Status != http.StatusNoContent {
					t.Fatalf("delete %s issuer: %s", p, describe(r))
				}
			}
		})

		t.Run("issuer refusals", func(t *testing.T) {
			s := s.as(t)
			for _, c := range []struct {
				name   string
				body   map[string]any
				fields []string
			}{
				{"nothing", map[string]any{}, []string{"name", "issuerUrl", "jwksUri", "platform", "allowedAudiences", "allowedSubjects"}},
				{"blank name", body(func(b map[string]any) { b["name"] = "  " }), []string{"name"}},
				{"unknown platform", body(func(b map[string]any) { b["platform"] = "openshift" }), []string{"platform"}},
				{"http issuer off loopback", body(func(b map[string]any) { b["issuerUrl"] = "http://oidc.prod.example" }), []string{"issuerUrl"}},
				{"relative issuer", body(func(b map[string]any) { b["issuerUrl"] = "/cluster" }), []string{"issuerUrl"}},
				{"issuer with fragment", body(func(b map[string]any) { b["issuerUrl"] = "https://oidc.prod.example/#x" }), []string{"issuerUrl"}},
				{"issuer with user info", body(func(b map[string]any) { b["issuerUrl"] = "https://u:p@oidc.prod.example/" }), []string{"issuerUrl"}},
				{"ftp key set", body(func(b map[string]any) { b["jwksUri"] = "ftp://oidc.prod.example/jwks" }), []string{"jwksUri"}},
				{"age zero", body(func(b map[string]any) { b["maxTokenAgeSeconds"] = 0 }), []string{"maxTokenAgeSeconds"}},
				{"age over a day", body(func(b map[string]any) { b["maxTokenAgeSeconds"] = 86401 }), []string{"maxTokenAgeSeconds"}},
				{"no audiences", body(func(b map[string]any) { b["allowedAudiences"] = []string{} }), []string{"allowedAudiences"}},
				{"blank subject", body(func(b map[string]any) { b["allowedSubjects"] = []string{"system:serviceaccount:prod:*", " "} }), []string{"allowedSubjects[1]"}},
			} {
				t.Run(c.name, func(t *testing.T) {
					expectFields(t, s.as(t).do(http.MethodPost, issuersPath, c.body, auth...), c.fields...)
				})
			}
			expectError(t, s.do(http.MethodPost, issuersPath, body(func(b map[string]any) { b["issuer"] = "x" }), auth...), http.StatusBadRequest, "invalid_request")
			expectError(t, s.do(http.MethodPost, issuersPath, body(func(b map[string]any) { b["allowedAudiences"] = "identityd" }), auth...), http.StatusBadRequest, "invalid_request")
			expectError(t, s.do(http.MethodPost, issuersPath, `{"name":`, auth...), http.StatusBadRequest, "invalid_json")
			// One issuer per issuerUrl.
			expectError(t, s.do(http.MethodPost, issuersPath, body(func(b map[string]any) { b["name"] = "again" }), auth...), http.StatusConflict, "issuer_exists")
			// Admin only; a token is needed.
			id := first["id"].(string)
			expectScopeRefused(t, s.do(http.MethodPost, issuersPath, body(func(b map[string]any) { b["issuerUrl"] = "https://x.example" }), bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodGet, issuersPath, nil, bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodGet, issuersPath+"/"+id, nil, bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"name": "x"}, bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodDelete, issuersPath+"/"+id, nil, bearer(other)...), "admin")
			expectError(t, s.do(http.MethodGet, issuersPath, nil), http.StatusUnauthorized, "unauthorized")
		})

		t.Run("read and update issuers", func(t *testing.T) {
			s := s.as(t)
			id := first["id"].(string)
			l := mustOK(t, s.do(http.MethodGet, issuersPath, nil, auth...))
			exactKeys(t, l, "issuers", "total", "limit", "offset")
			var ids []string
			for _, x := range l["issuers"].([]any) {
				ids = append(ids, x.(map[string]any)["id"].(string))
			}
			if l["total"] != float64(2) || !slices.Equal(ids, []string{id, second["id"].(string)}) {
				t.Fatalf("list: %s", jsonText(l))
			}
			if p := mustOK(t, s.do(http.MethodGet, issuersPath+"?limit=1&offset=1", nil, auth...)); p["total"] != float64(2) || len(p["issuers"].([]any)) != 1 ||
				p["issuers"].([]any)[0].(map[string]any)["id"] != second["id"] {
				t.Fatalf("second page: %s", jsonText(p))
			}
			if g := mustOK(t, s.do(http.MethodGet, issuersPath+"/"+id, nil, auth...)); !sameJSON(t, g, first) {
				t.Fatalf("get %v, created %v", g, first)
			}
			expectError(t, s.do(http.MethodGet, issuersPath+"/"+uuid.NewString(), nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodGet, issuersPath+"/not-a-uuid", nil, auth...), http.StatusNotFound, "not_found")

			// PATCH changes the fields given, and only those.
			p := mustOK(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"name": "renamed", "maxTokenAgeSeconds": 600}, auth...))
			want := copyMap(first)
			want["name"], want["maxTokenAgeSeconds"], want["updatedAt"] = "renamed", float64(600), p["updatedAt"]
			if !sameJSON(t, p, want) {
				t.Fatalf("patched %v, want %v", p, want)
			}
			if isoZ(t, p["updatedAt"]).Before(isoZ(t, first["updatedAt"])) {
				t.Fatalf("updatedAt went back: %v", p["updatedAt"])
			}
			expectError(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"issuerUrl": second["issuerUrl"]}, auth...), http.StatusConflict, "issuer_exists")
			expectFields(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"platform": "vmware", "allowedSubjects": []string{}}, auth...), "platform", "allowedSubjects")
			expectFields(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"jwksUri": "http://keys.example/jwks"}, auth...), "jwksUri")
			expectError(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"id": uuid.NewString()}, auth...), http.StatusBadRequest, "invalid_request")
			expectError(t, s.do(http.MethodPatch, issuersPath+"/"+uuid.NewString(), map[string]any{"name": "x"}, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodPatch, issuersPath+"/nope", map[string]any{"name": "x"}, auth...), http.StatusNotFound, "not_found")
			// The refused changes left it as patched.
			if g := mustOK(t, s.do(http.MethodGet, issuersPath+"/"+id, nil, auth...)); !sameJSON(t, g, p) {
				t.Fatalf("after refused changes %v, want %v", g, p)
			}
			first = p
		})

		var ag, doomed agent
		var m1, m2 map[string]any
		t.Run("mappings", func(t *testing.T) {
			s := s.as(t)
			ag = s.createAgent(super, map[string]any{"name": "triage", "type": "service", "capabilities": []string{"read_users"}})
			doomed = s.createAgent(super, map[string]any{"name": "doomed", "type": "service", "capabilities": []string{"read_users"}})
			iss1, iss2 := first["id"].(string), second["id"].(string)
			mb := func(edit func(map[string]any)) map[string]any {
				b := map[string]any{"issuerId": iss1, "agentClientId": ag.ClientID, "subjectPattern": "system:serviceaccount:prod:triage",
					"scopes": []string{"users:read", "users:write", "users:read"}}
				if edit != nil {
					edit(b)
				}
				return b
			}
			r := s.do(http.MethodPost, mappingsPath, mb(nil), auth...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create mapping: %s", describe(r))
			}
			m1 = r.JSON(t)
			exactKeys(t, m1, "id", "issuerId", "agentClientId", "subjectPattern", "subjectMatchType", "scopes", "createdAt")
			if loc := r.Header.Get("Location"); loc != mappingsPath+"/"+m1["id"].(string) {
				t.Fatalf("Location %q", loc)
			}
			if m1["issuerId"] != iss1 || m1["agentClientId"] != ag.ClientID || m1["subjectPattern"] != "system:serviceaccount:prod:triage" ||
				m1["subjectMatchType"] != "exact" || !slices.Equal(strs(m1["scopes"]), []string{"users:read", "users:write"}) {
				t.Fatalf("mapping not as sent (match type exact by default, scopes deduplicated): %s", r.Body)
			}
			isoZ(t, m1["createdAt"])
			// The same subject at another issuer is another mapping; "exact" may be said.
			m2 = s.createMapping(super, mb(func(b map[string]any) {
				b["issuerId"], b["agentClientId"], b["subjectMatchType"], b["scopes"] = iss2, doomed.ClientID, "exact", []string{}
			}))
			if m2["subjectMatchType"] != "exact" || len(strs(m2["scopes"])) != 0 {
				t.Fatalf("second mapping: %v", m2)
			}

			for _, c := range []struct {
				name   string
				body   map[string]any
				fields []string
			}{
				{"nothing", map[string]any{}, []string{"issuerId", "agentClientId", "subjectPattern"}},
				{"glob match type", mb(func(b map[string]any) { b["subjectMatchType"] = "glob"; b["subjectPattern"] = "x:*" }), []string{"subjectMatchType"}},
				{"prefix match type", mb(func(b map[string]any) { b["subjectMatchType"] = "prefix"; b["subjectPattern"] = "x" }), []string{"subjectMatchType"}},
				{"unknown issuer", mb(func(b map[string]any) { b["issuerId"] = uuid.NewString() }), []string{"issuerId"}},
				{"issuer id not a UUID", mb(func(b map[string]any) { b["issuerId"] = "prod" }), []string{"issuerId"}},
				{"unknown agent", mb(func(b map[string]any) { b["agentClientId"] = "agt_nobody" }), []string{"agentClientId"}},
				{"service account as agent", mb(func(b map[string]any) { b["agentClientId"] = s.AdminID }), []string{"agentClientId"}},
				{"unknown scope", mb(func(b map[string]any) { b["subjectPattern"] = "y"; b["scopes"] = []string{"users:read", "launch"} }), []string{"scopes[1]"}},
				{"blank subject", mb(func(b map[string]any) { b["subjectPattern"] = " " }), []string{"subjectPattern"}},
			} {
				t.Run(c.name, func(t *testing.T) {
					expectFields(t, s.as(t).do(http.MethodPost, mappingsPath, c.body, auth...), c.fields...)
				})
			}
			expectError(t, s.do(http.MethodPost, mappingsPath, mb(func(b map[string]any) { b["subjectPattern"] = "z"; b["extra"] = true }), auth...), http.StatusBadRequest, "invalid_request")
			// One mapping per subject at an issuer, whichever agent.
			expectError(t, s.do(http.MethodPost, mappingsPath, mb(nil), auth...), http.StatusConflict, "mapping_exists")
			expectError(t, s.do(http.MethodPost, mappingsPath, mb(func(b map[string]any) { b["agentClientId"] = doomed.ClientID }), auth...), http.StatusConflict, "mapping_exists")
			// Admin only.
			expectScopeRefused(t, s.do(http.MethodPost, mappingsPath, mb(func(b map[string]any) { b["subjectPattern"] = "w" }), bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodGet, mappingsPath, nil, bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodGet, mappingsPath+"/"+m1["id"].(string), nil, bearer(other)...), "admin")
			expectScopeRefused(t, s.do(http.MethodDelete, mappingsPath+"/"+m1["id"].(string), nil, bearer(other)...), "admin")

			// Read.
			list := func(query string) []string {
				l := mustOK(t, s.do(http.MethodGet, mappingsPath+query, nil, auth...))
				exactKeys(t, l, "mappings", "total", "limit", "offset")
				var ids []string
				for _, x := range l["mappings"].([]any) {
					ids = append(ids, x.(map[string]any)["id"].(string))
				}
				if l["total"] != float64(len(ids)) {
					t.Fatalf("total %v with %d items", l["total"], len(ids))
				}
				return ids
			}
			if got := list(""); !slices.Equal(got, []string{m1["id"].(string), m2["id"].(string)}) {
				t.Fatalf("all mappings: %v", got)
			}
			if got := list("?issuerId=" + iss1); !slices.Equal(got, []string{m1["id"].(string)}) {
				t.Fatalf("mappings of the first issuer: %v", got)
			}
			if got := list("?issuerId=" + iss2); !slices.Equal(got, []string{m2["id"].(string)}) {
				t.Fatalf("mappings of the second issuer: %v", got)
			}
			if got := list("?issuerId=" + uuid.NewString()); len(got) != 0 {
				t.Fatalf("mappings of no issuer: %v", got)
			}
			if got := list("?issuerId=not-a-uuid"); len(got) != 0 {
				t.Fatalf("mappings of a non-UUID issuer: %v", got)
			}
			if g := mustOK(t, s.do(http.MethodGet, mappingsPath+"/"+m1["id"].(string), nil, auth...)); !sameJSON(t, g, m1) {
				t.Fatalf("get %v, created %v", g, m1)
			}
			expectError(t, s.do(http.MethodGet, mappingsPath+"/"+uuid.NewString(), nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodGet, mappingsPath+"/x", nil, auth...), http.StatusNotFound, "not_found")
		})

		t.Run("deletes", func(t *testing.T) {
			s := s.as(t)
			iss1, iss2 := first["id"].(string), second["id"].(string)
			// An issuer in use stays.
			expectError(t, s.do(http.MethodDelete, issuersPath+"/"+iss1, nil, auth...), http.StatusConflict, "issuer_has_mappings")
			mustOK(t, s.do(http.MethodGet, issuersPath+"/"+iss1, nil, auth...))
			// Delete the mapping, then the issuer.
			if r := s.do(http.MethodDelete, mappingsPath+"/"+m1["id"].(string), nil, auth...); r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete mapping: %s", describe(r))
			}
			expectError(t, s.do(http.MethodGet, mappingsPath+"/"+m1["id"].(string), nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, mappingsPath+"/"+m1["id"].(string), nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, mappingsPath+"/nope", nil, auth...), http.StatusNotFound, "not_found")
			if r := s.do(http.MethodDelete, issuersPath+"/"+iss1, nil, auth...); r.Status != http.StatusNoContent || len(r.Body) != 0 {
				t.Fatalf("delete issuer: %s", describe(r))
			}
			expectError(t, s.do(http.MethodGet, issuersPath+"/"+iss1, nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, issuersPath+"/"+iss1, nil, auth...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, issuersPath+"/nope", nil, auth...), http.StatusNotFound, "not_found")

			// Deleting an agent deletes its mappings, and frees their issuer.
			expectError(t, s.do(http.MethodDelete, issuersPath+"/"+iss2, nil, auth...), http.StatusConflict, "issuer_has_mappings")
			if r := s.do(http.MethodDelete, agentsPath+"/"+doomed.ID, nil, auth...); r.Status != http.StatusNoContent {
				t.Fatalf("delete agent: %s", describe(r))
			}
			expectError(t, s.do(http.MethodGet, mappingsPath+"/"+m2["id"].(string), nil, auth...), http.StatusNotFound, "not_found")
			if l := mustOK(t, s.do(http.MethodGet, mappingsPath, nil, auth...)); l["total"] != float64(0) {
				t.Fatalf("mappings after the deletes: %s", jsonText(l))
			}
			if r := s.do(http.MethodDelete, issuersPath+"/"+iss2, nil, auth...); r.Status != http.StatusNoContent {
				t.Fatalf("delete the freed issuer: %s", describe(r))
			}
			if l := mustOK(t, s.do(http.MethodGet, issuersPath, nil, auth...)); l["total"] != float64(0) {
				t.Fatalf("issuers after the deletes: %s", jsonText(l))
			}
			// A mapping to a deleted issuer is refused as unknown.
			expectFields(t, s.do(http.MethodPost, mappingsPath, map[string]any{"issuerId": iss1, "agentClientId": ag.ClientID, "subjectPattern": "x"}, auth...), "issuerId")
		})
	})
}

// copyMap is a shallow copy of m.
func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Workload identity federation: a platform token, no client secret, a token
// of the mapped agent; every refusal; key rotation; the kill switch.
func TestFederationExchange(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		k8s := newPlatform(t, jose.RS256)
		is := s.createIssuer(super, issuerFor(k8s, 600))
		a := s.createAgent(super, map[string]any{"name": "triage", "type": "service", "capabilities": []string{"read_users", "write_users"}})
		// The mapping offers more than the agent holds: orgs:read never,
		// users:write from trust registered.
		s.createMapping(super, map[string]any{"issuerId": is["id"], "agentClientId": a.ClientID,
			"subjectPattern": "system:serviceaccount:prod:triage", "scopes": []string{"users:read", "users:write", "orgs:read"}})
		const subject = "system:serviceaccount:prod:triage"
		fresh := func(t *testing.T, edit ...func(map[string]any)) string {
			return k8s.sign(t, k8s.claims("prod", "triage", edit...))
		}

		t.Run("exchange", func(t *testing.T) {
			s := s.as(t)
			r := s.exchange(fedForm(fresh(t)))
			m := exchanged(t, r)
			exactKeys(t, m, "access_token", "issued_token_type", "token_type", "expires_in", "scope", "agent_id", "trust_level")
			if m["scope"] != "users:read" || m["agent_id"] != a.ID || m["trust_level"] != "sandboxed" || m["expires_in"] != float64(3600) {
				t.Fatalf("exchange answer: %s", r.Body)
			}
			tok := m["access_token"].(string)

			in := s.introspect(t, tok, s.AdminID, s.AdminSecret)
			expectActive(t, in, a.ClientID)
			if in["agent_id"] != a.ID || in["trust_level"] != "sandboxed" || in["scope"] != "users:read" || in["sub"] != a.ClientID {
				t.Fatalf("introspection: %v", in)
			}
			if _, ok := in["act"]; ok {
				t.Fatalf("a federated token has no act claim: %v", in)
			}
			// The agent may introspect its own token with its secret.
			expectActive(t, s.introspect(t, tok, a.ClientID, a.ClientSecret), a.ClientID)

			w := mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(tok)...))
			if w["id"] != a.ID || w["type"] != "agent" || w["clientId"] != a.ClientID || w["trustLevel"] != "sandboxed" ||
				!slices.Equal(strs(w["scopes"]), []string{"users:read"}) {
				t.Fatalf("whoami: %v", w)
			}

			// The audit trail says where the token came from.
			var found bool
			for _, e := range s.auditEntries(t, super, a.ID, "token_issued") {
				d, _ := e["details"].(map[string]any)
				if d["grantType"] == grantExchange {
					if !sameJSON(t, d["scopes"], []string{"users:read"}) ||
						!sameJSON(t, d["exchange"], map[string]any{"issuer": k8s.URL(), "subject": subject}) {
						t.Fatalf("audit entry: %v", e)
					}
					found = true
				}
			}
			if !found {
				t.Fatal("no token_issued audit entry for the exchange")
			}
		})

		t.Run("request variants", func(t *testing.T) {
			s := s.as(t)
			// A JSON body, requested_token_type, the agent's own client_id, the scope.
			m := exchanged(t, s.exchange(fedForm(fresh(t), "requested_token_type", typeAccessToken, "client_id", a.ClientID, "scope", "users:read")))
			if m["scope"] != "users:read" || m["agent_id"] != a.ID {
				t.Fatalf("answer: %v", m)
			}
			r := s.do(http.MethodPost, tokenPath, map[string]any{"grant_type": grantExchange, "subject_token": fresh(t), "subject_token_type": typeJWT})
			if m := exchanged(t, r); m["agent_id"] != a.ID {
				t.Fatalf("JSON body: %s", r.Body)
			}
			// The alias path.
			exchanged(t, s.do(http.MethodPost, "/oauth/token", fedForm(fresh(t))))

			// Audiences and resources become the token's audience.
			m = exchanged(t, s.exchange(fedForm(fresh(t), "audience", "https://api.example", "audience", "billing", "resource", "https://files.example/v1")))
			in := s.introspect(t, m["access_token"].(string), s.AdminID, s.AdminSecret)
			if got := slices.Sorted(slices.Values(strs(in["aud"]))); !slices.Equal(got, []string{"billing", "https://api.example", "https://files.example/v1"}) {
				t.Fatalf("aud %v", in["aud"])
			}

			// Scopes beyond what the mapping and the agent both allow.
			for _, scope := range []string{"users:write", "orgs:read", "analytics:read", "users:read admin"} {
				expectRFC6749(t, s.exchange(fedForm(fresh(t), "scope", scope)), http.StatusBadRequest, "invalid_scope")
			}
			expectExchangeError(t, s.exchange(fedForm(fresh(t), "requested_token_type", "urn:ietf:params:oauth:token-type:jwt")), http.StatusBadRequest, "invalid_request", "requested_token_type")
			expectExchangeError(t, s.exchange(fedForm(fresh(t), "resource", "/relative")), http.StatusBadRequest, "invalid_target", "absolute URI")
			expectExchangeError(t, s.exchange(fedForm(fresh(t), "resource", "https://files.example/v1#part")), http.StatusBadRequest, "invalid_target", "fragment")
		})

		t.Run("client authentication", func(t *testing.T) {
			s := s.as(t)
			other := s.createAgent(super, map[string]any{"name": "other", "type": "service", "capabilities": []string{"read_users"}})
			// Another client id than the mapped agent's.
			r := s.exchange(fedForm(fresh(t), "client_id", other.ClientID))
			expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
			expectRFC6749(t, s.exchange(fedForm(fresh(t), "client_id", "agt_nobody")), http.StatusUnauthorized, "invalid_client")
			// A secret is never taken, right or wrong, in either place.
			for name, c := range map[string]struct {
				form    url.Values
				headers []string
			}{
				"Basic, the agent's own secret":     {fedForm(fresh(t)), basic(a.ClientID, a.ClientSecret)},
				"Basic, a wrong secret":             {fedForm(fresh(t)), basic(a.ClientID, "wrong")},
				"Basic, another client":             {fedForm(fresh(t)), basic(s.AdminID, s.AdminSecret)},
				"client_secret, the agent's own":    {fedForm(fresh(t), "client_id", a.ClientID, "client_secret", a.ClientSecret), nil},
				"client_secret without a client_id": {fedForm(fresh(t), "client_secret", "x"), nil},
			} {
				t.Run(name, func(t *testing.T) {
					expectExchangeError(t, s.as(t).exchange(c.form, c.headers...), http.StatusBadRequest, "invalid_request", "secret")
				})
			}
		})

		t.Run("refusals", func(t *testing.T) {
			s := s.as(t)
			hs := hmac.New(sha256.New, []byte("the public key, as an HMAC secret"))
			hs.Write([]byte("header.payload"))
			now := time.Now()
			at := func(k string, d time.Duration) func(map[string]any) {
				return func(c map[string]any) { c[k] = now.Add(d).Unix() }
			}
			set := func(k string, v any) func(map[string]any) { return func(c map[string]any) { c[k] = v } }
			stranger := newPlatform(t, jose.RS256) // keys the issuer never published
			for _, c := range []struct {
				name  string
				token string
				says  string
			}{
				{"alg none", rawJWT(map[string]any{"alg": "none", "typ": "JWT"}, k8s.claims("prod", "triage"), nil), "asymmetric algorithm"},
				{"HS256", rawJWT(map[string]any{"alg": "HS256", "typ": "JWT"}, k8s.claims("prod", "triage"), hs.Sum(nil)), "asymmetric algorithm"},
				{"not a JWT", "not-a-jwt", "asymmetric algorithm"},
				{"three garbage parts", "a.b.c", "asymmetric algorithm"},
				{"unknown issuer", fresh(t, set("iss", "https://oidc.unknown.example")), "is not registered"},
				{"issuer with a trailing slash", fresh(t, set("iss", k8s.URL()+"/")), "is not registered"},
				{"bad signature", tamperSig(fresh(t)), "signature"},
				{"signed by another key", stranger.sign(t, k8s.claims("prod", "triage")), "signature"},
				{"audience", fresh(t, set("aud", "someone-else")), "audience"},
				{"audiences, none allowed", fresh(t, set("aud", []string{"https://kubernetes.default.svc", "vault"})), "audience"},
				{"expired", fresh(t, at("iat", -5*time.Minute), at("nbf", -5*time.Minute), at("exp", -2*time.Minute)), "expired"},
				{"no exp", fresh(t, func(c map[string]any) { delete(c, "exp") }), "exp"},
				{"not yet valid", fresh(t, at("nbf", 5*time.Minute)), "not yet valid"},
				{"too old", fresh(t, at("iat", -11*time.Minute), at("nbf", -11*time.Minute)), "too old"},
				{"no iat", fresh(t, func(c map[string]any) { delete(c, "iat") }), "iat"},
				{"issued in the future", fresh(t, at("iat", 5*time.Minute)), "future"},
				{"subject not allowed", k8s.sign(t, k8s.claims("dev", "triage")), "allowed subjects"},
				{"no mapping", k8s.sign(t, k8s.claims("prod", "other")), "no mapping"},
				{"no sub", fresh(t, func(c map[string]any) { delete(c, "sub") }), "sub"},
			} {
				t.Run(c.name, func(t *testing.T) {
					r := s.as(t).exchange(fedForm(c.token))
					expectExchangeError(t, r, http.StatusBadRequest, "invalid_request", c.says)
					if d := r.JSON(t)["error_description"].(string); strings.Contains(d, `"`) {
						t.Fatalf("error_description with a double quote: %q", d)
					}
				})
			}
			// The request itself.
			form := fedForm(fresh(t))
			form.Del("subject_token")
			expectExchangeError(t, s.exchange(form), http.StatusBadRequest, "invalid_request", "subject_token")
			form = fedForm(fresh(t))
			form.Del("subject_token_type")
			r := s.exchange(form)
			if r.Status == http.StatusOK {
				t.Fatalf("an exchange without subject_token_type: %s", describe(r))
			}
			form = fedForm(fresh(t))
			form.Set("subject_token_type", "urn:ietf:params:oauth:token-type:id_token")
			if r := s.exchange(form); r.Status == http.StatusOK {
				t.Fatalf("subject_token_type id_token: %s", describe(r))
			}
		})

		t.Run("clock skew", func(t *testing.T) {
			s := s.as(t)
			now := time.Now()
			at := func(k string, d time.Duration) func(map[string]any) {
				return func(c map[string]any) { c[k] = now.Add(d).Unix() }
			}
			// Within 60 seconds either way.
			exchanged(t, s.exchange(fedForm(fresh(t, at("iat", -2*time.Minute), at("nbf", -2*time.Minute), at("exp", -30*time.Second)))))
			exchanged(t, s.exchange(fedForm(fresh(t, at("nbf", 30*time.Second)))))
			exchanged(t, s.exchange(fedForm(fresh(t, at("iat", 30*time.Second), at("nbf", 30*time.Second)))))
			// Just within the issuer's maximum age (600 s).
			exchanged(t, s.exchange(fedForm(fresh(t, at("iat", -9*time.Minute), at("nbf", -9*time.Minute)))))
		})

		t.Run("key rotation", func(t *testing.T) {
			s := s.as(t)
			exchanged(t, s.exchange(fedForm(fresh(t)))) // the current key is cached
			before := k8s.fetches.Load()
			if before < 1 {
				t.Fatal("the key set was never fetched")
			}
			for range 3 {
				exchanged(t, s.exchange(fedForm(fresh(t))))
			}
			if n := k8s.fetches.Load(); n != before {
				t.Fatalf("a warm key set was fetched again (%d times)", n-before)
			}
			old := fresh(t)
			// A token naming an unknown key fetches the set again at most
			// every 5 s (forged kids must not make identityd hammer the
			// issuer); earlier refusals here may have just done so.
			time.Sleep(5500 * time.Millisecond)
			k8s.rotate(t, jose.ES256) // a new kid, and now an EC key
			m := exchanged(t, s.exchange(fedForm(fresh(t))))
			if m["agent_id"] != a.ID {
				t.Fatalf("after rotation: %v", m)
			}
			if k8s.fetches.Load() == before {
				t.Fatal("the rotated key set was not fetched")
			}
			after := k8s.fetches.Load()
			for range 3 {
				exchanged(t, s.exchange(fedForm(fresh(t))))
			}
			if n := k8s.fetches.Load(); n != after {
				t.Fatalf("the new key set was fetched again (%d times)", n-after)
			}
			// The retired key signs nothing any more.
			expectExchangeError(t, s.exchange(fedForm(old)), http.StatusBadRequest, "invalid_request", "signature")
		})

		t.Run("grant follows the agent", func(t *testing.T) {
			s := s.as(t)
			mustOK(t, s.changeTrust(super, a.ID, "registered", "reviewed"))
			m := exchanged(t, s.exchange(fedForm(fresh(t))))
			if got := scopeSet(m["scope"].(string)); !slices.Equal(got, []string{"users:read", "users:write"}) || m["trust_level"] != "registered" {
				t.Fatalf("registered agent's exchange: %v", m)
			}
			exchanged(t, s.exchange(fedForm(fresh(t), "scope", "users:write")))
			// The mapping's orgs:read stays out of reach: the agent lacks it.
			expectRFC6749(t, s.exchange(fedForm(fresh(t), "scope", "orgs:read")), http.StatusBadRequest, "invalid_scope")
		})

		t.Run("issuer changes apply at once", func(t *testing.T) {
			s := s.as(t)
			id := is["id"].(string)
			mustOK(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"allowedAudiences": []string{"vault"}}, bearer(super)...))
			expectExchangeError(t, s.exchange(fedForm(fresh(t))), http.StatusBadRequest, "invalid_request", "audience")
			exchanged(t, s.exchange(fedForm(fresh(t, func(c map[string]any) { c["aud"] = "vault" }))))
			mustOK(t, s.do(http.MethodPatch, issuersPath+"/"+id, map[string]any{"allowedAudiences": []string{"identityd"}}, bearer(super)...))
			exchanged(t, s.exchange(fedForm(fresh(t))))
		})

		t.Run("kill switch", func(t *testing.T) {
			s := s.as(t)
			stolen := fresh(t) // a platform token taken from the pod before the kill
			before := exchanged(t, s.exchange(fedForm(stolen)))["access_token"].(string)
			mustOK(t, s.killAgent(super, a.ID, map[string]any{"reason": "compromised pod"}))
			expectExchangeError(t, s.exchange(fedForm(fresh(t))), http.StatusBadRequest, "invalid_request", "not active")
			expectTokenRefused(t, s, before)
			expectInactive(t, s.introspect(t, before, s.AdminID, s.AdminSecret))

			mustOK(t, s.recoverAgent(super, a.ID))
			// The stolen platform token mints nothing after the recovery,
			// nor does any issued in the recovery's second (iat has whole
			// seconds); one issued after it does.
			expectExchangeError(t, s.exchange(fedForm(stolen)), http.StatusBadRequest, "invalid_request", "recovered")
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
			m := exchanged(t, s.exchange(fedForm(fresh(t))))
			if m["agent_id"] != a.ID {
				t.Fatalf("after recovery: %v", m)
			}
			w := mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(m["access_token"].(string))...))
			if w["id"] != a.ID {
				t.Fatalf("whoami after recovery: %v", w)
			}
			// The pre-kill token stays dead.
			expectTokenRefused(t, s, before)
		})
	})
}

// The issuer's key set is trusted for as long as it says (here the 5 s
// floor), so a key it removed stops minting; forged tokens naming invented
// keys do not make identityd fetch the set again and again; a key set that
// redirects is not followed.
func TestFederationKeySet(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		super := s.superToken()
		k8s := newPlatform(t, jose.RS256)
		k8s.cacheControl = "max-age=1" // below the floor: trusted 5 s
		is := s.createIssuer(super, issuerFor(k8s, 600))
		a := s.createAgent(super, map[string]any{"name": "keyed", "type": "service", "capabilities": []string{"read_users"}})
		s.createMapping(super, map[string]any{"issuerId": is["id"], "agentClientId": a.ClientID,
			"subjectPattern": "system:serviceaccount:prod:keyed", "scopes": []string{"users:read"}})
		fresh := func() string { return k8s.sign(t, k8s.claims("prod", "keyed")) }

		old := fresh()
		exchanged(t, s.exchange(fedForm(old)))
		k8s.rotate(t, jose.RS256) // the issuer drops the old key
		deadline := time.Now().Add(30 * time.Second)
		for s.exchange(fedForm(old)).Status == http.StatusOK {
			if time.Now().After(deadline) {
				t.Fatal("a key the issuer removed is still trusted 30 s later")
			}
			time.Sleep(250 * time.Millisecond)
		}
		expectExchangeError(t, s.exchange(fedForm(old)), http.StatusBadRequest, "invalid_request", "signature")
		exchanged(t, s.exchange(fedForm(fresh())))

		// 400 forged tokens, each naming a key nobody has.
		forger := newPlatform(t, jose.RS256)
		before := k8s.fetches.Load()
		var wg sync.WaitGroup
		for i := range 400 {
			claims := forger.claims("prod", "keyed", func(c map[string]any) { c["iss"] = k8s.URL() })
			forger.mu.Lock()
			forger.kid = fmt.Sprintf("forged-%d", i)
			forger.mu.Unlock()
			tok := forger.sign(t, claims)
			wg.Go(func() {
				if r := s.exchange(fedForm(tok)); r.Status != http.StatusBadRequest {
					t.Errorf("a forged token: %s", describe(r))
				}
			})
		}
		wg.Wait()
		if n := k8s.fetches.Load() - before; n > 2 {
			t.Fatalf("400 forged tokens fetched the issuer's key set %d times", n)
		}

		// A key set that redirects (to a host the https rule would refuse).
		other := newPlatform(t, jose.RS256)
		other.cacheControl = "max-age=1"
		moved := s.createIssuer(super, map[string]any{"name": "moved", "issuerUrl": other.URL(), "jwksUri": other.URL() + platformJWKSPath,
			"platform": "kubernetes", "allowedAudiences": []string{"identityd"}, "allowedSubjects": []string{"system:serviceaccount:prod:*"}})
		s.createMapping(super, map[string]any{"issuerId": moved["id"], "agentClientId": a.ClientID,
			"subjectPattern": "system:serviceaccount:prod:moved", "scopes": []string{"users:read"}})
		other.mu.Lock()
		other.redirectTo = "http://keys.elsewhere.example/jwks"
		other.mu.Unlock()
		r := s.exchange(fedForm(other.sign(t, other.claims("prod", "moved"))))
		if r.Status != http.StatusServiceUnavailable || r.JSON(t)["error"] != "temporarily_unavailable" {
			t.Fatalf("through a redirecting key set: %s", describe(r))
		}
	})
}

// Agent-to-agent delegation: act claims hop by hop, the depth limit, who
// may delegate, what the new token may hold, RAR details, and the kill
// switch anywhere in the chain.
func TestDelegationExchange(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_MAX_DELEGATION_DEPTH=3")
		super := s.superToken()
		promote := func(t *testing.T, id string, levels ...string) {
			t.Helper()
			for _, l := range levels {
				if r := s.as(t).changeTrust(super, id, l, "delegation test"); r.Status != http.StatusOK {
					t.Fatalf("trust %s: %s", l, describe(r))
				}
			}
		}
		// The subjects: a service account and a (sandboxed) agent.
		sa := s.createAccount(super, map[string]any{"name": "payments", "scopes": []string{"users:read", "users:write", "orgs:read"}})
		// Issued first, so that it has aged by the time it is exchanged.
		saTok := s.token(sa.ClientID, sa.ClientSecret, "")
		saIssued := time.Now()
		subj := s.createAgent(super, map[string]any{"name": "subject", "type": "autonomous", "capabilities": []string{"read_users"}})
		// The actors: B and C, verified, with a2a_exchange.
		b := s.createAgent(super, map[string]any{"name": "actor-b", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users", "write_users"}})
		c := s.createAgent(super, map[string]any{"name": "actor-c", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users"}})
		promote(t, b.ID, "registered", "verified")
		promote(t, c.ID, "registered", "verified")
		asB, asC := basic(b.ClientID, b.ClientSecret), basic(c.ClientID, c.ClientSecret)
		saIn := s.introspect(t, saTok, s.AdminID, s.AdminSecret)
		// Age the subject token by more than the seconds its exp and an
		// expires_in lose to rounding, so a cap shows.
		if d := time.Until(saIssued.Add(3 * time.Second)); d > 0 {
			time.Sleep(d)
		}

		var t1 string // B acting for the service account, audience https://api.example
		t.Run("act claim", func(t *testing.T) {
			s := s.as(t)
			before := time.Now()
			r := s.exchange(delegationForm(saTok), asB...)
			m := exchanged(t, r)
			exactKeys(t, m, "access_token", "issued_token_type", "token_type", "expires_in", "scope", "agent_id", "trust_level")
			// The subject's scopes that B holds too: not orgs:read.
			if got := scopeSet(m["scope"].(string)); !slices.Equal(got, []string{"users:read", "users:write"}) || m["agent_id"] != b.ID || m["trust_level"] != "verified" {
				t.Fatalf("delegation answer: %s", r.Body)
			}
			// It lives no longer than the subject token, which has aged: its
			// expires_in was counted after before, the subject's exp is whole
			// seconds (up to one early), an expires_in rounds (half one).
			if e, left := m["expires_in"].(float64), time.Unix(int64(saIn["exp"].(float64)), 0).Sub(before).Seconds(); e > left+1.5 || e < 3500 {
				t.Fatalf("expires_in %v, the subject token has %.0f s left", e, left)
			}
			tok := m["access_token"].(string)
			in := s.introspect(t, tok, s.AdminID, s.AdminSecret)
			expectActive(t, in, b.ClientID)
			if in["sub"] != sa.ClientID || !sameJSON(t, in["act"], map[string]any{"sub": b.ClientID}) || in["agent_id"] != b.ID ||
				!slices.Equal(scopeSet(in["scope"].(string)), []string{"users:read", "users:write"}) {
				t.Fatalf("introspection: %v", in)
			}
			if in["exp"].(float64) > saIn["exp"].(float64) {
				t.Fatalf("delegated exp %v after the subject's %v", in["exp"], saIn["exp"])
			}
			// B, its owner, sees it the same way.
			if own := s.introspect(t, tok, b.ClientID, b.ClientSecret); !sameJSON(t, own["act"], in["act"]) || own["sub"] != sa.ClientID {
				t.Fatalf("owner's introspection: %v", own)
			}
			w := mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(tok)...))
			if w["clientId"] != b.ClientID || w["id"] != b.ID || w["type"] != "agent" {
				t.Fatalf("whoami: %v", w)
			}
			// The audit of B says whose token it was and who acts.
			var found bool
			for _, e := range s.auditEntries(t, super, b.ID, "token_issued") {
				d, _ := e["details"].(map[string]any)
				if d["grantType"] == grantExchange {
					found = true
					if !sameJSON(t, d["act"], map[string]any{"sub": b.ClientID}) || !sameJSON(t, d["exchange"], map[string]any{"subjectClientId": sa.ClientID}) {
						t.Fatalf("audit entry: %v", e)
					}
				}
			}
			if !found {
				t.Fatal("no token_issued audit entry for the delegation")
			}

			// Narrower scope; an audience when the subject has none.
			m = exchanged(t, s.exchange(delegationForm(saTok, "scope", "users:read", "audience", "https://api.example"), asB...))
			if m["scope"] != "users:read" {
				t.Fatalf("narrowed: %v", m)
			}
			t1 = m["access_token"].(string)
			if in := s.introspect(t, t1, s.AdminID, s.AdminSecret); !slices.Equal(strs(in["aud"]), []string{"https://api.example"}) {
				t.Fatalf("aud %v", in["aud"])
			}
			// The JSON body, requested_token_type, an actor_token of B's own.
			bTok := decodeToken(t, s.agentToken(b.ClientID, b.ClientSecret, "")).AccessToken
			exchanged(t, s.exchange(delegationForm(saTok, "requested_token_type", typeAccessToken, "actor_token", bTok, "actor_token_type", typeAccessToken), asB...))
			exchanged(t, s.do(http.MethodPost, tokenPath, map[string]any{"grant_type": grantExchange, "subject_token": saTok, "subject_token_type": typeAccessToken,
				"client_id": b.ClientID, "client_secret": b.ClientSecret}))
		})

		t.Run("refusals", func(t *testing.T) {
			s := s.as(t)
			noCap := s.createAgent(super, map[string]any{"name": "no-a2a", "type": "autonomous", "capabilities": []string{"read_users", "write_users"}})
			low := s.createAgent(super, map[string]any{"name": "low-trust", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users"}})
			expectExchangeError(t, s.exchange(delegationForm(saTok), basic(noCap.ClientID, noCap.ClientSecret)...), http.StatusBadRequest, "unauthorized_client", "a2a_exchange")
			expectExchangeError(t, s.exchange(delegationForm(saTok), basic(low.ClientID, low.ClientSecret)...), http.StatusBadRequest, "unauthorized_client", "verified")
			promote(t, low.ID, "registered")
			expectExchangeError(t, s.exchange(delegationForm(saTok), basic(low.ClientID, low.ClientSecret)...), http.StatusBadRequest, "unauthorized_client", "verified")
			// A service account, even the admin, never acts for others.
			expectRFC6749(t, s.exchange(delegationForm(saTok), basic(sa.ClientID, sa.ClientSecret)...), http.StatusBadRequest, "unauthorized_client")
			expectRFC6749(t, s.exchange(delegationForm(saTok), basic(s.AdminID, s.AdminSecret)...), http.StatusBadRequest, "unauthorized_client")
			// No or bad client authentication.
			expectRFC6749(t, s.exchange(delegationForm(saTok)), http.StatusUnauthorized, "invalid_client")
			expectRFC6749(t, s.exchange(delegationForm(saTok), basic(b.ClientID, "wrong")...), http.StatusUnauthorized, "invalid_client")

			// Scope beyond the subject's, or beyond B's.
			for _, scope := range []string{"orgs:read", "users:admin", "delegations:read", "users:read admin"} {
				expectRFC6749(t, s.exchange(delegationForm(saTok, "scope", scope), asB...), http.StatusBadRequest, "invalid_scope")
			}
			// The subject token: garbage, revoked, absent, of another type.
			expectExchangeError(t, s.exchange(delegationForm("garbage"), asB...), http.StatusBadRequest, "invalid_request", "subject_token")
			revoked := s.token(sa.ClientID, sa.ClientSecret, "")
			if r := s.do(http.MethodPost, revokePath, url.Values{"token": {revoked}}, basic(sa.ClientID, sa.ClientSecret)...); r.Status != http.StatusOK {
				t.Fatalf("revoke: %s", describe(r))
			}
			expectExchangeError(t, s.exchange(delegationForm(revoked), asB...), http.StatusBadRequest, "invalid_request", "not an active")
			form := delegationForm(saTok)
			form.Del("subject_token")
			expectExchangeError(t, s.exchange(form, asB...), http.StatusBadRequest, "invalid_request", "subject_token")
			expectRFC6749(t, s.exchange(delegationForm(saTok, "requested_token_type", "urn:ietf:params:oauth:token-type:refresh_token"), asB...), http.StatusBadRequest, "invalid_request")
			// The actor token: another's, garbage, without its type, of the wrong type.
			cTok := decodeToken(t, s.agentToken(c.ClientID, c.ClientSecret, "")).AccessToken
			bTok := decodeToken(t, s.agentToken(b.ClientID, b.ClientSecret, "")).AccessToken
			expectExchangeError(t, s.exchange(delegationForm(saTok, "actor_token", cTok, "actor_token_type", typeAccessToken), asB...), http.StatusBadRequest, "invalid_request", "actor_token")
			expectExchangeError(t, s.exchange(delegationForm(saTok, "actor_token", saTok, "actor_token_type", typeAccessToken), asB...), http.StatusBadRequest, "invalid_request", "actor_token")
			expectExchangeError(t, s.exchange(delegationForm(saTok, "actor_token", "garbage", "actor_token_type", typeAccessToken), asB...), http.StatusBadRequest, "invalid_request", "actor_token")
			expectExchangeError(t, s.exchange(delegationForm(saTok, "actor_token", bTok), asB...), http.StatusBadRequest, "invalid_request", "actor_token_type")
			expectExchangeError(t, s.exchange(delegationForm(saTok, "actor_token", bTok, "actor_token_type", typeJWT), asB...), http.StatusBadRequest, "invalid_request", "actor_token_type")
			// A resource that is no absolute URI.
			expectRFC6749(t, s.exchange(delegationForm(saTok, "resource", "api"), asB...), http.StatusBadRequest, "invalid_target")
		})

		var t2, t3 string
		t.Run("chain", func(t *testing.T) {
			s := s.as(t)
			// Hop 2: C acts for B acting for the service account, within t1's audience.
			expectExchangeError(t, s.exchange(delegationForm(t1, "audience", "https://other.example"), asC...), http.StatusBadRequest, "invalid_target", "audience")
			expectRFC6749(t, s.exchange(delegationForm(t1, "resource", "https://other.example/x"), asC...), http.StatusBadRequest, "invalid_target")
			expectRFC6749(t, s.exchange(delegationForm(t1, "audience", "https://api.example", "audience", "https://other.example"), asC...), http.StatusBadRequest, "invalid_target")
			// t1 holds users:read only: C may not widen it to users:write (which B's subject had).
			expectRFC6749(t, s.exchange(delegationForm(t1, "scope", "users:write"), asC...), http.StatusBadRequest, "invalid_scope")
			// Without an audience, a hop keeps its subject's: delegation only narrows.
			kept := exchanged(t, s.exchange(delegationForm(t1), asC...))["access_token"].(string)
			if in := s.introspect(t, kept, s.AdminID, s.AdminSecret); !slices.Equal(strs(in["aud"]), []string{"https://api.example"}) {
				t.Fatalf("a hop without audience has aud %v, want its subject's", in["aud"])
			}
			m := exchanged(t, s.exchange(delegationForm(t1, "audience", "https://api.example"), asC...))
			t2 = m["access_token"].(string)
			in := s.introspect(t, t2, s.AdminID, s.AdminSecret)
			expectActive(t, in, c.ClientID)
			if in["sub"] != sa.ClientID || in["scope"] != "users:read" || !slices.Equal(strs(in["aud"]), []string{"https://api.example"}) ||
				!sameJSON(t, in["act"], map[string]any{"sub": c.ClientID, "act": map[string]any{"sub": b.ClientID}}) {
				t.Fatalf("two-hop introspection: %v", in)
			}
			t1In := s.introspect(t, t1, s.AdminID, s.AdminSecret)
			if in["exp"].(float64) > t1In["exp"].(float64) {
				t.Fatalf("hop 2 exp %v after hop 1's %v", in["exp"], t1In["exp"])
			}
			// Hop 3 (the limit here): B again.
			m = exchanged(t, s.exchange(delegationForm(t2), asB...))
			t3 = m["access_token"].(string)
			in = s.introspect(t, t3, s.AdminID, s.AdminSecret)
			if in["sub"] != sa.ClientID || !sameJSON(t, in["act"], map[string]any{"sub": b.ClientID, "act": map[string]any{"sub": c.ClientID, "act": map[string]any{"sub": b.ClientID}}}) {
				t.Fatalf("three-hop introspection: %v", in)
			}
			// Hop 4 is one too many.
			r := s.exchange(delegationForm(t3), asC...)
			expectExchangeError(t, r, http.StatusBadRequest, "invalid_request", "hops")
			if d := r.JSON(t)["error_description"].(string); !strings.Contains(d, "4") || !strings.Contains(d, "3") {
				t.Fatalf("depth refusal %q names neither the length nor the limit", d)
			}
		})

		t.Run("the subject's principal loses a scope", func(t *testing.T) {
			s := s.as(t)
			acct := s.createAccount(super, map[string]any{"name": "narrowing", "scopes": []string{"users:read", "users:write"}})
			derived := exchanged(t, s.exchange(delegationForm(s.token(acct.ClientID, acct.ClientSecret, "")), asB...))["access_token"].(string)
			if r := s.do(http.MethodPatch, "/api/v1/service-accounts/"+acct.ID, map[string]any{"scopes": []string{"users:read"}}, bearer(super)...); r.Status != http.StatusOK {
				t.Fatalf("patch: %s", describe(r))
			}
			if in := s.introspect(t, derived, b.ClientID, b.ClientSecret); in["scope"] != "users:read" {
				t.Fatalf("the delegated token still holds %v after its subject's account lost users:write", in["scope"])
			}
		})

		t.Run("authorization_details", func(t *testing.T) {
			s := s.as(t)
			// Open to any agent (no required capability), and one needing write_users.
			s.registerType(super, map[string]any{"type": "account_information", "allowedActions": []string{"list", "read"},
				"readOnlyActions": []string{"list", "read"}, "schema": map[string]any{}})
			s.registerType(super, paymentType("payment_initiation"))
			read := map[string]any{"type": "account_information", "actions": []string{"read"}}
			list := map[string]any{"type": "account_information", "actions": []string{"list"}}
			granted := []any{read, list}
			subject := decodeToken(t, s.detailsToken(sa.ClientID, sa.ClientSecret, granted)).AccessToken

			// Inherited whole when the request names none.
			r := s.exchange(delegationForm(subject), asB...)
			m := exchanged(t, r)
			if !sameJSON(t, m["authorization_details"], granted) {
				t.Fatalf("inherited details in the answer: %s", r.Body)
			}
			inherited := m["access_token"].(string)
			if in := s.introspect(t, inherited, s.AdminID, s.AdminSecret); !sameJSON(t, in["authorization_details"], granted) || in["act"] == nil {
				t.Fatalf("inherited details: %v", in)
			}
			// A subset.
			m = exchanged(t, s.exchange(delegationForm(subject, "authorization_details", jsonText([]any{list})), asB...))
			if !sameJSON(t, m["authorization_details"], []any{list}) {
				t.Fatalf("subset answer: %v", m)
			}
			subset := m["access_token"].(string)
			if in := s.introspect(t, subset, s.AdminID, s.AdminSecret); !sameJSON(t, in["authorization_details"], []any{list}) {
				t.Fatalf("subset details: %v", in)
			}
			// Anything the subject was not granted.
			both := map[string]any{"type": "account_information", "actions": []string{"list", "read"}}
			for name, d := range map[string][]any{
				"wider entry":       {both},
				"one of two wider":  {read, both},
				"unregistered type": {map[string]any{"type": "wire_transfer"}},
				"another type":      {payment("payment_initiation", "status")},
			} {
				t.Run(name, func(t *testing.T) {
					expectRFC6749(t, s.as(t).exchange(delegationForm(subject, "authorization_details", jsonText(d)), asB...), http.StatusBadRequest, "invalid_authorization_details")
				})
			}
			// The next hop inherits the narrowed set.
			m = exchanged(t, s.exchange(delegationForm(subset), asC...))
			if in := s.introspect(t, m["access_token"].(string), s.AdminID, s.AdminSecret); !sameJSON(t, in["authorization_details"], []any{list}) {
				t.Fatalf("second hop details: %v", in)
			}
			expectRFC6749(t, s.exchange(delegationForm(subset, "authorization_details", jsonText([]any{read})), asC...), http.StatusBadRequest, "invalid_authorization_details")

			// The actor's own ceiling: C lacks write_users, which payments need.
			pay := []any{payment("payment_initiation", "initiate")}
			paySubject := decodeToken(t, s.detailsToken(sa.ClientID, sa.ClientSecret, pay)).AccessToken
			m = exchanged(t, s.exchange(delegationForm(paySubject), asB...))
			if !sameJSON(t, m["authorization_details"], pay) {
				t.Fatalf("B inherits the payment: %v", m)
			}
			expectRFC6749(t, s.exchange(delegationForm(paySubject), asC...), http.StatusBadRequest, "invalid_authorization_details")
			expectRFC6749(t, s.exchange(delegationForm(paySubject, "authorization_details", jsonText(pay)), asC...), http.StatusBadRequest, "invalid_authorization_details")

			// A principal earlier in the chain that loses what an entry
			// needs takes the entry from every token derived from it,
			// although the actor still meets the entry's ceiling.
			payer := s.createAgent(super, map[string]any{"name": "payer", "type": "autonomous", "capabilities": []string{"read_users", "write_users"}})
			promote(t, payer.ID, "registered")
			payerTok := decodeToken(t, s.detailsToken(payer.ClientID, payer.ClientSecret, pay)).AccessToken
			viaB := exchanged(t, s.exchange(delegationForm(payerTok), asB...))["access_token"].(string)
			if in := s.introspect(t, viaB, s.AdminID, s.AdminSecret); !sameJSON(t, in["authorization_details"], pay) {
				t.Fatalf("B acting for the payer: %v", in)
			}
			mustOK(t, s.do(http.MethodPut, "/api/v1/agents/"+payer.ID+"/capabilities", map[string]any{"capabilities": []string{"read_users"}}, bearer(super)...))
			for _, tok := range []string{payerTok, viaB} {
				if in := s.introspect(t, tok, s.AdminID, s.AdminSecret); in["active"] != true || !sameJSON(t, in["authorization_details"], []any{}) {
					t.Fatalf("after the payer lost write_users, a token derived from its own still says %v", in)
				}
			}
			expectRFC6749(t, s.exchange(delegationForm(payerTok, "authorization_details", jsonText(pay)), asB...), http.StatusBadRequest, "invalid_authorization_details")

			// A subject token without details grants none to ask for.
			r = s.exchange(delegationForm(saTok, "authorization_details", jsonText([]any{read})), asB...)
			if r.Status == http.StatusOK {
				in := s.introspect(t, r.JSON(t)["access_token"].(string), s.AdminID, s.AdminSecret)
				t.Errorf("the subject token holds no authorization_details, yet the delegated token was granted %v", in["authorization_details"])
			} else {
				expectRFC6749(t, r, http.StatusBadRequest, "invalid_authorization_details")
			}
		})

		t.Run("killing the subject's agent", func(t *testing.T) {
			s := s.as(t)
			subjTok := decodeToken(t, s.agentToken(subj.ClientID, subj.ClientSecret, "")).AccessToken
			// B holds users:write, the sandboxed subject does not: not to be had.
			expectRFC6749(t, s.exchange(delegationForm(subjTok, "scope", "users:write"), asB...), http.StatusBadRequest, "invalid_scope")
			viaB := exchanged(t, s.exchange(delegationForm(subjTok), asB...))["access_token"].(string)
			if in := s.introspect(t, viaB, b.ClientID, b.ClientSecret); in["scope"] != "users:read" {
				t.Fatalf("B acting for a users:read subject holds %v", in["scope"])
			}
			viaC := exchanged(t, s.exchange(delegationForm(viaB), asC...))["access_token"].(string)
			if in := s.introspect(t, viaC, c.ClientID, c.ClientSecret); in["sub"] != subj.ClientID || in["scope"] != "users:read" ||
				!sameJSON(t, in["act"], map[string]any{"sub": c.ClientID, "act": map[string]any{"sub": b.ClientID}}) {
				t.Fatalf("chain from an agent: %v", in)
			}
			mustOK(t, s.killAgent(super, subj.ID, map[string]any{"reason": "subject compromised"}))
			for _, x := range []struct {
				tok, id, secret string
			}{{viaB, b.ClientID, b.ClientSecret}, {viaC, c.ClientID, c.ClientSecret}} {
				expectInactive(t, s.introspect(t, x.tok, x.id, x.secret))
				expectInactive(t, s.introspect(t, x.tok, s.AdminID, s.AdminSecret))
				expectTokenRefused(t, s, x.tok)
			}
			expectRFC6749(t, s.exchange(delegationForm(viaB), asC...), http.StatusBadRequest, "invalid_request")
			// The actors themselves go on.
			mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(decodeToken(t, s.agentToken(c.ClientID, c.ClientSecret, "")).AccessToken)...))
			// Recovery does not revive them.
			mustOK(t, s.recoverAgent(super, subj.ID))
			expectInactive(t, s.introspect(t, viaB, b.ClientID, b.ClientSecret))
			expectInactive(t, s.introspect(t, viaC, c.ClientID, c.ClientSecret))
		})

		t.Run("killing an actor", func(t *testing.T) {
			s := s.as(t)
			// C's tokens without B in their chain, for contrast.
			cOwn := decodeToken(t, s.agentToken(c.ClientID, c.ClientSecret, "")).AccessToken
			cDirect := exchanged(t, s.exchange(delegationForm(saTok), asC...))["access_token"].(string)
			for _, tok := range []string{t1, t2, t3, cOwn, cDirect} {
				if in := s.introspect(t, tok, s.AdminID, s.AdminSecret); in["active"] != true {
					t.Fatalf("before the kill: %v", in)
				}
			}
			mustOK(t, s.killAgent(super, b.ID, map[string]any{"reason": "actor compromised"}))
			// B's own delegated tokens, and C's whose chain has B as an earlier actor.
			for _, tok := range []string{t1, t2, t3} {
				expectInactive(t, s.introspect(t, tok, s.AdminID, s.AdminSecret))
				expectTokenRefused(t, s, tok)
			}
			expectInactive(t, s.introspect(t, t2, c.ClientID, c.ClientSecret))
			expectRFC6749(t, s.exchange(delegationForm(t2), asC...), http.StatusBadRequest, "invalid_request")
			// C's other tokens live on.
			expectActive(t, s.introspect(t, cOwn, c.ClientID, c.ClientSecret), c.ClientID)
			expectActive(t, s.introspect(t, cDirect, c.ClientID, c.ClientSecret), c.ClientID)
			mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(cDirect)...))
			// B cannot exchange any more.
			expectRFC6749(t, s.exchange(delegationForm(saTok), asB...), http.StatusUnauthorized, "invalid_client")
			// Recovery revives none of them.
			mustOK(t, s.recoverAgent(super, b.ID))
			for _, tok := range []string{t1, t2, t3} {
				expectInactive(t, s.introspect(t, tok, s.AdminID, s.AdminSecret))
			}
			expectInactive(t, s.introspect(t, t2, c.ClientID, c.ClientSecret))
		})
	})
}
