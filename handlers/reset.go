package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/gorilla/mux"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/handlers/pages"
)

// Password reset (spec: Password reset): the JSON API an application's
// page or backend calls, and identityd's hosted pages (a "Forgot
// password?" link on the password step, the forgot page, and the reset
// page the e-mailed link opens). The rules are in extensions/reset.
//
// Limits (spec: 3 requests per hour per e-mail address, 10 per hour per
// address): every forgot-password request, API or page, counts against
// its address and the e-mail address it names; the e-mail address's
// budget refuses only addresses that have already asked in the window, so
// a stranger cannot spend a person's budget from elsewhere and keep them
// from resetting their own password. Token checks (verify, reset, the
// reset page) count against their address (rl.ResetToken). 429s answer
// rate_limit_exceeded, the spec's code.
const (
	forgotPasswordPath = "/api/v1/auth/forgot-password"
	resetVerifyPath    = "/api/v1/auth/reset-password/verify"
	resetPasswordPath  = "/api/v1/auth/reset-password"
	forgotPagePath     = signinPath + "/forgot-password"
	resetPagePath      = reset.PagePath
)

// CSRF purposes of the reset pages' forms.
const (
	forgotPurpose = "forgot-password"
	resetPurpose  = "reset-password"
)

func (a *api) resetRoutes(r *mux.Router, rl RateLimits) {
	if a.reset == nil {
		return
	}
	if a.limitStore != nil {
		a.resetRequests = a.newFailureLimit("reset-request", rl.ResetRequest, nil)
		a.resetRequests.claims = limiter.New(a.limitStore, rl.ResetRequestEmail)
		a.resetTokens = limiter.New(a.limitStore, rl.ResetToken)
	}
	r.HandleFunc(forgotPasswordPath, a.forgotPassword).Methods(http.MethodPost)
	r.HandleFunc(resetVerifyPath, a.resetTokenLimited(a.verifyResetToken, writeVerifyRateLimited)).Methods(http.MethodGet)
	r.HandleFunc(resetPasswordPath, a.resetTokenLimited(a.resetPassword, writeResetRateLimited)).Methods(http.MethodPost)
	r.HandleFunc(forgotPagePath, a.forgotPage).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(forgotPagePath, a.forgotSubmit).Methods(http.MethodPost)
	r.HandleFunc(resetPagePath, a.resetTokenLimited(a.resetPage, a.resetPageLimited)).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(resetPagePath, a.resetTokenLimited(a.resetSubmit, a.resetPageLimited)).Methods(http.MethodPost)
}

// --- limits

// admitResetRequest counts a forgot-password request for email against
// its address and the e-mail address, and sets the X-RateLimit headers of
// the address's budget; spent, it answers through refuse and is false.
func (a *api) admitResetRequest(w http.ResponseWriter, r *http.Request, email string, refuse func(http.ResponseWriter, *http.Request, limiter.Context)) bool {
	f := a.resetRequests
	if f == nil {
		return true
	}
	key := emailKey(email)
	if f.refusedAs(w, r, key, refuse) {
		return false
	}
	f.failedAs(r, key) // every request counts, whatever its outcome
	if c, err := f.l.Peek(r.Context(), f.key("ip", addressKey(r))); err == nil {
		setRateHeaders(w, c)
	}
	return true
}

// resetTokenLimited counts a token check against its address.
func (a *api) resetTokenLimited(next http.HandlerFunc, refuse func(http.ResponseWriter, *http.Request, limiter.Context)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.resetTokens == nil || count(w, r, a.resetTokens, "reset-token:"+byIP(r), refuse) {
			next(w, r)
		}
	}
}

const rateLimitMessage = "Too many password reset requests. Wait and try again later."

// writeResetRateLimited is the reset API's 429: the envelope with the
// spec's code.
func writeResetRateLimited(w http.ResponseWriter, r *http.Request, c limiter.Context) {
	retry := retryAfter(w, c)
	writeError(w, r, newError(http.StatusTooManyRequests, "rate_limit_exceeded", rateLimitMessage,
		map[string]any{"limit": c.Limit, "retryAfter": retry}))
}

// writeVerifyRateLimited is verify's 429, in verify's shape.
func writeVerifyRateLimited(w http.ResponseWriter, _ *http.Request, c limiter.Context) {
	retryAfter(w, c)
	writeJSON(w, http.StatusTooManyRequests, verifyRefusal{Error: "rate_limit_exceeded", Description: rateLimitMessage, Message: rateLimitMessage})
}

// resetPageLimited is the reset pages' 429: a page, with Retry-After.
func (a *api) resetPageLimited(w http.ResponseWriter, _ *http.Request, c limiter.Context) {
	tooManyPage(w, c, "password reset")
}

// --- the API

// forgotBody is forgot-password's body (spec).
type forgotBody struct {
	Email        string `json:"email"`
	ClientID     string `json:"clientId"`
	CaptchaToken string `json:"captchaToken"`
}

// POST /api/v1/auth/forgot-password: always 200 with the same message for
// any well-formed request, whether or not the address has an account.
func (a *api) forgotPassword(w http.ResponseWriter, r *http.Request) {
	var b forgotBody
	if err := decodeJSON(r, &b); err != nil {
		writeError(w, r, err)
		return
	}
	if missing := missingMembers(map[string]string{"email": b.Email, "clientId": b.ClientID}, "email", "clientId"); missing != nil {
		writeError(w, r, missing)
		return
	}
	if !a.admitResetRequest(w, r, b.Email, writeResetRateLimited) {
		return
	}
	ctx := r.Context()
	app, err := a.signin.Application(ctx, strings.TrimSpace(b.ClientID))
	if errors.Is(err, signin.ErrNotApplication) {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "clientId is not an application.", map[string]any{"field": "clientId"}))
		return
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	if err := a.reset.Request(ctx, app, b.Email, b.CaptchaToken, resetClient(r)); err != nil {
		logCaptchaOutage(r, err)
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"message": reset.Neutral})
}

// missingMembers refuses the first required member (in order) that is
// empty, naming it.
func missingMembers(values map[string]string, order ...string) error {
	for _, name := range order {
		if strings.TrimSpace(values[name]) == "" {
			return newError(http.StatusBadRequest, "invalid_request", name+" is required.", map[string]any{"field": name})
		}
	}
	return nil
}

// logCaptchaOutage logs why a captcha could not be checked (the answer
// says only that it could not).
func logCaptchaOutage(r *http.Request, err error) {
	if errors.Is(err, reset.ErrCaptchaUnavailable) {
		logger(r).WarnContext(r.Context(), "captcha verification unavailable", "error", err.Error())
	}
}

// resetClient is the address and user agent of a request, for events and
// the captcha's remoteip.
func resetClient(r *http.Request) reset.Client {
	c := requestClient(r)
	return reset.Client{IP: c.IP, UserAgent: c.UserAgent}
}

// verifyRefusal is verify's answer for a token that cannot be used: the
// spec's valid, error and error_description, and message as in every
// other error body.
type verifyRefusal struct {
	Valid       bool   `json:"valid"`
	Error       string `json:"error"`
	Description string `json:"error_description"`
	Message     string `json:"message"`
}

// GET /api/v1/auth/reset-password/verify?token=…: whether a token can be
// used, without spending it or counting an attempt.
func (a *api) verifyResetToken(w http.ResponseWriter, r *http.Request) {
	st, err := a.reset.Verify(r.Context(), r.URL.Query().Get("token"))
	var refusal *extensions.Error
	switch {
	case errors.As(err, &refusal) && refusal.Status < http.StatusInternalServerError:
		writeJSON(w, refusal.Status, verifyRefusal{Error: refusal.Code, Description: refusal.Message, Message: refusal.Message})
		return
	case err != nil:
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"valid": true, "email": st.Email, "expiresIn": st.ExpiresIn})
}

// resetBody is reset-password's body (spec).
type resetBody struct {
	Token       string  `json:"token"`
	NewPassword *string `json:"newPassword"`
}

// POST /api/v1/auth/reset-password: a new password through a token.
func (a *api) resetPassword(w http.ResponseWriter, r *http.Request) {
	var b resetBody
	if err := decodeJSON(r, &b); err != nil {
		writeError(w, r, err)
		return
	}
	if strings.TrimSpace(b.Token) == "" {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "token is required.", map[string]any{"field": "token"}))
		return
	}
	if b.NewPassword == nil {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "newPassword is required.", map[string]any{"field": "newPassword"}))
		return
	}
	if err := a.reset.Reset(r.Context(), b.Token, *b.NewPassword, resetClient(r)); err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"message": "Your password has been changed. Every session of your account has ended: sign in again with the new password."})
}

// --- the hosted pages

// GET /signin/forgot-password?flow=ID (from the password step) or
// ?client_id=… (an application's own link), with email= to fill in.
func (a *api) forgotPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	clientID, email, back := q.Get("client_id"), q.Get("email"), ""
	if id := q.Get("flow"); id != "" {
		f, err := a.signin.Flow(r.Context(), id, a.cookies.Browser(r))
		if err != nil {
			a.pageError(w, r, "Sign-in expired", err)
			return
		}
		clientID, email, back = f.ClientID, f.Email, signinPath+"?flow="+url.QueryEscape(f.ID)
	}
	app, err := a.signin.Application(r.Context(), clientID)
	if err != nil {
		a.pageError(w, r, "Reset your password", err)
		return
	}
	browser := a.ensureBrowser(w, r)
	a.renderForgot(w, http.StatusOK, app.App.Name, app.ID, email, back, a.csrf.Token(browser, forgotPurpose), "", "")
}

// renderForgot shows the forgot page: the form, or (message set) its
// neutral answer.
func (a *api) renderForgot(w http.ResponseWriter, status int, appName, clientID, email, back, csrf, problem, message string) {
	p := pages.Page{
		Title: "Reset your password", AppName: appName, Email: email, Error: problem, Action: forgotPagePath, BackLink: back,
		Hidden: []pages.Field{{Name: "client_id", Value: clientID}, {Name: "back", Value: back}, {Name: "csrf_token", Value: csrf}},
	}
	if message != "" {
		p.Title, p.Message, p.Detail = "Check your email", message, "Nothing arrived? Check your spam folder, or ask again in a few minutes."
	} else if c := a.reset.CaptchaWidget(); c != nil {
		p.Captcha = &pages.Captcha{Script: c.Script, Class: c.Class, SiteKey: c.SiteKey, Sources: c.Sources}
	}
	pages.Render(w, status, "forgot", p)
}

// resetForm reads a reset page's form with its CSRF token for purpose in
// this browser; it answers the browser's secret, or renders the refusal.
func (a *api) resetForm(w http.ResponseWriter, r *http.Request, purpose string) (string, bool) {
	if !a.readPageForm(w, r) {
		return "", false
	}
	browser := a.cookies.Browser(r)
	if !a.csrf.Valid(browser, purpose, r.PostForm.Get("csrf_token")) {
		a.pageError(w, r, "Reset your password", errCSRF)
		return "", false
	}
	return browser, true
}

// POST /signin/forgot-password: the form; the same neutral page for any
// well-formed address.
func (a *api) forgotSubmit(w http.ResponseWriter, r *http.Request) {
	browser, ok := a.resetForm(w, r, forgotPurpose)
	if !ok {
		return
	}
	ctx := r.Context()
	app, err := a.signin.Application(ctx, r.PostForm.Get("client_id"))
	if err != nil {
		a.pageError(w, r, "Reset your password", err)
		return
	}
	email, back := strings.TrimSpace(r.PostForm.Get("email")), r.PostForm.Get("back")
	if !strings.HasPrefix(back, signinPath+"?flow=") {
		back = "" // only a way back to a sign-in of this server
	}
	csrf := a.csrf.Token(browser, forgotPurpose)
	if email == "" {
		a.renderForgot(w, http.StatusBadRequest, app.App.Name, app.ID, email, back, csrf, "Enter an email address, like name@example.com.", "")
		return
	}
	if !a.admitResetRequest(w, r, email, a.resetPageLimited) {
		return
	}
	err = a.reset.Request(ctx, app, email, captchaOfForm(r), resetClient(r))
	var invalid *extensions.ValidationError
	var refusal *extensions.Error
	switch {
	case errors.As(err, &invalid):
		a.renderForgot(w, http.StatusBadRequest, app.App.Name, app.ID, email, back, csrf, "Enter an email address, like name@example.com.", "")
		return
	case errors.As(err, &refusal) && refusal.Status == http.StatusBadRequest:
		a.renderForgot(w, http.StatusBadRequest, app.App.Name, app.ID, email, back, csrf, refusal.Message, "")
		return
	case err != nil:
		logCaptchaOutage(r, err)
		a.pageError(w, r, "Reset your password", err)
		return
	}
	a.renderForgot(w, http.StatusOK, app.App.Name, app.ID, email, back, csrf, "", reset.Neutral)
}

// captchaOfForm is the captcha token a form carries: a widget's own field
// (Turnstile, hCaptcha, reCAPTCHA) or captchaToken.
func captchaOfForm(r *http.Request) string {
	for _, name := range []string{"captchaToken", "cf-turnstile-response", "h-captcha-response", "g-recaptcha-response"} {
		if v := r.PostForm.Get(name); v != "" {
			return v
		}
	}
	return ""
}

// GET /signin/reset-password?token=…: the e-mailed link's page. Reading
// spends nothing (mail scanners GET links): the form's POST does.
func (a *api) resetPage(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("token")
	st, err := a.reset.Verify(r.Context(), token)
	if err != nil {
		a.pageError(w, r, "Reset your password", err)
		return
	}
	browser := a.ensureBrowser(w, r)
	a.renderReset(w, r, http.StatusOK, st, token, a.csrf.Token(browser, resetPurpose), "")
}

// renderReset shows the reset form for a live token, named after its
// application.
func (a *api) renderReset(w http.ResponseWriter, r *http.Request, status int, st *reset.Status, token, csrf, problem string) {
	appName := ""
	if app, err := a.signin.Application(r.Context(), st.ClientID); err == nil {
		appName = app.App.Name
	}
	pages.Render(w, status, "reset", pages.Page{
		Title: "Choose a new password", AppName: appName, Email: st.Email, Error: problem, Action: resetPagePath,
		Hidden: []pages.Field{{Name: "token", Value: token}, {Name: "csrf_token", Value: csrf}},
	})
}

// POST /signin/reset-password: the new password, twice.
func (a *api) resetSubmit(w http.ResponseWriter, r *http.Request) {
	browser, ok := a.resetForm(w, r, resetPurpose)
	if !ok {
		return
	}
	ctx := r.Context()
	token, password := r.PostForm.Get("token"), r.PostForm.Get("new_password")
	st, err := a.reset.Verify(ctx, token)
	if err != nil {
		a.pageError(w, r, "Reset your password", err)
		return
	}
	csrf := a.csrf.Token(browser, resetPurpose)
	if password != r.PostForm.Get("confirm_password") {
		a.renderReset(w, r, http.StatusBadRequest, st, token, csrf, "The two passwords are not the same. Type the new password twice.")
		return
	}
	err = a.reset.Reset(ctx, token, password, resetClient(r))
	var refusal *extensions.Error
	switch {
	case errors.As(err, &refusal) && refusal.Code == "weak_password":
		msg := refusal.Message
		if left, ok := refusal.Details["attemptsRemaining"].(int); ok && left == 0 {
			a.pageError(w, r, "Reset your password", reset.ErrTooManyAttempts)
			return
		} else if ok && left == 1 {
			msg += " One attempt is left with this link."
		}
		a.renderReset(w, r, http.StatusBadRequest, st, token, csrf, msg)
		return
	case errors.As(err, &refusal) && refusal.Code == "invalid_request":
		a.renderReset(w, r, http.StatusBadRequest, st, token, csrf, refusal.Message)
		return
	case err != nil:
		a.pageError(w, r, "Reset your password", err)
		return
	}
	pages.Render(w, http.StatusOK, "message", pages.Page{
		Title: "Password changed", Message: "Your password has been changed.",
		Detail: "Every session of your account has ended. Go back to the application and sign in with your new password.",
	})
}
