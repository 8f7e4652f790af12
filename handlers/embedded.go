package handlers

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/gorilla/mux"
	"github.com/ory/fosite"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// The embedded sign-in API (spec, "Embedded sign-in"): an application's own
// page signs its people in with JSON calls, each naming the application
// (clientId), and gets an authorization code its backend exchanges. A
// browser's call is answered only for an origin among the application's
// webOrigins (CORS, never "*"); a call without Origin (a server's) is
// served. Errors are the spec's sign-in shape: error and error_description.
const embeddedPath = "/api/v1/embedded/auth"

// embeddedCodeScope is what an embedded sign-in's code grants: the person's
// identity, e-mail and profile, and a refresh token.
const embeddedCodeScope = "openid email profile offline_access"

// embeddedCodeTTL is what expiresIn says of a code (the provider's
// authorization code lifetime, spec: 10 minutes).
const embeddedCodeTTL = 600

// embeddedBody is every embedded call's JSON body; each route reads the
// members it needs and refuses missing ones.
type embeddedBody struct {
	ClientID            string          `json:"clientId"`
	Email               string          `json:"email"`
	Password            string          `json:"password"`
	Code                string          `json:"code"`
	RedirectURI         string          `json:"redirectUri"`
	CodeChallenge       string          `json:"codeChallenge"`
	CodeChallengeMethod string          `json:"codeChallengeMethod"`
	MFASessionID        string          `json:"mfaSessionId"`
	Method              string          `json:"method"`
	Credential          json.RawMessage `json:"credential"` // a passkey's PublicKeyCredential (passkey/finish)
}

// signInError is the embedded API's error body.
type signInError struct {
	Error       string `json:"error"`
	Description string `json:"error_description"`
}

// accountExists is the 409 of an e-mailed code or link asked for an
// account that signs in another way (spec, Account linking rule 4).
type accountExists struct {
	signInError
	ExistingIdentities []string `json:"existingIdentities"`
	LinkingRequired    bool     `json:"linkingRequired"`
	LinkingEndpoint    string   `json:"linkingEndpoint"`
	Suggestion         string   `json:"suggestion"`
}

// LinkingPath is where account linking begins (spec).
const LinkingPath = "/api/v1/auth/link/initiate"

// writeSignInError answers err in the sign-in shape.
func writeSignInError(w http.ResponseWriter, r *http.Request, err error) {
	var exists *signin.AccountExistsError
	if errors.As(err, &exists) {
		writeJSON(w, http.StatusConflict, accountExists{
			signInError:        signInError{Error: "account_exists", Description: "An account with this e-mail address exists and signs in another way."},
			ExistingIdentities: exists.Identities, LinkingRequired: true, LinkingEndpoint: LinkingPath,
			Suggestion: "Sign in with an existing method, or link this method to the account first.",
		})
		return
	}
	var ae *apiError
	if !errors.As(err, &ae) {
		switch {
		case persistence.Unavailable(err) || abandoned(r, err):
			w.Header().Set("Retry-After", retryAfterUnavailable)
			ae = newError(http.StatusServiceUnavailable, "temporarily_unavailable", "The service cannot serve this request now; retry later.", nil)
		default:
			logger(r).ErrorContext(r.Context(), "internal error", "error", err.Error())
			ae = newError(http.StatusInternalServerError, "server_error", "An internal error occurred.", nil)
		}
	}
	code := ae.Code
	if code == "invalid_json" || code == "unsupported_media_type" || code == "payload_too_large" {
		code = "invalid_request" // the spec's code for a body it cannot use
	}
	writeJSON(w, ae.Status, signInError{Error: code, Description: ae.Message})
}

var (
	errOriginNotAllowed = newError(http.StatusForbidden, "origin_not_allowed", "This origin is not registered for the application.", nil)
	errNeedClientID     = newError(http.StatusBadRequest, "invalid_request", "clientId is required.", nil)
)

// embeddedCall is what an embedded handler gets: the body and the
// application it names.
type embeddedCall struct {
	body embeddedBody
	app  *persistence.Client
}

// embedded guards an embedded route: the per-address limit (rl.Embedded),
// the body, the application, and the origin, in that order; nothing else
// runs for a refused origin.
func (a *api) embedded(next func(w http.ResponseWriter, r *http.Request, c *embeddedCall)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.embeddedLimit != nil && !count(w, r, a.embeddedLimit, "embedded:"+byIP(r), a.embeddedRateLimited) {
			return
		}
		c := &embeddedCall{}
		if r.Method == http.MethodGet {
			c.body.ClientID = r.URL.Query().Get("clientId")
		} else if err := decodeJSON(r, &c.body); err != nil {
			a.embeddedOrigin(w, r, nil)
			writeSignInError(w, r, err)
			return
		}
		if c.body.ClientID == "" {
			a.embeddedOrigin(w, r, nil)
			writeSignInError(w, r, errNeedClientID)
			return
		}
		app, err := a.signin.Application(r.Context(), c.body.ClientID)
		if err != nil {
			a.embeddedOrigin(w, r, nil)
			writeSignInError(w, r, err)
			return
		}
		if !a.embeddedOrigin(w, r, app) {
			writeSignInError(w, r, errOriginNotAllowed)
			return
		}
		c.app = app
		next(w, r, c)
	}
}

// embeddedOrigin checks a browser's Origin against the application's web
// origins and, when it is one, lets the browser read the answer. A request
// without Origin is a server's: allowed. app nil: no application is known
// (the answer is an error the page may still read if the origin is any
// application's).
func (a *api) embeddedOrigin(w http.ResponseWriter, r *http.Request, app *persistence.Client) bool {
	origin := r.Header.Get("Origin")
	w.Header().Add("Vary", "Origin")
	if origin == "" {
		return true
	}
	allowed := false
	if app != nil {
		allowed = slices.Contains(app.App.WebOrigins, strings.ToLower(origin))
	} else if ok, err := a.signin.OriginRegistered(r.Context(), strings.ToLower(origin)); err == nil {
		allowed = ok
	}
	if allowed {
		w.Header().Set("Access-Control-Allow-Origin", origin)
		// A page may read when to try again, and a step-up challenge (recent).
		w.Header().Set("Access-Control-Expose-Headers", "Retry-After, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, WWW-Authenticate")
	}
	return allowed
}

// OPTIONS /api/v1/embedded/auth/*: the CORS preflight, for an origin some
// application registered (or the one ?clientId= names).
func (a *api) embeddedPreflight(w http.ResponseWriter, r *http.Request) {
	var app *persistence.Client
	if id := r.URL.Query().Get("clientId"); id != "" {
		found, err := a.signin.Application(r.Context(), id)
		if err != nil {
			writeSignInError(w, r, err)
			return
		}
		app = found
	}
	if r.Header.Get("Origin") == "" || !a.embeddedOrigin(w, r, app) {
		writeSignInError(w, r, errOriginNotAllowed)
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, POST")
	h.Set("Access-Control-Allow-Headers", "Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

// embeddedRateLimited is the per-address limit's 429, readable by a page
// of a registered origin (no application is known yet: the body is not read).
func (a *api) embeddedRateLimited(w http.ResponseWriter, r *http.Request, c limiter.Context) {
	a.embeddedOrigin(w, r, nil)
	writeSignInRateLimited(w, r, c)
}

// writeSignInRateLimited is the embedded API's 429.
func writeSignInRateLimited(w http.ResponseWriter, r *http.Request, c limiter.Context) {
	retry := retryAfter(w, c)
	writeSignInError(w, r, newError(http.StatusTooManyRequests, "rate_limited", "Too many requests; retry in "+strconv.FormatInt(retry, 10)+" seconds.", nil))
}

// embeddedRoutes registers the embedded API.
func (a *api) embeddedRoutes(r *mux.Router) {
	p := embeddedPath
	r.HandleFunc(p+"/check-email", a.embedded(a.checkEmail)).Methods(http.MethodPost)
	r.HandleFunc(p+"/password", a.embedded(a.embeddedPassword)).Methods(http.MethodPost)
	r.HandleFunc(p+"/otp/send", a.embedded(a.embeddedSendOTP)).Methods(http.MethodPost)
	r.HandleFunc(p+"/otp/verify", a.embedded(a.embeddedVerifyOTP)).Methods(http.MethodPost)
	r.HandleFunc(p+"/magic-link/send", a.embedded(a.embeddedSendLink)).Methods(http.MethodPost)
	r.HandleFunc(p+"/magic-link/verify", a.magicLinkPage).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(p+"/mfa/verify", a.embedded(a.embeddedMFA)).Methods(http.MethodPost)
	r.HandleFunc(p+"/code/exchange", a.embeddedExchange).Methods(http.MethodPost)
	if a.passkeys != nil {
		r.HandleFunc(p+"/passkey/begin", a.embedded(a.embeddedPasskeyBegin)).Methods(http.MethodPost)
		r.HandleFunc(p+"/passkey/finish", a.embedded(a.embeddedPasskeyFinish)).Methods(http.MethodPost)
	}
	r.PathPrefix(p + "/").HandlerFunc(a.embeddedPreflight).Methods(http.MethodOptions)
}

// POST /check-email
func (a *api) checkEmail(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	if c.body.Email == "" {
		writeSignInError(w, r, newError(http.StatusBadRequest, "invalid_request", "email is required.", nil))
		return
	}
	if a.signinFailures.refusedAs(w, r, emailKey(c.body.Email), writeSignInRateLimited) {
		return
	}
	check, err := a.signin.CheckEmail(r.Context(), c.app, c.body.Email, embeddedClient(r))
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	if a.upstream != nil { // the person's upstream providers (upstream.go), after identityd's own methods
		names, err := a.upstream.Methods(r.Context(), c.app, c.body.Email, check.Exists)
		if err != nil {
			writeSignInError(w, r, err)
			return
		}
		check.Methods = append(check.Methods, names...)
	}
	out := map[string]any{"exists": check.Exists, "methods": check.Methods, "mfaEnabled": check.MFAEnabled}
	if len(check.Methods) == 1 {
		out["method"] = check.Methods[0] // nothing to choose: the page goes straight to it
	}
	writeJSON(w, http.StatusOK, out)
}

// pkce checks a sign-in step's code challenge: required, S256 only, as at
// the authorization endpoint (every application uses PKCE here).
func pkce(c *embeddedCall) error {
	b := c.body
	switch {
	case b.CodeChallenge == "":
		return newError(http.StatusBadRequest, "invalid_request", "codeChallenge (with codeChallengeMethod S256) is required.", nil)
	case b.CodeChallengeMethod != "S256":
		return newError(http.StatusBadRequest, "invalid_request", "codeChallengeMethod must be S256.", nil)
	case len(b.CodeChallenge) < 43 || len(b.CodeChallenge) > 128:
		return newError(http.StatusBadRequest, "invalid_request", "codeChallenge must be the base64url SHA-256 of a code verifier (43 to 128 characters).", nil)
	}
	return nil
}

// required refuses a call without one of the members, given as name and
// value pairs: the first missing is named.
func required(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return newError(http.StatusBadRequest, "invalid_request", pairs[i]+" is required.", nil)
		}
	}
	return nil
}

// embeddedFailed counts a failed sign-in against the address and the
// e-mail (rl.SignInEmail, the budget the hosted page's failures share) and
// answers the refusal.
func (a *api) embeddedFailed(w http.ResponseWriter, r *http.Request, email string, err error) {
	if errors.Is(err, signin.ErrInvalidCredentials) || errors.Is(err, signin.ErrInvalidCode) ||
		errors.Is(err, signin.ErrTooManyWrongCode) || errors.Is(err, signin.ErrCodeExpired) {
		a.signinFailures.failedAs(r, email)
	}
	writeSignInError(w, r, err)
}

// POST /password
func (a *api) embeddedPassword(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	if err := cmp.Or(required("email", c.body.Email, "password", c.body.Password), pkce(c)); err != nil {
		writeSignInError(w, r, err)
		return
	}
	email := emailKey(c.body.Email)
	if a.signinFailures.refusedAs(w, r, email, writeSignInRateLimited) {
		return
	}
	res, code, err := a.embeddedSignIn(r, c.app, c.body.CodeChallenge, func(ctx context.Context) (*signin.Result, error) {
		return a.signin.PasswordSignIn(ctx, c.app, c.body.Email, c.body.Password, c.body.CodeChallenge, embeddedClient(r))
	})
	if err != nil {
		a.embeddedFailed(w, r, email, err)
		return
	}
	answerEmbeddedCode(w, res, code)
}

// POST /otp/send and /magic-link/send
func (a *api) embeddedSend(w http.ResponseWriter, r *http.Request, c *embeddedCall, link bool) {
	if err := required("email", c.body.Email); err != nil {
		writeSignInError(w, r, err)
		return
	}
	t := signin.Target{}
	if link {
		if err := cmp.Or(required("redirectUri", c.body.RedirectURI), pkce(c)); err != nil {
			writeSignInError(w, r, err)
			return
		}
		if !slices.Contains(c.app.RedirectURIs, c.body.RedirectURI) {
			writeSignInError(w, r, newError(http.StatusBadRequest, "invalid_request", "redirectUri must be one of the application's registered redirect URIs.", nil))
			return
		}
		t.RedirectURI, t.CodeChallenge = c.body.RedirectURI, c.body.CodeChallenge
	}
	email := emailKey(c.body.Email)
	if a.sends.refusedAs(w, r, email, writeSignInRateLimited) {
		return
	}
	send, what := a.signin.SendOTP, "A code"
	if link {
		send, what = a.signin.SendMagicLink, "A sign-in link"
	}
	if err := send(r.Context(), c.app, c.body.Email, t, embeddedClient(r)); err != nil {
		writeSignInError(w, r, err)
		return
	}
	a.sends.failedAs(r, email)
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": what + " was sent to the e-mail address."})
}

func (a *api) embeddedSendOTP(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	a.embeddedSend(w, r, c, false)
}

func (a *api) embeddedSendLink(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	a.embeddedSend(w, r, c, true)
}

// POST /otp/verify
func (a *api) embeddedVerifyOTP(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	if err := cmp.Or(required("email", c.body.Email, "code", c.body.Code), pkce(c)); err != nil {
		writeSignInError(w, r, err)
		return
	}
	email := emailKey(c.body.Email)
	if a.signinFailures.refusedAs(w, r, email, writeSignInRateLimited) {
		return
	}
	res, code, err := a.embeddedSignIn(r, c.app, c.body.CodeChallenge, func(ctx context.Context) (*signin.Result, error) {
		return a.signin.OTPSignIn(ctx, c.app, c.body.Email, c.body.Code, c.body.CodeChallenge, embeddedClient(r))
	})
	if err != nil {
		a.embeddedFailed(w, r, email, err)
		return
	}
	answerEmbeddedCode(w, res, code)
}

// embeddedSignIn runs an embedded sign-in step and issues the code it
// ends in, unless it must be stepped up, as one flow of the group commit:
// a returning person's session (persistence.OpenSession) and its code
// are committed together, once. The code is an authorization request made
// for the application (its first redirect URI, embeddedCodeScope, the PKCE
// challenge of the step that began the sign-in) and answered for the
// session the step opened. Every error has the sign-in shape.
func (a *api) embeddedSignIn(r *http.Request, app *persistence.Client, challenge string,
	step func(ctx context.Context) (*signin.Result, error)) (res *signin.Result, code string, err error) {
	err = a.provider.InFlow(r.Context(), func(ctx context.Context) error {
		if res, err = step(ctx); err != nil || res.StepUp != nil {
			return err
		}
		q := url.Values{"client_id": {app.ID}, "response_type": {"code"}, "redirect_uri": {app.RedirectURIs[0]}, "scope": {embeddedCodeScope},
			"state": {oauth.NewSecret()}}
		if challenge != "" {
			q.Set("code_challenge", challenge)
			q.Set("code_challenge_method", "S256")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, oauth.AuthorizePath+"?"+q.Encode(), nil)
		if err != nil {
			return err
		}
		req.RemoteAddr = r.RemoteAddr
		ar, err := a.provider.NewAuthorizeRequest(ctx, req)
		if err != nil {
			return oauthAsSignIn(err)
		}
		who, err := a.signin.SignedIn(ctx, res.Session, res.User)
		if err != nil {
			return err
		}
		code, err = a.provider.IssueCode(ctx, ar, who)
		return oauthAsSignIn(err)
	})
	switch {
	case errors.Is(err, persistence.ErrChallengeUsed):
		err = signin.ErrCodeExpired // the code or link was used by another request first
	case errors.Is(err, persistence.ErrNotFound):
		err = signin.ErrFlowExpired // the person was deleted meanwhile
	}
	return res, code, err
}

// answerEmbeddedCode answers a finished embedded sign-in with its code, or
// one that must be stepped up with its mfaSessionId and methods.
func answerEmbeddedCode(w http.ResponseWriter, res *signin.Result, code string) {
	w.Header().Set("Cache-Control", "no-store")
	if up := res.StepUp; up != nil {
		writeJSON(w, http.StatusOK, map[string]any{"mfaRequired": true, "mfaSessionId": up.Handle, "methods": up.Methods()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"code": code, "expiresIn": embeddedCodeTTL})
}

// oauthAsSignIn gives a fosite refusal the sign-in shape.
func oauthAsSignIn(err error) error {
	var rfc *fosite.RFC6749Error
	if !errors.As(err, &rfc) {
		return err
	}
	if rfc.CodeField >= 500 {
		return err
	}
	desc := rfc.HintField
	if desc == "" {
		desc = rfc.DescriptionField
	}
	return extensions.NewError(rfc.CodeField, rfc.ErrorField, desc, nil)
}

// POST /code/exchange: the application's backend trades the code for
// tokens. The body (spec: code, client_id, client_secret, code_verifier)
// becomes an authorization_code grant at the token endpoint, with the
// redirect URI the code was issued for, and is answered as that grant is.
func (a *api) embeddedExchange(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Code         string `json:"code"`
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
		CodeVerifier string `json:"code_verifier"`
	}
	if err := decodeJSON(r, &b); err != nil {
		writeSignInError(w, r, err)
		return
	}
	if err := required("code", b.Code, "client_id", b.ClientID); err != nil {
		writeSignInError(w, r, err)
		return
	}
	app, err := a.signin.Application(r.Context(), b.ClientID)
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	if !a.embeddedOrigin(w, r, app) {
		writeSignInError(w, r, errOriginNotAllowed)
		return
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {b.Code}, "redirect_uri": {app.RedirectURIs[0]}, "client_id": {b.ClientID}}
	if b.ClientSecret != "" {
		form.Set("client_secret", b.ClientSecret)
	}
	if b.CodeVerifier != "" {
		form.Set("code_verifier", b.CodeVerifier)
	}
	body := form.Encode()
	req := r.Clone(r.Context())
	req.Body, req.ContentLength, req.Form, req.PostForm = io.NopCloser(strings.NewReader(body)), int64(len(body)), nil, nil
	req.Header.Set("Content-Type", formType)
	oauthForm(a.token)(w, req)
}

// POST /mfa/verify: the second factor of a stepped-up sign-in; the code
// answered keeps the PKCE challenge of the step that began it.
func (a *api) embeddedMFA(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	if err := required("mfaSessionId", c.body.MFASessionID, "method", c.body.Method, "code", c.body.Code); err != nil {
		writeSignInError(w, r, err)
		return
	}
	ctx := r.Context()
	up, err := a.signin.PendingStepUp(ctx, c.app, c.body.MFASessionID)
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	res, code, err := a.embeddedSignIn(r, c.app, up.Pending.CodeChallenge, func(ctx context.Context) (*signin.Result, error) {
		return a.signin.VerifyStepUp(ctx, up, nil, c.app, c.body.Method, c.body.Code, embeddedClient(r))
	})
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	answerEmbeddedCode(w, res, code)
}

// POST /passkey/begin {"clientId", "email"?, "mfaSessionId"?}: the options
// for navigator.credentials.get, for a passkey sign-in (with email: that
// person's passkeys; without: any, usernameless) or, with mfaSessionId, for
// the passkey second factor of a stepped-up sign-in.
func (a *api) embeddedPasskeyBegin(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	where, stepUser := passkeys.Where{}, ""
	if c.body.MFASessionID != "" {
		up, err := a.signin.PendingStepUp(r.Context(), c.app, c.body.MFASessionID)
		if err != nil {
			writeSignInError(w, r, err)
			return
		}
		if !slices.Contains(up.Factors, signin.FactorPasskey) {
			writeSignInError(w, r, newError(http.StatusBadRequest, "invalid_request", "This second factor is not offered for this sign-in.", nil))
			return
		}
		where.StepUp, stepUser = up.Pending.ID, up.Pending.UserID
	}
	options, err := a.passkeys.BeginAuthentication(r.Context(), c.app, c.body.Email, where, stepUser)
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"challenge": options.Response.Challenge, "options": options})
}

// POST /passkey/finish {"clientId", "credential", "codeChallenge",
// "codeChallengeMethod"} or {"clientId", "credential", "mfaSessionId"}: the
// sign-in's code, as every embedded sign-in's (a step-up's keeps the PKCE
// challenge of the step that began it).
func (a *api) embeddedPasskeyFinish(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	if len(c.body.Credential) == 0 || string(c.body.Credential) == "null" {
		writeSignInError(w, r, newError(http.StatusBadRequest, "invalid_request", "credential (the PublicKeyCredential, as JSON) is required.", nil))
		return
	}
	if a.signinFailures.refusedAs(w, r, "", writeSignInRateLimited) {
		return
	}
	var res *signin.Result
	var code string
	var err error
	if c.body.MFASessionID != "" {
		up, e := a.signin.PendingStepUp(r.Context(), c.app, c.body.MFASessionID)
		if e != nil {
			writeSignInError(w, r, e)
			return
		}
		res, code, err = a.passkeySignIn(w, r, c.app, c.body.Credential, up, up.Pending.CodeChallenge)
	} else {
		if err := pkce(c); err != nil {
			writeSignInError(w, r, err)
			return
		}
		res, code, err = a.passkeySignIn(w, r, c.app, c.body.Credential, nil, c.body.CodeChallenge)
	}
	if err != nil {
		var f *passkeys.Failure
		if errors.As(err, &f) {
			logger(r).InfoContext(r.Context(), "passkey verification failed", "reason", f.Reason, "detail", f.Detail)
		}
		writeSignInError(w, r, err)
		return
	}
	answerEmbeddedCode(w, res, code)
}
