package handlers

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/persistence"
)

// sessionJSON is the API shape of an SSO session (ours: the spec shows no
// session fields).
type sessionJSON struct {
	ID            string   `json:"id"`
	UserID        string   `json:"userId"`
	ApplicationID *string  `json:"applicationId"`
	CreatedAt     string   `json:"createdAt"`
	LastSeenAt    string   `json:"lastSeenAt"`
	ExpiresAt     string   `json:"expiresAt"`
	IP            string   `json:"ip"`
	UserAgent     string   `json:"userAgent"`
	AMR           []string `json:"amr"`
	AuthTime      string   `json:"authTime"`
}

func toSessionJSON(s *persistence.SSOSession) sessionJSON {
	return sessionJSON{
		ID: s.ID, UserID: s.UserID, ApplicationID: s.ApplicationID, CreatedAt: isoTime(s.CreatedAt), LastSeenAt: isoTime(s.LastSeenAt),
		ExpiresAt: isoTime(s.ExpiresAt), IP: s.IP, UserAgent: s.UserAgent, AMR: s.AMR, AuthTime: isoTime(s.AuthTime),
	}
}

// GET /api/v1/m2m/users/{id}/sessions: the person's live sessions, oldest
// first, in the list shape (a person holds few; limit and offset apply).
func (a *api) listUserSessions(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, err := a.signin.Sessions(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	total := len(list)
	list = list[min(page.Offset, total):min(page.Offset+page.Limit, total)]
	writeList(w, "sessions", list, total, page, toSessionJSON)
}

// DELETE /api/v1/m2m/users/{id}/sessions: ends every session of the
// person; what hangs on them (refresh and access tokens) dies with them,
// on every replica, before the answer (the commit wait).
func (a *api) endUserSessions(w http.ResponseWriter, r *http.Request) {
	n, err := a.signin.EndAll(r.Context(), mux.Vars(r)["id"], a.browserClient(r))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ended": n})
}
