package handlers

import (
	"cmp"
	"context"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/extensions/upstream"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/persistence"
)

// Upstream sign-in providers (extensions/upstream): the admin API that
// registers them, the hosted page's "Continue with …" buttons, the
// embedded start route, and the one callback every provider returns to.

const (
	identityProvidersPath = "/api/v1/identity-providers"
	signinProviderPath    = signinPath + "/provider" // the hosted page's "Continue with …" form
	// LinkPagePath is where the hosted page's "link" button posts (flow,
	// csrf_token of the flow, pending: the pending link's handle): the
	// hosted linking step, which proves the account is the person's and
	// binds the upstream identity the handle names (docs/decisions.md,
	// "Upstream sign-in providers").
	LinkPagePath = signinPath + "/link"
)

// identityProviderJSON is the API shape of a provider; the client secret
// is never answered.
type identityProviderJSON struct {
	ID           string   `json:"id"`
	Name         string   `json:"name"`
	DisplayName  string   `json:"displayName"`
	Issuer       string   `json:"issuer"`
	ClientID     string   `json:"clientId"`
	Scopes       []string `json:"scopes"`
	Applications []string `json:"applications"`
	RedirectURI  string   `json:"redirectUri"`
	CreatedAt    string   `json:"createdAt"`
	UpdatedAt    string   `json:"updatedAt"`
}

func (a *api) toIdentityProviderJSON(p *persistence.IdentityProvider) identityProviderJSON {
	nonNil := func(l []string) []string {
		if l == nil {
			return []string{}
		}
		return l
	}
	return identityProviderJSON{
		ID: p.ID, Name: p.Name, DisplayName: p.DisplayName, Issuer: p.Issuer, ClientID: p.ClientID,
		Scopes: nonNil(p.Scopes), Applications: nonNil(p.Applications), RedirectURI: a.upstream.RedirectURI(),
		CreatedAt: isoTime(p.CreatedAt), UpdatedAt: isoTime(p.UpdatedAt),
	}
}

// identityProviderBody is what create and PATCH read; absent or null
// members are not given.
type identityProviderBody struct {
	Name         *string   `json:"name"`
	DisplayName  *string   `json:"displayName"`
	Issuer       *string   `json:"issuer"`
	ClientID     *string   `json:"clientId"`
	ClientSecret *string   `json:"clientSecret"`
	Scopes       *[]string `json:"scopes"`
	Applications *[]string `json:"applications"`
}

func (b *identityProviderBody) input() upstream.Input {
	return upstream.Input{Name: b.Name, DisplayName: b.DisplayName, Issuer: b.Issuer, ClientID: b.ClientID,
		ClientSecret: b.ClientSecret, Scopes: b.Scopes, Applications: b.Applications}
}

// POST /api/v1/identity-providers
func (a *api) createIdentityProvider(w http.ResponseWriter, r *http.Request) {
	var body identityProviderBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	p, err := a.upstream.Create(r.Context(), body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", identityProvidersPath+"/"+p.ID)
	writeJSON(w, http.StatusCreated, a.toIdentityProviderJSON(p))
}

// GET /api/v1/identity-providers
func (a *api) listIdentityProviders(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.upstream.List(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "identityProviders", list, total, page, a.toIdentityProviderJSON)
}

// GET /api/v1/identity-providers/{id}
func (a *api) getIdentityProvider(w http.ResponseWriter, r *http.Request) {
	p, err := a.upstream.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a.toIdentityProviderJSON(p))
}

// PATCH /api/v1/identity-providers/{id}
func (a *api) updateIdentityProvider(w http.ResponseWriter, r *http.Request) {
	var body identityProviderBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	p, err := a.upstream.Update(r.Context(), mux.Vars(r)["id"], body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a.toIdentityProviderJSON(p))
}

// DELETE /api/v1/identity-providers/{id}
func (a *api) deleteIdentityProvider(w http.ResponseWriter, r *http.Request) {
	if err := a.upstream.Delete(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// upstreamRoutes registers the browser routes of upstream sign-in (the
// admin routes are in the router's table): the hosted button's form and
// the callback count as sign-in form posts per address (rl.SignIn); the
// embedded start route as an embedded call (rl.Embedded).
func (a *api) upstreamRoutes(r *mux.Router) {
	if a.upstream == nil {
		return
	}
	r.HandleFunc(signinProviderPath, a.signinLimited(a.signinProvider)).Methods(http.MethodPost)
	r.HandleFunc(upstream.CallbackPath, a.signinLimited(a.providerCallback)).Methods(http.MethodGet)
	r.HandleFunc(embeddedPath+"/providers/{name}/start", a.embedded(a.embeddedProviderStart)).Methods(http.MethodGet)
}

// providerButtons are the "Continue with …" buttons of an application's
// hosted page, and the origins their forms lead to (CSP form-action).
func (a *api) providerButtons(ctx context.Context, r *http.Request, app *persistence.Client) ([]pages.Alternative, []string) {
	if a.upstream == nil {
		return nil, nil
	}
	list, origins, err := a.upstream.Offered(ctx, app.ID)
	if err != nil {
		logger(r).WarnContext(ctx, "reading the application's sign-in providers failed", "error", err.Error())
		return nil, nil
	}
	out := make([]pages.Alternative, len(list))
	for i, p := range list {
		out[i] = pages.Alternative{Method: p.Name, Label: "Continue with " + p.DisplayName}
	}
	return out, origins
}

// POST /signin/provider (flow, csrf_token, provider): the hosted page's
// "Continue with …" button; the browser goes to the provider.
func (a *api) signinProvider(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	p, err := a.upstream.Provider(ctx, app, r.PostForm.Get("provider"))
	if err != nil {
		a.renderStep(w, r, http.StatusBadRequest, f, app, browser, upstream.ErrNotOffered.Message)
		return
	}
	target, err := a.upstream.Begin(ctx, p, app, browser, upstream.Target{Flow: f})
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	pages.SetHeaders(w.Header(), pages.Target(target))
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// GET /api/v1/embedded/auth/providers/{name}/start?clientId=…&redirectUri=…&codeChallenge=…&codeChallengeMethod=S256:
// an application's page sends the browser here; it goes to the provider,
// comes back to the callback, and ends at redirectUri (registered) with
// code and iss, as an embedded magic link does.
func (a *api) embeddedProviderStart(w http.ResponseWriter, r *http.Request, c *embeddedCall) {
	q := r.URL.Query()
	c.body.RedirectURI, c.body.CodeChallenge, c.body.CodeChallengeMethod = q.Get("redirectUri"), q.Get("codeChallenge"), q.Get("codeChallengeMethod")
	if err := required("redirectUri", c.body.RedirectURI); err != nil {
		writeSignInError(w, r, err)
		return
	}
	if err := pkce(c); err != nil {
		writeSignInError(w, r, err)
		return
	}
	if !slices.Contains(c.app.RedirectURIs, c.body.RedirectURI) {
		writeSignInError(w, r, newError(http.StatusBadRequest, "invalid_request", "redirectUri must be one of the application's registered redirect URIs.", nil))
		return
	}
	ctx := r.Context()
	p, err := a.upstream.Provider(ctx, c.app, mux.Vars(r)["name"])
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	browser := a.ensureBrowser(w, r)
	target, err := a.upstream.Begin(ctx, p, c.app, browser, upstream.Target{RedirectURI: c.body.RedirectURI, CodeChallenge: c.body.CodeChallenge})
	if err != nil {
		writeSignInError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// GET /signin/provider/callback?state=…&code=… (or error=…): where every
// provider sends the browser back. The state is taken once, in the
// browser that began the sign-in; the code is traded and the ID token
// verified; the person it resolves to is signed in on the hosted flow or
// the embedded API the state names.
func (a *api) providerCallback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	browser := a.cookies.Browser(r)
	proof, st, err := a.upstream.Verify(ctx, browser, upstream.Callback{State: q.Get("state"), Code: q.Get("code"), Error: q.Get("error")}, a.browserClient(r))
	if st != nil && st.FlowID == nil {
		a.embeddedCallback(w, r, st, proof, err)
		return
	}
	if st == nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	f, ferr := a.signin.Flow(ctx, *st.FlowID, browser)
	if ferr != nil {
		a.pageError(w, r, "Sign-in expired", cmp.Or(err, ferr))
		return
	}
	app, aerr := a.signin.Application(ctx, f.ClientID)
	if aerr != nil {
		a.pageError(w, r, "Sign-in failed", aerr)
		return
	}
	var res *upstream.Resolution
	if err == nil {
		res, err = a.upstream.Resolve(ctx, proof, a.browserClient(r))
	}
	var link *upstream.LinkRequiredError
	switch {
	case errors.As(err, &link):
		a.renderLinkOffer(w, r, f, app, browser, link)
		return
	case err != nil:
		a.upstreamRefused(w, r, f, app, browser, err)
		return
	}
	result, err := a.upstream.Complete(ctx, res, f, "", a.browserClient(r))
	if err != nil {
		a.upstreamRefused(w, r, f, app, browser, err)
		return
	}
	if result.StepUp != nil {
		a.continuePage(w, signinPath+"?flow="+url.QueryEscape(f.ID), "")
		return
	}
	if old, _, err := a.signin.Live(ctx, a.cookies.Session(r)); err == nil && old != nil {
		if err := a.signin.End(ctx, old, persistence.SessionEndReplaced, "", "", a.browserClient(r)); err != nil {
			logger(r).WarnContext(ctx, "ending a replaced session failed", "error", err.Error())
		}
	}
	a.cookies.SetSession(w, result.Secret)
	a.continuePage(w, signinResumePath+"?flow="+url.QueryEscape(f.ID), redirectTarget(f.Request))
}

// upstreamRefused shows a refused upstream sign-in on the flow's page, so
// that the person may sign in another way; what is not a refusal is the
// error page.
func (a *api) upstreamRefused(w http.ResponseWriter, r *http.Request, f *persistence.SignInFlow, app *persistence.Client, browser string, err error) {
	var refusal *extensions.Error
	if errors.As(err, &refusal) && (refusal.Status < 500 || refusal == upstream.ErrUpstream) {
		if current, ferr := a.signin.Flow(r.Context(), f.ID, browser); ferr == nil && current.Step != signin.StepDone {
			a.renderStep(w, r, refusal.Status, current, app, browser, refusal.Message)
			return
		}
	}
	a.pageError(w, r, "Sign-in failed", err)
}

// renderLinkOffer shows the hosted page's answer to an upstream identity
// whose e-mail is an account's: nobody is signed in; a form offers the
// linking step (LinkPagePath) the pending link's handle, with the flow's
// CSRF token (the linking step checks it as any of the flow's forms).
func (a *api) renderLinkOffer(w http.ResponseWriter, r *http.Request, f *persistence.SignInFlow, app *persistence.Client, browser string, link *upstream.LinkRequiredError) {
	p := pages.Page{
		Title: "You already have an account", AppName: app.App.Name, Flow: f.ID, CSRF: a.csrf.Token(browser, flowPurpose(f.ID)),
		Email: link.Email, Action: LinkPagePath, RestartAction: signinRestartPath,
		Message: "An account with " + link.Email + " already exists, and it does not sign in with " + link.Provider.DisplayName + " yet.",
		Detail: "To use " + link.Provider.DisplayName + " for it, link it to your account: you will prove the account is yours with " +
			proofOf(link.Identities) + ". Or sign in the way you usually do.",
		Hidden: []pages.Field{{Name: "pending", Value: link.Handle}},
	}
	pages.Render(w, http.StatusConflict, "linkoffer", p, redirectTarget(f.Request))
}

// proofOf says how an account proves it is the person's (spec, Account
// linking rule 1).
func proofOf(identities []string) string {
	if slices.Contains(identities, persistence.IdentityPassword) {
		return "its password"
	}
	return "a code we e-mail to you"
}

// continuePage ends the callback with a page that moves the browser on
// (meta refresh, and a link for browsers that do not follow it): the
// callback is the last hop of the provider's form submission, whose
// Content-Security-Policy form-action would refuse a redirect onwards to
// the application's origin. target is the origin the next hop redirects
// to (for this page's own form-action).
func (a *api) continuePage(w http.ResponseWriter, next, target string) {
	pages.Render(w, http.StatusOK, "continue", pages.Page{Title: "Signing you in", Next: template.URL(next), //nolint:gosec // built here from registered URIs
		Message: "Signing you in…"}, target)
}

// embeddedCallback ends an embedded sign-in: a code for the application's
// redirect URI (as an embedded magic link does), or the refusal.
func (a *api) embeddedCallback(w http.ResponseWriter, r *http.Request, st *persistence.UpstreamState, proof *upstream.Proof, err error) {
	ctx := r.Context()
	c := embeddedClient(r)
	c.Device = a.cookies.Device(r)
	var app *persistence.Client
	if err == nil {
		app = proof.App
	} else if found, aerr := a.signin.Application(ctx, st.ClientID); aerr == nil {
		app = found
	}
	if app == nil || !slices.Contains(app.RedirectURIs, st.RedirectURI) { // deleted or unregistered since it began
		a.pageError(w, r, "Sign-in failed", upstream.ErrInvalidState)
		return
	}
	var res *upstream.Resolution
	if err == nil {
		res, err = a.upstream.Resolve(ctx, proof, c)
	}
	if err != nil {
		a.embeddedUpstreamRefused(w, r, st, err)
		return
	}
	result, code, err := a.embeddedSignIn(r, app, st.CodeChallenge, func(ctx context.Context) (*signin.Result, error) {
		return a.upstream.Complete(ctx, res, nil, st.CodeChallenge, c)
	})
	if err != nil {
		a.embeddedUpstreamRefused(w, r, st, err)
		return
	}
	target, _ := url.Parse(st.RedirectURI)
	q := target.Query()
	if up := result.StepUp; up != nil {
		q.Set("mfaRequired", "true")
		q.Set("mfaSessionId", up.Handle)
		q.Set("methods", strings.Join(up.Methods(), " "))
	} else {
		q.Set("code", code)
	}
	q.Set("iss", a.provider.Issuer)
	target.RawQuery = q.Encode()
	a.continuePage(w, target.String(), pages.Target(st.RedirectURI))
}

// embeddedUpstreamRefused answers a refused embedded upstream sign-in.
// The browser (Accept: text/html) goes back to the application's redirect
// URI with the refusal (error, error_description, iss; for an account
// that exists also the spec's account_exists members and pendingLink);
// any other client gets the embedded API's JSON error, for an account that
// exists the spec's 409 (Account linking rule 4) with pendingLink.
func (a *api) embeddedUpstreamRefused(w http.ResponseWriter, r *http.Request, st *persistence.UpstreamState, err error) {
	var link *upstream.LinkRequiredError
	isLink := errors.As(err, &link)
	var refusal *extensions.Error
	if !isLink && !errors.As(err, &refusal) {
		writeSignInError(w, r, err) // a 5xx
		return
	}
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		if isLink {
			writeJSON(w, http.StatusConflict, upstreamAccountExists(link))
			return
		}
		writeSignInError(w, r, err)
		return
	}
	target, _ := url.Parse(st.RedirectURI)
	q := target.Query()
	if isLink {
		body := upstreamAccountExists(link)
		q.Set("error", body.Error)
		q.Set("error_description", body.Description)
		q.Set("existingIdentities", strings.Join(body.ExistingIdentities, " "))
		q.Set("linkingRequired", "true")
		q.Set("linkingEndpoint", body.LinkingEndpoint)
		q.Set("suggestion", body.Suggestion)
		q.Set("pendingLink", body.PendingLink)
		q.Set("provider", body.Provider)
	} else {
		q.Set("error", refusal.Code)
		q.Set("error_description", refusal.Message)
	}
	q.Set("iss", a.provider.Issuer)
	target.RawQuery = q.Encode()
	a.continuePage(w, target.String(), pages.Target(st.RedirectURI))
}

// upstreamAccountExistsBody is the spec's 409 body (Account linking rule
// 4), with the pending link's handle (pendingLink) and the provider.
type upstreamAccountExistsBody struct {
	accountExists
	PendingLink string `json:"pendingLink"`
	Provider    string `json:"provider"`
}

func upstreamAccountExists(link *upstream.LinkRequiredError) upstreamAccountExistsBody {
	return upstreamAccountExistsBody{
		accountExists: accountExists{
			signInError: signInError{Error: "account_exists",
				Description: "An account with this e-mail address exists and does not sign in with " + link.Provider.DisplayName + " yet."},
			ExistingIdentities: link.Identities, LinkingRequired: true, LinkingEndpoint: LinkingPath,
			Suggestion: "Sign in with an existing method, or link " + link.Provider.DisplayName + " to the account first (pendingLink carries this upstream identity to the linking step: send it with the linking request).",
		},
		PendingLink: link.Handle, Provider: link.Provider.Name,
	}
}
