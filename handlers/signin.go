package handlers

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/ory/fosite"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/risk"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// The hosted sign-in pages. An authorization that needs a person to sign in
// begins a flow (authorize.go) and sends the browser to signinPath?flow=ID,
// which shows the flow's current step; each step's form posts to its own
// path and, once it succeeds, redirects back (post/redirect/get). A
// finished flow resumes the authorization at signinPath/resume. Every form
// carries a CSRF token bound to the browser cookie and to the flow.
const signinPath = "/signin"

// Sign-in form paths.
const (
	signinEmailPath    = signinPath + "/email"
	signinPasswordPath = signinPath + "/password"
	signinRestartPath  = signinPath + "/restart"
	signinResumePath   = signinPath + "/resume"
	signinMethodPath   = signinPath + "/method" // switch to (or resend) a method
	signinOTPPath      = signinPath + "/otp"
	signinMFAPath      = signinPath + "/mfa"
	signoutPath        = "/signout" // the sign-out confirmation's form
)

// maxUserAgent bounds the user agent kept with sessions and events.
const maxUserAgent = 512

// browserClient is what sessions, events and risk take of a request.
func (a *api) browserClient(r *http.Request) signin.Client {
	c := requestClient(r)
	c.Device = a.cookies.Device(r)
	return c
}

// embeddedClient is browserClient for the embedded API, which carries no
// device cookie (a cross-site call).
func embeddedClient(r *http.Request) signin.Client {
	c := requestClient(r)
	c.NoDevice = true
	return c
}

// requestClient is the address and user agent of a request.
func requestClient(r *http.Request) signin.Client {
	ua := r.UserAgent()
	if len(ua) > maxUserAgent || !extensions.ValidText(ua) {
		ua = strings.ToValidUTF8(ua[:min(len(ua), maxUserAgent)], "")
		ua = strings.ReplaceAll(ua, "\x00", "")
	}
	return signin.Client{IP: clientIP(r), UserAgent: ua}
}

// ensureDevice sets a device cookie on a browser without one (risk:
// new_device).
func (a *api) ensureDevice(w http.ResponseWriter, r *http.Request) {
	if a.cookies.Device(r) == "" {
		a.cookies.SetDevice(w, risk.NewDeviceSecret())
	}
}

// ensureBrowser is the browser cookie's secret, set now if the browser has
// none.
func (a *api) ensureBrowser(w http.ResponseWriter, r *http.Request) string {
	if b := a.cookies.Browser(r); b != "" {
		return b
	}
	b := oauth.NewSecret()
	a.cookies.SetBrowser(w, b)
	return b
}

// flowPurpose is the CSRF purpose of a flow's forms.
func flowPurpose(flowID string) string { return "flow:" + flowID }

// pageError renders a refusal as a page: its own message, or a generic one
// for what is not a refusal (logged).
func (a *api) pageError(w http.ResponseWriter, r *http.Request, title string, err error, formTargets ...string) {
	var e *extensions.Error
	if !errors.As(err, &e) {
		if persistence.Unavailable(err) || abandoned(r, err) {
			w.Header().Set("Retry-After", retryAfterUnavailable)
			e = extensions.NewError(http.StatusServiceUnavailable, "temporarily_unavailable", "The service cannot serve this request now. Try again in a moment.", nil)
		} else {
			logger(r).ErrorContext(r.Context(), "internal error", "error", err.Error())
			e = extensions.NewError(http.StatusInternalServerError, "internal_error", "Something went wrong on our side. Try again.", nil)
		}
	}
	pages.Render(w, e.Status, "message", pages.Page{Title: title, Error: e.Message}, formTargets...)
}

// errCSRF refuses a form without its token, or with another's.
var errCSRF = extensions.NewError(http.StatusForbidden, "invalid_csrf_token",
	"This form has expired or was not sent from this site. Go back to the application and sign in again.", nil)

// pageForm reads a hosted page's form: form-encoded, within the body
// limit, and with the CSRF token of the flow it names, in the browser that
// holds the flow. It answers the flow, or renders the refusal.
func (a *api) pageForm(w http.ResponseWriter, r *http.Request) (*persistence.SignInFlow, string, bool) {
	if !a.readPageForm(w, r) {
		return nil, "", false
	}
	browser := a.cookies.Browser(r)
	id := r.PostForm.Get("flow")
	if !a.csrf.Valid(browser, flowPurpose(id), r.PostForm.Get("csrf_token")) {
		a.pageError(w, r, "Sign-in failed", errCSRF)
		return nil, "", false
	}
	f, err := a.signin.Flow(r.Context(), id, browser)
	if err != nil {
		a.pageError(w, r, "Sign-in expired", err)
		return nil, "", false
	}
	return f, browser, true
}

// pageStep is pageForm and the flow's application: what every step's form
// handler begins with.
func (a *api) pageStep(w http.ResponseWriter, r *http.Request) (*persistence.SignInFlow, *persistence.Client, string, bool) {
	f, browser, ok := a.pageForm(w, r)
	if !ok {
		return nil, nil, "", false
	}
	app, err := a.signin.Application(r.Context(), f.ClientID)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return nil, nil, "", false
	}
	return f, app, browser, true
}

// readPageForm parses a hosted page's form: form-encoded, within the body
// limit; else it renders the refusal.
func (a *api) readPageForm(w http.ResponseWriter, r *http.Request) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != formType {
			a.pageError(w, r, "Sign-in failed", extensions.NewError(http.StatusUnsupportedMediaType, "unsupported_media_type", "The form must be sent as a web form.", nil))
			return false
		}
	}
	if err := r.ParseForm(); err != nil {
		a.pageError(w, r, "Sign-in failed", extensions.NewError(http.StatusBadRequest, "invalid_request", "The form could not be read.", nil))
		return false
	}
	return true
}

// redirectTarget is the CSP source of the redirect URI an authorization
// request (its parameters, form-encoded) names: where the sign-in's forms
// end up once the authorization answers.
func redirectTarget(request string) string {
	q, err := url.ParseQuery(request)
	if err != nil {
		return ""
	}
	return pages.Target(q.Get("redirect_uri"))
}

// GET /signin?flow=ID: the flow's current step.
func (a *api) signinPage(w http.ResponseWriter, r *http.Request) {
	browser := a.cookies.Browser(r)
	f, err := a.signin.Flow(r.Context(), r.URL.Query().Get("flow"), browser)
	if err != nil {
		a.pageError(w, r, "Sign-in expired", err)
		return
	}
	app, err := a.signin.Application(r.Context(), f.ClientID)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.ensureDevice(w, r)
	a.renderStep(w, r, http.StatusOK, f, app, browser, "")
}

// renderStep shows the step the flow is at, with a refusal if any.
func (a *api) renderStep(w http.ResponseWriter, r *http.Request, status int, f *persistence.SignInFlow, app *persistence.Client, browser, problem string) {
	a.renderStepPage(w, r, status, f, app, browser, problem, "")
}

// renderStepPage is renderStep with a refused passkey, said beside the
// passkey button rather than at the step's field.
func (a *api) renderStepPage(w http.ResponseWriter, r *http.Request, status int, f *persistence.SignInFlow, app *persistence.Client, browser, problem, passkeyProblem string) {
	p := pages.Page{
		AppName: app.App.Name, Flow: f.ID, CSRF: a.csrf.Token(browser, flowPurpose(f.ID)), Email: f.Email, Error: problem,
		RestartAction: signinRestartPath, MethodAction: signinMethodPath, Alternatives: alternatives(app, f.Step),
	}
	target := redirectTarget(f.Request)
	switch f.Step {
	case signin.StepEmail:
		p.Title, p.Action = "Sign in", signinEmailPath
		var upstreams []string
		p.Providers, upstreams = a.providerButtons(r.Context(), r, app)
		p.ProvidersPost = signinProviderPath
		p.Passkey = a.passkeyPage(app, f, nil, passkeyProblem)
		pages.Render(w, status, "email", p, append(upstreams, target)...)
	case signin.StepPassword:
		p.Title, p.Action = "Enter your password", signinPasswordPath
		if a.reset != nil {
			p.ForgotLink = forgotPagePath + "?flow=" + url.QueryEscape(f.ID)
		}
		pages.Render(w, status, "password", p, target)
	case signin.StepOTP:
		p.Title, p.Action = "Check your email", signinOTPPath
		p.Resend = &pages.Alternative{Method: signin.MethodOTP, Label: "Send a new code"}
		pages.Render(w, status, "otp", p, target)
	case signin.StepLinkSent:
		p.Title = "Check your email"
		p.Resend = &pages.Alternative{Method: signin.MethodMagicLink, Label: "Send a new link"}
		pages.Render(w, status, "linksent", p, target)
	case signin.StepMFA:
		up, err := a.signin.FlowStepUp(r.Context(), f)
		if err != nil {
			a.pageError(w, r, "Sign-in expired", err)
			return
		}
		p.Title, p.Action, p.Alternatives = "Two-step verification", signinMFAPath, nil
		p.Passkey = a.passkeyPage(app, f, up, passkeyProblem)
		p.Message = mfaMessage(f, up, p.Passkey)
		pages.Render(w, status, "mfa", p, target)
	default: // done: the authorization resumes
		pages.SetHeaders(w.Header(), target)
		http.Redirect(w, r, signinResumePath+"?flow="+url.QueryEscape(f.ID), http.StatusSeeOther)
	}
}

// POST /signin/email
func (a *api) signinEmail(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	email := strings.TrimSpace(r.PostForm.Get("email"))
	sends := firstMethodSends(app)
	if sends && a.sends.refusedAs(w, r, emailKey(email), a.tooManyAttempts) {
		return
	}
	next, err := a.signin.SubmitEmail(r.Context(), f, app, email, a.browserClient(r))
	if err == nil && sends {
		a.sends.failedAs(r, emailKey(email))
	}
	var refusal *extensions.Error
	if errors.As(err, &refusal) && refusal.Code == "invalid_request" && f.Step != signin.StepDone {
		f.Email, f.Step = r.PostForm.Get("email"), signin.StepEmail
		a.renderStep(w, r, refusal.Status, f, app, browser, refusal.Message)
		return
	}
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.nextStep(w, r, next)
}

// nextStep sends the browser to the flow's page (post/redirect/get).
func (a *api) nextStep(w http.ResponseWriter, r *http.Request, f *persistence.SignInFlow) {
	pages.SetHeaders(w.Header(), redirectTarget(f.Request))
	http.Redirect(w, r, signinPath+"?flow="+url.QueryEscape(f.ID), http.StatusSeeOther)
}

// POST /signin/restart: back to the e-mail step.
func (a *api) signinRestart(w http.ResponseWriter, r *http.Request) {
	f, _, ok := a.pageForm(w, r)
	if !ok {
		return
	}
	next, err := a.signin.Restart(r.Context(), f)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.nextStep(w, r, next)
}

// POST /signin/password. Limits (docs/decisions.md, "Sign-in limits"):
// every form post counts against its address (rl.SignIn, in signinLimited);
// a wrong password counts against the address and the e-mail address
// (rl.SignInEmail); an e-mail address whose budget is spent is refused
// only to addresses that have failed, so a guesser cannot lock the person
// out of their own browser.
func (a *api) signinPassword(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	email := emailKey(f.Email)
	if a.signinFailures.refusedAs(w, r, email, a.tooManyAttempts) {
		if err := a.signin.Failed(r.Context(), f, app.RecordID, a.browserClient(r), signin.ReasonRateLimited); err != nil {
			logger(r).WarnContext(r.Context(), "recording a refused sign-in failed", "error", err.Error())
		}
		return
	}
	res, err := a.signin.SubmitPassword(r.Context(), f, app, r.PostForm.Get("password"), a.browserClient(r))
	if errors.Is(err, signin.ErrInvalidCredentials) {
		a.signinFailures.failedAs(r, email)
		a.renderStep(w, r, http.StatusUnauthorized, f, app, browser, signin.ErrInvalidCredentials.Message)
		return
	}
	if errors.Is(err, signin.ErrDisabled) {
		a.renderStep(w, r, http.StatusForbidden, f, app, browser, signin.ErrDisabled.Message)
		return
	}
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.signedIn(w, r, f, res)
}

// tooManyAttempts is the sign-in's 429: a page, with Retry-After.
func (a *api) tooManyAttempts(w http.ResponseWriter, r *http.Request, c limiter.Context) {
	tooManyPage(w, c, "sign-in")
}

// tooManyPage is a hosted page's 429 for attempts at what: a page saying
// how long to wait, with Retry-After.
func tooManyPage(w http.ResponseWriter, c limiter.Context, what string) {
	retry := retryAfter(w, c)
	wait := "a minute"
	if retry > 90 {
		wait = fmt.Sprintf("%d minutes", (retry+59)/60)
	}
	pages.Render(w, http.StatusTooManyRequests, "message", pages.Page{
		Title: "Too many attempts", Error: "Too many " + what + " attempts. Wait " + wait + " and try again.",
	})
}

// signinLimited counts every post of the sign-in forms against the
// address (rl.SignIn) and answers the page's 429 beyond it.
func (a *api) signinLimited(next http.HandlerFunc) http.HandlerFunc {
	if a.signinLimit == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if count(w, r, a.signinLimit, "signin:"+byIP(r), a.tooManyAttempts) {
			next(w, r)
		}
	}
}

// GET /signin/resume?flow=ID: the finished flow's authorization, answered
// with a code for the session the flow ended in. The flow is used once,
// by the browser that began it, with the session it started.
func (a *api) signinResume(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ss, user, err := a.signin.Live(ctx, a.cookies.Session(r))
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	if ss == nil {
		a.pageError(w, r, "Sign-in expired", signin.ErrFlowExpired)
		return
	}
	f, err := a.signin.Resume(ctx, r.URL.Query().Get("flow"), a.cookies.Browser(r), ss.ID)
	if err != nil {
		a.pageError(w, r, "Sign-in expired", err)
		return
	}
	// The request as it came, but for prompt: the sign-in just made
	// answers it (login, select_account).
	q, err := url.ParseQuery(f.Request)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	q.Del("prompt")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, oauth.AuthorizePath+"?"+q.Encode(), nil)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	req.RemoteAddr, req.Header = r.RemoteAddr, r.Header
	ar, err := a.provider.NewAuthorizeRequest(ctx, req)
	if err != nil {
		a.authorizeError(w, r, ar, err)
		return
	}
	if req, ok := ar.(*fosite.AuthorizeRequest); ok {
		req.RequestedAt = f.CreatedAt // the person signed in after the application asked
	}
	a.answerCode(w, r, ar, ss, user)
}
