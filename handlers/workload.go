package handlers

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/workload"
	"github.com/identityd/identityd/persistence"
)

// issuerJSON is the API shape of a trusted issuer (spec: Trusted issuer).
type issuerJSON struct {
	ID                 string   `json:"id"`
	Name               string   `json:"name"`
	IssuerURL          string   `json:"issuerUrl"`
	JWKSURI            string   `json:"jwksUri"`
	Platform           string   `json:"platform"`
	AllowedAudiences   []string `json:"allowedAudiences"`
	AllowedSubjects    []string `json:"allowedSubjects"`
	MaxTokenAgeSeconds int      `json:"maxTokenAgeSeconds"`
	CreatedAt          string   `json:"createdAt"`
	UpdatedAt          string   `json:"updatedAt"`
}

func toIssuerJSON(is *persistence.WorkloadIssuer) issuerJSON {
	return issuerJSON{
		ID: is.ID, Name: is.Name, IssuerURL: is.IssuerURL, JWKSURI: is.JWKSURI, Platform: is.Platform,
		AllowedAudiences: is.AllowedAudiences, AllowedSubjects: is.AllowedSubjects, MaxTokenAgeSeconds: is.MaxTokenAgeSeconds,
		CreatedAt: isoTime(is.CreatedAt), UpdatedAt: isoTime(is.UpdatedAt),
	}
}

// issuerBody is what POST and PATCH accept; PATCH changes the fields given.
type issuerBody struct {
	Name               *string   `json:"name"`
	IssuerURL          *string   `json:"issuerUrl"`
	JWKSURI            *string   `json:"jwksUri"`
	Platform           *string   `json:"platform"`
	AllowedAudiences   *[]string `json:"allowedAudiences"`
	AllowedSubjects    *[]string `json:"allowedSubjects"`
	MaxTokenAgeSeconds *int      `json:"maxTokenAgeSeconds"`
}

func (b issuerBody) input() workload.IssuerInput {
	return workload.IssuerInput{
		Name: b.Name, IssuerURL: b.IssuerURL, JWKSURI: b.JWKSURI, Platform: b.Platform,
		AllowedAudiences: b.AllowedAudiences, AllowedSubjects: b.AllowedSubjects, MaxTokenAgeSeconds: b.MaxTokenAgeSeconds,
	}
}

// POST /api/v1/workload-identity/issuers
func (a *api) createIssuer(w http.ResponseWriter, r *http.Request) {
	var body issuerBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	is, err := a.workload.CreateIssuer(r.Context(), body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/workload-identity/issuers/"+is.ID)
	writeJSON(w, http.StatusCreated, toIssuerJSON(is))
}

// GET /api/v1/workload-identity/issuers
func (a *api) listIssuers(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.workload.ListIssuers(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "issuers", list, total, page, toIssuerJSON)
}

// GET /api/v1/workload-identity/issuers/{id}
func (a *api) getIssuer(w http.ResponseWriter, r *http.Request) {
	is, err := a.workload.GetIssuer(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toIssuerJSON(is))
}

// PATCH /api/v1/workload-identity/issuers/{id}
func (a *api) updateIssuer(w http.ResponseWriter, r *http.Request) {
	var body issuerBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	is, err := a.workload.UpdateIssuer(r.Context(), mux.Vars(r)["id"], body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toIssuerJSON(is))
}

// DELETE /api/v1/workload-identity/issuers/{id}
func (a *api) deleteIssuer(w http.ResponseWriter, r *http.Request) {
	if err := a.workload.DeleteIssuer(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mappingJSON is the API shape of an identity mapping (spec: Identity mapping).
type mappingJSON struct {
	ID               string   `json:"id"`
	IssuerID         string   `json:"issuerId"`
	AgentClientID    string   `json:"agentClientId"`
	SubjectPattern   string   `json:"subjectPattern"`
	SubjectMatchType string   `json:"subjectMatchType"`
	Scopes           []string `json:"scopes"`
	CreatedAt        string   `json:"createdAt"`
}

func toMappingJSON(m *persistence.WorkloadMapping) mappingJSON {
	return mappingJSON{
		ID: m.ID, IssuerID: m.IssuerID, AgentClientID: m.AgentClientID, SubjectPattern: m.SubjectPattern,
		SubjectMatchType: m.SubjectMatchType, Scopes: m.Scopes, CreatedAt: isoTime(m.CreatedAt),
	}
}

// POST /api/v1/workload-identity/mappings
func (a *api) createMapping(w http.ResponseWriter, r *http.Request) {
	var body struct {
		IssuerID         string   `json:"issuerId"`
		AgentClientID    string   `json:"agentClientId"`
		SubjectPattern   string   `json:"subjectPattern"`
		SubjectMatchType string   `json:"subjectMatchType"`
		Scopes           []string `json:"scopes"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	m, err := a.workload.CreateMapping(r.Context(), workload.MappingInput{
		IssuerID: body.IssuerID, AgentClientID: body.AgentClientID, SubjectPattern: body.SubjectPattern,
		SubjectMatchType: body.SubjectMatchType, Scopes: body.Scopes,
	})
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/workload-identity/mappings/"+m.ID)
	writeJSON(w, http.StatusCreated, toMappingJSON(m))
}

// GET /api/v1/workload-identity/mappings[?issuerId=]
func (a *api) listMappings(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.workload.ListMappings(r.Context(), r.URL.Query().Get("issuerId"), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "mappings", list, total, page, toMappingJSON)
}

// GET /api/v1/workload-identity/mappings/{id}
func (a *api) getMapping(w http.ResponseWriter, r *http.Request) {
	m, err := a.workload.GetMapping(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toMappingJSON(m))
}

// DELETE /api/v1/workload-identity/mappings/{id}
func (a *api) deleteMapping(w http.ResponseWriter, r *http.Request) {
	if err := a.workload.DeleteMapping(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
