package jit

import "testing"

func TestGrantable(t *testing.T) {
	for scope, want := range map[string]bool{
		"orgs:write": true, "users:read": true, "roles:read": true,
		"admin": false, "agents:read": false, "agents:write": false, "tokens:introspect": false, "nope": false, "": false,
		"roles:manage": false, "users:admin": false, "users:write": true, "delegations:write": true,
	} {
		if got := Grantable(scope); got != want {
			t.Errorf("Grantable(%q) = %v, want %v", scope, got, want)
		}
	}
}
