package handlers

import (
	"errors"
	"net/http"

	"github.com/identityd/identityd/persistence"
)

// GET /api/v1/m2m/whoami: any valid token; the identity behind it.
func (a *api) whoami(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	out := map[string]any{"clientId": p.ClientID, "type": p.Kind, "scopes": p.Scopes, "expiresAt": isoTime(p.ExpiresAt)}
	switch p.Kind {
	case persistence.KindAgent:
		ag, err := a.agents.Get(r.Context(), p.RecordID)
		if err != nil {
			writeError(w, r, err)
			return
		}
		out["id"], out["name"], out["trustLevel"], out["capabilities"] = ag.ID, ag.Name, ag.TrustLevel, ag.Capabilities
	default:
		sa, err := a.serviceAccounts.Get(r.Context(), p.RecordID)
		if errors.Is(err, persistence.ErrNotFound) {
			// Deleted between token check and here: the token is gone with it.
			w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="invalid_token"`)
			writeError(w, r, newError(http.StatusUnauthorized, "invalid_token", "The access token is unknown, expired or revoked.", nil))
			return
		} else if err != nil {
			writeError(w, r, err)
			return
		}
		out["id"], out["name"] = sa.ID, sa.Name
	}
	writeJSON(w, http.StatusOK, out)
}
