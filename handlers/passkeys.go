package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/gorilla/mux"
	"github.com/ory/fosite"
	"github.com/ulule/limiter/v3"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Passkeys (spec, "Passkeys (WebAuthn)"): a person registers passkeys with
// their own token from an application's page, lists, renames and deletes
// them, and signs in with one, answered with tokens. Rules in
// extensions/passkeys; the embedded API's passkey sign-in (ending in a
// code, and the passkey as a second factor) is in embedded.go.
const webauthnPath = "/api/v1/auth/webauthn"

// passkeyRoutes registers the passkey routes: every request counts against
// rl.Passkey per address; a person's own routes also against
// rl.PasskeyUser per person, and failed assertions against the person
// they claim (signinFailures: a stranger cannot spend a person's budget
// from an address that has not failed).
func (a *api) passkeyRoutes(r *mux.Router, rl RateLimits) {
	if a.passkeys == nil {
		return
	}
	p := webauthnPath
	open := func(h http.HandlerFunc) http.HandlerFunc {
		return a.passkeyCORS(a.limited("passkey", rl.Passkey, byIP, h))
	}
	self := func(h http.HandlerFunc) http.HandlerFunc {
		return open(a.authenticated("", "", a.personal(a.limited("passkey-self", rl.PasskeyUser, byPerson, h))))
	}
	// Adding or removing a passkey needs a recent sign-in (recent); a
	// rename changes a label, not what signs in.
	r.HandleFunc(p+"/register/begin", self(a.recent(a.passkeyRegisterBegin))).Methods(http.MethodPost)
	r.HandleFunc(p+"/register/finish", self(a.recent(a.passkeyRegisterFinish))).Methods(http.MethodPost)
	r.HandleFunc(p+"/authenticate/begin", open(a.passkeyAuthenticateBegin)).Methods(http.MethodPost)
	r.HandleFunc(p+"/authenticate/finish", open(a.passkeyAuthenticateFinish)).Methods(http.MethodPost)
	r.HandleFunc(p+"/credentials", self(a.listPasskeys)).Methods(http.MethodGet)
	r.HandleFunc(p+"/credentials/{id}", self(a.renamePasskey)).Methods(http.MethodPut)
	r.HandleFunc(p+"/credentials/{id}", self(a.recent(a.deletePasskey))).Methods(http.MethodDelete)
	r.PathPrefix(p + "/").HandlerFunc(a.passkeyPreflight).Methods(http.MethodOptions)
}

// passkeyCORS lets a page of the application's web origins read every
// answer: the handler allows the origin once it knows the application
// (passkeyOrigin); an answer written before that (a refused body, token or
// limit) is readable by an origin some application registered.
func (a *api) passkeyCORS(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Origin") == "" {
			next(w, r)
			return
		}
		next(&lateCORS{ResponseWriter: w, a: a, r: r}, r)
	}
}

// lateCORS allows a registered origin when an answer is written without
// the handler having allowed one.
type lateCORS struct {
	http.ResponseWriter
	a       *api
	r       *http.Request
	settled bool
}

func (c *lateCORS) settle() {
	if !c.settled {
		c.settled = true
		if c.Header().Get("Access-Control-Allow-Origin") == "" {
			c.a.embeddedOrigin(c.ResponseWriter, c.r, nil)
		}
	}
}

func (c *lateCORS) WriteHeader(status int) { c.settle(); c.ResponseWriter.WriteHeader(status) }

func (c *lateCORS) Write(b []byte) (int, error) { c.settle(); return c.ResponseWriter.Write(b) }

// passkeyOrigin refuses a browser's call from an origin that is not one of
// app's web origins, and lets the page read the answer of one that is (a
// call without Origin is a server's).
func (a *api) passkeyOrigin(w http.ResponseWriter, r *http.Request, app *persistence.Client) error {
	if r.Header.Get("Origin") == "" {
		return nil
	}
	if !a.embeddedOrigin(w, r, app) {
		return errOriginNotAllowed
	}
	return nil
}

// OPTIONS /api/v1/auth/webauthn/*: the CORS preflight, for an origin some
// application registered; the calls carry a Bearer token.
func (a *api) passkeyPreflight(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Origin") == "" || !a.embeddedOrigin(w, r, nil) {
		writeError(w, r, errOriginNotAllowed)
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

// passkeyBody is every passkey call's JSON body.
type passkeyBody struct {
	ClientID   string          `json:"clientId"`
	Name       string          `json:"name"`
	Email      string          `json:"email"`
	Credential json.RawMessage `json:"credential"`
}

// readPasskeyBody reads the body and the application it names: the
// person's token's own, for a person's call (personal).
func (a *api) readPasskeyBody(w http.ResponseWriter, r *http.Request, credential bool) (*passkeyBody, *persistence.Client, error) {
	var b passkeyBody
	if err := decodeJSON(r, &b); err != nil {
		return nil, nil, err
	}
	switch {
	case b.ClientID == "":
		return nil, nil, newError(http.StatusBadRequest, "invalid_request", "clientId is required.", nil)
	case credential && (len(b.Credential) == 0 || string(b.Credential) == "null"):
		return nil, nil, newError(http.StatusBadRequest, "invalid_request", "credential (the PublicKeyCredential, as JSON) is required.", nil)
	}
	var app *persistence.Client
	if p := principalFrom(r.Context()); p != nil {
		if b.ClientID != p.ClientID() {
			return nil, nil, newError(http.StatusForbidden, "client_mismatch", "clientId must be the application the access token was issued to.", nil)
		}
		app = p.Client
	} else {
		found, err := a.signin.Application(r.Context(), b.ClientID)
		if err != nil {
			return nil, nil, err
		}
		app = found
	}
	if err := a.passkeyOrigin(w, r, app); err != nil {
		return nil, nil, err
	}
	return &b, app, nil
}

// passkeyOrigins is what the event log records of a passkey request.
func passkeyOrigins(r *http.Request, app *persistence.Client) passkeys.Origin {
	c := requestClient(r)
	o := passkeys.Origin{ClientID: app.ID, ApplicationID: app.RecordID, IP: c.IP, UserAgent: c.UserAgent}
	if p := principalFrom(r.Context()); p != nil {
		o.SessionID = p.SessionID
	}
	return o
}

// writePasskeyError answers err, logging what a verification failure hides.
func writePasskeyError(w http.ResponseWriter, r *http.Request, err error) {
	var f *passkeys.Failure
	if errors.As(err, &f) {
		logger(r).InfoContext(r.Context(), "passkey verification failed", "reason", f.Reason, "detail", f.Detail)
	}
	writeError(w, r, err)
}

// registrant reads a registration's body, its application and the person
// whose token calls.
func (a *api) registrant(w http.ResponseWriter, r *http.Request, credential bool) (*passkeyBody, *persistence.Client, *persistence.User, error) {
	b, app, err := a.readPasskeyBody(w, r, credential)
	if err != nil {
		return nil, nil, nil, err
	}
	user, err := a.signin.User(r.Context(), principalFrom(r.Context()).Subject)
	if err != nil {
		return nil, nil, nil, err
	}
	return b, app, user, nil
}

// POST /register/begin {"clientId", "name"?}: the options for
// navigator.credentials.create.
func (a *api) passkeyRegisterBegin(w http.ResponseWriter, r *http.Request) {
	b, app, user, err := a.registrant(w, r, false)
	if err != nil {
		writeError(w, r, err)
		return
	}
	options, err := a.passkeys.BeginRegistration(r.Context(), app, user, b.Name, passkeyOrigins(r, app))
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"challenge": options.Response.Challenge, "options": options})
}

// POST /register/finish {"clientId", "credential"}: the passkey made.
func (a *api) passkeyRegisterFinish(w http.ResponseWriter, r *http.Request) {
	b, app, user, err := a.registrant(w, r, true)
	if err != nil {
		writeError(w, r, err)
		return
	}
	p, err := a.passkeys.FinishRegistration(r.Context(), app, user, b.Credential, passkeyOrigins(r, app))
	if err != nil {
		writePasskeyError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, passkeys.ViewOf(p))
}

// POST /authenticate/begin {"clientId", "email"?}: the options for
// navigator.credentials.get; without email, for any passkey of the rpId.
func (a *api) passkeyAuthenticateBegin(w http.ResponseWriter, r *http.Request) {
	b, app, err := a.readPasskeyBody(w, r, false)
	if err != nil {
		writeError(w, r, err)
		return
	}
	options, err := a.passkeys.BeginAuthentication(r.Context(), app, b.Email, passkeys.Where{}, "")
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"challenge": options.Response.Challenge, "options": options})
}

// POST /authenticate/finish {"clientId", "credential"}: the person signed
// in, as every sign-in (risk rules, session, events), answered with the
// tokens the application's code would have brought (access, refresh, ID),
// multi-factor: amr hwk or swk, user, mfa; acr multi-factor.
func (a *api) passkeyAuthenticateFinish(w http.ResponseWriter, r *http.Request) {
	if a.signinFailures.refusedAs(w, r, "", writeRateLimited) {
		return
	}
	b, app, err := a.readPasskeyBody(w, r, true)
	if err != nil {
		writeError(w, r, err)
		return
	}
	verifier := oauth2.GenerateVerifier() // PKCE between this server and itself
	_, code, err := a.passkeySignIn(w, r, app, b.Credential, nil, oauth2.S256ChallengeFromVerifier(verifier))
	if err != nil {
		writePasskeyError(w, r, err)
		return
	}
	a.vouchedTokens(w, r, app, code, verifier)
}

// passkeySignIn verifies an assertion and signs its person in (a first
// factor; with up, that step-up's second), ending in a code for app bound
// to challenge, as embedded sign-ins do. Failures count against the
// address and the person.
func (a *api) passkeySignIn(w http.ResponseWriter, r *http.Request, app *persistence.Client, credential []byte, up *signin.StepUp,
	challenge string) (*signin.Result, string, error) {
	var where passkeys.Where
	if up != nil {
		where.StepUp = up.Pending.ID
	}
	where.Admit = func(user *persistence.User) error {
		var refused *limiter.Context
		if a.signinFailures.refusedAs(w, r, limitKey("user", user.ID), func(_ http.ResponseWriter, _ *http.Request, c limiter.Context) { refused = &c }) {
			retry := retryAfter(w, *refused)
			return newError(http.StatusTooManyRequests, "rate_limited", "Too many failed attempts; retry later.",
				map[string]any{"limit": refused.Limit, "retryAfter": retry})
		}
		return nil
	}
	v, err := a.passkeys.FinishAuthentication(r.Context(), app, credential, where, passkeyOrigins(r, app))
	if err != nil {
		var f *passkeys.Failure
		if errors.As(err, &f) {
			claimed := ""
			if f.UserID != "" {
				claimed = limitKey("user", f.UserID)
			}
			a.signinFailures.failedAs(r, claimed)
		}
		return nil, "", err
	}
	res, code, err := a.embeddedSignIn(r, app, challenge, func(ctx context.Context) (*signin.Result, error) {
		if up != nil {
			return a.signin.PasskeyStepUp(ctx, up, nil, app, v.User.ID, v.AMR, v.Use, embeddedClient(r))
		}
		return a.signin.PasskeySignIn(ctx, nil, app, v.User, v.AMR, challenge, v.Use, embeddedClient(r))
	})
	if errors.Is(err, persistence.ErrPasskeyUseLost) {
		a.signinFailures.failedAs(r, limitKey("user", v.User.ID))
		err = a.passkeys.Lost(r.Context(), v, passkeyOrigins(r, app))
	}
	return res, code, err
}

// vouchedTokens trades a code this server just issued for app's tokens at
// the token endpoint, for app without its secret (oauth.Vouch: the server
// verified the person itself), and answers them as the token endpoint does.
func (a *api) vouchedTokens(w http.ResponseWriter, r *http.Request, app *persistence.Client, code, verifier string) {
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {app.RedirectURIs[0]},
		"client_id": {app.ID}, "code_verifier": {verifier}}
	body := form.Encode()
	ctx := oauth.Vouch(r.Context(), app.ID)
	req := r.Clone(ctx)
	req.Body, req.ContentLength, req.Form, req.PostForm = io.NopCloser(strings.NewReader(body)), int64(len(body)), nil, nil
	req.Header = req.Header.Clone()
	req.Header.Set("Content-Type", formType)
	req.Header.Del("Authorization")
	var ar fosite.AccessRequester
	var resp fosite.AccessResponder
	var err error
	if cerr := a.provider.ExchangeCode(ctx, func(ctx context.Context) {
		if ar, err = a.provider.NewAccessRequest(ctx, req, oauth.NewSession()); err == nil {
			resp, err = a.provider.NewAccessResponse(ctx, ar)
		}
	}); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		if persistence.Unavailable(err) || errors.Is(err, fosite.ErrTemporarilyUnavailable) {
			writeError(w, r, persistence.ErrUnavailable)
			return
		}
		writeError(w, r, err)
		return
	}
	a.provider.WriteAccessResponse(ctx, w, ar, resp)
}

// GET /credentials: the person's passkeys.
func (a *api) listPasskeys(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	if err := a.passkeyOrigin(w, r, p.Client); err != nil {
		writeError(w, r, err)
		return
	}
	list, err := a.passkeys.List(r.Context(), p.Subject)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"credentials": list})
}

// PUT /credentials/{id} {"name"}: renamed.
func (a *api) renamePasskey(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	if err := a.passkeyOrigin(w, r, p.Client); err != nil {
		writeError(w, r, err)
		return
	}
	var b struct {
		Name *string `json:"name"`
	}
	if err := decodeJSON(r, &b); err != nil {
		writeError(w, r, err)
		return
	}
	if b.Name == nil {
		var v extensions.ValidationError
		v.Add("name", "is required")
		writeError(w, r, &v)
		return
	}
	view, err := a.passkeys.Rename(r.Context(), p.Subject, mux.Vars(r)["id"], *b.Name)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view)
}

// DELETE /credentials/{id}: removed (a lost passkey).
func (a *api) deletePasskey(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	if err := a.passkeyOrigin(w, r, p.Client); err != nil {
		writeError(w, r, err)
		return
	}
	if err := a.passkeys.Delete(r.Context(), p.Client, p.Subject, mux.Vars(r)["id"], passkeyOrigins(r, p.Client)); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
