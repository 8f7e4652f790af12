package handlers

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/persistence"
)

// applicationJSON is the API shape of an application. The secret appears
// only in the answers to create and rotate.
type applicationJSON struct {
	ID                     string            `json:"id"`
	ClientID               string            `json:"clientId"`
	ClientSecret           string            `json:"clientSecret,omitempty"`
	Name                   string            `json:"name"`
	Type                   string            `json:"type"`
	RedirectURIs           []string          `json:"redirectUris"`
	PostLogoutRedirectURIs []string          `json:"postLogoutRedirectUris"`
	WebOrigins             []string          `json:"webOrigins"`
	RPID                   string            `json:"rpId"`
	SignInMethods          []string          `json:"signInMethods"`
	MFA                    *applications.MFA `json:"mfa"`
	AccessTokenFormat      string            `json:"accessTokenFormat"`
	IDTokenSigningAlg      string            `json:"idTokenSigningAlg"`
	AccessTokenTTL         *int              `json:"accessTokenTtl"`
	RefreshTokenTTL        *int              `json:"refreshTokenTtl"`
	AdminConsole           bool              `json:"adminConsole"`
	CreatedAt              string            `json:"createdAt"`
	UpdatedAt              string            `json:"updatedAt"`
	RotatedAt              *string           `json:"rotatedAt,omitempty"`
}

func toApplicationJSON(a *persistence.Application, secret string) applicationJSON {
	list := func(l []string) []string {
		if l == nil {
			return []string{}
		}
		return l
	}
	out := applicationJSON{
		ID: a.ID, ClientID: a.ClientID, ClientSecret: secret, Name: a.Name, Type: a.Type, RedirectURIs: list(a.RedirectURIs),
		PostLogoutRedirectURIs: list(a.PostLogoutRedirectURIs), WebOrigins: list(a.WebOrigins), RPID: a.RPID,
		SignInMethods: list(a.SignInMethods), MFA: applications.MFAOf(a), AccessTokenFormat: a.AccessTokenFormat,
		IDTokenSigningAlg: a.IDTokenSigningAlg, AccessTokenTTL: a.AccessTokenTTL, RefreshTokenTTL: a.RefreshTokenTTL,
		AdminConsole: a.AdminConsole, CreatedAt: isoTime(a.CreatedAt), UpdatedAt: isoTime(a.UpdatedAt),
	}
	if a.RotatedAt != nil {
		t := isoTime(*a.RotatedAt)
		out.RotatedAt = &t
	}
	return out
}

// applicationBody is what create and update read. Lifetimes tell an
// explicit null (back to the server's default) from an absent field.
type applicationBody struct {
	Name                   *string           `json:"name"`
	Type                   *string           `json:"type"`
	RedirectURIs           *[]string         `json:"redirectUris"`
	PostLogoutRedirectURIs *[]string         `json:"postLogoutRedirectUris"`
	WebOrigins             *[]string         `json:"webOrigins"`
	RPID                   *string           `json:"rpId"`
	SignInMethods          *[]string         `json:"signInMethods"`
	MFA                    *applications.MFA `json:"mfa"`
	AccessTokenFormat      *string           `json:"accessTokenFormat"`
	IDTokenSigningAlg      *string           `json:"idTokenSigningAlg"`
	AccessTokenTTL         nullableInt       `json:"accessTokenTtl"`
	RefreshTokenTTL        nullableInt       `json:"refreshTokenTtl"`
	AdminConsole           *bool             `json:"adminConsole"`
}

// nullableInt is an integer field that may be absent, null or a number.
type nullableInt struct {
	set bool
	v   *int
}

func (n *nullableInt) UnmarshalJSON(b []byte) error {
	n.set = true
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	return json.Unmarshal(b, &n.v)
}

func orEmpty(l *[]string) []string {
	if l == nil {
		return nil
	}
	return *l
}

// POST /api/v1/applications
func (a *api) createApplication(w http.ResponseWriter, r *http.Request) {
	var b applicationBody
	if err := decodeJSON(r, &b); err != nil {
		writeError(w, r, err)
		return
	}
	in := applications.Input{
		Name: deref(b.Name), Type: deref(b.Type), RedirectURIs: orEmpty(b.RedirectURIs), PostLogoutRedirectURIs: orEmpty(b.PostLogoutRedirectURIs),
		WebOrigins: orEmpty(b.WebOrigins), RPID: deref(b.RPID), SignInMethods: orEmpty(b.SignInMethods), MFA: b.MFA,
		AccessTokenFormat: deref(b.AccessTokenFormat), IDTokenSigningAlg: deref(b.IDTokenSigningAlg),
		AccessTokenTTL: b.AccessTokenTTL.v, RefreshTokenTTL: b.RefreshTokenTTL.v, AdminConsole: b.AdminConsole != nil && *b.AdminConsole,
	}
	if b.SignInMethods != nil && in.SignInMethods == nil {
		in.SignInMethods = []string{} // sent empty: refused, not defaulted
	}
	app, secret, err := a.applications.Create(r.Context(), in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/applications/"+app.ID)
	writeJSON(w, http.StatusCreated, toApplicationJSON(app, secret))
}

// GET /api/v1/applications
func (a *api) listApplications(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.applications.List(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "applications", list, total, page, func(x *persistence.Application) applicationJSON { return toApplicationJSON(x, "") })
}

// GET /api/v1/applications/{id}
func (a *api) getApplication(w http.ResponseWriter, r *http.Request) {
	app, err := a.applications.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toApplicationJSON(app, ""))
}

// PATCH /api/v1/applications/{id}
func (a *api) updateApplication(w http.ResponseWriter, r *http.Request) {
	var b applicationBody
	if err := decodeJSON(r, &b); err != nil {
		writeError(w, r, err)
		return
	}
	app, err := a.applications.Update(r.Context(), mux.Vars(r)["id"], applications.Patch{
		Name: b.Name, Type: b.Type, RedirectURIs: b.RedirectURIs, PostLogoutRedirectURIs: b.PostLogoutRedirectURIs,
		WebOrigins: b.WebOrigins, RPID: b.RPID, SignInMethods: b.SignInMethods, MFA: b.MFA, AccessTokenFormat: b.AccessTokenFormat,
		IDTokenSigningAlg: b.IDTokenSigningAlg, AccessTokenTTL: b.AccessTokenTTL.v, RefreshTokenTTL: b.RefreshTokenTTL.v,
		ClearAccessTTL: b.AccessTokenTTL.set && b.AccessTokenTTL.v == nil, ClearRefreshTTL: b.RefreshTokenTTL.set && b.RefreshTokenTTL.v == nil,
		AdminConsole: b.AdminConsole,
	})
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toApplicationJSON(app, ""))
}

// DELETE /api/v1/applications/{id}
func (a *api) deleteApplication(w http.ResponseWriter, r *http.Request) {
	if err := a.applications.Delete(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// POST /api/v1/applications/{id}/rotate
func (a *api) rotateApplication(w http.ResponseWriter, r *http.Request) {
	app, secret, err := a.applications.Rotate(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"clientId": app.ClientID, "clientSecret": secret, "rotatedAt": isoTime(*app.RotatedAt)})
}
