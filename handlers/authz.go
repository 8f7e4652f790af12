package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/authz"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Fine-grained authorization on the embedded OpenFGA engine (issue 17),
// and the per-application access of service accounts that identityd's own
// model decides. Rules live in extensions/authz.

const (
	authzPath      = "/api/v1/m2m/authz"
	appGrantsPath  = "/api/v1/applications/{id}/service-accounts"
	appScopedPath  = "/api/v1/m2m/applications/{appId}"
	authzCheckOnly = "authz:check"
	authzWrite     = "authz:write"
)

// authzRoutes adds the engine's routes, the admin's grants and the
// per-application M2M routes. None of the engine's routes runs in a unit of
// work of ours: the engine writes through its own connections, and on
// SQLite a unit holding the write lock would make it wait for itself.
func (a *api) authzRoutes(r *mux.Router, rl RateLimits) {
	if a.authz == nil {
		return
	}
	// The spec's M2M limits: reads 100/min, posts 30/min, per client. A
	// caller with many checks batches them (up to 50 a call).
	// Like every M2M route they pass the HITL gate (m2mActions), though no
	// agent holds an authz scope today (its scopes come from capabilities).
	read := func(scope string, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, "", a.limited("m2m-read", rl.M2MRead, byPrincipal, a.gated(h)))
	}
	write := func(scope string, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, "", a.limited("m2m-write", rl.M2MWrite, byPrincipal, a.gated(h)))
	}
	r.HandleFunc(authzPath+"/model", write(authzWrite, a.writeAuthzModel)).Methods(http.MethodPut)
	r.HandleFunc(authzPath+"/model", read(authzCheckOnly+"|"+authzWrite, a.readAuthzModel)).Methods(http.MethodGet)
	r.HandleFunc(authzPath+"/tuples", write(authzWrite, a.writeTuples)).Methods(http.MethodPost)
	r.HandleFunc(authzPath+"/tuples", read(authzWrite, a.readTuples)).Methods(http.MethodGet)
	r.HandleFunc(authzPath+"/check", write(authzCheckOnly, a.checkAuthz)).Methods(http.MethodPost)
	r.HandleFunc(authzPath+"/batch-check", write(authzCheckOnly, a.batchCheckAuthz)).Methods(http.MethodPost)
	r.HandleFunc(authzPath+"/list-objects", write(authzCheckOnly, a.listObjectsAuthz)).Methods(http.MethodPost)

	// The admin's grants: not in a unit of work either (the engine writes).
	admin := func(h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(oauth.ScopeAdmin, "", a.limited("admin", rl.Admin, byPrincipal, h))
	}
	r.HandleFunc(appGrantsPath, admin(a.listAppGrants)).Methods(http.MethodGet)
	r.HandleFunc(appGrantsPath+"/{serviceAccountId}", admin(a.grantApp)).Methods(http.MethodPut)
	r.HandleFunc(appGrantsPath+"/{serviceAccountId}", admin(a.withdrawApp)).Methods(http.MethodDelete)

	// Per-application M2M routes: the route's scope, then the grant.
	m2mRead := func(scope, capability string, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, capability, a.limited("m2m-read", rl.M2MRead, byPrincipal, a.gated(a.committed(a.appGranted(h)))))
	}
	r.HandleFunc(appScopedPath+"/users", m2mRead("users:read", agents.ReadUsers, a.listAppUsers)).Methods(http.MethodGet)
	r.HandleFunc(appScopedPath+"/sessions", m2mRead("users:admin", agents.ManageSessions, a.listAppSessions)).Methods(http.MethodGet)
}

// appGranted guards a per-application route: the caller must be granted
// the application named by the path's {appId} (extensions/authz Admit).
// The end-user API keys of the next issue sit behind the same guard.
func (a *api) appGranted(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := uuid.Parse(mux.Vars(r)["appId"])
		if err != nil {
			writeError(w, r, persistence.ErrNotFound)
			return
		}
		p := principalFrom(r.Context())
		c := authz.Caller{Admin: p.HasScope(oauth.ScopeAdmin)}
		if p.Client.Kind == persistence.KindServiceAccount && p.ForItself() {
			c.ServiceAccountID = p.Client.RecordID
		}
		if err := a.authz.Admit(r.Context(), id.String(), c); err != nil {
			writeError(w, r, err)
			return
		}
		next(w, r)
	}
}

// readJSONObject reads a JSON body the decoder cannot take strictly into a
// struct (a model is OpenFGA's, open-ended): JSON media type, text the
// stores hold, one object.
func readJSONObject(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, newError(http.StatusUnsupportedMediaType, "unsupported_media_type", "The body must be application/json.", nil)
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, jsonError(err)
	}
	var probe map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&probe); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, newError(http.StatusBadRequest, "invalid_json", "The body is not a single valid JSON value.", nil)
	}
	if probe == nil {
		return nil, newError(http.StatusBadRequest, "invalid_json", "The body must be a JSON object.", nil)
	}
	if p := jsonTextProblem(body); p != nil {
		return nil, p
	}
	return body, nil
}

// PUT /api/v1/m2m/authz/model: a new version of the deployment's model.
func (a *api) writeAuthzModel(w http.ResponseWriter, r *http.Request) {
	body, err := readJSONObject(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	m, err := authz.ParseModel(body)
	if err != nil {
		writeError(w, r, err)
		return
	}
	stored, err := a.authz.WriteModel(r.Context(), m)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, authz.ModelJSON(stored))
}

// GET /api/v1/m2m/authz/model: the newest version, or ?id= one.
func (a *api) readAuthzModel(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if len(id) > 64 {
		writeError(w, r, newError(http.StatusNotFound, "model_not_found", "No authorization model has that id.", nil))
		return
	}
	m, err := a.authz.Model(r.Context(), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, authz.ModelJSON(m))
}

// POST /api/v1/m2m/authz/tuples: writes and deletes, all or none.
func (a *api) writeTuples(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Writes  []authz.Tuple `json:"writes"`
		Deletes []authz.Tuple `json:"deletes"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	if err := a.authz.WriteTuples(r.Context(), body.Writes, body.Deletes); err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"written": len(body.Writes), "deleted": len(body.Deletes)})
}

// cursorPage reads limit and cursor of the engine's cursor-paged lists.
func cursorPage(r *http.Request) (int, string, error) {
	q := r.URL.Query()
	limit := authz.DefaultPageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > authz.MaxPageSize {
			return 0, "", newError(http.StatusBadRequest, "invalid_request", "limit must be an integer from 1 to 100.", map[string]any{"field": "limit"})
		}
		limit = n
	}
	cursor := q.Get("cursor")
	if len(cursor) > 2048 {
		return 0, "", newError(http.StatusBadRequest, "invalid_cursor", "The cursor is not one a previous page gave.", map[string]any{"field": "cursor"})
	}
	return limit, cursor, nil
}

// GET /api/v1/m2m/authz/tuples?user=&relation=&object=&limit=&cursor=
func (a *api) readTuples(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, cursor, err := cursorPage(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, next, err := a.authz.ReadTuples(r.Context(), authz.Tuple{User: q.Get("user"), Relation: q.Get("relation"), Object: q.Get("object")}, limit, cursor)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := map[string]any{"tuples": list, "nextCursor": nil}
	if next != "" {
		out["nextCursor"] = next
	}
	writeJSON(w, http.StatusOK, out)
}

// POST /api/v1/m2m/authz/check: {user, relation, object,
// contextualTuples?, context?} → {"allowed": bool}.
func (a *api) checkAuthz(w http.ResponseWriter, r *http.Request) {
	var body authz.Check
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	ok, err := a.authz.Check(r.Context(), body)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"allowed": ok})
}

// POST /api/v1/m2m/authz/batch-check: {"checks": [...]} → {"results":
// [...]}, one per check, in order.
func (a *api) batchCheckAuthz(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Checks []authz.Check `json:"checks"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	results, err := a.authz.BatchCheck(r.Context(), body.Checks)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// POST /api/v1/m2m/authz/list-objects: {user, relation, type,
// contextualTuples?, context?} → {"objects": [...]}.
func (a *api) listObjectsAuthz(w http.ResponseWriter, r *http.Request) {
	var body struct {
		User             string         `json:"user"`
		Relation         string         `json:"relation"`
		Type             string         `json:"type"`
		ContextualTuples []authz.Tuple  `json:"contextualTuples"`
		Context          map[string]any `json:"context"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	objects, err := a.authz.ListObjects(r.Context(), body.User, body.Relation, body.Type, body.ContextualTuples, body.Context)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"objects": objects})
}

// grantTarget reads the application and service account a grant route
// names (both must exist).
func (a *api) grantTarget(r *http.Request) (*persistence.Application, *persistence.ServiceAccount, error) {
	app, err := a.applications.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		return nil, nil, err
	}
	sa, err := a.serviceAccounts.Get(r.Context(), mux.Vars(r)["serviceAccountId"])
	if err != nil {
		return nil, nil, extensions.NewError(http.StatusNotFound, "not_found", "No service account has that id.", map[string]any{"field": "serviceAccountId"})
	}
	return app, sa, nil
}

// PUT /api/v1/applications/{id}/service-accounts/{serviceAccountId}: the
// service account may call the application's per-application M2M routes.
// Granting again changes nothing.
func (a *api) grantApp(w http.ResponseWriter, r *http.Request) {
	app, sa, err := a.grantTarget(r)
	if err == nil {
		err = a.authz.Grant(r.Context(), app.ID, sa.ID)
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"applicationId": app.ID, "serviceAccountId": sa.ID, "granted": true})
}

// DELETE /api/v1/applications/{id}/service-accounts/{serviceAccountId}:
// withdraws the grant (a grant that does not exist is withdrawn already).
func (a *api) withdrawApp(w http.ResponseWriter, r *http.Request) {
	app, sa, err := a.grantTarget(r)
	if err == nil {
		err = a.authz.Withdraw(r.Context(), app.ID, sa.ID)
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// GET /api/v1/applications/{id}/service-accounts?limit=&cursor=
func (a *api) listAppGrants(w http.ResponseWriter, r *http.Request) {
	app, err := a.applications.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	limit, cursor, err := cursorPage(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, next, err := a.authz.Grants(r.Context(), app.ID, limit, cursor)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := map[string]any{"serviceAccounts": list, "nextCursor": nil}
	if next != "" {
		out["nextCursor"] = next
	}
	writeJSON(w, http.StatusOK, out)
}

// GET /api/v1/m2m/applications/{appId}/users: the people who have signed
// in through the application.
func (a *api) listAppUsers(w http.ResponseWriter, r *http.Request) {
	appList(a, w, r, "users", a.directory.ApplicationUsers, toUserJSON)
}

// GET /api/v1/m2m/applications/{appId}/sessions: the live sessions begun
// through the application.
func (a *api) listAppSessions(w http.ResponseWriter, r *http.Request) {
	appList(a, w, r, "sessions", a.signin.ApplicationSessions, toSessionJSON)
}

// appList answers one page of an application's records, read by list.
func appList[T, J any](a *api, w http.ResponseWriter, r *http.Request, plural string,
	list func(ctx context.Context, appID string, p persistence.Page) ([]T, int, error), shape func(*T) J) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	app, err := a.applications.Get(r.Context(), mux.Vars(r)["appId"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	records, total, err := list(r.Context(), app.ID, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, plural, records, total, page, shape)
}
