package agents

import (
	"errors"
	"slices"
	"testing"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

func TestScopesFor(t *testing.T) {
	all := Capabilities
	cases := []struct {
		caps  []string
		trust string
		want  []string
	}{
		{all, Sandboxed, []string{"analytics:read", "users:read"}},
		{all, Registered, []string{"analytics:read", "delegations:read", "users:read", "users:write"}},
		{all, Verified, []string{"analytics:read", "delegations:read", "delegations:write", "users:read", "users:write"}},
		{all, Privileged, []string{"analytics:read", "delegations:read", "delegations:write", "users:admin", "users:read", "users:write"}},
		{[]string{WriteUsers}, Sandboxed, []string{}},
		{[]string{ReadTickets, SendNotifications, A2AExchange}, Privileged, []string{}},
		{nil, Privileged, []string{}},
	}
	for _, c := range cases {
		if got := ScopesFor(c.caps, c.trust); !slices.Equal(got, c.want) {
			t.Errorf("ScopesFor(%v, %s) = %v, want %v", c.caps, c.trust, got, c.want)
		}
	}
}

// Every scope the table can grant exists in the catalog, no agent can ever
// hold admin, and sandboxed agents only ever read.
func TestCapabilityTableIsSound(t *testing.T) {
	for _, s := range ScopesFor(Capabilities, Privileged) {
		if !oauth.KnownScope(s) || s == oauth.ScopeAdmin {
			t.Errorf("scope %q is not grantable to agents", s)
		}
	}
	for _, s := range ScopesFor(Capabilities, Sandboxed) {
		if len(s) < 5 || s[len(s)-5:] != ":read" {
			t.Errorf("sandboxed agents get %q, not a read scope", s)
		}
	}
	if len(Capabilities) != len(capabilityScopes) {
		t.Errorf("Capabilities lists %d, the table %d", len(Capabilities), len(capabilityScopes))
	}
}

func TestCheckTrustChange(t *testing.T) {
	cases := []struct {
		from, to string
		code     string // "" allowed; "invalid" a plain error
	}{
		{Sandboxed, Registered, ""},
		{Registered, Verified, ""},
		{Verified, Privileged, ""},
		{Sandboxed, Verified, "trust_level_skipped"},
		{Sandboxed, Privileged, "trust_level_skipped"},
		{Registered, Privileged, "trust_level_skipped"},
		{Privileged, Sandboxed, ""},
		{Verified, Registered, ""},
		{Registered, Registered, "trust_level_unchanged"},
		{Sandboxed, "root", "invalid"},
	}
	for _, c := range cases {
		err := CheckTrustChange(c.from, c.to)
		var ce *extensions.Error
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s→%s refused: %v", c.from, c.to, err)
		case c.code == "invalid" && (err == nil || errors.As(err, &ce)):
			t.Errorf("%s→%s: %v, want a plain error", c.from, c.to, err)
		case c.code != "" && c.code != "invalid" && (!errors.As(err, &ce) || ce.Code != c.code):
			t.Errorf("%s→%s: %v, want %s", c.from, c.to, err, c.code)
		}
	}
}

func TestDelegation(t *testing.T) {
	agent := func(trust string, caps ...string) *persistence.Client {
		return &persistence.Client{Kind: persistence.KindAgent, Agent: &persistence.AgentFacts{TrustLevel: trust, Capabilities: caps}}
	}
	for _, c := range []struct {
		name   string
		client *persistence.Client
		ok     bool
	}{
		{"verified with a2a_exchange", agent(Verified, A2AExchange), true},
		{"privileged with a2a_exchange", agent(Privileged, A2AExchange, ReadUsers), true},
		{"registered with a2a_exchange", agent(Registered, A2AExchange), false},
		{"verified without the capability", agent(Verified, ReadUsers, Delegate), false},
		{"service account", &persistence.Client{Kind: persistence.KindServiceAccount, Scopes: []string{"admin"}}, false},
	} {
		err := Delegation{}.MayDelegate(c.client)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
		if err != nil && !errors.Is(err, fosite.ErrUnauthorizedClient) {
			t.Errorf("%s: %v, want unauthorized_client", c.name, err)
		}
	}
}

// A capability is given only by a caller holding every scope it allows, at
// any trust level; capabilities that allow none need nothing.
func TestCheckGiven(t *testing.T) {
	holding := func(scopes ...string) Grantor { return func(s string) bool { return slices.Contains(scopes, s) } }
	cases := []struct {
		given           []string
		by              Grantor
		scope, refusing string // the scope and capability named, "" when given
	}{
		{[]string{ReadUsers, WriteUsers}, holding("users:read", "users:write"), "", ""},
		{[]string{ReadTickets, SendNotifications, A2AExchange}, holding(), "", ""},
		{nil, holding(), "", ""},
		{Capabilities, AnyScope, "", ""},
		{[]string{ReadUsers, ManageSessions}, holding("users:read", "users:write"), "users:admin", ManageSessions},
		{[]string{Delegate}, holding("delegations:read"), "delegations:write", Delegate}, // verified's scope too
		{[]string{ReadAnalytics}, holding("users:read"), "analytics:read", ReadAnalytics},
	}
	for _, c := range cases {
		err := CheckGiven(c.given, c.by)
		var refusal *extensions.Error
		switch {
		case c.scope == "" && err != nil:
			t.Errorf("%v: %v", c.given, err)
		case c.scope != "" && (!errors.As(err, &refusal) || refusal.Status != 403 || refusal.Code != "insufficient_scope" ||
			refusal.Details["requiredScope"] != c.scope || refusal.Details["capability"] != c.refusing):
			t.Errorf("%v: %v, want insufficient_scope naming %s and %s", c.given, err, c.scope, c.refusing)
		}
	}
}
