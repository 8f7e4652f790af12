package hitl

import (
	"testing"
	"time"
	"unicode/utf8"

	"github.com/identityd/identityd/persistence"
)

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, input string
		want           bool
	}{
		{"delete_*", "delete_user", true},
		{"delete_*", "delete_", true},
		{"delete_*", "delete", false},
		{"delete_*", "xdelete_user", false},
		{"users/*", "users/42", true},
		{"users/*", "users/42/sessions", true}, // * crosses /
		{"users/?", "users/4", true},
		{"users/?", "users/42", false},
		{"users/?", "users/é", true}, // one character, not one byte
		{"*", "", true},
		{"", "", true},
		{"", "a", false},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false},
		{`a\*b`, "a*b", true},
		{`a\*b`, "aXb", false},
		{`a\?`, "a?", true},
		{`a\?`, "ab", false},
		{`a\\b`, `a\b`, true},
		{"***x", "x", true},
		{"Delete_*", "delete_user", false}, // case-sensitive
		{"*", "\xff", false},               // invalid UTF-8 never matches
	} {
		g, err := CompileGlob(c.pattern)
		if err != nil {
			t.Fatalf("%q: %v", c.pattern, err)
		}
		if got := g.Match(c.input); got != c.want {
			t.Errorf("%q matches %q: %v, want %v", c.pattern, c.input, got, c.want)
		}
	}
	for _, bad := range []string{`a\`, `a\b`, `\`} {
		if _, err := CompileGlob(bad); err == nil {
			t.Errorf("%q compiled", bad)
		}
	}
}

func FuzzGlob(f *testing.F) {
	f.Add("delete_*", "delete_user")
	f.Add(`a\*?*`, "a*bc")
	f.Fuzz(func(t *testing.T, pattern, input string) {
		g, err := CompileGlob(pattern)
		if err != nil {
			return
		}
		g.Match(input)
		// A pattern without wildcards or escapes matches exactly itself.
		if g2, _ := CompileGlob(input); utf8.ValidString(input) && len(input) < 50 && !containsAny(input, `*?\`) && !g2.Match(input) {
			t.Fatalf("%q does not match itself", input)
		}
	})
}

func containsAny(s, chars string) bool {
	for _, c := range s {
		for _, d := range chars {
			if c == d {
				return true
			}
		}
	}
	return false
}

func TestStatus(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		stored   string
		autoDeny bool
		now      time.Time
		want     string
		timedOut bool
	}{
		{persistence.HITLPending, true, at.Add(-time.Nanosecond), persistence.HITLPending, false},
		{persistence.HITLPending, true, at, persistence.HITLDenied, true},
		{persistence.HITLPending, false, at, persistence.HITLExpired, true},
		{persistence.HITLApproved, false, at.Add(time.Hour), persistence.HITLApproved, false},
	} {
		r := &persistence.HITLRequest{Status: c.stored, AutoDenyOnTimeout: c.autoDeny, ExpiresAt: at}
		if got := Status(r, c.now); got != c.want {
			t.Errorf("%+v: %s, want %s", c, got, c.want)
		}
		if got := TimedOut(r, c.now); got != c.timedOut {
			t.Errorf("%+v: timed out %v", c, got)
		}
	}
}
