package oauth

import "slices"

// ScopeAdmin marks an admin token (see DESIGN: decisions already taken).
const ScopeAdmin = "admin"

// Scopes is the catalog a service account may hold: the spec's scope table,
// the API-key scopes it names, tokens:introspect and admin.
var Scopes = []string{
	"users:read", "users:write", "users:invite", "users:admin",
	"orgs:read", "orgs:write",
	"analytics:read",
	"agents:read", "agents:write",
	"delegations:read", "delegations:write",
	"roles:manage", "roles:read",
	"authz:check", "authz:write",
	"api-keys:issue", "api-keys:read", "api-keys:revoke",
	ScopeIntrospect,
	ScopeAdmin,
}

// KnownScope tells whether s is in the catalog.
func KnownScope(s string) bool { return slices.Contains(Scopes, s) }
