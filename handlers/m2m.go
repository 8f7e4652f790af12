package handlers

import (
	"errors"
	"net/http"

	"github.com/identityd/identityd/persistence"
)

// GET /api/v1/m2m/whoami: any valid token; who it speaks for (sub), who
// holds it (the client and the record behind it), and, for a delegated
// token, who acts (act).
func (a *api) whoami(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	out := map[string]any{"sub": p.Subject, "clientId": p.ClientID(), "type": p.Client.Kind, "scopes": p.Scopes, "expiresAt": isoTime(p.ExpiresAt)}
	if p.Client.Kind == persistence.KindApplication {
		out["type"] = "user" // a person signed in through an application
	}
	if p.Act != nil {
		out["act"] = p.Act
	}
	var err error
	switch p.Client.Kind {
	case persistence.KindAgent:
		var ag *persistence.Agent
		if ag, err = a.agents.Get(r.Context(), p.Client.RecordID); err == nil {
			out["id"], out["name"], out["trustLevel"], out["capabilities"] = ag.ID, ag.Name, ag.TrustLevel, ag.Capabilities
		}
	case persistence.KindApplication:
		var u *persistence.User
		if u, err = a.directory.GetUser(r.Context(), p.Subject); err == nil {
			out["id"], out["email"], out["name"], out["sessionId"] = u.ID, u.Email, u.Name, p.SessionID
		}
	case persistence.KindServiceAccount:
		var sa *persistence.ServiceAccount
		if sa, err = a.serviceAccounts.Get(r.Context(), p.Client.RecordID); err == nil {
			out["id"], out["name"] = sa.ID, sa.Name
		}
	}
	if errors.Is(err, persistence.ErrNotFound) {
		// Deleted between token check and here: the token is gone with it.
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="invalid_token"`)
		writeError(w, r, newError(http.StatusUnauthorized, "invalid_token", "The access token is unknown, expired or revoked.", nil))
		return
	} else if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
