package handlers

import (
	"errors"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// userJSON is the API shape of a user (ours: the spec shows none). The
// password is never returned; hasPassword says whether one is set.
type userJSON struct {
	ID            string         `json:"id"`
	Email         string         `json:"email"`
	EmailVerified bool           `json:"emailVerified"`
	Name          string         `json:"name"`
	FirstName     string         `json:"firstName"`
	LastName      string         `json:"lastName"`
	Status        string         `json:"status"`
	Metadata      map[string]any `json:"metadata"`
	HasPassword   bool           `json:"hasPassword"`
	CreatedAt     string         `json:"createdAt"`
	UpdatedAt     string         `json:"updatedAt"`
	LastSignInAt  *string        `json:"lastSignInAt"`
	ConsoleAdmin  bool           `json:"consoleAdmin"`
}

func toUserJSON(u *persistence.User) userJSON {
	out := userJSON{
		ID: u.ID, Email: u.Email, EmailVerified: u.EmailVerified, Name: u.Name, FirstName: u.FirstName, LastName: u.LastName,
		Status: u.Status, Metadata: u.Metadata, HasPassword: u.PasswordHash != nil, CreatedAt: isoTime(u.CreatedAt), UpdatedAt: isoTime(u.UpdatedAt),
		ConsoleAdmin: u.ConsoleAdmin,
	}
	if out.Metadata == nil {
		out.Metadata = map[string]any{}
	}
	if u.LastSignInAt != nil {
		t := isoTime(*u.LastSignInAt)
		out.LastSignInAt = &t
	}
	return out
}

// userBody is what POST and PATCH accept.
type userBody struct {
	Email         *string         `json:"email"`
	EmailVerified *bool           `json:"emailVerified"`
	Name          *string         `json:"name"`
	FirstName     *string         `json:"firstName"`
	LastName      *string         `json:"lastName"`
	Status        *string         `json:"status"`
	Metadata      *map[string]any `json:"metadata"`
	Password      *string         `json:"password"`
}

func (b userBody) input() directory.UserInput {
	return directory.UserInput{Email: b.Email, EmailVerified: b.EmailVerified, Name: b.Name, FirstName: b.FirstName,
		LastName: b.LastName, Status: b.Status, Metadata: b.Metadata, Password: b.Password}
}

// POST /api/v1/m2m/users
func (a *api) createUser(w http.ResponseWriter, r *http.Request) {
	var body userBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	u, err := a.directory.CreateUser(r.Context(), actor(r), body.input())
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/m2m/users/"+u.ID)
	writeJSON(w, http.StatusCreated, toUserJSON(u))
}

// GET /api/v1/m2m/users?email=&q=&status=
func (a *api) listUsers(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	list, total, err := a.directory.ListUsers(r.Context(), persistence.UserFilter{Email: q.Get("email"), Q: q.Get("q"), Status: q.Get("status")}, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "users", list, total, page, toUserJSON)
}

// GET /api/v1/m2m/users/{id}
func (a *api) getUser(w http.ResponseWriter, r *http.Request) {
	u, err := a.directory.GetUser(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toUserJSON(u))
}

// PATCH /api/v1/m2m/users/{id}
func (a *api) updateUser(w http.ResponseWriter, r *http.Request) {
	var body userBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	in := body.input()
	u, err := a.directory.UpdateUser(r.Context(), actor(r), powers(r), mux.Vars(r)["id"], in)
	// In the disabling's unit of work: the person's delegations to agents
	// are revoked with it (the request and the revocations commit
	// together, and no replica lets their tokens through once answered).
	if err == nil && a.ciba != nil && in.Status != nil && u.Status == directory.StatusDisabled {
		err = a.ciba.RevokeUser(r.Context(), u.ID, actor(r))
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toUserJSON(u))
}

// powers is what the caller's token holds beyond the route's own scope
// (directory.Powers): admin holds every power.
func powers(r *http.Request) directory.Powers {
	p := principalFrom(r.Context())
	admin := p.HasScope(oauth.ScopeAdmin)
	return directory.Powers{Admin: admin, UsersAdmin: admin || p.HasScope("users:admin")}
}

// PUT and DELETE /api/v1/m2m/users/{id}/console-admin: admin only, both
// idempotent, both answer the user after the change.
func (a *api) setConsoleAdmin(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u, err := a.directory.SetConsoleAdmin(r.Context(), actor(r), mux.Vars(r)["id"], on)
		if err != nil {
			writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, toUserJSON(u))
	}
}

// DELETE /api/v1/m2m/users/{id}
func (a *api) deleteUser(w http.ResponseWriter, r *http.Request) {
	if err := a.directory.DeleteUser(r.Context(), actor(r), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// orgJSON is the API shape of an organization (ours).
type orgJSON struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Slug      string         `json:"slug"`
	Metadata  map[string]any `json:"metadata"`
	CreatedAt string         `json:"createdAt"`
	UpdatedAt string         `json:"updatedAt"`
}

func toOrgJSON(o *persistence.Org) orgJSON {
	out := orgJSON{ID: o.ID, Name: o.Name, Slug: o.Slug, Metadata: o.Metadata, CreatedAt: isoTime(o.CreatedAt), UpdatedAt: isoTime(o.UpdatedAt)}
	if out.Metadata == nil {
		out.Metadata = map[string]any{}
	}
	return out
}

type orgBody struct {
	Name     *string         `json:"name"`
	Slug     *string         `json:"slug"`
	Metadata *map[string]any `json:"metadata"`
}

// POST /api/v1/m2m/orgs
func (a *api) createOrg(w http.ResponseWriter, r *http.Request) {
	var body orgBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	o, err := a.directory.CreateOrg(r.Context(), actor(r), directory.OrgInput{Name: body.Name, Slug: body.Slug, Metadata: body.Metadata})
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/api/v1/m2m/orgs/"+o.ID)
	writeJSON(w, http.StatusCreated, toOrgJSON(o))
}

// GET /api/v1/m2m/orgs
func (a *api) listOrgs(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.directory.ListOrgs(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "orgs", list, total, page, toOrgJSON)
}

// GET /api/v1/m2m/orgs/{id}
func (a *api) getOrg(w http.ResponseWriter, r *http.Request) {
	o, err := a.directory.GetOrg(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toOrgJSON(o))
}

// PATCH /api/v1/m2m/orgs/{id}
func (a *api) updateOrg(w http.ResponseWriter, r *http.Request) {
	var body orgBody
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	o, err := a.directory.UpdateOrg(r.Context(), actor(r), mux.Vars(r)["id"], directory.OrgInput{Name: body.Name, Slug: body.Slug, Metadata: body.Metadata})
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toOrgJSON(o))
}

// DELETE /api/v1/m2m/orgs/{id}
func (a *api) deleteOrg(w http.ResponseWriter, r *http.Request) {
	if err := a.directory.DeleteOrg(r.Context(), actor(r), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// memberJSON is the API shape of a membership (ours).
type memberJSON struct {
	UserID   string `json:"userId"`
	Email    string `json:"email"`
	Name     string `json:"name"`
	Role     string `json:"role"`
	JoinedAt string `json:"joinedAt"`
}

func toMemberJSON(m *persistence.Member) memberJSON {
	return memberJSON{UserID: m.UserID, Email: m.Email, Name: m.Name, Role: m.Role, JoinedAt: isoTime(m.JoinedAt)}
}

// GET /api/v1/m2m/orgs/{id}/members
func (a *api) listMembers(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.directory.Members(r.Context(), mux.Vars(r)["id"], page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "members", list, total, page, toMemberJSON)
}

// POST /api/v1/m2m/orgs/{id}/members
func (a *api) addMember(w http.ResponseWriter, r *http.Request) {
	var body struct {
		UserID string `json:"userId"`
		Role   string `json:"role"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	m, err := a.directory.AddMember(r.Context(), actor(r), mux.Vars(r)["id"], body.UserID, body.Role)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toMemberJSON(m))
}

// DELETE /api/v1/m2m/orgs/{id}/members/{userId}
func (a *api) removeMember(w http.ResponseWriter, r *http.Request) {
	if err := a.directory.RemoveMember(r.Context(), actor(r), mux.Vars(r)["id"], mux.Vars(r)["userId"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// roleJSON is the API shape of a role (ours).
type roleJSON struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	CreatedAt   string `json:"createdAt"`
}

func toRoleJSON(r *persistence.Role) roleJSON {
	return roleJSON{Name: r.Name, Description: r.Description, CreatedAt: isoTime(r.CreatedAt)}
}

func toRolesJSON(list []persistence.Role) []roleJSON {
	out := make([]roleJSON, len(list))
	for i := range list {
		out[i] = toRoleJSON(&list[i])
	}
	return out
}

// POST /api/v1/m2m/roles
func (a *api) createRole(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name        string `json:"name"`
		Description string `json:"description"`
	}
	if err := decodeJSON(r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	role, err := a.directory.CreateRole(r.Context(), actor(r), body.Name, body.Description)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toRoleJSON(role))
}

// GET /api/v1/m2m/roles
func (a *api) listRoles(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.directory.ListRoles(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "roles", list, total, page, toRoleJSON)
}

// DELETE /api/v1/m2m/roles/{name}
func (a *api) deleteRole(w http.ResponseWriter, r *http.Request) {
	if err := a.directory.DeleteRole(r.Context(), actor(r), powers(r), mux.Vars(r)["name"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// POST /api/v1/m2m/roles/assign and DELETE /api/v1/m2m/roles/remove, with
// userId and role in a JSON body: both idempotent, both answer the user's
// roles after the change.
func (a *api) changeRole(assign bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			UserID string `json:"userId"`
			Role   string `json:"role"`
		}
		if err := decodeJSON(r, &body); err != nil {
			writeError(w, r, err)
			return
		}
		change := a.directory.RemoveRole
		if assign {
			change = a.directory.AssignRole
		}
		roles, err := change(r.Context(), actor(r), powers(r), body.UserID, body.Role)
		var nf *directory.NotFoundError
		if errors.As(err, &nf) {
			err = newError(http.StatusNotFound, "not_found", "No such "+nf.What+".", map[string]any{"resource": nf.What})
		}
		if err != nil {
			writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"userId": body.UserID, "roles": toRolesJSON(roles)})
	}
}

// GET /api/v1/m2m/users/{id}/roles
func (a *api) userRoles(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	roles, err := a.directory.UserRoles(r.Context(), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"userId": id, "roles": toRolesJSON(roles)})
}
