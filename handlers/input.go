package handlers

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
)

// Text the stores cannot hold (bytes that are not UTF-8, NUL characters,
// numbers beyond PostgreSQL's numeric) is refused at the door, with a 400
// that says where, before anything is looked up or stored: the path, the
// query and the header values here, JSON bodies in decodeJSON, OAuth
// parameters in oauthForm (docs/decisions.md).

// badText is the refusal of one part of a request.
func badText(part, message string, details map[string]any) *apiError {
	if details == nil {
		details = map[string]any{}
	}
	details["part"] = part
	return newError(http.StatusBadRequest, "invalid_request", message, details)
}

// requestTextProblem checks the path, the query and the header values
// identityd reads of a request. The intent headers are left to parseIntent, which refuses them
// as invalid_intent_header once the caller is known (so an agent's refused
// call is still on its trail).
func requestTextProblem(r *http.Request) *apiError {
	// The decoded path holds every byte of the raw one ("%FF" is 0xFF).
	if !extensions.ValidText(r.URL.Path) {
		return badText("path", "The path must be UTF-8 text without NUL characters.", nil)
	}
	if r.URL.RawQuery != "" {
		q, _ := url.ParseQuery(r.URL.RawQuery) // what Query() reads; malformed pairs are dropped there too
		for name, values := range q {
			if !extensions.ValidText(name) {
				return badText("query", "Query parameter names must be UTF-8 text without NUL characters.", nil)
			}
			for _, v := range values {
				if !extensions.ValidText(v) {
					return badText("query", fmt.Sprintf("Query parameter %q must be UTF-8 text without NUL characters.", name), map[string]any{"field": name})
				}
			}
		}
	}
	for _, name := range checkedHeaders {
		for _, v := range r.Header.Values(name) {
			if !extensions.ValidText(v) {
				return badText("header", "Header "+name+" must be UTF-8 text without NUL characters.", map[string]any{"header": name})
			}
		}
	}
	return nil
}

// checkedHeaders are the headers whose values identityd uses as text
// (credentials are looked up; X-Request-ID is checked where it is read, the
// intent headers by parseIntent). Others are not read, so not judged:
// RFC 9110 §5.5 lets field values carry bytes beyond ASCII (obs-text).
var checkedHeaders = []string{"Authorization"}

// oauthPaths are the endpoints that answer RFC 6749 errors.
var oauthPaths = map[string]bool{oauth.TokenPath: true, "/oauth/token": true, oauth.IntrospectPath: true, oauth.RevokePath: true, BackchannelPath: true}

// writeTextProblem answers a requestTextProblem in the shape of the
// endpoint asked for: RFC 6749 at the OAuth endpoints, else the envelope.
func writeTextProblem(w http.ResponseWriter, r *http.Request, p *apiError) {
	if oauthPaths[r.URL.Path] {
		writeOAuthError(w, p.Status, "invalid_request", "The request has bytes that are not UTF-8 or a NUL character in its "+p.Details["part"].(string)+".")
		return
	}
	writeError(w, r, p)
}

// formTextProblem is an error_description when an OAuth request's
// parameters or HTTP Basic credentials are not UTF-8 text without NUL.
func formTextProblem(r *http.Request) string {
	for name, values := range r.PostForm {
		if !extensions.ValidText(name) {
			return "Parameter names must be UTF-8 text without NUL characters."
		}
		for _, v := range values {
			if !extensions.ValidText(v) {
				return "Parameter values must be UTF-8 text without NUL characters."
			}
		}
	}
	if id, secret, ok := r.BasicAuth(); ok {
		for _, s := range []string{id, secret} {
			plain, err := url.QueryUnescape(s) // RFC 6749 §2.3.1 form-encodes both
			if !extensions.ValidText(s) || err == nil && !extensions.ValidText(plain) {
				return "The HTTP Basic credentials must be UTF-8 text without NUL characters."
			}
		}
	}
	return ""
}

// jsonTextProblem refuses a JSON body that JSONTextProblem finds fault
// with; the offset is the byte's in the body.
func jsonTextProblem(body []byte) *apiError {
	off, problem := extensions.JSONTextProblem(body)
	if off < 0 {
		return nil
	}
	return badText("body", fmt.Sprintf("The body has %s at byte %d.", problem, off), map[string]any{"offset": off})
}

// jsonBodyProblem is jsonTextProblem for a JSON body at an OAuth endpoint.
func jsonBodyProblem(body []byte) error {
	if off, problem := extensions.JSONTextProblem(body); off >= 0 {
		return oauthProblem(fmt.Sprintf("The JSON body has %s at byte %d.", problem, off))
	}
	return nil
}
