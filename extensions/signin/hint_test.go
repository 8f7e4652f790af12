package signin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

func sign(t *testing.T, key any, alg jose.SignatureAlgorithm, kid, typ string, claims any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithHeader("kid", kid)
	if typ != "" {
		opts = opts.WithType(jose.ContentType(typ))
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestParseIDTokenHint(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	strange, _ := rsa.GenerateKey(rand.Reader, 2048)
	keys := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: rsaKey.Public(), KeyID: "r", Algorithm: "RS256", Use: "sig"},
		{Key: ecKey.Public(), KeyID: "e", Algorithm: "ES256", Use: "sig"},
	}}
	const iss = "https://id.example.com"
	past := jwt.NewNumericDate(time.Now().Add(-time.Hour))
	claims := func(sub string, aud ...string) map[string]any {
		return map[string]any{"iss": iss, "sub": sub, "aud": aud, "exp": past, "iat": past, "sid": "s1"}
	}
	cases := []struct {
		name string
		hint string
		ok   bool
	}{
		{"RS256, expired", sign(t, rsaKey, jose.RS256, "r", "JWT", claims("u1", "app_a")), true},
		{"ES256, no typ", sign(t, ecKey, jose.ES256, "e", "", claims("u1", "app_a")), true},
		{"another issuer", sign(t, rsaKey, jose.RS256, "r", "JWT", map[string]any{"iss": "https://evil", "sub": "u1", "aud": "app_a"}), false},
		{"no subject", sign(t, rsaKey, jose.RS256, "r", "JWT", claims("", "app_a")), false},
		{"no audience", sign(t, rsaKey, jose.RS256, "r", "JWT", map[string]any{"iss": iss, "sub": "u1"}), false},
		{"an unknown key", sign(t, strange, jose.RS256, "r", "JWT", claims("u1", "app_a")), false},
		{"a key under another's kid", sign(t, ecKey, jose.ES256, "r", "JWT", claims("u1", "app_a")), false},
		{"an access token", sign(t, rsaKey, jose.RS256, "r", "at+jwt", claims("u1", "app_a")), false},
		{"HS256", sign(t, []byte("0123456789abcdef0123456789abcdef"), jose.HS256, "r", "JWT", claims("u1", "app_a")), false},
		{"not a JWT", "x.y.z", false},
		{"empty", "", false},
		{"huge", string(make([]byte, maxHint+1)), false},
	}
	for _, tc := range cases {
		h, err := ParseIDTokenHint(keys, iss, tc.hint)
		if (err == nil) != tc.ok {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.ok && (h.Subject != "u1" || h.SessionID != "s1" || len(h.Audience) != 1 || h.Audience[0] != "app_a") {
			t.Fatalf("%s: %+v", tc.name, h)
		}
	}
}

// FuzzParseIDTokenHint: arbitrary hints never panic and never verify
// without one of the keys.
func FuzzParseIDTokenHint(f *testing.F) {
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	keys := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "r", Algorithm: "RS256"}}}
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	claims := map[string]any{"iss": "https://id.example.com", "sub": "u", "aud": "a"}
	var t testing.T
	f.Add(sign(&t, other, jose.RS256, "r", "JWT", claims))
	f.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ1In0.")
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, hint string) {
		if h, err := ParseIDTokenHint(keys, "https://id.example.com", hint); err == nil {
			t.Fatalf("%q verified: %+v", hint, h)
		}
	})
}
