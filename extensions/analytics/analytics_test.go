package analytics

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence"
)

func TestParseWindow(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	today := persistence.DayOf(now)
	for _, c := range []struct {
		from, to string
		def, max int
		want     Window
		bad      bool
	}{
		{"", "", 30, 366, Window{today - 29, today}, false},
		{"2026-11-01", "", 30, 366, Window{today - 25, today}, false},
		{"", "2026-11-10", 7, 366, Window{today - 22, today - 16}, false},
		{"2026-11-26", "2026-11-26", 30, 366, Window{today, today}, false},
		{"2026-11-27", "2026-11-26", 30, 366, Window{}, true},
		{"2025-01-01", "2026-11-26", 30, 366, Window{}, true},
		{"", "2026-12-30", 30, 366, Window{}, true},
		{"26-11-01", "", 30, 366, Window{}, true},
		{"", "tomorrow", 30, 366, Window{}, true},
		{"1969-12-01", "1970-01-02", 60, 366, Window{}, true},
	} {
		w, err := ParseWindow(c.from, c.to, c.def, c.max, now)
		if (err != nil) != c.bad || !c.bad && w != c.want {
			t.Errorf("ParseWindow(%q, %q) = %v, %v; want %v, bad %v", c.from, c.to, w, err, c.want, c.bad)
		}
	}
}

func TestMethodName(t *testing.T) {
	for in, want := range map[string]string{"pwd": "password", "password": "password", "otp": "otp", "email": "magic-link", "hwk": "passkey", "swk": "passkey", "passkey": "passkey", "fed": "upstream", "": ""} {
		if got := MethodName(in); got != want {
			t.Errorf("MethodName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDecodeCursor(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for in, ok := range map[string]bool{
		enc(`{"t":"2026-11-26T10:00:00Z","i":"0190d7a2-0000-7000-8000-000000000000"}`):       true,
		enc(`{"t":"2026-11-26T10:00:00Z","i":"x"}`):                                          false,
		enc(`{"i":"0190d7a2-0000-7000-8000-000000000000"}`):                                  false,
		enc(`{"t":"2026-11-26T10:00:00Z","i":"0190d7a2-0000-7000-8000-000000000000","x":1}`): false,
		enc(`[]`): false,
		"!!":      false,
		"":        false,
	} {
		if _, got := decodeCursor(in); got != ok {
			t.Errorf("decodeCursor(%q) ok = %v, want %v", in, got, ok)
		}
	}
}

func TestFilterTypes(t *testing.T) {
	if got := filterTypes([]string{persistence.EventSignIn, persistence.EventSignInFailed}, FailureTypes, true); len(got) != 1 || got[0] != persistence.EventSignInFailed {
		t.Errorf("failures of the asked types: %v", got)
	}
	if got := filterTypes(nil, FailureTypes, false); len(got) != len(KnownTypes)-len(FailureTypes) {
		t.Errorf("successes of all types: %d", len(got))
	}
}
