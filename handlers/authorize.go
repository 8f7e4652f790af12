package handlers

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// The authorization endpoint (OpenID Connect Core §3.1.2) and RP-initiated
// logout (OpenID Connect RP-Initiated Logout 1.0). fosite parses and checks
// the authorization request (client, redirect URI, response type, scope,
// state) and answers it; here it meets the browser's SSO session.

// authorizeRequest reads an authorization request, GET (query) or POST
// (form, OpenID Connect Core §3.1.2.1), and lets fosite check it.
func (a *api) authorizeRequest(r *http.Request) (fosite.AuthorizeRequester, error) {
	if r.Method == http.MethodPost {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != formType {
			return fosite.NewAuthorizeRequest(), fosite.ErrInvalidRequest.WithHint("A POST authorization request must be a web form (application/x-www-form-urlencoded).")
		}
	}
	if err := r.ParseForm(); err != nil {
		return fosite.NewAuthorizeRequest(), fosite.ErrInvalidRequest.WithHint("The request could not be read.")
	}
	for name, values := range r.Form {
		if len(values) > 1 {
			// RFC 6749 §3.1: parameters must not be included more than once.
			return fosite.NewAuthorizeRequest(), fosite.ErrInvalidRequest.WithHint("Parameter " + quoteName(name) + " is repeated; each parameter may appear once.")
		}
	}
	return a.provider.NewAuthorizeRequest(r.Context(), r)
}

// authParams are the OpenID Connect parameters that decide whether the
// person signs in again.
type authParams struct {
	none, login, selectAccount bool
	maxAge                     time.Duration // negative: none asked
	hint                       *signin.Hint  // a verified id_token_hint
	loginHint                  string
}

// parseAuthParams reads prompt, max_age, id_token_hint and login_hint
// (OpenID Connect Core §3.1.2.1). consent is accepted and needs nothing:
// applications are first-party, registered by an admin, and have no
// consent screen (docs/decisions.md).
func (a *api) parseAuthParams(form url.Values) (authParams, error) {
	p := authParams{maxAge: -1, loginHint: form.Get("login_hint")}
	prompts := strings.Fields(form.Get("prompt"))
	for _, v := range prompts {
		switch v {
		case "none":
			p.none = true
		case "login":
			p.login = true
		case "select_account":
			p.selectAccount = true
		case "consent":
		default:
			return p, fosite.ErrInvalidRequest.WithHint("The prompt value " + quoteName(v) + " is not supported; use none, login, consent or select_account.")
		}
	}
	if p.none && len(prompts) > 1 {
		return p, fosite.ErrInvalidRequest.WithHint("prompt=none cannot be combined with other prompt values.")
	}
	if v := form.Get("max_age"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1<<31 {
			return p, fosite.ErrInvalidRequest.WithHint("max_age must be a whole number of seconds.")
		}
		p.maxAge = time.Duration(n) * time.Second
	}
	if v := form.Get("id_token_hint"); v != "" {
		h, err := signin.ParseIDTokenHint(a.provider.Keys.PublicJWKS(), a.provider.Issuer, v)
		if err != nil {
			return p, fosite.ErrInvalidRequest.WithHint("The id_token_hint is not an ID token this server issued.")
		}
		p.hint = h
	}
	if len(p.loginHint) > 254 || !extensions.ValidText(p.loginHint) {
		p.loginHint = "" // a hint, not a demand: one that cannot be an address is dropped
	}
	return p, nil
}

// GET and POST /api/v1/oauth/authorize (and /oauth/authorize)
func (a *api) authorize(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ar, err := a.authorizeRequest(r)
	if err != nil {
		a.authorizeError(w, r, ar, err)
		return
	}
	client, ok := ar.GetClient().(*persistence.Client)
	if !ok || client.App == nil {
		a.authorizeError(w, r, ar, fosite.ErrUnauthorizedClient.WithHint("Only applications sign people in."))
		return
	}
	p, err := a.parseAuthParams(ar.GetRequestForm())
	if err != nil {
		a.authorizeError(w, r, ar, err)
		return
	}
	ss, user, err := a.signin.Live(ctx, a.cookies.Session(r))
	if err != nil {
		a.authorizeError(w, r, ar, oauth.Unavailable(err))
		return
	}
	// Whether the session (if any) answers this request without a page:
	// not when the application asks for a sign-in (login, select_account),
	// when the sign-in is older than max_age, or when the application
	// believes another person is signed in (id_token_hint).
	answers := ss != nil && !p.login && !p.selectAccount && a.signin.FreshEnough(ss, p.maxAge) &&
		(p.hint == nil || p.hint.Subject == user.ID)
	if answers {
		a.answerCode(w, r, ar, ss, user)
		return
	}
	if p.none {
		a.authorizeError(w, r, ar, fosite.ErrLoginRequired.WithHint("The person must sign in, and prompt=none forbids showing a page."))
		return
	}
	hint := p.loginHint
	if hint == "" && user != nil && p.hint == nil {
		hint = user.Email // signing in again (login, max_age, select_account): the same person, most likely
	}
	if !a.flows.allow(ctx, addressKey(r)) {
		pages.Render(w, http.StatusTooManyRequests, "message", pages.Page{Title: "Too many attempts",
			Error: "Too many sign-ins were started from your network. Wait a minute and try again."})
		return
	}
	browser := a.ensureBrowser(w, r)
	f, err := a.signin.BeginFlow(ctx, browser, client.ID, ar.GetRequestForm(), hint)
	if err != nil {
		a.authorizeError(w, r, ar, oauth.Unavailable(err))
		return
	}
	pages.SetHeaders(w.Header())
	http.Redirect(w, r, signinPath+"?flow="+url.QueryEscape(f.ID), http.StatusSeeOther)
}

// answerCode answers a verified authorization request for the person
// signed in with ss.
func (a *api) answerCode(w http.ResponseWriter, r *http.Request, ar fosite.AuthorizeRequester, ss *persistence.SSOSession, user *persistence.User) {
	who, err := a.signin.SignedIn(r.Context(), ss, user)
	if err != nil {
		a.authorizeError(w, r, ar, oauth.Unavailable(err))
		return
	}
	answerHeaders(w, ar)
	a.provider.AuthorizeCode(r.Context(), w, ar, who)
}

// answerHeaders are the pages' headers on an authorization's answer, but
// for a form_post answer (OAuth 2.0 Form Post Response Mode), whose page
// submits itself with a script the pages' policy would block.
func answerHeaders(w http.ResponseWriter, ar fosite.AuthorizeRequester) {
	pages.SetHeaders(w.Header())
	if ar.GetResponseMode() == fosite.ResponseModeFormPost {
		w.Header().Del("Content-Security-Policy")
	}
}

// authorizeError answers a refused authorization request: redirected to
// the client (RFC 6749 §4.1.2.1) once its client and redirect URI are
// verified; otherwise an error page, never a redirect.
func (a *api) authorizeError(w http.ResponseWriter, r *http.Request, ar fosite.AuthorizeRequester, err error) {
	rfc := fosite.ErrorToRFC6749Error(err)
	if ar == nil || !ar.IsRedirectURIValid() {
		message := "The application sent an authorization request this server cannot accept."
		switch {
		case errors.Is(rfc, fosite.ErrInvalidClient):
			message = "The application is not registered with this server."
		case rfc.ErrorField == fosite.ErrInvalidRequest.ErrorField && strings.Contains(rfc.HintField, "redirect"):
			message = "The application's redirect address is not registered with this server."
		case rfc.HintField != "":
			message = rfc.HintField
		}
		pages.Render(w, rfc.CodeField, "message", pages.Page{
			Title: "Sign-in cannot continue", Error: message,
			Detail: "Error: " + rfc.ErrorField + ". Contact the application's owner.",
		})
		return
	}
	answerHeaders(w, ar)
	a.provider.AuthorizeError(r.Context(), w, ar, err)
}

// --- RP-initiated logout

// logoutRequest is a verified logout request.
type logoutRequest struct {
	hint     *signin.Hint
	client   *persistence.Client // nil: none named
	redirect string              // a registered post_logout_redirect_uri, or ""
	state    string
}

var errLogoutRequest = func(message string) error {
	return extensions.NewError(http.StatusBadRequest, "invalid_request", message, nil)
}

// parseLogout checks a logout request (RP-Initiated Logout §2): the hint
// must be our ID token; client_id, when given with a hint, must be among
// its audience; post_logout_redirect_uri must be registered, exactly, by
// the application named (client_id or the hint's single audience).
func (a *api) parseLogout(r *http.Request, form url.Values) (*logoutRequest, error) {
	for name, values := range form {
		if len(values) > 1 {
			return nil, errLogoutRequest("The parameter " + quoteName(name) + " is repeated.")
		}
	}
	lr := &logoutRequest{state: form.Get("state")}
	if len(lr.state) > oauth.MaxStateLength { // echoed in the redirect, as an authorization's
		return nil, errLogoutRequest(fmt.Sprintf("The state must be at most %d bytes.", oauth.MaxStateLength))
	}
	if v := form.Get("id_token_hint"); v != "" {
		h, err := signin.ParseIDTokenHint(a.provider.Keys.PublicJWKS(), a.provider.Issuer, v)
		if err != nil {
			return nil, errLogoutRequest("The id_token_hint is not an ID token this server issued.")
		}
		lr.hint = h
	}
	clientID := form.Get("client_id")
	if lr.hint != nil {
		switch {
		case clientID != "" && !slices.Contains(lr.hint.Audience, clientID):
			return nil, errLogoutRequest("The client_id is not the audience of the id_token_hint.")
		case clientID == "" && len(lr.hint.Audience) == 1:
			clientID = lr.hint.Audience[0]
		}
	}
	if clientID != "" {
		app, err := a.signin.Application(r.Context(), clientID)
		if err != nil {
			var e *extensions.Error
			if errors.As(err, &e) {
				return nil, errLogoutRequest("The application is not registered with this server.")
			}
			return nil, err
		}
		lr.client = app
	}
	if v := form.Get("post_logout_redirect_uri"); v != "" {
		if lr.client == nil {
			return nil, errLogoutRequest("A post_logout_redirect_uri needs the client_id or id_token_hint of its application.")
		}
		if !slices.Contains(lr.client.App.PostLogoutRedirectURIs, v) {
			return nil, errLogoutRequest("The post_logout_redirect_uri is not registered for this application.")
		}
		lr.redirect = v
	}
	return lr, nil
}

// logoutForm reads a logout request's parameters, GET or POST.
func logoutForm(r *http.Request) (url.Values, error) {
	if r.Method == http.MethodPost {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != formType {
			return nil, errLogoutRequest("A POST logout request must be a web form.")
		}
	}
	if err := r.ParseForm(); err != nil {
		return nil, errLogoutRequest("The request could not be read.")
	}
	return r.Form, nil
}

// GET and POST /api/v1/oauth/logout. A valid id_token_hint naming the
// session's person (and session, by sid) ends the session at once; a
// request without one, or naming someone else, asks the person first, so
// that no other site can sign a person out unasked.
func (a *api) endSession(w http.ResponseWriter, r *http.Request) {
	form, err := logoutForm(r)
	if err != nil {
		a.pageError(w, r, "Sign-out failed", err)
		return
	}
	lr, err := a.parseLogout(r, form)
	if err != nil {
		a.pageError(w, r, "Sign-out failed", err)
		return
	}
	ss, user, err := a.signin.Live(r.Context(), a.cookies.Session(r))
	if err != nil {
		a.pageError(w, r, "Sign-out failed", err)
		return
	}
	if ss != nil && (lr.hint == nil || lr.hint.Subject != ss.UserID || (lr.hint.SessionID != "" && lr.hint.SessionID != ss.ID)) {
		browser := a.ensureBrowser(w, r)
		var hidden []pages.Field
		for _, name := range []string{"client_id", "post_logout_redirect_uri", "state"} {
			if v := form.Get(name); v != "" {
				hidden = append(hidden, pages.Field{Name: name, Value: v})
			}
		}
		if lr.client != nil && form.Get("client_id") == "" {
			hidden = append(hidden, pages.Field{Name: "client_id", Value: lr.client.ID})
		}
		p := pages.Page{Title: "Sign out", Email: user.Email, CSRF: a.csrf.Token(browser, logoutPurpose), Action: signoutPath, Hidden: hidden}
		if lr.client != nil {
			p.AppName = lr.client.App.Name
		}
		pages.Render(w, http.StatusOK, "logout", p, pages.Target(lr.redirect))
		return
	}
	a.logout(w, r, lr, ss)
}

// logoutPurpose is the CSRF purpose of the sign-out confirmation.
const logoutPurpose = "logout"

// POST /signout: the person confirmed signing out.
func (a *api) signOut(w http.ResponseWriter, r *http.Request) {
	form, err := logoutForm(r)
	if err != nil {
		a.pageError(w, r, "Sign-out failed", err)
		return
	}
	if !a.csrf.Valid(a.cookies.Browser(r), logoutPurpose, r.PostForm.Get("csrf_token")) {
		a.pageError(w, r, "Sign-out failed", errCSRF)
		return
	}
	form.Del("csrf_token")
	lr, err := a.parseLogout(r, form)
	if err != nil {
		a.pageError(w, r, "Sign-out failed", err)
		return
	}
	ss, _, err := a.signin.Live(r.Context(), a.cookies.Session(r))
	if err != nil {
		a.pageError(w, r, "Sign-out failed", err)
		return
	}
	a.logout(w, r, lr, ss)
}

// logout ends the session (if any), clears its cookie and answers: back to
// the application's registered address with state, or a page.
func (a *api) logout(w http.ResponseWriter, r *http.Request, lr *logoutRequest, ss *persistence.SSOSession) {
	if ss != nil {
		appID, clientID := "", ""
		if lr.client != nil {
			appID, clientID = lr.client.RecordID, lr.client.ID
		}
		if err := a.signin.End(r.Context(), ss, persistence.SessionEndLogout, appID, clientID, a.browserClient(r)); err != nil {
			a.pageError(w, r, "Sign-out failed", err)
			return
		}
	}
	a.cookies.ClearSession(w)
	if lr.redirect != "" {
		u, _ := url.Parse(lr.redirect)
		if lr.state != "" {
			q := u.Query()
			q.Set("state", lr.state)
			u.RawQuery = q.Encode()
		}
		pages.SetHeaders(w.Header())
		http.Redirect(w, r, u.String(), http.StatusSeeOther)
		return
	}
	p := pages.Page{Title: "Signed out", Message: "You are signed out."}
	if lr.client != nil {
		p.AppName = lr.client.App.Name
	}
	pages.Render(w, http.StatusOK, "message", p)
}
