package handlers

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// GET and POST /api/v1/oauth/userinfo (OpenID Connect Core §5.3): the
// person's claims that the access token's scopes release, read from the
// directory now. The token comes as a Bearer header, or in a POST form body
// as access_token (RFC 6750 §2.2); refusals are RFC 6750 §3 challenges with
// a JSON body of error and error_description.
func (a *api) userinfo(w http.ResponseWriter, r *http.Request) {
	if a.bearerFailures.refused(w, r, writeOAuthRateLimited) {
		return
	}
	token, ok := bearerToken(r)
	if !ok && r.Method == http.MethodPost {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == formType && r.ParseForm() == nil {
			token = r.PostForm.Get("access_token")
			ok = token != ""
		}
	}
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd"`)
		writeOAuthError(w, http.StatusUnauthorized, "invalid_request", "An access token is required (Authorization: Bearer).")
		return
	}
	invalid := func(description string) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="invalid_token", error_description="`+description+`"`)
		writeOAuthError(w, http.StatusUnauthorized, "invalid_token", description)
	}
	p, err := a.provider.Authenticate(r.Context(), token)
	if errors.Is(err, fosite.ErrServerError) {
		a.userinfoFailed(w, r, err)
		return
	} else if err != nil {
		a.bearerFailures.failed(r)
		invalid("The access token is unknown, expired or revoked.")
		return
	}
	if p.Client.App == nil || p.ForItself() {
		invalid("The access token was not issued to a person.")
		return
	}
	if !p.HasScope(oauth.ScopeOpenID) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="insufficient_scope", scope="openid"`)
		writeOAuthError(w, http.StatusForbidden, "insufficient_scope", "The access token was not granted the openid scope.")
		return
	}
	who, err := a.provider.Person(r.Context(), p.Subject)
	if errors.Is(err, oauth.ErrPersonGone) {
		invalid("The person no longer exists or is disabled.")
		return
	} else if err != nil {
		a.userinfoFailed(w, r, err)
		return
	}
	claims := who.Claims(p.Scopes)
	claims["sub"] = p.Subject
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(claims)
}

// userinfoFailed answers a failure that is no verdict on the token: 503
// while storage fails, else 500.
func (a *api) userinfoFailed(w http.ResponseWriter, r *http.Request, err error) {
	if persistence.Unavailable(err) {
		a.writeUnavailable(w, r, "userinfo", err)
		return
	}
	logger(r).ErrorContext(r.Context(), "userinfo failed", "error", err.Error())
	writeOAuthError(w, http.StatusInternalServerError, "server_error", "The server could not answer; retry later.")
}
