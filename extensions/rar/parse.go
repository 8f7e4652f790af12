package rar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
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
// JSON array, within the bounds above, in valid UTF-8, with no member name
// repeated in any object (where parsers disagree on which one counts, a
// resource server could read a value we never checked). Numbers keep their
// text (json.Number). Each entry is returned as decoded; whether it is an
// object of a registered type is for Check.
func Parse(text []byte) ([]any, error) {
	switch {
	case len(text) > MaxDetailsBytes:
		return nil, parseErrorf("authorization_details exceeds %d bytes", MaxDetailsBytes)
	case !utf8.Valid(text):
		return nil, parseErrorf("authorization_details is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('[') {
		return nil, parseErrorf("authorization_details must be a JSON array")
	}
	p := parser{dec: dec}
	entries := []any{}
	for dec.More() {
		if len(entries) == MaxDetailsEntries {
			return nil, parseErrorf("authorization_details has more than %d entries", MaxDetailsEntries)
		}
		v, err := p.value(2)
		if err != nil {
			return nil, err
		}
		entries = append(entries, v)
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, errNotJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, parseErrorf("authorization_details must be one JSON array, with nothing after it")
	}
	if len(entries) == 0 {
		return nil, parseErrorf("authorization_details must list at least one entry")
	}
	return entries, nil
}

var errNotJSON = &ParseError{Reason: "authorization_details is not valid JSON"}

type parser struct{ dec *json.Decoder }

// value reads one JSON value at the given nesting depth.
func (p parser) value(depth int) (any, error) {
	tok, err := p.dec.Token()
	if err != nil {
		return nil, errNotJSON
	}
	d, isDelim := tok.(json.Delim)
	if !isDelim {
		return tok, nil // string, json.Number, bool or nil
	}
	if depth > MaxDetailsDepth {
		return nil, parseErrorf("authorization_details nests deeper than %d levels", MaxDetailsDepth)
	}
	switch d {
	case '[':
		arr := []any{}
		for p.dec.More() {
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		_, err = p.dec.Token()
		return arr, orNotJSON(err)
	case '{':
		obj := map[string]any{}
		for p.dec.More() {
			tok, err := p.dec.Token()
			if err != nil {
				return nil, errNotJSON
			}
			name := tok.(string) // the decoder yields only strings as member names
			if _, dup := obj[name]; dup {
				return nil, parseErrorf("authorization_details repeats the member %q in one object", name)
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			obj[name] = v
		}
		_, err = p.dec.Token()
		return obj, orNotJSON(err)
	default:
		return nil, errNotJSON // a closing delimiter where a value belongs
	}
}

func orNotJSON(err error) error {
	if err != nil {
		return errNotJSON
	}
	return nil
}

// IsParseError tells whether err came from Parse.
func IsParseError(err error) bool {
	var pe *ParseError
	return errors.As(err, &pe)
}
