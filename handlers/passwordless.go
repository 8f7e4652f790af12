package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/persistence"
)

// The hosted page's e-mailed methods: a one-time code typed into the page,
// or a magic link opened from the e-mail. Sending counts against a.sends
// (per address, and per e-mail address for addresses that have sent: a
// stranger cannot spend a person's budget from elsewhere); a wrong code
// counts as a wrong password does.

// methodLabels name the buttons that switch to a method.
var methodLabels = map[string]string{
	signin.MethodPassword:  "Sign in with a password",
	signin.MethodOTP:       "Email me a code",
	signin.MethodMagicLink: "Email me a link",
}

// stepMethods are the method each method step is.
var stepMethods = map[string]string{
	signin.StepPassword: signin.MethodPassword, signin.StepOTP: signin.MethodOTP, signin.StepLinkSent: signin.MethodMagicLink,
}

// alternatives are the application's other methods than the step's own.
func alternatives(app *persistence.Client, step string) []pages.Alternative {
	own, ok := stepMethods[step]
	if !ok {
		return nil
	}
	var out []pages.Alternative
	for _, m := range signin.Methods(app.App) {
		if m != own {
			out = append(out, pages.Alternative{Method: m, Label: methodLabels[m]})
		}
	}
	return out
}

// firstMethodSends tells whether the e-mail step sends a code or a link.
func firstMethodSends(app *persistence.Client) bool {
	methods := signin.Methods(app.App)
	return len(methods) > 0 && methods[0] != signin.MethodPassword
}

// POST /signin/method: switch to another method, or send a new code or
// link.
func (a *api) signinMethod(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	method := r.PostForm.Get("method")
	sends := method == signin.MethodOTP || method == signin.MethodMagicLink
	email := emailKey(f.Email)
	if sends && a.sends.refusedAs(w, r, email, a.tooManyAttempts) {
		return
	}
	next, err := a.signin.ChooseMethod(r.Context(), f, app, method, a.browserClient(r))
	if errors.Is(err, signin.ErrMethodNotAllowed) {
		a.renderStep(w, r, http.StatusBadRequest, f, app, browser, signin.ErrMethodNotAllowed.Message)
		return
	}
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	if sends {
		a.sends.failedAs(r, email)
	}
	a.nextStep(w, r, next)
}

// POST /signin/otp: the e-mailed code.
func (a *api) signinOTP(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	email := emailKey(f.Email)
	if a.signinFailures.refusedAs(w, r, email, a.tooManyAttempts) {
		return
	}
	res, err := a.signin.SubmitOTP(r.Context(), f, app, r.PostForm.Get("code"), a.browserClient(r))
	switch {
	case errors.Is(err, signin.ErrInvalidCode), errors.Is(err, signin.ErrTooManyWrongCode), errors.Is(err, signin.ErrCodeExpired):
		a.signinFailures.failedAs(r, email)
		a.renderStep(w, r, http.StatusBadRequest, f, app, browser, codeMessage(err))
		return
	case errors.Is(err, signin.ErrDisabled):
		a.renderStep(w, r, http.StatusForbidden, f, app, browser, signin.ErrDisabled.Message)
		return
	case err != nil:
		var exists *signin.AccountExistsError
		if errors.As(err, &exists) {
			a.renderStep(w, r, http.StatusBadRequest, f, app, browser, signin.ErrCodeExpired.Message)
			return
		}
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.signedIn(w, r, f, res)
}

// codeMessage is the page's text for a refused code.
func codeMessage(err error) string {
	for _, e := range []*extensions.Error{signin.ErrTooManyWrongCode, signin.ErrCodeExpired, signin.ErrInvalidCode} {
		if errors.Is(err, e) {
			return e.Message
		}
	}
	return signin.ErrInvalidCode.Message
}

// signedIn sets the new session's cookie and resumes the authorization.
// The browser's previous session, if any, gives way to the new one. A
// sign-in that must be stepped up goes to the flow's second-factor page.
func (a *api) signedIn(w http.ResponseWriter, r *http.Request, f *persistence.SignInFlow, res *signin.Result) {
	if res.StepUp != nil {
		a.nextStep(w, r, f)
		return
	}
	if old, _, err := a.signin.Live(r.Context(), a.cookies.Session(r)); err == nil && old != nil {
		if err := a.signin.End(r.Context(), old, persistence.SessionEndReplaced, "", "", a.browserClient(r)); err != nil {
			logger(r).WarnContext(r.Context(), "ending a replaced session failed", "error", err.Error())
		}
	}
	a.cookies.SetSession(w, res.Secret)
	pages.SetHeaders(w.Header(), redirectTarget(f.Request))
	http.Redirect(w, r, signinResumePath+"?flow="+url.QueryEscape(f.ID), http.StatusSeeOther)
}

// magicLinkPurpose is the CSRF purpose of a magic link's confirmation.
const magicLinkPurpose = "magic-link"

// GET /signin/magic-link?token=…: a page with one button. Nothing is spent
// here: mail scanners and link previews GET (and HEAD) links.
func (a *api) magicLinkPage(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("token")
	ch, err := a.signin.MagicLink(r.Context(), token)
	if err != nil {
		a.pageError(w, r, "Link expired", err)
		return
	}
	app, err := a.signin.Application(r.Context(), ch.ClientID)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	browser := a.ensureBrowser(w, r)
	pages.Render(w, http.StatusOK, "magiclink", pages.Page{
		Title: "Sign in", AppName: app.App.Name, Email: ch.Email, Action: signin.MagicLinkPath,
		Hidden: []pages.Field{{Name: "token", Value: token}, {Name: "csrf_token", Value: a.csrf.Token(browser, magicLinkPurpose)}},
	}, magicLinkTarget(ch))
}

// magicLinkTarget is where a link's confirmation ends up: the
// application's redirect URI (embedded) or its authorization's.
func magicLinkTarget(ch *persistence.EmailChallenge) string {
	if ch.RedirectURI != "" {
		return pages.Target(ch.RedirectURI)
	}
	return ""
}

// POST /signin/magic-link: the click that spends the link.
func (a *api) magicLinkConfirm(w http.ResponseWriter, r *http.Request) {
	if !a.readPageForm(w, r) {
		return
	}
	browser := a.cookies.Browser(r)
	if !a.csrf.Valid(browser, magicLinkPurpose, r.PostForm.Get("csrf_token")) {
		a.pageError(w, r, "Sign-in failed", errCSRF)
		return
	}
	ctx := r.Context()
	ch, err := a.signin.MagicLink(ctx, r.PostForm.Get("token"))
	if err != nil {
		a.pageError(w, r, "Link expired", err)
		return
	}
	app, err := a.signin.Application(ctx, ch.ClientID)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	if ch.FlowID == nil {
		a.embeddedLinkConfirm(w, r, ch, app)
		return
	}
	f, err := a.signin.LinkFlow(ctx, ch, browser)
	if err != nil {
		a.pageError(w, r, "Link expired", err)
		return
	}
	res, err := a.signin.SignInWithLink(ctx, ch, f, app, a.browserClient(r))
	if err != nil {
		var exists *signin.AccountExistsError
		if errors.As(err, &exists) {
			err = signin.ErrCodeExpired
		}
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.signedIn(w, r, f, res)
}

// embeddedLinkConfirm spends an embedded sign-in's link and sends the
// browser to the application's redirect URI with the code (and iss, as
// every authorization response here).
func (a *api) embeddedLinkConfirm(w http.ResponseWriter, r *http.Request, ch *persistence.EmailChallenge, app *persistence.Client) {
	if !slices.Contains(app.RedirectURIs, ch.RedirectURI) { // unregistered since the link was sent
		a.pageError(w, r, "Link expired", signin.ErrCodeExpired)
		return
	}
	res, code, err := a.embeddedSignIn(r, app, ch.CodeChallenge, func(ctx context.Context) (*signin.Result, error) {
		return a.signin.EmbeddedLinkSignIn(ctx, ch, app, a.browserClient(r))
	})
	if err != nil {
		var exists *signin.AccountExistsError
		if errors.As(err, &exists) {
			err = signin.ErrCodeExpired
		}
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	target, err := url.Parse(ch.RedirectURI)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	q := target.Query()
	if up := res.StepUp; up != nil {
		// The application's page goes on with POST /mfa/verify.
		q.Set("mfaRequired", "true")
		q.Set("mfaSessionId", up.Handle)
		q.Set("methods", strings.Join(up.Methods(), " "))
	} else {
		q.Set("code", code)
	}
	q.Set("iss", a.provider.Issuer)
	target.RawQuery = q.Encode()
	pages.SetHeaders(w.Header(), pages.Target(ch.RedirectURI))
	http.Redirect(w, r, target.String(), http.StatusSeeOther)
}

// POST /signin/mfa: the second factor. With TOTP on, the code field takes
// a TOTP code or a recovery code; otherwise the code e-mailed.
func (a *api) signinMFA(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	up, err := a.signin.FlowStepUp(ctx, f)
	if err != nil {
		a.pageError(w, r, "Sign-in expired", err)
		return
	}
	code := strings.TrimSpace(r.PostForm.Get("code"))
	method := signin.FactorOTP
	if slices.Contains(up.Factors, signin.FactorTOTP) {
		method = signin.FactorTOTP
		if len(code) != 6 {
			method = signin.FactorRecovery
		}
	}
	res, err := a.signin.VerifyStepUp(ctx, up, f, app, method, code, a.browserClient(r))
	var refusal *extensions.Error
	switch {
	case errors.As(err, &refusal) && refusal.Code == "invalid_code":
		a.renderStep(w, r, http.StatusBadRequest, f, app, browser, refusal.Message)
		return
	case errors.As(err, &refusal) && refusal.Status == http.StatusTooManyRequests:
		a.renderStep(w, r, http.StatusTooManyRequests, f, app, browser, refusal.Message)
		return
	case err != nil:
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.signedIn(w, r, f, res)
}
