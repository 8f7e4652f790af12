package handlers

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/oauth"
)

// A person's TOTP second factor, self-service: enrol an authenticator app,
// confirm it with a code (which turns it on and gives recovery codes), turn
// it off with a code. Rules in extensions/mfa.
const (
	mfaTOTPPath        = "/api/v1/auth/mfa/totp"
	mfaTOTPEnrollPath  = mfaTOTPPath + "/enroll"
	mfaTOTPConfirmPath = mfaTOTPPath + "/confirm"
)

// mfaRoutes registers the second-factor routes: a person's token only
// (personal) from a recent sign-in (recent), each request counted per
// person against rl.SignIn, and wrong
// codes per person inside the service (mfa.Config: shared with sign-in).
// They are not units of work (committed): a refused code must still be
// recorded, so the service commits its own changes, each in one
// transaction, before the answer is written.
func (a *api) mfaRoutes(r *mux.Router, rl RateLimits) {
	if a.mfa == nil {
		return
	}
	self := func(h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated("", "", a.personal(a.limited("mfa", rl.SignIn, byPerson, a.recent(h))))
	}
	r.HandleFunc(mfaTOTPEnrollPath, self(a.enrollTOTP)).Methods(http.MethodPost)
	r.HandleFunc(mfaTOTPConfirmPath, self(a.confirmTOTP)).Methods(http.MethodPost)
	r.HandleFunc(mfaTOTPPath, self(a.disableTOTP)).Methods(http.MethodDelete)
}

// errUserTokenRequired refuses a token that does not speak for a person.
var errUserTokenRequired = newError(http.StatusForbidden, "user_token_required",
	"This call needs a person's access token, issued when they signed in through an application.", nil)

// personal admits a person's own token only: one issued to them through an
// application, in a sign-in session, held by no agent and not delegated.
// A machine's token (client credentials, an agent's, a delegated one) is
// refused with errUserTokenRequired.
func (a *api) personal(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p := principalFrom(r.Context()); !isPerson(p) {
			writeError(w, r, errUserTokenRequired)
			return
		}
		next(w, r)
	}
}

// isPerson tells whether p is a person acting for themselves.
func isPerson(p *oauth.Principal) bool {
	return p != nil && p.SessionID != "" && p.Client.App != nil && p.Agent == nil && p.Act == nil && !p.ForItself()
}

// byPerson keys a limit on the person a token speaks for: byPrincipal
// would count every person of one application together.
func byPerson(r *http.Request) string {
	if p := principalFrom(r.Context()); p != nil {
		return limitKey("user", p.Subject)
	}
	return byIP(r)
}

// mfaOrigin is what the event log records of a person's request.
func mfaOrigin(r *http.Request) mfa.Origin {
	p, c := principalFrom(r.Context()), requestClient(r)
	return mfa.Origin{ClientID: p.ClientID(), ApplicationID: p.Client.RecordID, AppName: p.Client.App.Name, SessionID: p.SessionID, IP: c.IP, UserAgent: c.UserAgent}
}

// maxCodeLength bounds a code: six digits or a recovery code, with room for
// the spaces and dashes people type.
const maxCodeLength = 64

// readCode reads a {"code": "..."} body: strictly (decodeJSON), with a
// code that is present, a string, and no longer than any code is.
func readCode(r *http.Request) (string, error) {
	var body struct {
		Code *string `json:"code"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return "", err
	}
	var v extensions.ValidationError
	switch {
	case body.Code == nil || *body.Code == "":
		v.Add("code", "is required")
	case len(*body.Code) > maxCodeLength:
		v.Add("code", "must be at most %d characters", maxCodeLength)
	}
	if err := v.Err(); err != nil {
		return "", err
	}
	return *body.Code, nil
}

// writeMFAError is writeError with Retry-After on the try limit's 429.
func writeMFAError(w http.ResponseWriter, r *http.Request, err error) {
	var e *apiError
	if errors.As(err, &e) && e.Status == http.StatusTooManyRequests {
		if retry, ok := e.Details["retryAfter"].(int64); ok {
			w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
		}
	}
	writeError(w, r, err)
}

// POST /api/v1/auth/mfa/totp/enroll: a new secret for the authenticator
// app, as text, otpauth URI and QR code; confirmed by the next call. No body.
func (a *api) enrollTOTP(w http.ResponseWriter, r *http.Request) {
	e, err := a.mfa.Enroll(r.Context(), principalFrom(r.Context()).Subject)
	if err != nil {
		writeMFAError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"secret": e.Secret, "otpauthUri": e.URI, "qrCode": e.QRCode})
}

// POST /api/v1/auth/mfa/totp/confirm {"code"}: turns TOTP on and answers
// the recovery codes, shown this once.
func (a *api) confirmTOTP(w http.ResponseWriter, r *http.Request) {
	code, err := readCode(r)
	if err != nil {
		writeMFAError(w, r, err)
		return
	}
	codes, err := a.mfa.Confirm(r.Context(), principalFrom(r.Context()).Subject, code, mfaOrigin(r))
	if err != nil {
		writeMFAError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"enabled": true, "recoveryCodes": codes})
}

// DELETE /api/v1/auth/mfa/totp {"code"}: turns TOTP off, proved by a
// current code or an unused recovery code.
func (a *api) disableTOTP(w http.ResponseWriter, r *http.Request) {
	code, err := readCode(r)
	if err != nil {
		writeMFAError(w, r, err)
		return
	}
	if _, err := a.mfa.Disable(r.Context(), principalFrom(r.Context()).Subject, code, mfaOrigin(r)); err != nil {
		writeMFAError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
