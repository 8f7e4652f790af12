package directory

import (
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
