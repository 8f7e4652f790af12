package handlers

import (
	"errors"
	"net/http"

	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/persistence"
)

// The hosted linking step: an upstream sign-in whose e-mail is an existing
// account's is offered linking (renderLinkOffer); the offer posts here,
// the person proves the account is theirs (its password, or a code e-mailed
// to it), and the upstream identity is linked and signs them in.

// linkVerifyPagePath is where the proof's form posts.
const linkVerifyPagePath = LinkPagePath + "/verify"

// POST /signin/link (flow, csrf_token, pending): starts the link of the
// pending upstream identity and asks for the proof.
func (a *api) linkPage(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	pending, err := a.upstream.PendingLink(ctx, r.PostForm.Get("pending"))
	if err != nil {
		a.pageError(w, r, "Linking failed", err)
		return
	}
	user, err := a.directory.GetUser(ctx, pending.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		err = signin.ErrLinkExpired
	}
	if err != nil {
		a.pageError(w, r, "Linking failed", err)
		return
	}
	if a.links.refusedAs(w, r, emailKey(user.Email), a.linkRateLimited) {
		return
	}
	a.links.failedAs(r, emailKey(user.Email)) // every start is an attempt, as at the API
	start, err := a.signin.InitiateLink(ctx, app, user.Email, pending.Provider, pending, a.browserClient(r))
	if err != nil {
		a.pageError(w, r, "Linking failed", err)
		return
	}
	name := pending.Provider
	if p, err := a.upstream.Provider(ctx, app, pending.Provider); err == nil {
		name = p.DisplayName
	}
	a.renderLinkProof(w, r, http.StatusOK, f, app, browser, user.Email, name, start.Token, start.Verification, "")
}

// POST /signin/link/verify (flow, csrf_token, token, verification, and
// password or code): links, then signs the person in through the flow.
func (a *api) linkPageVerify(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	if a.links.refused(w, r, a.linkRateLimited) {
		return
	}
	ctx := r.Context()
	token, verification := r.PostForm.Get("token"), r.PostForm.Get("verification")
	linked, err := a.signin.VerifyLink(ctx, token, r.PostForm.Get("password"), r.PostForm.Get("code"), a.browserClient(r))
	// A wrong proof (400, 401; not a spent token) is asked again on the
	// page; anything else ends the step.
	var refusal *extensions.Error
	switch {
	case errors.As(err, &refusal) && refusal.Code != signin.ErrLinkExpired.Code && (refusal.Status == http.StatusBadRequest || refusal.Status == http.StatusUnauthorized):
		a.links.failed(r)
		a.renderLinkProof(w, r, refusal.Status, f, app, browser, r.PostForm.Get("email"), r.PostForm.Get("provider"), token, verification, refusal.Message)
		return
	case err != nil:
		a.links.failed(r)
		a.pageError(w, r, "Linking failed", err)
		return
	}
	user, err := a.directory.GetUser(ctx, linked.UserID)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	res, err := a.signin.Proven(ctx, f, app, user, []string{"fed"}, "", a.browserClient(r))
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.signedIn(w, r, f, res)
}

// renderLinkProof asks for the proof a linking token needs; email and
// provider (its display name) are only shown, and come back in the form
// to be shown again with a refusal.
func (a *api) renderLinkProof(w http.ResponseWriter, r *http.Request, status int, f *persistence.SignInFlow, app *persistence.Client, browser,
	email, provider, token, verification, problem string) {
	p := pages.Page{
		Title: "Link " + provider + " to your account", AppName: app.App.Name, Flow: f.ID, CSRF: a.csrf.Token(browser, flowPurpose(f.ID)),
		Email: email, Action: linkVerifyPagePath, RestartAction: signinRestartPath, Error: problem,
		Hidden: []pages.Field{{Name: "token", Value: token}, {Name: "verification", Value: verification}, {Name: "email", Value: email}, {Name: "provider", Value: provider}},
	}
	name := "linkpassword"
	p.Message = "Enter your account's password to link " + provider + " to it. You then sign in with either."
	if verification == persistence.VerifyEmailCode {
		name = "linkcode"
		p.Message = "We sent a code to " + email + ". Enter it to link " + provider + " to your account. It works for 10 minutes."
	}
	pages.Render(w, status, name, p, redirectTarget(f.Request))
}

// linkRateLimited refuses a hosted linking step over its limit.
func (a *api) linkRateLimited(w http.ResponseWriter, r *http.Request, c limiter.Context) {
	retryAfter(w, c)
	a.pageError(w, r, "Too many attempts", newError(http.StatusTooManyRequests, "rate_limited", "Too many attempts to link. Try again later.", nil))
}
