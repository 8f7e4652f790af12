package rar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/identityd/identityd/extensions"
)

// Bounds on one authorization_details parameter: it is attacker input, read
// before anything else about the request is known to be good.
const (
	MaxDetailsBytes   = 32 << 10 // the JSON text
	MaxDetailsEntries = 20       // entries in the array
	MaxDetailsDepth   = 16       // nesting of arrays and objects, the outer array included
)

// ParseError says why an authorization_details text is not acceptable JSON.
type ParseError struct{ Reason string }

func (e *ParseError) Error() string { return e.Reason }

func parseErrorf(format string, args ...any) error {
	return &ParseError{Reason: fmt.Sprintf(format, args...)}
}

// Parse reads an authorization_details parameter (RFC 9396 §2): a non-empty
// JSON array, within the bounds above, in valid UTF-8 without NUL
// characters, its numbers within the stores' range (extensions.NumberFits),
// with no member name repeated in any object (where parsers disagree on
// which one counts, a resource server could read a value we never
// checked). Numbers keep their text (json.Number). Each entry is returned
// as decoded; whether it is an object of a registered type is for Check.
//
// The tokens come from jsontext, the reader of encoding/json/v2: it refuses
// repeated names itself (escaped spellings included), and
// reads tokens several times faster than encoding/json's Decoder.Token.
func Parse(text []byte) ([]any, error) {
	switch {
	case len(text) > MaxDetailsBytes:
		return nil, parseErrorf("authorization_details exceeds %d bytes", MaxDetailsBytes)
	case !utf8.Valid(text):
		return nil, parseErrorf("authorization_details is not valid UTF-8")
	}
	dec := jsontext.NewDecoder(bytes.NewReader(text))
	if dec.PeekKind() != '[' {
		return nil, parseErrorf("authorization_details must be a JSON array")
	}
	v, err := readValue(dec, 1)
	if err != nil {
		return nil, err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return nil, parseErrorf("authorization_details must be one JSON array, with nothing after it")
	}
	entries := v.([]any)
	switch {
	case len(entries) == 0:
		return nil, parseErrorf("authorization_details must list at least one entry")
	case len(entries) > MaxDetailsEntries:
		return nil, parseErrorf("authorization_details has more than %d entries", MaxDetailsEntries)
	}
	return entries, nil
}

// readValue reads one JSON value at the given nesting depth.
func readValue(dec *jsontext.Decoder, depth int) (any, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, syntaxProblem(err)
	}
	switch tok.Kind() {
	case '"':
		return storable(tok.String())
	case '0':
		if !extensions.NumberFits(tok.String()) {
			return nil, errNumberRange
		}
		return json.Number(tok.String()), nil
	case 't', 'f':
		return tok.Bool(), nil
	case 'n':
		return nil, nil
	}
	if depth > MaxDetailsDepth {
		return nil, parseErrorf("authorization_details nests deeper than %d levels", MaxDetailsDepth)
	}
	if tok.Kind() == '[' {
		arr := []any{}
		for dec.PeekKind() != ']' {
			if depth == 1 && len(arr) == MaxDetailsEntries { // stop reading a huge array early
				return nil, parseErrorf("authorization_details has more than %d entries", MaxDetailsEntries)
			}
			v, err := readValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err := dec.ReadToken()
		return arr, syntaxProblem(err)
	}
	obj := map[string]any{} // tok is '{'
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil, syntaxProblem(err)
		}
		name, err := storable(tok.String()) // before the next read, which reuses the token's buffer
		if err != nil {
			return nil, err
		}
		v, err := readValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		obj[name] = v
	}
	_, err = dec.ReadToken()
	return obj, syntaxProblem(err)
}

// syntaxProblem words a reading error: a repeated name is named, anything
// else is invalid JSON.
func syntaxProblem(err error) error {
	var se *jsontext.SyntacticError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jsontext.ErrDuplicateName):
		name := ""
		if errors.As(err, &se) {
			name = se.JSONPointer.LastToken()
		}
		return parseErrorf("authorization_details repeats the member %q in one object", name)
	default:
		return errNotJSON
	}
}

var errNotJSON = &ParseError{Reason: "authorization_details is not valid JSON"}

// What the stores cannot hold (extensions.JSONTextProblem) is refused:
// granted details are stored with the token and in the audit.
var (
	errNUL         = &ParseError{Reason: "authorization_details contains a NUL character (U+0000)"}
	errNumberRange = &ParseError{Reason: "authorization_details has a number out of range"}
)

// storable passes a string or member name that the stores can hold.
func storable(s string) (string, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return "", errNUL
	}
	return s, nil
}
