package workload

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Subject tokens are attacker input read before anything else is known:
// Verify must answer every string with an RFC 6749 error or a mapping, and
// never panic.
func FuzzVerify(f *testing.F) {
	is := newIssuer(f)
	store := dbtest.Store(f, dbtest.URLs(f)["sqlite"])
	s := New(store)
	ptr := func(v string) *string { return &v }
	list := func(v ...string) *[]string { return &v }
	ctx := context.Background()
	if _, err := s.CreateIssuer(ctx, IssuerInput{Name: ptr("fuzz"), IssuerURL: ptr(is.srv.URL), JWKSURI: ptr(is.srv.URL + "/keys"),
		Platform: ptr("kubernetes"), AllowedAudiences: list("identityd"), AllowedSubjects: list("*")}); err != nil {
		f.Fatal(err)
	}
	claims := map[string]any{"iss": is.srv.URL, "sub": "system:serviceaccount:a:b", "aud": "identityd",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	valid := is.sign(f, claims)
	for _, seed := range []string{
		valid, tamper(valid), valid + ".", "." + valid, "", ".", "..", "a.b.c", "e30.e30.",
		unsigned(map[string]any{"alg": "none"}, claims, nil),
		unsigned(map[string]any{"alg": "RS256", "kid": "\x00"}, map[string]any{"iss": []any{1}}, []byte("x")),
		unsigned(map[string]any{"alg": "ES256", "crit": []string{"b64"}}, claims, make([]byte, 64)),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fed, err := s.Verify(ctx, token)
		var rfc *fosite.RFC6749Error
		switch {
		case err == nil && fed == nil:
			t.Fatal("no error and no mapping")
		case err != nil && !errors.As(err, &rfc):
			t.Fatalf("error of another kind: %T %v", err, err)
		}
	})
}
