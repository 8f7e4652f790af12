package apikeys

import (
	"strings"
	"testing"
	"time"
)

func TestKeyFormat(t *testing.T) {
	k := NewKey("abcdefgh2345")
	if len(k) != KeyLength || !strings.HasPrefix(k, "idk_abcdefgh2345_") || !WellFormed(k) {
		t.Fatalf("key %q", k)
	}
	if NewKey("abcdefgh2345") == k {
		t.Fatal("two keys alike")
	}
	swap := func(i int, c byte) string { b := []byte(k); b[i] = c; return string(b) }
	other := func(c byte) byte {
		if c == 'A' {
			return 'B'
		}
		return 'A'
	}
	for name, s := range map[string]string{
		"empty": "", "prefix only": Prefix, "short": k[:KeyLength-1], "long": k + "A",
		"secret changed":   swap(30, other(k[30])),
		"checksum changed": swap(KeyLength-1, other(k[KeyLength-1])),
		"tag changed":      swap(5, 'z'+0*k[5]),
		"tag not base32":   swap(5, '1'),
		"no separator":     swap(16, 'a'),
		"not base62":       swap(40, '-'),
		"other prefix":     "ghp" + k[3:],
		"non-ASCII":        k[:20] + "é" + k[22:],
		"NUL":              swap(30, 0),
	} {
		if s == k {
			continue // a swap that changed nothing
		}
		if WellFormed(s) {
			t.Errorf("%s: %q taken as well formed", name, s)
		}
	}
	if h := Hint(k); h != k[:17]+"…"+k[62:] {
		t.Fatalf("hint %q", h)
	}
	if Tag("app_ABCDEFGHIJKLMNOP") != "ABCDEFGHIJKL" || Tag("app_abc") != "abc" {
		t.Fatal("tag")
	}
}

func TestInputValidation(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	future, past := now.Add(time.Hour), now.Add(-time.Second)
	tooFar := now.Add(MaxLifetime + time.Hour)
	user := &Owner{Type: OwnerUser, ID: "0190d7a2-0000-7000-8000-000000000000"}
	for _, c := range []struct {
		name  string
		in    Input
		field string // "" valid
	}{
		{"minimal", Input{Name: "ci", Owner: user}, ""},
		{"full", Input{Name: "ci", Owner: &Owner{Type: OwnerOrg, ID: user.ID}, Scopes: []string{"orders:read", "a/b", "x!"}, ExpiresAt: &future, Metadata: map[string]any{"k": "v"}}, ""},
		{"no name", Input{Owner: user}, "name"},
		{"blank name", Input{Name: "  ", Owner: user}, "name"},
		{"no owner", Input{Name: "ci"}, "owner"},
		{"owner type", Input{Name: "ci", Owner: &Owner{Type: "team", ID: user.ID}}, "owner.type"},
		{"owner id", Input{Name: "ci", Owner: &Owner{Type: OwnerUser, ID: "x"}}, "owner.id"},
		{"scope with space", Input{Name: "ci", Owner: user, Scopes: []string{"a b"}}, "scopes[0]"},
		{"scope with quote", Input{Name: "ci", Owner: user, Scopes: []string{"ok", `a"b`}}, "scopes[1]"},
		{"empty scope", Input{Name: "ci", Owner: user, Scopes: []string{""}}, "scopes[0]"},
		{"long scope", Input{Name: "ci", Owner: user, Scopes: []string{strings.Repeat("a", MaxScope+1)}}, "scopes[0]"},
		{"non-ASCII scope", Input{Name: "ci", Owner: user, Scopes: []string{"é"}}, "scopes[0]"},
		{"too many scopes", Input{Name: "ci", Owner: user, Scopes: make([]string, MaxScopes+1)}, "scopes"},
		{"expired", Input{Name: "ci", Owner: user, ExpiresAt: &past}, "expiresAt"},
		{"too far", Input{Name: "ci", Owner: user, ExpiresAt: &tooFar}, "expiresAt"},
		{"big metadata", Input{Name: "ci", Owner: user, Metadata: map[string]any{"k": strings.Repeat("a", 17<<10)}}, "metadata"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.in.validate(now)
			if c.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.field+":") {
				t.Fatalf("want a problem with %s, got %v", c.field, err)
			}
		})
	}
}

func TestUsesWrittenAtMostOnceAMinute(t *testing.T) {
	s := &Service{pending: map[string]time.Time{}, written: map[string]time.Time{}}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.used("k", at)
	s.written["k"], s.pending = at, map[string]time.Time{} // as a flush leaves it
	s.used("k", at.Add(30*time.Second))
	if len(s.pending) != 0 {
		t.Fatal("a use within the minute is written again")
	}
	s.used("k", at.Add(TouchEvery))
	if !s.pending["k"].Equal(at.Add(TouchEvery)) {
		t.Fatal("a use a minute later is not written")
	}
}
