package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// The OAuth endpoints answer RFC 6749 errors (error, error_description),
// written by fosite; everything else here only gets the request into the
// shape fosite reads.

// oauthForm reads the body of an OAuth endpoint once, within the size limit,
// and leaves it as form values for fosite. A JSON object body is accepted
// with the same field names: each string member becomes the form value of the
// same name, authorization_details (an array) its JSON text, which is what
// RFC 9396 §6 sends in a form, and an array of audience or resource values
// that many values. Nothing is parsed a second way.
func oauthForm(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var big *http.MaxBytesError
		if errors.As(err, &big) {
			writeOAuthError(w, http.StatusRequestEntityTooLarge, "invalid_request", "The request body exceeds 1048576 bytes.")
			return
		} else if err != nil {
			writeOAuthError(w, http.StatusBadRequest, "invalid_request", "The request body could not be read.")
			return
		}
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt == "application/json" {
			form, err := jsonToForm(body)
			if err != nil {
				writeOAuthError(w, http.StatusBadRequest, "invalid_request", err.Error())
				return
			}
			body = []byte(form.Encode())
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		if err := r.ParseForm(); err != nil {
			writeOAuthError(w, http.StatusBadRequest, "invalid_request", "The form body is malformed.")
			return
		}
		if problem := formTextProblem(r); problem != "" {
			writeOAuthError(w, http.StatusBadRequest, "invalid_request", problem)
			return
		}
		for name, values := range r.PostForm {
			if len(values) > 1 && !multiValued[name] {
				writeOAuthError(w, http.StatusBadRequest, "invalid_request", "Parameter '"+name+"' is repeated; each parameter may appear once (RFC 6749 §3.2).")
				return
			}
		}
		next(w, r)
	}
}

// multiValued are the parameters that may be repeated: RFC 8693 §2.1's
// audience and RFC 8707's resource.
var multiValued = map[string]bool{"audience": true, "resource": true}

// oauthProblem is an error_description: a sentence for the client.
type oauthProblem string

func (p oauthProblem) Error() string { return string(p) }

const errNotAnObject oauthProblem = "The JSON body must be one object of request parameters."

// jsonToForm turns a JSON token request into form values; see oauthForm.
// A member given twice is refused, as a repeated form parameter is.
func jsonToForm(body []byte) (url.Values, error) {
	if err := jsonBodyProblem(body); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errNotAnObject
	}
	form := url.Values{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errNotAnObject
		}
		name := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, errNotAnObject
		}
		if seen[name] {
			return nil, oauthProblem("Parameter '" + name + "' is repeated; each parameter may appear once (RFC 6749 §3.2).")
		}
		seen[name] = true
		switch {
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, oauthProblem("Parameter '" + name + "' is not a valid JSON string.")
			}
			form.Set(name, s)
		case multiValued[name] && raw[0] == '[':
			var list []string
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, oauthProblem("Parameter '" + name + "' must be a string or an array of strings.")
			}
			form[name] = list
		case name == "authorization_details" && raw[0] == '[':
			var compact bytes.Buffer
			if err := json.Compact(&compact, raw); err != nil {
				return nil, oauthProblem("Parameter 'authorization_details' is not valid JSON.")
			}
			form.Set(name, compact.String())
		case string(raw) == "null":
			// An absent parameter.
		default:
			return nil, oauthProblem("Parameter '" + name + "' must be a string.")
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errNotAnObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errNotAnObject
	}
	return form, nil
}

func writeOAuthError(w http.ResponseWriter, status int, code, description string) {
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": description})
}

// token is POST /api/v1/oauth/token (and its alias /oauth/token). An
// agent's token is committed together with its token_issued audit entry; a
// refused request naming an agent is recorded as token_refused.
func (a *api) token(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if info := infoFrom(ctx); info != nil && info.intentErr != nil {
		a.writeTokenError(w, r, nil, fosite.ErrInvalidRequest.WithHint(info.intentErr.(*apiError).Message))
		return
	}
	ar, err := a.provider.NewAccessRequest(ctx, r, oauth.NewSession())
	if err != nil {
		a.writeTokenError(w, r, ar, err)
		return
	}
	if c, ok := ar.GetClient().(*persistence.Client); ok && c.Kind == persistence.KindAgent {
		ctx = persistence.WithTokenAudit(ctx, a.agents.TokenIssued(c.RecordID, c.ID, clientIP(r), oauth.GrantFacts(ar), intentOf(r)))
	}
	resp, err := a.provider.NewAccessResponse(ctx, ar)
	if err != nil {
		a.writeTokenError(w, r, ar, err)
		return
	}
	if info := infoFrom(ctx); info != nil {
		info.principal = ar.GetClient().GetID()
	}
	a.provider.WriteAccessResponse(ctx, w, ar, resp)
}

func (a *api) writeTokenError(w http.ResponseWriter, r *http.Request, ar fosite.AccessRequester, err error) {
	if persistence.Unavailable(err) {
		// Storage fails: say so, and record no refusal, for nothing was refused.
		logger(r).WarnContext(r.Context(), "token endpoint: storage unavailable", "error", err.Error())
		w.Header().Set("Retry-After", retryAfterUnavailable)
		a.provider.WriteAccessError(r.Context(), w, ar, oauth.Unavailable(err))
		return
	}
	rfc := fosite.ErrorToRFC6749Error(err)
	if rfc.CodeField >= 500 {
		logger(r).ErrorContext(r.Context(), "token endpoint failed", "error", rfc.Error(), "debug", rfc.DebugField, "cause", errorCause(err))
	}
	// RFC 6749 §5.2 wants the challenge when the client tried HTTP Basic,
	// and RFC 9110 §15.5.2 on every 401: invalid_client always carries it.
	if errors.Is(err, fosite.ErrInvalidClient) {
		w.Header().Set("WWW-Authenticate", `Basic realm="identityd"`)
	}
	a.recordRefusal(r, ar, rfc.ErrorField)
	a.provider.WriteAccessError(r.Context(), w, ar, err)
}

// recordRefusal puts a refused token request on the trail of the agent it
// concerns: the client it authenticated as, or else the agent client id it
// named. Anyone can name a client id, so an unauthenticated refusal is
// recorded as such, without the caller's intent headers, and an address
// writes at most refusalAudit of them a minute (the rest are only
// logged): nobody can fill an agent's trail with entries of their making.
// The audit must not fail the answer: a failure to record is logged.
func (a *api) recordRefusal(r *http.Request, ar fosite.AccessRequester, code string) {
	id, authenticated := claimedClientID(r), false
	if ar != nil && ar.GetClient() != nil && ar.GetClient().GetID() != "" {
		id, authenticated = ar.GetClient().GetID(), true
	}
	if !strings.HasPrefix(id, persistence.AgentClientPrefix) || len(id) > 64 { // no agent has a longer id
		return
	}
	if !authenticated && !a.refusals.allow(r.Context(), clientIP(r)) {
		logger(r).WarnContext(r.Context(), "unauthenticated token refusals from this address are over their audit budget; not recorded", "client_id", id, "remote", clientIP(r))
		return
	}
	if err := a.agents.TokenRefused(r.Context(), id, clientIP(r), r.PostForm.Get("grant_type"), code, authenticated, intentOf(r)); err != nil {
		a.metrics.AuditFailed(agents.ActionTokenRefused)
		logger(r).ErrorContext(r.Context(), "recording a refused agent token request failed", "error", err.Error())
	}
}

func errorCause(err error) string {
	if c := errors.Unwrap(err); c != nil {
		return c.Error()
	}
	return ""
}

// introspect is POST /api/v1/oauth/introspect (RFC 7662). The caller
// authenticates as a client, with HTTP Basic or client_id and client_secret
// in the body, and learns about its own tokens, or about any token when it
// may (oauth.Provider.MayIntrospect); otherwise the token reads as inactive
// (§2.2 lets the server hide a token this way).
func (a *api) introspect(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if _, ok := bearerToken(r); ok {
		a.writeClientAuthError(w, r, "Authenticate as a client (client_secret_basic or client_secret_post), not with an access token.")
		return
	}
	_, _, basic := r.BasicAuth()
	if basic && r.PostForm.Has("client_secret") {
		writeOAuthError(w, http.StatusBadRequest, "invalid_request", "Use one client authentication method: HTTP Basic or client_secret in the body, not both.")
		return
	}
	// fosite reads client credentials from HTTP Basic only: hand it the
	// body's credentials the same way (RFC 6749 §2.3.1 form-encoding).
	if !basic && r.PostForm.Get("client_id") != "" {
		r.SetBasicAuth(url.QueryEscape(r.PostForm.Get("client_id")), url.QueryEscape(r.PostForm.Get("client_secret")))
	}
	ir, err := a.provider.NewIntrospectionRequest(ctx, r, oauth.NewSession())
	if err != nil {
		if errors.Is(err, fosite.ErrRequestUnauthorized) && !errors.Is(err, fosite.ErrInactiveToken) {
			// §2.3: bad client credentials are answered as RFC 6749 §5.2 does.
			a.writeClientAuthError(w, r, "Client authentication failed.")
			return
		}
		a.provider.WriteIntrospectionError(ctx, w, err)
		return
	}
	id, _, _ := r.BasicAuth()
	caller, _ := url.QueryUnescape(id)
	ok, err := a.provider.MayIntrospect(ctx, caller, ir.GetAccessRequester().GetClient().GetID())
	if err != nil {
		a.provider.WriteIntrospectionError(ctx, w, fosite.ErrServerError.WithWrap(err))
		return
	}
	if !ok {
		a.provider.WriteIntrospectionResponse(ctx, w, &fosite.IntrospectionResponse{Active: false})
		return
	}
	a.provider.WriteIntrospectionResponse(ctx, w, ir)
}

func (a *api) writeClientAuthError(w http.ResponseWriter, r *http.Request, hint string) {
	w.Header().Set("WWW-Authenticate", `Basic realm="identityd"`)
	a.provider.WriteAccessError(r.Context(), w, nil, fosite.ErrInvalidClient.WithHint(hint))
}

// revoke is POST /api/v1/oauth/revoke (RFC 7009). fosite's writer answers
// 200 to every error but invalid_request and invalid_client; RFC 7009 wants a
// token of another client refused (§2.1) and a store outage answered 503
// (§2.2.1), so those two are written here.
func (a *api) revoke(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	err := a.provider.NewRevocationRequest(ctx, r)
	switch {
	case persistence.Unavailable(err), errors.Is(err, fosite.ErrTemporarilyUnavailable):
		logger(r).WarnContext(ctx, "revocation: storage unavailable", "cause", errorCause(err))
		w.Header().Set("Retry-After", retryAfterUnavailable)
		a.provider.WriteAccessError(ctx, w, nil, oauth.Unavailable(err))
		return
	case errors.Is(err, fosite.ErrInvalidClient):
		if _, _, ok := r.BasicAuth(); ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="identityd"`)
		}
	case errors.Is(err, fosite.ErrUnauthorizedClient):
		a.provider.WriteAccessError(ctx, w, nil, err)
		return
	}
	a.provider.WriteRevocationResponse(ctx, w, err)
}

// discovery serves RFC 8414 and OpenID Provider metadata: one document,
// listing the RAR types registered now (RFC 9396 §10.1).
func (a *api) discovery(w http.ResponseWriter, r *http.Request) {
	types, err := a.rar.TypeNames(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	md := maps.Clone(a.metadata)
	md["authorization_details_types_supported"] = types
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=60")
	_ = json.NewEncoder(w).Encode(md)
}

func (a *api) jwks(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_ = json.NewEncoder(w).Encode(a.provider.Keys.PublicJWKS())
}

// buildMetadata lists what the server does, every URL derived from the issuer.
func buildMetadata(p *oauth.Provider) map[string]any {
	iss := strings.TrimSuffix(p.Issuer, "/")
	md := map[string]any{
		"issuer":                                iss,
		"token_endpoint":                        iss + oauth.TokenPath,
		"introspection_endpoint":                iss + oauth.IntrospectPath,
		"revocation_endpoint":                   iss + oauth.RevokePath,
		"jwks_uri":                              iss + oauth.JWKSPath,
		"grant_types_supported":                 oauth.GrantTypes,
		"token_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post"},
		"introspection_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post"},
		"revocation_endpoint_auth_methods_supported":    []string{"client_secret_basic", "client_secret_post"},
		"scopes_supported":                      oauth.Scopes,
		"response_types_supported":              []string{},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{oauth.AlgRS256, oauth.AlgES256},
	}
	return md
}
