package workload

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Subject tokens are attacker input read before anything else is known:
// Verify must answer every string with an RFC 6749 error or a mapping, and
// never panic. It runs on a store of each dialect (PostgreSQL when
// TEST_DATABASE_URL is set), and both must answer every token alike: the
// issuer and subject it looks up come from the token before it is trusted.
func FuzzVerify(f *testing.F) {
	is := newIssuer(f)
	ptr := func(v string) *string { return &v }
	list := func(v ...string) *[]string { return &v }
	ctx := context.Background()
	var services []*Service
	for _, dbURL := range dbtest.URLs(f) {
		store := dbtest.Store(f, dbURL)
		s := New(store)
		issuer, err := s.CreateIssuer(ctx, IssuerInput{Name: ptr("fuzz"), IssuerURL: ptr(is.srv.URL), JWKSURI: ptr(is.srv.URL + "/keys"),
			Platform: ptr("kubernetes"), AllowedAudiences: list("identityd"), AllowedSubjects: list("*")})
		if err != nil {
			f.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		if err := store.CreateAgent(ctx, &persistence.Agent{ID: uuid.NewString(), ClientID: "agt_fuzz", SecretHash: []byte("x"), Name: "fuzz",
			Type: "service", Scopes: []string{"users:read"}, TrustLevel: "sandboxed", Status: persistence.AgentActive, CreatedAt: now, UpdatedAt: now}); err != nil {
			f.Fatal(err)
		}
		if _, err := s.CreateMapping(ctx, MappingInput{IssuerID: issuer.ID, AgentClientID: "agt_fuzz",
			SubjectPattern: "system:serviceaccount:a:b", Scopes: []string{"users:read"}}); err != nil {
			f.Fatal(err)
		}
		services = append(services, s)
	}
	claims := func(edit func(map[string]any)) map[string]any {
		c := map[string]any{"iss": is.srv.URL, "sub": "system:serviceaccount:a:b", "aud": "identityd",
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
		if edit != nil {
			edit(c)
		}
		return c
	}
	valid := is.sign(f, claims(nil))
	for _, seed := range []string{
		valid, tamper(valid), valid + ".", "." + valid, "", ".", "..", "a.b.c", "e30.e30.",
		is.sign(f, claims(func(c map[string]any) { c["sub"] = "system:serviceaccount:a:other" })),
		is.sign(f, claims(func(c map[string]any) { c["sub"] = "a\x00b" })),
		is.sign(f, claims(func(c map[string]any) { c["sub"] = "a\xffb" })),
		unsigned(map[string]any{"alg": "RS256", "kid": "k"}, claims(func(c map[string]any) { c["iss"] = "https://x\x00.example" }), []byte("x")),
		unsigned(map[string]any{"alg": "RS256", "kid": "k"}, claims(func(c map[string]any) { c["iss"] = is.srv.URL + "\xff" }), []byte("x")),
		unsigned(map[string]any{"alg": "none"}, claims(nil), nil),
		unsigned(map[string]any{"alg": "RS256", "kid": "\x00"}, map[string]any{"iss": []any{1}}, []byte("x")),
		unsigned(map[string]any{"alg": "ES256", "crit": []string{"b64"}}, claims(nil), make([]byte, 64)),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var first string
		for i, s := range services {
			fed, err := s.Verify(ctx, token)
			var rfc *fosite.RFC6749Error
			switch {
			case err == nil && fed == nil:
				t.Fatal("no error and no mapping")
			case err != nil && !errors.As(err, &rfc):
				t.Fatalf("error of another kind: %T %v", err, err)
			case err != nil && rfc.CodeField >= 500:
				t.Fatalf("a server error for a token: %v (%s)", err, rfc.DebugField)
			}
			answer := "mapped"
			if err != nil {
				answer = rfc.ErrorField + ": " + rfc.HintField
			}
			if i == 0 {
				first = answer
			} else if answer != first {
				t.Fatalf("the dialects disagree: %q and %q", first, answer)
			}
		}
	})
}
