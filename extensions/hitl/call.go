package hitl

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/identityd/identityd/extensions"
)

// An approval is for one call (issue 39): its method, its path and its
// body, as the agent asked (a gated call that was refused, or the method,
// path and body an explicit request names). The digest of the three binds
// the approval; the gated call must have the same digest, and passes once.

// Bounds of a call.
const (
	MaxCallPathLength = 2000
	MaxCallBodyBytes  = 64 << 10 // the canonical body
)

// callMethods are the methods an M2M call may have.
var callMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}

// Call is the one call an approval is for.
type Call struct {
	Method string // upper case
	Path   string // the URL path, then "?" and the query (CanonicalQuery) when it has one
	Body   string // canonical JSON (CanonicalJSON); "" for no body
	// Shown is Path as stored and shown to people, when it differs: with
	// a secret in it hidden (an invite's token). The digest is Path's.
	Shown string
}

// shown is the path as stored and shown.
func (c Call) shown() string {
	if c.Shown != "" {
		return c.Shown
	}
	return c.Path
}

// Digest is the call's SHA-256, hex: each part length-prefixed, so that no
// two calls share one.
func (c Call) Digest() string {
	h := sha256.New()
	for _, part := range []string{c.Method, c.Path, c.Body} {
		fmt.Fprintf(h, "%d:%s;", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// CanonicalPath is a request path with its query as one string: the
// decoded path, then "?" and the query with its keys sorted (each key's
// values kept in order), so that the order of its parameters does not
// matter and their values do.
func CanonicalPath(path, rawQuery string) string {
	if rawQuery == "" {
		return path
	}
	q, _ := url.ParseQuery(rawQuery) // what the handler reads: malformed pairs are dropped
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// CanonicalJSON is a JSON text as one string, whatever its key order and
// whitespace: decoded, then encoded again with every object's keys sorted
// (by their bytes), no whitespace, strings escaped only where JSON must
// (no HTML escapes), and numbers as written (json.Number). An empty text
// or null is no body: "". A duplicate key keeps its last value, as the
// handlers' decoder does.
//
// Not RFC 8785 (JCS): JCS writes numbers as IEEE 754 doubles, so 2^53 and
// 2^53+1, two different values, would read alike. Here both sides of the
// comparison are this server's, so no other implementation has to agree.
func CanonicalJSON(raw []byte) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "", nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("trailing data after the JSON value")
	}
	return CanonicalValue(v)
}

// CanonicalValue is a decoded JSON value (numbers as json.Number) as
// CanonicalJSON writes it.
func CanonicalValue(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// NewCall checks and makes the call an explicit request names: a method
// an M2M call has, an absolute path (with its query, if any) and a JSON
// body (nil: none); hide turns a path into what may be stored and shown
// of it (Call.Shown). Problems are added to v under the fields' names.
func NewCall(v *extensions.ValidationError, method, path string, body any, hide func(string) string) Call {
	found := false
	for _, m := range callMethods {
		found = found || m == method
	}
	if !found {
		v.Add("method", "must be one of %s", strings.Join(callMethods, ", "))
	}
	v.CheckIdentifier("path", path, true, MaxCallPathLength)
	u, err := url.Parse(path)
	if _, bad := v.Fields["path"]; !bad && (err != nil || !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") || u.Fragment != "" || strings.Contains(path, "#")) {
		v.Add("path", "must be an absolute path on this server, such as /api/v1/m2m/users, with no fragment")
	}
	text, err := CanonicalValue(body)
	switch {
	case err != nil:
		v.Add("body", "must be a JSON value")
	case len(text) > MaxCallBodyBytes:
		v.Add("body", "must be at most %d bytes as JSON", MaxCallBodyBytes)
	}
	if len(v.Fields) > 0 {
		return Call{}
	}
	return Call{Method: method, Path: CanonicalPath(u.Path, u.RawQuery), Body: text, Shown: CanonicalPath(hide(u.Path), u.RawQuery)}
}

// PrettyBody is a call's body as people read it: indented ("" for none).
func PrettyBody(body string) string {
	if body == "" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(body), "", "  "); err != nil {
		return body
	}
	return b.String()
}
