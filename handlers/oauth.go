package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/hitl"
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
// that many values. Nothing is parsed a second way. Any other media type,
// multipart/form-data included, is refused: RFC 6749 §3.2 sends forms, and a
// body fosite would parse on its own would escape the checks below.
func oauthForm(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var mt string
		if ct := r.Header.Get("Content-Type"); ct != "" {
			var err error
			if mt, _, err = mime.ParseMediaType(ct); err != nil || (mt != formType && mt != "application/json") {
				writeOAuthError(w, http.StatusBadRequest, "invalid_request", "The request body must be application/x-www-form-urlencoded (or application/json).")
				return
			}
		}
		body, err := io.ReadAll(r.Body)
		var big *http.MaxBytesError
		if errors.As(err, &big) {
			writeOAuthError(w, http.StatusRequestEntityTooLarge, "invalid_request", "The request body exceeds 1048576 bytes.")
			return
		} else if err != nil {
			writeOAuthError(w, http.StatusBadRequest, "invalid_request", "The request body could not be read.")
			return
		}
		if mt == "application/json" {
			form, err := jsonToForm(body)
			if err != nil {
				writeOAuthError(w, http.StatusBadRequest, "invalid_request", err.Error())
				return
			}
			body = []byte(form.Encode())
			r.Header.Set("Content-Type", formType)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		if err := r.ParseForm(); err != nil {
			writeOAuthError(w, http.StatusBadRequest, "invalid_request", "The form body is malformed.")
			return
		}
		if problem := basicTextProblem(r); problem != "" {
			writeOAuthError(w, http.StatusBadRequest, "invalid_request", problem)
			return
		}
		// RFC 6749 §3.2: a parameter sent without a value is treated as
		// omitted (clients send empty actor_token, resource, client_secret).
		dropEmpty(r.PostForm)
		dropEmpty(r.Form)
		for name, values := range r.PostForm {
			if len(values) > 1 && !multiValued[name] {
				writeOAuthError(w, http.StatusBadRequest, "invalid_request", "Parameter "+quoteName(name)+" is repeated; each parameter may appear once (RFC 6749 section 3.2).")
				return
			}
		}
		next(w, r)
	}
}

const formType = "application/x-www-form-urlencoded"

// multiValued are the parameters that may be repeated: RFC 8693 §2.1's
// audience and RFC 8707's resource.
var multiValued = map[string]bool{"audience": true, "resource": true}

// dropEmpty removes empty values, and the parameters left without one.
func dropEmpty(v url.Values) {
	for name, values := range v {
		if kept := slices.DeleteFunc(values, func(s string) bool { return s == "" }); len(kept) > 0 {
			v[name] = kept
		} else {
			delete(v, name)
		}
	}
}

// quoteName is a parameter name as an error_description may echo it:
// quoted, at most 64 characters, in the characters RFC 6749 §5.2 allows.
func quoteName(name string) string {
	if len(name) > 64 {
		name = name[:64] + "..."
	}
	return "'" + oauth.DescriptionText(name) + "'"
}

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
			return nil, oauthProblem("Parameter " + quoteName(name) + " is repeated; each parameter may appear once (RFC 6749 section 3.2).")
		}
		seen[name] = true
		switch {
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, oauthProblem("Parameter " + quoteName(name) + " is not a valid JSON string.")
			}
			form.Set(name, s)
		case multiValued[name] && raw[0] == '[':
			var list []string
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, oauthProblem("Parameter " + quoteName(name) + " must be a string or an array of strings.")
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
			return nil, oauthProblem("Parameter " + quoteName(name) + " must be a string.")
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

// writeOAuthError writes an RFC 6749 error of our own; fosite's go through
// oauthError. Either way error_description holds only the characters RFC
// 6749 §5.2 allows.
func writeOAuthError(w http.ResponseWriter, status int, code, description string) {
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": oauth.DescriptionText(description)})
}

// oauthError is err as an OAuth endpoint answers it: its code and status,
// and an error_description built from fosite's description and hint (which
// may echo the request) reduced to the characters RFC 6749 §5.2 allows. It
// wraps err, so the cause still reaches the log.
func oauthError(err error) *fosite.RFC6749Error {
	e := fosite.ErrorToRFC6749Error(err)
	out := &fosite.RFC6749Error{ErrorField: e.ErrorField, CodeField: e.CodeField, DebugField: e.DebugField,
		DescriptionField: oauth.DescriptionText(e.GetDescription())}
	return out.WithWrap(err)
}

// authenticatedClient is the client a token request authenticated (or a
// workload identity exchange established), nil if none: fosite starts every
// request with an empty client of its own, which stays when none is found.
func authenticatedClient(ar fosite.AccessRequester) fosite.Client {
	if ar == nil {
		return nil
	}
	if c, ok := ar.GetClient().(*persistence.Client); ok && c != nil {
		return c
	}
	return nil
}

// token is POST /api/v1/oauth/token (and its alias /oauth/token). An
// agent's token is committed together with its token_issued audit entry; a
// refused request naming an agent is recorded as token_refused. Refused
// requests without an authenticated client count as failed authentications;
// an authenticated client's requests count against its token limit.
func (a *api) token(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if a.authFailures.refused(w, r, writeOAuthRateLimited) {
		return
	}
	if info := infoFrom(ctx); info != nil && info.intentErr != nil {
		a.writeTokenError(w, r, nil, fosite.ErrInvalidRequest.WithHint(info.intentErr.(*apiError).Message))
		return
	}
	var ar fosite.AccessRequester
	var resp fosite.AccessResponder
	var err error
	limited := false
	grant := func(ctx context.Context) error {
		ar, err = a.provider.NewAccessRequest(ctx, r, oauth.NewSession())
		if c := authenticatedClient(ar); c != nil && !a.tokenLimit.admit(w, r, c.GetID()) {
			limited = true
			return nil
		}
		if err != nil {
			return nil
		}
		if c, ok := ar.GetClient().(*persistence.Client); ok && c.Kind == persistence.KindAgent {
			ctx = persistence.WithTokenAudit(ctx, a.agents.TokenIssued(c.RecordID, c.ID, clientIP(r), oauth.GrantFacts(ar), intentOf(r)))
		}
		resp, err = a.provider.NewAccessResponse(ctx, ar)
		return nil
	}
	if r.PostForm.Get("grant_type") == persistence.GrantAuthorizationCode {
		// A code's exchange writes several rows (the code used, its PKCE
		// and OpenID Connect requests spent, the tokens): one flow of the
		// group commit, committed once, after reads that take no lock. It
		// commits even when fosite refuses the request, for a refusal may
		// spend (a wrong PKCE verifier) or revoke (a replayed code). A
		// refresh's writes join the group commit at the end of fosite's own
		// transaction; reuse's revocation is a unit of its own.
		if cerr := a.provider.ExchangeCode(ctx, func(ctx context.Context) { _ = grant(ctx) }); cerr != nil && err == nil && !limited {
			err = cerr
		}
	} else if r.PostForm.Get("grant_type") == oauth.GrantCIBA {
		// A CIBA poll is one unit of work: the delegation spent (row lock:
		// of concurrent polls one gets the token) and its token commit
		// together, and a refused request spends nothing. A poll's answer
		// (pending, slow_down, denied, expired) commits what it wrote: the
		// poll's time and interval, a lapsed request's expiry.
		terr := a.transact(ctx, func(ctx context.Context) error {
			if _ = grant(ctx); limited || (err != nil && !oauth.PollAnswer(err)) {
				return errRefused
			}
			return nil
		})
		if terr != nil && !errors.Is(terr, errRefused) && (err == nil || oauth.PollAnswer(err)) && !limited {
			err = terr
		}
	} else if strings.Contains(r.PostForm.Get(oauth.ClaimAuthorizationDetails), hitl.TypeApproval) {
		// Redeeming a HITL approval and issuing its token are one unit of
		// work: a refused request spends nothing, and of two redemptions of
		// one approval only one commits a token.
		terr := a.transact(ctx, func(ctx context.Context) error {
			if _ = grant(ctx); err != nil || limited {
				return errRefused
			}
			return nil
		})
		if terr != nil && !errors.Is(terr, errRefused) && err == nil && !limited {
			err = terr
		}
	} else {
		_ = grant(ctx)
	}
	if limited {
		return
	}
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
		a.writeUnavailable(w, r, "token endpoint", err)
		return
	}
	rfc := fosite.ErrorToRFC6749Error(err)
	if rfc.CodeField >= 500 {
		logger(r).ErrorContext(r.Context(), "token endpoint failed", "error", rfc.Error(), "debug", rfc.DebugField, "cause", errorCause(err))
	} else if authenticatedClient(ar) == nil {
		a.authFailures.failed(r)
	}
	// RFC 6749 §5.2 wants the challenge when the client tried HTTP Basic,
	// and RFC 9110 §15.5.2 on every 401: invalid_client always carries it.
	if errors.Is(err, fosite.ErrInvalidClient) {
		w.Header().Set("WWW-Authenticate", `Basic realm="identityd"`)
	}
	if rfc.ErrorField != oauth.ErrAuthorizationPending.ErrorField && rfc.ErrorField != oauth.ErrSlowDown.ErrorField {
		a.recordRefusal(r, ar, rfc.ErrorField) // a CIBA poll still waiting is no refusal worth a trail entry
	}
	a.provider.WriteAccessError(r.Context(), w, ar, oauthError(err))
}

// writeUnavailable answers while storage fails: 503 temporarily_unavailable
// with Retry-After, never a verdict on the request or its credentials.
func (a *api) writeUnavailable(w http.ResponseWriter, r *http.Request, what string, err error) {
	logger(r).WarnContext(r.Context(), what+": storage unavailable", "error", err.Error())
	w.Header().Set("Retry-After", retryAfterUnavailable)
	a.provider.WriteAccessError(r.Context(), w, nil, oauthError(oauth.Unavailable(err)))
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
	if c := authenticatedClient(ar); c != nil {
		id, authenticated = c.GetID(), true
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
// in the body, exactly as at the token endpoint, and learns about its own
// tokens, or about any token when that authenticated client may
// (oauth.MayIntrospect); otherwise the token reads as inactive (§2.2 lets
// the server hide a token this way). No access token stands in for the
// client: fosite's introspection request would take one from the
// Authorization header or an access_token parameter.
func (a *api) introspect(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	caller, ok := a.oauthClient(w, r, a.introspectLimit)
	if !ok {
		return
	}
	token := r.PostForm.Get("token")
	if token == "" {
		a.provider.WriteAccessError(ctx, w, nil, oauthError(fosite.ErrInvalidRequest.WithHint("The 'token' parameter is required.")))
		return
	}
	scopes := fosite.RemoveEmpty(strings.Split(r.PostForm.Get("scope"), " "))
	use, ar, err := a.provider.IntrospectToken(ctx, token, fosite.TokenUse(r.PostForm.Get("token_type_hint")), oauth.NewSession(), scopes...)
	if err != nil {
		// A store failure is not an inactive token.
		if persistence.Unavailable(err) {
			a.writeUnavailable(w, r, "introspection", err)
			return
		} else if rfc := fosite.ErrorToRFC6749Error(err); rfc.CodeField >= 500 {
			logger(r).ErrorContext(ctx, "introspection failed", "error", rfc.Error(), "cause", errorCause(err))
			a.provider.WriteAccessError(ctx, w, nil, oauthError(err))
			return
		}
		a.provider.WriteIntrospectionResponse(ctx, w, &fosite.IntrospectionResponse{Active: false})
		return
	}
	if !oauth.MayIntrospect(caller, ar.GetClient().GetID()) {
		a.provider.WriteIntrospectionResponse(ctx, w, &fosite.IntrospectionResponse{Active: false})
		return
	}
	resp := &fosite.IntrospectionResponse{Active: true, AccessRequester: ar, TokenUse: use}
	if use == fosite.AccessToken {
		resp.AccessTokenType = fosite.BearerAccessToken
	}
	a.provider.WriteIntrospectionResponse(ctx, w, resp)
}

// oauthClient authenticates the client of an introspection or revocation
// request and counts the request: a failure against the address and the
// claimed client, a success against the client's limit. It has answered
// when ok is false.
func (a *api) oauthClient(w http.ResponseWriter, r *http.Request, limit *clientLimit) (fosite.Client, bool) {
	if a.authFailures.refused(w, r, writeOAuthRateLimited) {
		return nil, false
	}
	if _, ok := bearerToken(r); ok {
		a.writeClientAuthError(w, r, fosite.ErrInvalidClient.WithHint("Authenticate as a client (client_secret_basic or client_secret_post), not with an access token."))
		return nil, false
	}
	client, err := a.provider.AuthenticateClient(r.Context(), r, r.PostForm)
	if err != nil {
		a.writeClientAuthError(w, r, err)
		return nil, false
	}
	return client, limit.admit(w, r, client.GetID())
}

// writeClientAuthError answers a failed client authentication as RFC 6749
// §5.2 does, with a Basic challenge on every 401 (RFC 9110 §15.5.2), and
// counts it as a failure.
func (a *api) writeClientAuthError(w http.ResponseWriter, r *http.Request, err error) {
	if persistence.Unavailable(err) {
		a.writeUnavailable(w, r, "client authentication", err)
		return
	} else if rfc := fosite.ErrorToRFC6749Error(err); rfc.CodeField >= 500 {
		logger(r).ErrorContext(r.Context(), "client authentication failed", "error", rfc.Error(), "cause", errorCause(err))
	} else {
		a.authFailures.failed(r)
	}
	if errors.Is(err, fosite.ErrInvalidClient) {
		w.Header().Set("WWW-Authenticate", `Basic realm="identityd"`)
	}
	a.provider.WriteAccessError(r.Context(), w, nil, oauthError(err))
}

// revoke is POST /api/v1/oauth/revoke (RFC 7009). The client authenticates
// here first, to be counted (fosite authenticates it again: a cached read
// and one HMAC). Every error is answered as it is: a missing token, a token
// of another client (§2.1) and a store outage (§2.2.1) included, where
// fosite's writer would answer 200 or a bare code.
func (a *api) revoke(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if _, ok := a.oauthClient(w, r, a.introspectLimit); !ok {
		return
	}
	err := a.provider.NewRevocationRequest(ctx, r)
	switch {
	case err == nil:
		a.provider.WriteRevocationResponse(ctx, w, nil)
	case persistence.Unavailable(err), errors.Is(err, fosite.ErrTemporarilyUnavailable):
		a.writeUnavailable(w, r, "revocation", err)
	case errors.Is(err, fosite.ErrInvalidClient):
		a.writeClientAuthError(w, r, err)
	default:
		if rfc := fosite.ErrorToRFC6749Error(err); rfc.CodeField >= 500 {
			logger(r).ErrorContext(ctx, "revocation failed", "error", rfc.Error(), "cause", errorCause(err))
		}
		a.provider.WriteAccessError(ctx, w, nil, oauthError(err))
	}
}

// discovery serves RFC 8414 and OpenID Provider metadata: one document,
// listing the RAR types registered now (RFC 9396 §10.1).
func (a *api) discovery(w http.ResponseWriter, r *http.Request) {
	types, err := a.rar.TypeNames(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	if a.hitl != nil { // built in: approvals are redeemed with it
		types = append(types, hitl.TypeApproval)
		slices.Sort(types)
	}
	md := maps.Clone(a.metadata)
	if len(types) > 0 { // RFC 8414 §2: optional members are omitted, not empty
		md["authorization_details_types_supported"] = types
	}
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
		"token_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post", "none"}, // none: public applications
		"introspection_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post"},
		"revocation_endpoint_auth_methods_supported":    []string{"client_secret_basic", "client_secret_post"},
		"scopes_supported":                      append(slices.Clone(persistence.ApplicationScopes), oauth.Scopes...),
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{oauth.AlgRS256, oauth.AlgES256},

		// OpenID Connect (Discovery 1.0 §3) for people's applications.
		"authorization_endpoint":                         iss + oauth.AuthorizePath,
		"userinfo_endpoint":                              iss + oauth.UserinfoPath,
		"end_session_endpoint":                           iss + oauth.EndSessionPath,
		"response_types_supported":                       []string{"code"},
		"response_modes_supported":                       []string{"query", "form_post"},
		"code_challenge_methods_supported":               []string{"S256"},
		"authorization_response_iss_parameter_supported": true, // RFC 9207
		"claims_supported": []string{"iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "sid", "amr", "acr", "at_hash",
			"email", "email_verified", "name", "roles"},
		"claims_parameter_supported":      false,
		"request_parameter_supported":     false,
		"request_uri_parameter_supported": false,
		"prompt_values_supported":         []string{"none", "login", "consent", "select_account"},
		"ui_locales_supported":            []string{"en"},
	}
	return md
}
