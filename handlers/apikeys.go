package handlers

import (
	"errors"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/apikeys"
	"github.com/identityd/identityd/extensions/authz"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// End-user API keys of an application (issue 18; spec "What the service
// does" 8, Authentication 3). Rules live in extensions/apikeys.

const (
	apiKeysPath      = appScopedPath + "/api-keys"
	apiKeyValidate   = "/api/v1/m2m/api-keys/validate"
	scopeKeysIssue   = "api-keys:issue"
	scopeKeysRead    = "api-keys:read"
	scopeKeysRevoke  = "api-keys:revoke"
	unknownKeyReason = apikeys.ReasonNone
)

// apiKeyRoutes adds the per-application key routes (behind the grant, like
// every per-application route) and validation.
func (a *api) apiKeyRoutes(r *mux.Router, rl RateLimits) {
	if a.apiKeys == nil || a.authz == nil {
		return
	}
	perApp := func(scope, class string, rate Rate, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, "", a.limited(class, rate, byPrincipal, a.gated(a.committed(a.appGranted(h)))))
	}
	r.HandleFunc(apiKeysPath, perApp(scopeKeysIssue, "m2m-write", rl.M2MWrite, a.issueAPIKey)).Methods(http.MethodPost)
	r.HandleFunc(apiKeysPath, perApp(scopeKeysRead, "m2m-read", rl.M2MRead, a.listAPIKeys)).Methods(http.MethodGet)
	r.HandleFunc(apiKeysPath+"/{id}", perApp(scopeKeysRead, "m2m-read", rl.M2MRead, a.getAPIKey)).Methods(http.MethodGet)
	r.HandleFunc(apiKeysPath+"/{id}", perApp(scopeKeysRevoke, "m2m-delete", rl.M2MDelete, a.revokeAPIKey)).Methods(http.MethodDelete)
	// Validation is what a product calls on every request of its own
	// customers: it counts against the caller's tier only (not the M2M
	// POST limit of 30 a minute), changes nothing, and so runs in no unit
	// of work (which would bypass the caches). See docs/decisions.md.
	r.HandleFunc(apiKeyValidate, a.authenticated(scopeKeysRead, "", a.tierLimited(a.gated(a.validateAPIKey)))).Methods(http.MethodPost)
}

// apiKeyJSON is the API shape of a key; the key itself only in the answer
// that issues it.
type apiKeyJSON struct {
	ID            string         `json:"id"`
	ApplicationID string         `json:"applicationId"`
	Name          string         `json:"name"`
	Hint          string         `json:"hint"`
	Scopes        []string       `json:"scopes"`
	Metadata      map[string]any `json:"metadata"`
	Owner         apikeys.Owner  `json:"owner"`
	Status        string         `json:"status"` // active, revoked or expired
	ExpiresAt     *string        `json:"expiresAt"`
	RevokedAt     *string        `json:"revokedAt"`
	LastUsedAt    *string        `json:"lastUsedAt"`
	CreatedAt     string         `json:"createdAt"`
	IssuedBy      string         `json:"issuedBy"`
	Key           string         `json:"key,omitempty"`
}

func keyOwner(k *persistence.APIKey) apikeys.Owner {
	if k.UserID != nil {
		return apikeys.Owner{Type: apikeys.OwnerUser, ID: *k.UserID}
	}
	return apikeys.Owner{Type: apikeys.OwnerOrg, ID: deref(k.OrgID)}
}

func (a *api) toAPIKeyJSON(k *persistence.APIKey) apiKeyJSON {
	out := apiKeyJSON{ID: k.ID, ApplicationID: k.ApplicationID, Name: k.Name, Hint: k.Hint, Scopes: k.Scopes, Metadata: k.Metadata,
		Owner: keyOwner(k), Status: "active", ExpiresAt: isoPtr(k.ExpiresAt), RevokedAt: isoPtr(k.RevokedAt),
		LastUsedAt: isoPtr(a.apiKeys.LastUsed(k)), CreatedAt: isoTime(k.CreatedAt), IssuedBy: k.IssuedBy}
	switch {
	case k.RevokedAt != nil:
		out.Status = "revoked"
	case k.ExpiresAt != nil && !time.Now().Before(*k.ExpiresAt):
		out.Status = "expired"
	}
	if out.Scopes == nil {
		out.Scopes = []string{}
	}
	if out.Metadata == nil {
		out.Metadata = map[string]any{}
	}
	return out
}

type apiKeyBody struct {
	Name      string         `json:"name"`
	Scopes    []string       `json:"scopes"`
	ExpiresAt *time.Time     `json:"expiresAt"`
	Metadata  map[string]any `json:"metadata"`
	Owner     *apikeys.Owner `json:"owner"`
}

// POST /api/v1/m2m/applications/{appId}/api-keys: 201 with the key, once.
func (a *api) issueAPIKey(w http.ResponseWriter, r *http.Request) {
	var body apiKeyBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	appID := mux.Vars(r)["appId"]
	k, key, err := a.apiKeys.Issue(r.Context(), appID, principalFrom(r.Context()).ClientID(), apikeys.Input{
		Name: body.Name, Scopes: body.Scopes, ExpiresAt: body.ExpiresAt, Metadata: body.Metadata, Owner: body.Owner})
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := a.toAPIKeyJSON(k)
	out.Key = key
	w.Header().Set("Location", "/api/v1/m2m/applications/"+appID+"/api-keys/"+k.ID)
	w.Header().Set("Cache-Control", "no-store") // the key is shown once
	writeJSON(w, http.StatusCreated, out)
}

// GET /api/v1/m2m/applications/{appId}/api-keys
func (a *api) listAPIKeys(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	appID := mux.Vars(r)["appId"]
	if _, err := a.applications.Get(r.Context(), appID); err != nil { // an admin may name one that does not exist
		writeError(w, r, err)
		return
	}
	list, total, err := a.apiKeys.List(r.Context(), appID, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "apiKeys", list, total, page, a.toAPIKeyJSON)
}

// GET /api/v1/m2m/applications/{appId}/api-keys/{id}
func (a *api) getAPIKey(w http.ResponseWriter, r *http.Request) {
	k, err := a.apiKeys.Get(r.Context(), mux.Vars(r)["appId"], mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a.toAPIKeyJSON(k))
}

// DELETE /api/v1/m2m/applications/{appId}/api-keys/{id}: 204; once
// answered, no replica validates the key.
func (a *api) revokeAPIKey(w http.ResponseWriter, r *http.Request) {
	if _, err := a.apiKeys.Revoke(r.Context(), mux.Vars(r)["appId"], mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// POST /api/v1/m2m/api-keys/validate: {"key"} → whether it is valid, and
// whose it is. A key the caller's service account is not granted the
// application of is answered as unknown: validation must not tell other
// tenants' keys from made-up ones.
func (a *api) validateAPIKey(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Key *string `json:"key"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	if body.Key == nil || *body.Key == "" {
		var v extensions.ValidationError
		v.Add("key", "is required")
		writeError(w, r, v.Err())
		return
	}
	ctx := r.Context()
	st, err := a.apiKeys.Find(ctx, *body.Key)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if st.Key != nil {
		p := principalFrom(ctx)
		c := authz.Caller{Admin: p.HasScope(oauth.ScopeAdmin)}
		if p.Client.Kind == persistence.KindServiceAccount && p.ForItself() {
			c.ServiceAccountID = p.Client.RecordID
		}
		var refused *extensions.Error
		if err := a.authz.Admit(ctx, st.Key.ApplicationID, c); errors.As(err, &refused) && refused.Code == "application_not_granted" {
			st = apikeys.Status{Reason: unknownKeyReason}
		} else if err != nil {
			writeError(w, r, err)
			return
		} else {
			a.usage.Add(persistence.UsageApplication, st.Key.ApplicationID)
		}
	}
	st = a.apiKeys.Validity(st)
	if !st.Valid {
		writeJSON(w, http.StatusOK, map[string]any{"valid": false, "reason": st.Reason})
		return
	}
	k := st.Key
	writeJSON(w, http.StatusOK, map[string]any{
		"valid": true, "id": k.ID, "applicationId": k.ApplicationID, "name": k.Name, "owner": keyOwner(k),
		"scopes": nonNil(k.Scopes), "metadata": k.Metadata, "expiresAt": isoPtr(k.ExpiresAt),
	})
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
