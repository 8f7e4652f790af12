package handlers

import (
	"net/http"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/persistence"
)

// serviceAccountJSON is the API shape of a service account. The secret
// appears only in the answers to create and rotate.
type serviceAccountJSON struct {
	ID           string   `json:"id"`
	ClientID     string   `json:"clientId"`
	ClientSecret string   `json:"clientSecret,omitempty"`
	Name         string   `json:"name"`
	Description  string   `json:"description"`
	Scopes       []string `json:"scopes"`
	RedirectURIs []string `json:"redirectUris"`
	CreatedAt    string   `json:"createdAt"`
	UpdatedAt    string   `json:"updatedAt"`
	RotatedAt    *string  `json:"rotatedAt,omitempty"`
	Tier         string   `json:"tier"`
}

func toServiceAccountJSON(sa *persistence.ServiceAccount, secret string) serviceAccountJSON {
	out := serviceAccountJSON{
		ID: sa.ID, ClientID: sa.ClientID, ClientSecret: secret, Name: sa.Name, Description: sa.Description,
		Scopes: sa.Scopes, RedirectURIs: sa.RedirectURIs, CreatedAt: isoTime(sa.CreatedAt), UpdatedAt: isoTime(sa.UpdatedAt),
		Tier: sa.Tier,
	}
	if out.Scopes == nil {
		out.Scopes = []string{}
	}
	if out.RedirectURIs == nil {
		out.RedirectURIs = []string{}
	}
	if sa.RotatedAt != nil {
		t := isoTime(*sa.RotatedAt)
		out.RotatedAt = &t
	}
	return out
}

type serviceAccountBody struct {
	Name         *string   `json:"name"`
	Description  *string   `json:"description"`
	Scopes       *[]string `json:"scopes"`
	RedirectURIs *[]string `json:"redirectUris"`
	Tier         *string   `json:"tier"`
}

// POST /api/v1/service-accounts
func (a *api) createServiceAccount(w http.ResponseWriter, r *http.Request) {
	var body serviceAccountBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	in := serviceaccounts.Input{Name: deref(body.Name), Description: deref(body.Description)}
	if body.Scopes != nil {
		in.Scopes = *body.Scopes
	}
	if body.RedirectURIs != nil {
		in.RedirectURIs = *body.RedirectURIs
	}
	if body.Tier != nil {
		if *body.Tier == "" { // only absence means the default
			var v extensions.ValidationError
			v.Add("tier", "must be free, startup or enterprise")
			writeError(w, r, v.Err())
			return
		}
		in.Tier = *body.Tier
	}
	sa, secret, err := a.serviceAccounts.Create(r.Context(), in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/service-accounts/"+sa.ID)
	writeJSON(w, http.StatusCreated, toServiceAccountJSON(sa, secret))
}

// GET /api/v1/service-accounts
func (a *api) listServiceAccounts(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.serviceAccounts.List(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "serviceAccounts", list, total, page, func(x *persistence.ServiceAccount) serviceAccountJSON { return toServiceAccountJSON(x, "") })
}

// GET /api/v1/service-accounts/{id}
func (a *api) getServiceAccount(w http.ResponseWriter, r *http.Request) {
	sa, err := a.serviceAccounts.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toServiceAccountJSON(sa, ""))
}

// PATCH /api/v1/service-accounts/{id}
func (a *api) updateServiceAccount(w http.ResponseWriter, r *http.Request) {
	var body serviceAccountBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	sa, err := a.serviceAccounts.Update(r.Context(), mux.Vars(r)["id"], serviceaccounts.Patch{
		Name: body.Name, Description: body.Description, Scopes: body.Scopes, RedirectURIs: body.RedirectURIs, Tier: body.Tier,
	})
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toServiceAccountJSON(sa, ""))
}

// DELETE /api/v1/service-accounts/{id}
func (a *api) deleteServiceAccount(w http.ResponseWriter, r *http.Request) {
	if err := a.serviceAccounts.Delete(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// POST /api/v1/service-accounts/{id}/rotate
func (a *api) rotateServiceAccount(w http.ResponseWriter, r *http.Request) {
	sa, secret, err := a.serviceAccounts.Rotate(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"clientId": sa.ClientID, "clientSecret": secret, "rotatedAt": isoTime(*sa.RotatedAt)})
}

// Page sizes of every list endpoint.
const (
	defaultLimit = 50
	maxLimit     = 200
)

// pageFrom reads limit and offset; a malformed or out-of-range value is a 400.
func pageFrom(r *http.Request) (persistence.Page, error) {
	p := persistence.Page{Limit: defaultLimit}
	q := r.URL.Query()
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return p, newError(http.StatusBadRequest, "invalid_request", "limit must be an integer from 1 to 200.", map[string]any{"field": "limit"})
		}
		p.Limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return p, newError(http.StatusBadRequest, "invalid_request", "offset must be a non-negative integer.", map[string]any{"field": "offset"})
		}
		p.Offset = n
	}
	return p, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
