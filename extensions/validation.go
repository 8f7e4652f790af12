// Package extensions holds identityd's domain capabilities, one package each.
// This file has what they share: the validation error every rule returns.
package extensions

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
)

// ValidationError lists every problem with an input at once, by field.
type ValidationError struct {
	Fields map[string]string
}

func (e *ValidationError) Error() string {
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ": " + e.Fields[k]
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// Add records a problem with a field.
func (e *ValidationError) Add(field, format string, args ...any) {
	if e.Fields == nil {
		e.Fields = map[string]string{}
	}
	e.Fields[field] = fmt.Sprintf(format, args...)
}

// Err returns the error when it holds a problem, else nil.
func (e *ValidationError) Err() error {
	if len(e.Fields) == 0 {
		return nil
	}
	return e
}

// CheckText checks a free-text field: at most max characters, no control
// characters; required fields must not be blank.
func (e *ValidationError) CheckText(field, v string, required bool, max int) {
	switch {
	case required && strings.TrimSpace(v) == "":
		e.Add(field, "is required")
	case len([]rune(v)) > max:
		e.Add(field, "must be at most %d characters", max)
	case strings.IndexFunc(v, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' }) >= 0:
		e.Add(field, "must not contain control characters")
	}
}

// CheckIdentifier checks a field that names something a person reads to
// decide (an action, a resource, a path): like CheckText, but with no
// control (Cc) or format (Cf) character at all, newlines and tabs
// included. Format characters (bidi overrides such as U+202E, zero-width
// ones such as U+200B) change how the text shows without showing
// themselves: "users/\u202e24" would read as "users/42" (issue 39).
func (e *ValidationError) CheckIdentifier(field, v string, required bool, max int) {
	e.CheckText(field, v, required, max)
	if _, bad := e.Fields[field]; !bad && strings.IndexFunc(v, Invisible) >= 0 {
		e.Add(field, "must not contain control or format characters (Unicode Cc, Cf)")
	}
}

// Invisible tells whether r is a control (Cc) or format (Cf) character:
// one that shows as nothing, or changes how the text around it shows.
func Invisible(r rune) bool {
	return unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r)
}

// CheckHTTPSURL checks a URL the server sends people or requests to:
// absolute, no fragment, no user info, https, or http only on a loopback
// host. These are the rules OAuth 2.0 Security BCP (RFC 9700 §2.1) and
// RFC 8252 §7.3 set for redirect URIs; invite accept pages and workload
// issuer and key-set URLs follow them too.
func CheckHTTPSURL(raw string) error {
	if len(raw) > 2000 {
		return fmt.Errorf("must be at most 2000 characters")
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || !u.IsAbs() || u.Host == "":
		return fmt.Errorf("must be an absolute URL")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return fmt.Errorf("must not contain a fragment")
	case u.User != nil:
		return fmt.Errorf("must not contain user information")
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && IsLoopbackHost(u.Hostname()):
		return nil
	case u.Scheme == "http":
		return fmt.Errorf("http is allowed only for loopback hosts; use https")
	default:
		return fmt.Errorf("scheme must be https")
	}
}

// Distinct returns items without repeats, in their first order.
func Distinct(items []string) []string {
	out := make([]string, 0, len(items))
	for _, s := range items {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// IsLoopbackHost tells whether host is localhost or a loopback address.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Error is a refusal with its public face: the HTTP status that carries it,
// a stable snake_case code, a message for people and details. Rules return
// these (or a ValidationError); the HTTP layer renders them in one place.
type Error struct {
	Status  int
	Code    string
	Message string
	Details map[string]any
}

// NewError returns an Error.
func NewError(status int, code, message string, details map[string]any) *Error {
	return &Error{Status: status, Code: code, Message: message, Details: details}
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is matches the same refusal whatever its details: a refusal made with
// details (With) is still the one a caller tests for.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && t.Code == e.Code && t.Message == e.Message
}

// With returns a copy of e carrying details.
func (e *Error) With(details map[string]any) *Error {
	c := *e
	c.Details = details
	return &c
}

// Conflict refuses a change the record's current state does not allow
// (HTTP 409), with a stable code saying which rule.
func Conflict(code, message string, details map[string]any) *Error {
	return NewError(http.StatusConflict, code, message, details)
}

// Hasher hashes client secrets (oauth.SecretHasher in production).
type Hasher interface {
	Hash(ctx context.Context, data []byte) ([]byte, error)
}

// Now is the time records are stamped with: UTC, to the microsecond, what
// PostgreSQL stores, so that an answer reads the same before and after a
// round trip through either dialect.
func Now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// JSONDepth measures how deeply a decoded JSON value nests (a scalar: 0).
func JSONDepth(v any) int {
	deepest := 0
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			deepest = max(deepest, JSONDepth(e))
		}
	case []any:
		for _, e := range v {
			deepest = max(deepest, JSONDepth(e))
		}
	default:
		return 0
	}
	return deepest + 1
}
