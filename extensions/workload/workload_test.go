package workload

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"system:serviceaccount:prod:agent", "system:serviceaccount:prod:agent", true},
		{"system:serviceaccount:prod:agent", "system:serviceaccount:prod:agent2", false},
		{"system:serviceaccount:prod:*", "system:serviceaccount:prod:agent", true},
		{"system:serviceaccount:prod:*", "system:serviceaccount:dev:agent", false},
		{"*", "", true},
		{"*", "anything at all", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "a-b-b-c", true},
		{"a*b*c", "a-c-b", false},
		{"*:agent", "ns:agent", true},
		{"*:agent", "ns:agent:x", false},
		{"x*", "", false},
	} {
		if got := matchGlob(c.pattern, c.s); got != c.want {
			t.Errorf("matchGlob(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// issuer is a platform's token service in miniature: keys, a JWKS on
// 127.0.0.1, and tokens signed with them.
type issuer struct {
	srv          *httptest.Server
	key          any
	kid          string
	alg          jose.SignatureAlgorithm
	fetches      atomic.Int64
	cacheControl atomic.Value // string: the key set's Cache-Control
	redirect     atomic.Bool  // answer 302 to another place instead
}

func newIssuer(t testing.TB) *issuer {
	is := &issuer{}
	is.rotate(t, jose.RS256)
	is.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.fetches.Add(1)
		if is.redirect.Load() && r.URL.Path != "/elsewhere" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		if cc, _ := is.cacheControl.Load().(string); cc != "" {
			w.Header().Set("Cache-Control", cc)
		}
		var pub any
		switch k := is.key.(type) {
		case *rsa.PrivateKey:
			pub = &k.PublicKey
		case *ecdsa.PrivateKey:
			pub = &k.PublicKey
		}
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: is.kid, Algorithm: string(is.alg), Use: "sig"}}})
	}))
	t.Cleanup(is.srv.Close)
	return is
}

// rotate replaces the signing key (and the JWKS serves only the new one).
func (is *issuer) rotate(t testing.TB, alg jose.SignatureAlgorithm) {
	var err error
	switch alg {
	case jose.ES256:
		is.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		is.key, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	if err != nil {
		t.Fatal(err)
	}
	is.alg, is.kid = alg, uuid.NewString()
}

func (is *issuer) sign(t testing.TB, claims map[string]any) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: is.alg, Key: is.key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", is.kid))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(claims)
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := jws.CompactSerialize()
	return out
}

// unsigned builds a token with any header, e.g. alg none or HS256.
func unsigned(header, claims map[string]any, sig []byte) string {
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	return enc(header) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// tamper changes one character in the middle of a token's signature.
func tamper(token string) string {
	i := strings.LastIndexByte(token, '.') + (len(token)-strings.LastIndexByte(token, '.'))/2
	c := byte('A')
	if token[i] == 'A' {
		c = 'B'
	}
	return token[:i] + string(c) + token[i+1:]
}

func TestVerify(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		s := New(store)
		is := newIssuer(t)
		ptr := func(v string) *string { return &v }
		list := func(v ...string) *[]string { return &v }
		registered, err := s.CreateIssuer(ctx, IssuerInput{
			Name: ptr("cluster"), IssuerURL: ptr(is.srv.URL), JWKSURI: ptr(is.srv.URL + "/keys"), Platform: ptr("kubernetes"),
			AllowedAudiences: list("identityd"), AllowedSubjects: list("system:serviceaccount:prod:*"),
		})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		agent := &persistence.Agent{ID: uuid.NewString(), ClientID: "agt_fed", SecretHash: []byte("x"), Name: "fed", Type: "service",
			Scopes: []string{"users:read"}, TrustLevel: "sandboxed", Status: persistence.AgentActive, CreatedAt: now, UpdatedAt: now}
		if err := store.CreateAgent(ctx, agent); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateMapping(ctx, MappingInput{IssuerID: registered.ID, AgentClientID: "agt_fed",
			SubjectPattern: "system:serviceaccount:prod:agent", Scopes: []string{"users:read", "users:write"}}); err != nil {
			t.Fatal(err)
		}
		claims := func(edit func(map[string]any)) map[string]any {
			c := map[string]any{"iss": is.srv.URL, "sub": "system:serviceaccount:prod:agent", "aud": []string{"other", "identityd"},
				"iat": time.Now().Unix(), "nbf": time.Now().Unix(), "exp": time.Now().Add(10 * time.Minute).Unix()}
			if edit != nil {
				edit(c)
			}
			return c
		}

		fed, err := s.Verify(ctx, is.sign(t, claims(nil)))
		if err != nil {
			t.Fatal(err)
		}
		if fed.AgentClientID != "agt_fed" || fed.Subject != "system:serviceaccount:prod:agent" || fed.Issuer != is.srv.URL || len(fed.Scopes) != 2 {
			t.Fatalf("federated %+v", fed)
		}

		hs := hmac.New(sha256.New, []byte("key"))
		for _, c := range []struct {
			name, token, says string
		}{
			{"alg none", unsigned(map[string]any{"alg": "none", "typ": "JWT"}, claims(nil), nil), "asymmetric algorithm"},
			{"HS256", unsigned(map[string]any{"alg": "HS256", "typ": "JWT"}, claims(nil), hs.Sum(nil)), "asymmetric algorithm"},
			{"not a JWT", "a.b", "asymmetric algorithm"},
			{"unknown issuer", is.sign(t, claims(func(c map[string]any) { c["iss"] = "https://other.example" })), "is not registered"},
			{"NUL in sub", is.sign(t, claims(func(c map[string]any) { c["sub"] = "system:serviceaccount:prod:a\x00" })), "holds a NUL character"},
			{"bad signature", tamper(is.sign(t, claims(nil))), "signature"},
			{"signed by another key", newIssuer(t).sign(t, claims(nil)), "signature"},
			{"audience", is.sign(t, claims(func(c map[string]any) { c["aud"] = "someone-else" })), "audience"},
			{"expired", is.sign(t, claims(func(c map[string]any) { c["exp"] = time.Now().Add(-2 * time.Minute).Unix() })), "expired"},
			{"no exp", is.sign(t, claims(func(c map[string]any) { delete(c, "exp") })), "no valid exp"},
			{"not yet valid", is.sign(t, claims(func(c map[string]any) { c["nbf"] = time.Now().Add(5 * time.Minute).Unix() })), "not yet valid"},
			{"too old", is.sign(t, claims(func(c map[string]any) { c["iat"] = time.Now().Add(-2 * time.Hour).Unix() })), "too old"},
			{"no iat", is.sign(t, claims(func(c map[string]any) { delete(c, "iat") })), "no valid iat"},
			{"subject not allowed", is.sign(t, claims(func(c map[string]any) { c["sub"] = "system:serviceaccount:dev:agent" })), "allowed subjects"},
			{"no mapping", is.sign(t, claims(func(c map[string]any) { c["sub"] = "system:serviceaccount:prod:other" })), "no mapping"},
		} {
			_, err := s.Verify(ctx, c.token)
			var rfc *fosite.RFC6749Error
			if !errors.As(err, &rfc) || rfc.ErrorField != "invalid_request" || !strings.Contains(rfc.HintField, c.says) {
				t.Errorf("%s: got %v, want invalid_request saying %q", c.name, err, c.says)
			}
		}

		// Key rotation at the issuer: the next token names a key the cache
		// does not hold, and the key set is fetched again (once the last
		// such fetch, for the token of another key above, is missInterval
		// old).
		later := time.Now().Add(missInterval)
		s.now = func() time.Time { return later }
		before := is.fetches.Load()
		is.rotate(t, jose.ES256)
		if _, err := s.Verify(ctx, is.sign(t, claims(nil))); err != nil {
			t.Fatalf("after rotation: %v", err)
		}
		if is.fetches.Load() != before+1 {
			t.Fatalf("key set fetched %d times for the rotation, want once", is.fetches.Load()-before)
		}
		// A warm cache fetches nothing.
		for range 5 {
			if _, err := s.Verify(ctx, is.sign(t, claims(nil))); err != nil {
				t.Fatal(err)
			}
		}
		if is.fetches.Load() != before+1 {
			t.Fatal("a warm key set was fetched again")
		}
	})
}

// BenchmarkVerify is one federation check with a warm key set: parse,
// issuer, signature (RS256, 2048 bits), claims, mapping.
func BenchmarkVerify(b *testing.B) {
	r := newFedRig(b, dbtest.URLs(b)["sqlite"])
	r.s.now = extensions.Now // a moving clock: the key set stays trusted
	ctx := context.Background()
	token := r.is.sign(b, r.claims())
	for b.Loop() {
		if _, err := r.s.Verify(ctx, token); err != nil {
			b.Fatal(err)
		}
	}
}
