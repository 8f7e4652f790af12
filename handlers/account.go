package handlers

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Sign-in for identityd's own hosted pages (issue 16). A page that needs a
// signed-in person (the approval and consent pages), reached without an
// SSO session, sends the browser through the authorization endpoint as
// identityd's own public application (applications.AccountClientID) with
// PKCE; the hosted sign-in opens the SSO session on this origin, and the
// callback spends the code and returns the browser to the page.
//
// The state is sealed (AES-GCM, oauth.Sealer under its own purpose) and
// bound to the browser cookie: it carries the return path (a relative
// path of this server, checked again on the way back), the PKCE verifier
// and an expiry, so the server keeps nothing per sign-in, the verifier
// never leaves the server in clear, and a state copied to another browser
// does not open.

// PurposeAccountState is the HKDF label of the state sealer's key.
const PurposeAccountState = "account sign-in state"

// accountStateTTL bounds a sign-in begun from a page: as long as a
// sign-in flow may take.
const accountStateTTL = 30 * time.Minute

type accountState struct {
	Return   string    `json:"r"`
	Verifier string    `json:"v"`
	Expires  time.Time `json:"e"`
}

var errSignInFailed = extensions.NewError(http.StatusBadRequest, "sign_in_failed",
	"The sign-in could not be completed. Open the link from your e-mail again.", nil)

// localPath tells whether p is a path of this server to return to: a
// relative path from the root, never another origin (//host, /\host).
func localPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") || strings.ContainsAny(p, "\r\n\\") {
		return false
	}
	u, err := url.Parse(p)
	return err == nil && u.Scheme == "" && u.Host == "" && u.User == nil
}

// sendToSignIn answers a page reached without a session: a GET goes to
// the sign-in and comes back; anything else is told to open the link again.
func (a *api) sendToSignIn(w http.ResponseWriter, r *http.Request, title string) {
	if a.accountSealer == nil || (r.Method != http.MethodGet && r.Method != http.MethodHead) || !localPath(r.URL.RequestURI()) {
		a.pageError(w, r, title, errSignInToApprove)
		return
	}
	browser := a.ensureBrowser(w, r)
	st := accountState{Return: r.URL.RequestURI(), Verifier: oauth.NewSecret(), Expires: time.Now().Add(accountStateTTL)}
	plain, _ := json.Marshal(st)
	sum := sha256.Sum256([]byte(st.Verifier))
	q := url.Values{
		"client_id": {applications.AccountClientID}, "response_type": {"code"}, "scope": {oauth.ScopeOpenID},
		"redirect_uri":   {a.provider.Issuer + applications.AccountCallbackPath},
		"state":          {base64.RawURLEncoding.EncodeToString(a.accountSealer.Seal(plain, []byte(browser)))},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, oauth.AuthorizePath+"?"+q.Encode(), http.StatusSeeOther)
}

// GET /account/callback?code&state (or error): the state is opened in the
// browser it was sealed for, the code is spent with its verifier at the
// token endpoint (proving this sign-in is the one the page began), and
// the browser returns to the page, where its SSO session now answers.
func (a *api) accountCallback(w http.ResponseWriter, r *http.Request) {
	const title = "Sign-in"
	q := r.URL.Query()
	raw, err := base64.RawURLEncoding.DecodeString(q.Get("state"))
	var st accountState
	if err == nil {
		var plain []byte
		if plain, err = a.accountSealer.Open(raw, []byte(a.cookies.Browser(r))); err == nil {
			err = json.Unmarshal(plain, &st)
		}
	}
	if err != nil || a.cookies.Browser(r) == "" || !time.Now().Before(st.Expires) || !localPath(st.Return) {
		a.pageError(w, r, title, errSignInFailed)
		return
	}
	if q.Get("error") != "" || q.Get("code") == "" {
		a.pageError(w, r, title, errSignInFailed)
		return
	}
	if err := a.spendAccountCode(r, q.Get("code"), st.Verifier); err != nil {
		if persistence.Unavailable(err) {
			a.pageError(w, r, title, err)
			return
		}
		logger(r).InfoContext(r.Context(), "own sign-in callback refused", "error", err.Error())
		a.pageError(w, r, title, errSignInFailed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, st.Return, http.StatusSeeOther)
}

// spendAccountCode trades the code at the token endpoint, in process, as
// the public application with its PKCE verifier. The tokens are never
// shown to anyone: they live with the SSO session like any person's.
func (a *api) spendAccountCode(r *http.Request, code, verifier string) error {
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "client_id": {applications.AccountClientID},
		"redirect_uri": {a.provider.Issuer + applications.AccountCallbackPath}, "code_verifier": {verifier}}
	body := form.Encode()
	req := r.Clone(r.Context())
	req.Method = http.MethodPost
	req.Body, req.ContentLength, req.Form, req.PostForm = io.NopCloser(strings.NewReader(body)), int64(len(body)), nil, nil
	req.Header = req.Header.Clone()
	req.Header.Set("Content-Type", formType)
	req.Header.Del("Authorization")
	var err error
	if cerr := a.provider.ExchangeCode(r.Context(), func(ctx context.Context) {
		var ar fosite.AccessRequester
		if ar, err = a.provider.NewAccessRequest(ctx, req, oauth.NewSession()); err == nil {
			_, err = a.provider.NewAccessResponse(ctx, ar)
		}
	}); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil && errors.Is(err, fosite.ErrTemporarilyUnavailable) {
		return persistence.ErrUnavailable
	}
	return err
}
