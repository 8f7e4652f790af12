package handlers

import (
	"errors"
	"net/http"

	"github.com/identityd/identityd/persistence"
)

// GET /api/v1/m2m/whoami: any valid token; the identity behind it.
func (a *api) whoami(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	sa, err := a.serviceAccounts.GetByClientID(r.Context(), p.ClientID)
	if errors.Is(err, persistence.ErrNotFound) {
		// Deleted between token check and here: the token is gone with it.
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="invalid_token"`)
		writeError(w, r, newError(http.StatusUnauthorized, "invalid_token", "The access token is unknown, expired or revoked.", nil))
		return
	} else if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": sa.ID, "clientId": sa.ClientID, "name": sa.Name, "type": persistence.KindServiceAccount,
		"scopes": p.Scopes, "expiresAt": isoTime(p.ExpiresAt),
	})
}
