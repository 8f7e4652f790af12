package extensions_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	_ "github.com/lib/pq" // PostgreSQL driver

	"github.com/identityd/identityd/extensions"
)

var numbers = map[string]bool{
	"0": true, "-0": true, "1e400": true, "1e-400": true, "9007199254740993": true, "1E+5": true,
	"1e131071": true, "9.99e131071": true, "0.0001e131075": true, "-1e131071": true,
	"1e131072": false, "10e131071": false, "0.0001e131076": false, "1e999999999": false, "1e99999999999999999999": false,
	"1e-16383": true, "1.5e-16382": true, "0e-16383": true, "0e999999999": true,
	"1e-16384": false, "1.5e-16383": false, "0e-16384": false, "0e1073741823": false,
	"0." + strings.Repeat("0", 16382) + "1": true, "0." + strings.Repeat("0", 16383) + "1": false,
	"1" + strings.Repeat("0", 131071): true, "1" + strings.Repeat("0", 131072): false,
}

func TestNumberFits(t *testing.T) {
	for lit, ok := range numbers {
		if extensions.NumberFits(lit) != ok {
			t.Errorf("NumberFits(%.40s…) = %v", lit, !ok)
		}
	}
	for _, malformed := range []string{"1e", "1e+", "-", "1.2.3", "1e5e5"} {
		if !extensions.NumberFits(malformed) {
			t.Errorf("%q is for the decoder to refuse, not out of range", malformed)
		}
	}
}

func TestJSONTextProblem(t *testing.T) {
	for text, want := range map[string]int{
		`{"a":"b","c":[1,2.5,-3e7,true,null]}`: -1,
		`{"a":"\uFFFD é \ud83d\ude00"}`:        -1, // an escaped U+FFFD is a character like any other
		`{"a":"\\u0000"}`:                      -1, // a backslash, then u0000
		`{"a":"\"\u0000"}`:                     8,
		`{"a\u0000":1}`:                        3,
		"{\"a\":\"b\xff\"}":                    7,
		"{\"a\":\"\xc3\x28\"}":                 6,
		`{"a":"\ud800"}`:                       6,
		`{"a":"\ud800\u0041"}`:                 6,
		`{"a":"\udc00"}`:                       6,
		`{"a":"\ud800`:                         6,
		`{"a":1e131072}`:                       5,
		`[1,2,1e-99999]`:                       5,
		`{"a":"1e999999999"}`:                  -1, // a string, not a number
		strings.Repeat("[", 100000) + strings.Repeat("]", 100000): -1,
		`{"a":"\u00`: -1, // malformed: the decoder's to report
	} {
		if got, problem := extensions.JSONTextProblem([]byte(text)); got != want {
			t.Errorf("%.60s: offset %d (%s), want %d", text, got, problem, want)
		}
	}
	for s, ok := range map[string]bool{"abc é": true, "": true, "a\x00": false, "\xff": false, "\uFFFD": true} {
		if extensions.ValidText(s) != ok {
			t.Errorf("ValidText(%q) = %v", s, !ok)
		}
	}
}

// The bounds are PostgreSQL's: what JSONTextProblem accepts, jsonb holds,
// and what it refuses, jsonb refuses too.
func TestBoundsArePostgreSQLs(t *testing.T) {
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		t.Skip("TEST_DATABASE_URL is not set")
	}
	db, err := sql.Open("postgres", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	texts := []string{`{"a":"\u0000"}`, "{\"a\":\"\xff\"}", `{"a":"\ud800"}`, `{"a":"\ud83d\ude00"}`, `{"a":"\uFFFD"}`}
	for lit := range numbers {
		texts = append(texts, `{"a":`+lit+`}`)
	}
	for _, text := range texts {
		_, err := db.ExecContext(ctx, `SELECT $1::jsonb`, text)
		if off, problem := extensions.JSONTextProblem([]byte(text)); (off < 0) != (err == nil) {
			t.Errorf("%.50s: we find %q, PostgreSQL says %v", text, problem, err)
		}
	}
	for _, s := range []string{"a\x00b", "\xff", "ok é"} {
		_, err := db.ExecContext(ctx, `SELECT $1::text`, s)
		if extensions.ValidText(s) != (err == nil) {
			t.Errorf("%q: ValidText %v, PostgreSQL says %v", s, extensions.ValidText(s), err)
		}
	}
}

func TestTruncate(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"cut here", 3, "cut"},
		{"caf\u00e9!", 4, "caf"}, // é is two bytes: not split
		{"\u00e9\u00e9", 3, "\u00e9"},
	} {
		if got := extensions.Truncate(c.in, c.n); got != c.want || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// Free text shows its control and format characters as escapes, never
// applied; newlines and tabs stay; other text is as written.
func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"users/\u202e24":        "users/<U+202E>24",
		"zero\u200bwidth":       "zero<U+200B>width",
		"bell\a and esc\x1b":    "bell<U+0007> and esc<U+001B>",
		"isolate\u2067x\u2069":  "isolate<U+2067>x<U+2069>",
		"lines\nand\ttabs":      "lines\nand\ttabs",
		"plain <b>text</b> & ü": "plain <b>text</b> & ü",
		"":                      "",
	} {
		if got := extensions.Visible(in); got != want {
			t.Errorf("Visible(%q) = %q, want %q", in, got, want)
		}
	}
}
