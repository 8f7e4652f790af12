package extensions

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// What both stores hold. PostgreSQL's text and jsonb take only UTF-8 and no
// NUL character, and jsonb keeps numbers as numeric, which has at most
// 131,072 digits before the decimal point and 16,383 after it; SQLite
// takes all of it. Input outside these bounds is refused before any
// storage, so that both dialects answer it alike (docs/decisions.md).
const (
	maxNumberDigits = 131072    // before the decimal point
	maxNumberScale  = 16383     // after it
	maxExponent     = 1<<30 - 1 // numeric refuses exponents from here on, even of zero
)

// ValidText reports whether s is UTF-8 without NUL characters.
func ValidText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// JSONTextProblem finds the first thing in a JSON text that cannot be
// stored as it reads: bytes that are not UTF-8 (a decoder would turn them
// into U+FFFD), a \u0000 escape, an escaped surrogate that is not half of a
// pair (RFC 8259 §8.2: decoders disagree on it; a decoder would turn it
// into U+FFFD), or a number out of range (NumberFits). It returns the byte
// offset of the problem and a phrase naming it, or -1 and "". The text
// need not be valid JSON (a decoder reports that); scanning is linear and
// keeps no stack, whatever the nesting.
func JSONTextProblem(b []byte) (int, string) {
	inString := false
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i, "bytes that are not UTF-8"
			}
			i += n
			continue
		case inString && c == '"':
			inString = false
		case inString && c == '\\':
			if i+1 < len(b) && b[i+1] == 'u' {
				r, ok := hex4(b, i+2)
				switch {
				case !ok: // malformed: the decoder says so
				case r == 0:
					return i, "a NUL character (U+0000)"
				case r >= 0xDC00 && r <= 0xDFFF:
					return i, "an unpaired surrogate escape"
				case r >= 0xD800 && r < 0xDC00:
					low, ok := hex4(b, i+8)
					if i+7 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' || !ok || low < 0xDC00 || low > 0xDFFF {
						return i, "an unpaired surrogate escape"
					}
					i += 12
					continue
				default:
					i += 6
					continue
				}
			}
			i += 2 // the escaped character, whatever it is
			continue
		case inString:
		case c == '"':
			inString = true
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(b) && strings.IndexByte("+-.eE0123456789", b[j]) >= 0 {
				j++
			}
			if !NumberFits(string(b[i:j])) {
				return i, "a number out of range"
			}
			i = j
			continue
		}
		i++
	}
	return -1, ""
}

// hex4 reads the four hex digits of a \u escape at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 16)
	return rune(v), err == nil
}

// NumberFits reports whether a JSON number, written out in plain decimal
// notation, has at most 131,072 digits before the decimal point and 16,383
// after it: what PostgreSQL's numeric (and so jsonb) holds. 1e400 fits;
// 1e131072 and 1e-16384 do not. A literal that is not a JSON number is
// left to the decoder and reported as fitting.
func NumberFits(lit string) bool {
	mant, exp, hasExp := strings.Cut(strings.ToLower(lit), "e")
	e := 0
	if hasExp {
		var err error
		if e, err = strconv.Atoi(exp); err != nil {
			// Too many digits for an int is out of range; anything else
			// is not a number, for the decoder to report.
			digits := strings.TrimLeft(exp, "+-")
			return digits == "" || strings.Trim(digits, "0123456789") != ""
		}
		if e >= maxExponent || e <= -maxExponent {
			return false
		}
	}
	intPart, frac, _ := strings.Cut(strings.TrimPrefix(mant, "-"), ".")
	if len(frac)-e > maxNumberScale {
		return false
	}
	digits := intPart + frac
	significant := strings.TrimLeft(digits, "0")
	if significant == "" {
		return true // zero
	}
	// The power of ten of the leading significant digit.
	lead := len(intPart) - 1 - (len(digits) - len(significant)) + e
	return lead < maxNumberDigits
}

// Truncate cuts s to at most n bytes without splitting a character (the
// stores take only valid UTF-8).
func Truncate(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "")
	}
	return s
}

// Visible is free text as a person may safely read it: every control (Cc)
// and format (Cf) character, which would show as nothing or reorder the
// text around it, is replaced by a visible escape, <U+202E>; newlines and
// tabs stay (issue 39). Identifiers refuse these characters
// (CheckIdentifier); free text keeps them, shown, never applied.
func Visible(s string) string {
	if strings.IndexFunc(s, visibleEscaped) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if visibleEscaped(r) {
			fmt.Fprintf(&b, "<U+%04X>", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func visibleEscaped(r rune) bool { return r != '\n' && r != '\t' && Invisible(r) }
