package directory

import (
	"errors"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions"
)

func TestPasswords(t *testing.T) {
	hash, err := HashPassword("correct horse battery")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hash, "$argon2id$v=19$m=65536,t=3,p=4$") {
		t.Fatalf("hash %q is not argon2id in PHC form with our parameters", hash)
	}
	again, _ := HashPassword("correct horse battery")
	if again == hash {
		t.Fatal("two hashes of one password are equal: no salt")
	}
	for pw, want := range map[string]bool{"correct horse battery": true, "correct horse batter": false, "": false} {
		if ok, err := VerifyPassword(hash, pw); err != nil || ok != want {
			t.Errorf("verify %q: %v %v, want %v", pw, ok, err, want)
		}
	}
	for _, bad := range []string{"", "$argon2i$v=19$m=1,t=1,p=1$c2FsdA$a2V5", "$argon2id$v=18$m=1,t=1,p=1$c2FsdA$a2V5", "$argon2id$v=19$m=x$c2FsdA$a2V5", "$argon2id$v=19$m=1,t=1,p=1$!!$a2V5"} {
		if _, err := VerifyPassword(bad, "pw"); err == nil {
			t.Errorf("malformed hash %q accepted", bad)
		}
	}
}

func TestCheckEmail(t *testing.T) {
	for email, ok := range map[string]bool{
		"ada@example.com":                  true,
		"Ada.Lovelace+x@example.co.uk":     true,
		"":                                 false,
		"ada":                              false,
		"Ada <ada@example.com>":            false,
		"ada@example.com, b@x.io":          false,
		strings.Repeat("a", 250) + "@x.io": false,
	} {
		var v extensions.ValidationError
		CheckEmail(&v, "email", email)
		if (v.Err() == nil) != ok {
			t.Errorf("CheckEmail(%q) = %v, want ok %v", email, v.Err(), ok)
		}
	}
}

func TestSlugFrom(t *testing.T) {
	for name, want := range map[string]string{
		"Acme Corp":               "acme-corp",
		"  ACME -- Corp!  ":       "acme-corp",
		"Zürich Labs":             "z-rich-labs",
		strings.Repeat("ab ", 40): strings.TrimSuffix(strings.Repeat("ab-", 21), "-"),
	} {
		if got := slugFrom(name); got != want || !slugSyntax.MatchString(got) {
			t.Errorf("slugFrom(%q) = %q, want %q", name, got, want)
		}
	}
}

// The changes of a user beyond users:write: email and emailVerified need
// users:admin; other fields need nothing more.
func TestMayChange(t *testing.T) {
	for _, c := range []struct {
		changed map[string]any
		p       Powers
		want    string // the scope required, "" when allowed
	}{
		{map[string]any{"name": "Ada", "status": "disabled", "metadata": true}, Powers{}, ""},
		{map[string]any{}, Powers{}, ""},
		{map[string]any{"email": "x@example.com"}, Powers{}, "users:admin"},
		{map[string]any{"emailVerified": true}, Powers{Admin: true}, "users:admin"}, // powers() gives admin UsersAdmin too
		{map[string]any{"name": "Ada", "emailVerified": false}, Powers{}, "users:admin"},
		{map[string]any{"email": "x@example.com", "emailVerified": true}, Powers{UsersAdmin: true}, ""},
	} {
		err := c.p.mayChange(c.changed)
		var refusal *extensions.Error
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v with %+v: %v", c.changed, c.p, err)
		case c.want != "" && (!errors.As(err, &refusal) || refusal.Status != 403 || refusal.Code != "insufficient_scope" || refusal.Details["requiredScope"] != c.want):
			t.Errorf("%v with %+v: %v, want insufficient_scope naming %s", c.changed, c.p, err, c.want)
		}
	}
}
