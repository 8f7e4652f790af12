// Package handlers is identityd's HTTP layer: the router, middleware, one
// file per API area and one error writer. Rules live one hop away, in
// extensions/ and oauth/.
package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// apiError is an error with its public face: status, stable code, message
// for people and details. Internal causes never go into it. The rules'
// refusals are the same type.
type apiError = extensions.Error

func newError(status int, code, message string, details map[string]any) *apiError {
	return extensions.NewError(status, code, message, details)
}

// envelope is the spec's error body.
type envelope struct {
	Error   string         `json:"error"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// retryAfterUnavailable is the Retry-After of a 503 while storage is down.
const retryAfterUnavailable = "5"

// writeError is the one error writer of the non-OAuth API. Errors it does
// not know are logged with the request id and answered as a bare 500.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var ve *extensions.ValidationError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &ve):
		ae = newError(http.StatusBadRequest, "invalid_request", "The request has invalid fields.", map[string]any{"fields": ve.Fields})
	case errors.Is(err, persistence.ErrNotFound):
		ae = newError(http.StatusNotFound, "not_found", "The resource does not exist.", nil)
	case errors.Is(err, persistence.ErrDuplicate):
		ae = newError(http.StatusConflict, "conflict", "The resource conflicts with one that exists.", nil)
	case errors.Is(err, persistence.ErrMissingReference):
		ae = newError(http.StatusConflict, "missing_reference", "The resource refers to one that does not exist.", nil)
	case persistence.Unavailable(err):
		logger(r).WarnContext(r.Context(), "storage unavailable", "error", err.Error())
		w.Header().Set("Retry-After", retryAfterUnavailable)
		ae = newError(http.StatusServiceUnavailable, "temporarily_unavailable", "The service cannot serve this request now; retry later.", nil)
	case abandoned(r, err):
		logger(r).DebugContext(r.Context(), "request abandoned by its client", "error", err.Error())
		ae = newError(http.StatusServiceUnavailable, "temporarily_unavailable", "The request ended before it was served.", nil)
	default:
		logger(r).ErrorContext(r.Context(), "internal error", "error", err.Error())
		ae = newError(http.StatusInternalServerError, "internal_error", "An internal error occurred.", nil)
	}
	details := ae.Details
	if details == nil {
		details = map[string]any{}
	}
	// A rule's refusal of a change beyond the token's scopes challenges as
	// the route's own does (RFC 6750 §3.1).
	if scope, ok := details["requiredScope"].(string); ok && ae.Code == "insufficient_scope" && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="insufficient_scope", scope="`+scope+`"`)
	}
	writeJSON(w, ae.Status, envelope{Error: ae.Code, Message: ae.Message, Details: details})
}

// abandoned tells whether err is the request's own end: its client went away
// while it was served. Nothing failed on our side and nobody reads the
// answer, so it is not logged as an internal error.
func abandoned(r *http.Request, err error) bool {
	return r.Context().Err() != nil && errors.Is(err, context.Canceled)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeList answers one page of a list in the DESIGN's shape, {"<plural>":
// [...], "total", "limit", "offset"}, each record in its API shape.
func writeList[T, J any](w http.ResponseWriter, plural string, list []T, total int, page persistence.Page, shape func(*T) J) {
	out := make([]J, len(list))
	for i := range list {
		out[i] = shape(&list[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{plural: out, "total": total, "limit": page.Limit, "offset": page.Offset})
}

// maxBody bounds every request body.
const maxBody = 1 << 20

// decodeJSON reads a JSON object body into v strictly: JSON media type, one
// value, no unknown fields, right types, and text the stores hold (UTF-8,
// no NUL, numbers in range: jsonTextProblem), which the decoder alone
// would not refuse. Each failure names what is wrong.
func decodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return newError(http.StatusUnsupportedMediaType, "unsupported_media_type", "The body must be application/json.", nil)
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return jsonError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber() // free-form objects (metadata) keep their numbers as written
	err = dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data")
	}
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data")
		}
	}
	if err != nil {
		return jsonError(err)
	}
	if p := jsonTextProblem(body); p != nil {
		return p
	}
	return nil
}

// jsonError turns a decoding error into its public form.
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var big *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &big):
		return newError(http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("The body exceeds %d bytes.", maxBody), map[string]any{"maxBytes": maxBody})
	case errors.Is(err, io.EOF):
		return newError(http.StatusBadRequest, "invalid_json", "The body is empty; a JSON object is required.", nil)
	case errors.As(err, &syn):
		return newError(http.StatusBadRequest, "invalid_json", "The body is not valid JSON.", map[string]any{"offset": syn.Offset})
	case errors.Is(err, io.ErrUnexpectedEOF):
		return newError(http.StatusBadRequest, "invalid_json", "The body is not valid JSON: it ends too soon.", nil)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "(body)"
		}
		return newError(http.StatusBadRequest, "invalid_request", fmt.Sprintf("Field %q must be of type %s.", field, jsonType(typ.Type.String())), map[string]any{"field": field, "expected": jsonType(typ.Type.String())})
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return newError(http.StatusBadRequest, "invalid_request", fmt.Sprintf("Unknown field %q.", field), map[string]any{"field": field})
	default:
		return newError(http.StatusBadRequest, "invalid_json", "The body is not a single valid JSON value.", nil)
	}
}

// jsonType names a Go type the way a JSON client thinks of it.
func jsonType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "array"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "struct"), strings.Contains(goType, "."):
		return "object"
	case strings.Contains(goType, "int"), strings.Contains(goType, "float"):
		return "number"
	case strings.Contains(goType, "bool"):
		return "boolean"
	default:
		return goType
	}
}

// isoTime renders a time as ISO 8601 in UTC with Z, as every JSON time here.
func isoTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// logger is the log of one request: every line carries its request id and
// principal. Made on demand, so requests that log nothing pay nothing.
func logger(r *http.Request) *slog.Logger {
	if info := infoFrom(r.Context()); info != nil && info.log != nil {
		return info.log.With("request_id", info.id, "principal", info.principal)
	}
	return slog.Default()
}
