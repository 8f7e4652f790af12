package handlers

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/oauth"
)

// inviteCaller is the principal as the invite rules see it.
func inviteCaller(p *oauth.Principal) invites.Caller {
	return invites.Caller{ClientID: p.ClientID(), ServiceAccountID: p.ServiceAccountID(), Actor: p.Actor()}
}

// POST /api/v1/m2m/users/invite (spec: Invites; snake_case fields as the spec writes them)
func (a *api) createInvite(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Email           string         `json:"email"`
		RedirectURI     string         `json:"redirect_uri"`
		InviteAcceptURI string         `json:"invite_accept_uri"`
		State           string         `json:"state"`
		FirstName       string         `json:"first_name"`
		LastName        string         `json:"last_name"`
		AppName         string         `json:"app_name"`
		Metadata        map[string]any `json:"metadata"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	p := principalFrom(r.Context())
	inv, err := a.invites.Create(r.Context(), inviteCaller(p), invites.Input{
		Email: body.Email, RedirectURI: body.RedirectURI, InviteAcceptURI: body.InviteAcceptURI, State: body.State,
		FirstName: body.FirstName, LastName: body.LastName, AppName: body.AppName, Metadata: body.Metadata,
	})
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{
		"invite_id": inv.ID, "email": inv.Email, "status": inv.Status, "user_exists": inv.UserExisted, "expires_at": isoTime(inv.ExpiresAt),
	})
}

// GET /api/v1/invites/{token}: public, read-only.
func (a *api) inviteStatus(w http.ResponseWriter, r *http.Request) {
	inv, left, err := a.invites.Status(r.Context(), mux.Vars(r)["token"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"email": inv.Email, "app_name": inv.AppName, "user_exists": inv.UserExisted, "status": "pending", "expires_in": int64(left.Seconds()),
	})
}

// GET /invites/{token}: where the e-mailed link points; a 303 to the
// application's accept page.
func (a *api) followInvite(w http.ResponseWriter, r *http.Request) {
	to, err := a.invites.Follow(r.Context(), mux.Vars(r)["token"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer") // the token is in this URL
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// POST /api/v1/m2m/invites/{token}/accept: by the account that made it, once.
func (a *api) acceptInvite(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	inv, err := a.invites.Accept(r.Context(), inviteCaller(p), mux.Vars(r)["token"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"invite_id": inv.ID, "email": inv.Email, "user_id": inv.UserID, "user_exists": inv.UserExisted, "app_name": inv.AppName,
		"accepted_at": isoTime(*inv.AcceptedAt), "metadata": inv.Metadata,
	})
}
