package handlers

import (
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/persistence"
)

// rarTypeFields are the fields an admin sets on a type (spec: RAR
// authorization type; readOnlyActions and requiredCapabilities are ours):
// the body of POST and PUT.
type rarTypeFields struct {
	Type                 string          `json:"type"`
	DisplayName          string          `json:"displayName"`
	Description          string          `json:"description"`
	AllowedActions       []string        `json:"allowedActions"`
	AllowedLocations     []string        `json:"allowedLocations"`
	ReadOnlyActions      []string        `json:"readOnlyActions"`
	RequiredCapabilities []string        `json:"requiredCapabilities"`
	Schema               json.RawMessage `json:"schema,omitempty"`
}

func (b rarTypeFields) input() rar.Input {
	return rar.Input{
		Type: b.Type, DisplayName: b.DisplayName, Description: b.Description, AllowedActions: b.AllowedActions,
		AllowedLocations: b.AllowedLocations, ReadOnlyActions: b.ReadOnlyActions, RequiredCapabilities: b.RequiredCapabilities, Schema: b.Schema,
	}
}

// rarTypeJSON is the API shape of a type. The list leaves the schema out;
// one type carries it.
type rarTypeJSON struct {
	rarTypeFields
	CreatedAt string `json:"createdAt"`
	UpdatedAt string `json:"updatedAt"`
}

func toRARTypeJSON(t *persistence.RARType, withSchema bool) rarTypeJSON {
	out := rarTypeJSON{rarTypeFields: rarTypeFields{
		Type: t.Type, DisplayName: t.DisplayName, Description: t.Description,
		AllowedActions: t.AllowedActions, AllowedLocations: t.AllowedLocations, ReadOnlyActions: t.ReadOnlyActions,
		RequiredCapabilities: t.RequiredCapabilities,
	}, CreatedAt: isoTime(t.CreatedAt), UpdatedAt: isoTime(t.UpdatedAt)}
	if withSchema {
		out.Schema = json.RawMessage(t.Schema)
	}
	return out
}

// POST /api/v1/rar/types
func (a *api) createRARType(w http.ResponseWriter, r *http.Request) {
	var body rarTypeFields
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	t, err := a.rar.Create(r.Context(), body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/rar/types/"+t.Type)
	writeJSON(w, http.StatusCreated, toRARTypeJSON(t, true))
}

// GET /api/v1/rar/types
func (a *api) listRARTypes(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.rar.List(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "types", list, total, page, func(t *persistence.RARType) rarTypeJSON { return toRARTypeJSON(t, false) })
}

// GET /api/v1/rar/types/{type}
func (a *api) getRARType(w http.ResponseWriter, r *http.Request) {
	t, err := a.rar.Get(r.Context(), mux.Vars(r)["type"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toRARTypeJSON(t, true))
}

// PUT /api/v1/rar/types/{type}
func (a *api) replaceRARType(w http.ResponseWriter, r *http.Request) {
	var body rarTypeFields
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	t, err := a.rar.Replace(r.Context(), mux.Vars(r)["type"], body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toRARTypeJSON(t, true))
}

// DELETE /api/v1/rar/types/{type}
func (a *api) deleteRARType(w http.ResponseWriter, r *http.Request) {
	if err := a.rar.Delete(r.Context(), mux.Vars(r)["type"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// POST /api/v1/rar/validate: a dry run of the token endpoint's checks. A
// body that is not an authorization_details array is a 400; entries that
// would be refused are answered 200 with valid false and every problem
// found. An agent caller meets its own capability ceiling, as it would at
// the token endpoint.
func (a *api) validateRAR(w http.ResponseWriter, r *http.Request) {
	var body struct {
		AuthorizationDetails json.RawMessage `json:"authorization_details"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	if len(body.AuthorizationDetails) == 0 {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "Field \"authorization_details\" is required.", map[string]any{"field": "authorization_details"}))
		return
	}
	entries, err := rar.Parse(body.AuthorizationDetails)
	if err != nil {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_authorization_details", err.Error()+".", map[string]any{"field": "authorization_details"}))
		return
	}
	p := principalFrom(r.Context())
	problems, _, err := a.rar.Check(r.Context(), entries, rar.CeilingOf(p.Agent))
	if err != nil {
		writeError(w, r, err)
		return
	}
	if problems == nil {
		problems = []rar.Problem{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"valid": len(problems) == 0, "errors": problems})
}
