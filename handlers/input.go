package handlers

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/extensions/ciba"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
)

// Text the stores cannot hold (bytes that are not UTF-8, NUL characters,
// numbers beyond PostgreSQL's numeric) is refused at the door, with a 400
// that says where, before anything is looked up or stored: the path, the
// query, form bodies and the header values here, for every route at once
// (outer); JSON bodies in decodeJSON, JSON bodies and HTTP Basic
// credentials at the OAuth endpoints in oauthForm (docs/decisions.md).

// badText is the refusal of one part of a request.
func badText(part, message string, details map[string]any) *apiError {
	if details == nil {
		details = map[string]any{}
	}
	details["part"] = part
	return newError(http.StatusBadRequest, "invalid_request", message, details)
}

// requestTextProblem checks the path, the query, a form body and the
// header values identityd reads of a request. The intent headers are left
// to parseIntent, which refuses them as invalid_intent_header once the
// caller is known (so an agent's refused call is still on its trail).
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
	return formBodyProblem(r)
}

// formBodyProblem checks the parameters of a form body (hosted pages,
// OAuth endpoints): read here once, within the body limit, and put back
// for the handler, which parses it as before. A body it cannot read
// (beyond the limit) or parse is left to the handler, which meets the same
// error and refuses it in its own words.
func formBodyProblem(r *http.Request) *apiError {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != formType {
		return nil
	}
	body, err := io.ReadAll(r.Body)
	r.Body = readCloser{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	if err != nil {
		return nil
	}
	form, _ := url.ParseQuery(string(body)) // what ParseForm reads; malformed pairs are dropped there too
	for name, values := range form {
		if !extensions.ValidText(name) {
			return badText("body", "Form parameter names must be UTF-8 text without NUL characters.", nil)
		}
		for _, v := range values {
			if !extensions.ValidText(v) {
				return badText("body", fmt.Sprintf("Form parameter %q must be UTF-8 text without NUL characters.", name), map[string]any{"field": name})
			}
		}
	}
	return nil
}

// readCloser reads a body put back together and closes the original.
type readCloser struct {
	io.Reader
	io.Closer
}

// checkedHeaders are the headers whose values identityd uses as text
// (credentials are looked up; X-Request-ID is checked where it is read, the
// intent headers by parseIntent). Others are not read, so not judged:
// RFC 9110 §5.5 lets field values carry bytes beyond ASCII (obs-text).
var checkedHeaders = []string{"Authorization"}

// oauthPaths are the endpoints that answer RFC 6749 errors.
var oauthPaths = map[string]bool{oauth.TokenPath: true, "/oauth/token": true, oauth.IntrospectPath: true, oauth.RevokePath: true, BackchannelPath: true}

// writeTextProblem answers a requestTextProblem in the shape of the
// endpoint asked for: RFC 6749 at the OAuth endpoints, a page at the
// browser's, the embedded sign-in API's own, else the envelope.
func (a *api) writeTextProblem(w http.ResponseWriter, r *http.Request, p *apiError) {
	switch part := p.Details["part"].(string); {
	case oauthPaths[r.URL.Path]:
		writeOAuthError(w, p.Status, "invalid_request", "The request has bytes that are not UTF-8 or a NUL character in its "+part+".")
	case pagePath(r.URL.Path):
		a.pageError(w, r, "Request refused", extensions.NewError(p.Status, p.Code,
			"The request has characters this server cannot read (bytes that are not UTF-8, or a NUL) in its "+part+". Go back to the application and try again.", nil))
	case strings.HasPrefix(r.URL.Path, embeddedPath+"/"):
		writeSignInError(w, r, p)
	default:
		writeError(w, r, p)
	}
}

// pagePath tells whether path is a browser's: the hosted pages, the
// authorization endpoint and RP-initiated logout, which answer refusals as
// pages (pageError).
func pagePath(path string) bool {
	switch path {
	case signinPath, signoutPath, oauth.AuthorizePath, "/oauth/authorize", oauth.EndSessionPath, signin.EmbeddedMagicLinkPath, applications.AccountCallbackPath:
		return true
	}
	for _, prefix := range []string{signinPath + "/", hitl.ApprovalPath, ciba.ConsentPath} {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}
	return false
}

// basicTextProblem is an error_description when an OAuth request's HTTP
// Basic credentials are not UTF-8 text without NUL (form bodies are
// requestTextProblem's, JSON bodies jsonToForm's).
func basicTextProblem(r *http.Request) string {
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
