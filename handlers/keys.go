package handlers

import (
	"net/http"

	"github.com/identityd/identityd/oauth"
)

// keyJSON is the API shape of a published signing key: never its private
// half, nor its public one (that is what JWKS is for).
type keyJSON struct {
	KID            string  `json:"kid"`
	Alg            string  `json:"alg"`
	State          string  `json:"state"` // active (signs) or retired
	CreatedAt      string  `json:"createdAt"`
	RetiredAt      *string `json:"retiredAt,omitempty"`
	PublishedUntil *string `json:"publishedUntil,omitempty"` // a retired key leaves JWKS then
}

func toKeyJSON(k *oauth.KeyInfo) keyJSON {
	out := keyJSON{KID: k.KID, Alg: k.Alg, State: k.State, CreatedAt: isoTime(k.CreatedAt)}
	if k.RetiredAt != nil {
		t := isoTime(*k.RetiredAt)
		out.RetiredAt = &t
	}
	if k.PublishedUntil != nil {
		t := isoTime(*k.PublishedUntil)
		out.PublishedUntil = &t
	}
	return out
}

// GET /api/v1/keys: the published signing keys, oldest first.
func (a *api) listKeys(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	keys, err := a.provider.Keys.List(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	total := len(keys)
	keys = keys[min(page.Offset, total):min(page.Offset+page.Limit, total)]
	writeList(w, "keys", keys, total, page, toKeyJSON)
}

// POST /api/v1/keys/rotate: a new key per algorithm signs from now on; the
// keys it replaces stay published until what they signed has expired.
func (a *api) rotateKeys(w http.ResponseWriter, r *http.Request) {
	added, retired, err := a.provider.Keys.Rotate(r.Context())
	if err != nil {
		writeError(w, r, err)
		return
	}
	keys, kids := make([]keyJSON, len(added)), make([]string, len(added))
	for i, k := range added {
		keys[i], kids[i] = toKeyJSON(&oauth.KeyInfo{KID: k.KID, Alg: k.Alg, State: oauth.KeyActive, CreatedAt: k.CreatedAt}), k.KID
	}
	if retired == nil {
		retired = []string{}
	}
	logger(r).InfoContext(r.Context(), "signing keys rotated", "added", kids, "retired", retired, "by", principalFrom(r.Context()).ClientID())
	writeJSON(w, http.StatusOK, map[string]any{"keys": keys, "retired": retired})
}
