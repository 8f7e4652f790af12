package handlers

import (
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/persistence"
)

// applicationJSON is the API shape of an application. The secret appears
// only in the answer to create (and rotate, which answers it alone); a
// lifetime of null is the server's default.
type applicationJSON struct {
	ID                     string           `json:"id"`
	ClientID               string           `json:"clientId"`
	ClientSecret           string           `json:"clientSecret,omitempty"`
	Name                   string           `json:"name"`
	Type                   string           `json:"type"`
	RedirectURIs           []string         `json:"redirectUris"`
	PostLogoutRedirectURIs []string         `json:"postLogoutRedirectUris"`
	WebOrigins             []string         `json:"webOrigins"`
	RPID                   string           `json:"rpId"`
	SignInMethods          []string         `json:"signInMethods"`
	MFA                    applications.MFA `json:"mfa"`
	AccessTokenFormat      string           `json:"accessTokenFormat"`
	IDTokenSigningAlg      string           `json:"idTokenSigningAlg"`
	AccessTokenTTL         *int             `json:"accessTokenTtl"`
	RefreshTokenTTL        *int             `json:"refreshTokenTtl"`
	AdminConsole           bool             `json:"adminConsole"`
	AllowSignUp            bool             `json:"allowSignUp"`
	PasswordResetURI       *string          `json:"passwordResetUri"`
	CreatedAt              string           `json:"createdAt"`
	UpdatedAt              string           `json:"updatedAt"`
	RotatedAt              *string          `json:"rotatedAt,omitempty"`
}

func toApplicationJSON(a *persistence.Application, secret string) applicationJSON {
	nonNil := func(l []string) []string {
		if l == nil {
			return []string{}
		}
		return l
	}
	out := applicationJSON{
		ID: a.ID, ClientID: a.ClientID, ClientSecret: secret, Name: a.Name, Type: a.Type,
		RedirectURIs: nonNil(a.RedirectURIs), PostLogoutRedirectURIs: nonNil(a.PostLogoutRedirectURIs), WebOrigins: nonNil(a.WebOrigins),
		RPID: a.RPID, SignInMethods: nonNil(a.SignInMethods), MFA: applications.MFAOf(a),
		AccessTokenFormat: a.AccessTokenFormat, IDTokenSigningAlg: a.IDTokenSigningAlg,
		AccessTokenTTL: a.AccessTokenTTL, RefreshTokenTTL: a.RefreshTokenTTL, AdminConsole: a.AdminConsole, AllowSignUp: a.AllowSignUp,
		CreatedAt: isoTime(a.CreatedAt), UpdatedAt: isoTime(a.UpdatedAt),
	}
	if a.RotatedAt != nil {
		t := isoTime(*a.RotatedAt)
		out.RotatedAt = &t
	}
	if a.PasswordResetURI != "" {
		out.PasswordResetURI = &a.PasswordResetURI
	}
	return out
}

// applicationBody is what create and PATCH read. A member that is absent or
// null is not given, as on every route; but a lifetime's null is a value:
// the server's default (JSON Merge Patch, RFC 7396), so that PATCH can
// restore it.
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
	AccessTokenTTL         seconds           `json:"accessTokenTtl"`
	RefreshTokenTTL        seconds           `json:"refreshTokenTtl"`
	AdminConsole           *bool             `json:"adminConsole"`
	AllowSignUp            *bool             `json:"allowSignUp"`
	PasswordResetURI       *string           `json:"passwordResetUri"`
}

func (b *applicationBody) input() applications.Input {
	return applications.Input{
		Name: b.Name, Type: b.Type, RedirectURIs: b.RedirectURIs, PostLogoutRedirectURIs: b.PostLogoutRedirectURIs,
		WebOrigins: b.WebOrigins, RPID: b.RPID, SignInMethods: b.SignInMethods, MFA: b.MFA,
		AccessTokenFormat: b.AccessTokenFormat, IDTokenSigningAlg: b.IDTokenSigningAlg,
		AccessTokenTTL: applications.Seconds(b.AccessTokenTTL), RefreshTokenTTL: applications.Seconds(b.RefreshTokenTTL),
		AdminConsole: b.AdminConsole, AllowSignUp: b.AllowSignUp, PasswordResetURI: b.PasswordResetURI,
	}
}

// seconds is a lifetime member: present or not, and null or an integer.
type seconds applications.Seconds

// UnmarshalJSON implements json.Unmarshaler; a value that is not an
// integer is the decoder's usual type error, which names the member.
func (s *seconds) UnmarshalJSON(b []byte) error {
	s.Set, s.Value = true, nil
	if string(b) == "null" {
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	s.Value = &n
	return nil
}

// POST /api/v1/applications
func (a *api) createApplication(w http.ResponseWriter, r *http.Request) {
	var body applicationBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	app, secret, err := a.applications.Create(r.Context(), body.input())
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
	var body applicationBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	app, err := a.applications.Update(r.Context(), mux.Vars(r)["id"], body.input())
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
