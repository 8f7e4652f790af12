package ciba

import (
	"testing"
	"time"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

func agentClient(typ, trust string, capabilities []string, scopes ...string) *persistence.Client {
	grants := []string{persistence.GrantClientCredentials}
	if typ == persistence.AgentUserDelegated {
		grants = append(grants, persistence.GrantCIBA)
	}
	return &persistence.Client{ID: "agt_x", Kind: persistence.KindAgent, Scopes: scopes, GrantTypes: grants,
		Agent: &persistence.AgentFacts{TrustLevel: trust, Capabilities: capabilities}}
}

func TestMayAsk(t *testing.T) {
	for _, c := range []struct {
		name   string
		client *persistence.Client
		ok     bool
	}{
		{"user-delegated, delegate, registered", agentClient("user-delegated", "registered", []string{"delegate"}), true},
		{"user-delegated, delegate, privileged", agentClient("user-delegated", "privileged", []string{"delegate"}), true},
		{"sandboxed", agentClient("user-delegated", "sandboxed", []string{"delegate"}), false},
		{"without delegate", agentClient("user-delegated", "verified", []string{"read_users"}), false},
		{"autonomous", agentClient("autonomous", "verified", []string{"delegate"}), false},
		{"a service account", &persistence.Client{ID: "sa_x", Kind: persistence.KindServiceAccount, GrantTypes: []string{"client_credentials"}}, false},
	} {
		if err := MayAsk(c.client); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

func TestDelegableAndRead(t *testing.T) {
	c := agentClient("user-delegated", "verified", []string{"delegate"}, "users:read", "users:write", "delegations:read")
	for _, x := range []struct {
		scope           string
		delegable, read bool
	}{
		{"openid", true, true}, {"email", true, true}, {"profile", true, true}, {"roles", true, true},
		{"offline_access", false, false}, // no refresh tokens
		{"users:read", true, true}, {"users:write", true, false},
		{"orgs:read", false, true}, // the agent does not hold it
		{"delegations:read", false, true}, {"admin", false, false}, {"tokens:introspect", false, false}, {"agents:read", false, true},
	} {
		if got := Delegable(c, x.scope); got != x.delegable {
			t.Errorf("Delegable(%s) = %v", x.scope, got)
		}
		if got := ReadScope(x.scope); got != x.read {
			t.Errorf("ReadScope(%s) = %v", x.scope, got)
		}
	}
}

func TestStatus(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		written string
		end     time.Duration
		want    string
	}{
		{"pending", time.Second, "pending"}, {"pending", 0, "expired"}, {"active", time.Second, "active"}, {"active", -time.Second, "expired"},
		{"denied", -time.Second, "denied"}, {"revoked", -time.Second, "revoked"},
	} {
		d := &persistence.Delegation{Status: c.written, ExpiresAt: now.Add(c.end)}
		if got := Status(d, now); got != c.want {
			t.Errorf("%s ending in %v: %s, want %s", c.written, c.end, got, c.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	text := `[{"type":"calendar","actions":["read"],"locations":["https://cal.example"],"calendar":"work"}]`
	d := &persistence.Delegation{Scopes: []string{"email", "weird:scope"}, AuthorizationDetails: &text, LifetimeSeconds: 3600}
	w := Describe(d)
	if w.Lifetime != "1 hour" || w.Scopes[0] != "See your e-mail address and whether it is verified (email)" || w.Scopes[1] != "Use the permission weird:scope (weird:scope)" ||
		w.Details[0] != `calendar: read at https://cal.example (calendar "work")` {
		t.Fatalf("%+v", w)
	}
	for secs, want := range map[int]string{1: "1 second", 90: "90 seconds", 120: "2 minutes", 7200: "2 hours", 86400: "1 day"} {
		if got := duration(time.Duration(secs) * time.Second); got != want {
			t.Errorf("%d s: %q", secs, got)
		}
	}
}

func TestPollAnswers(t *testing.T) {
	for _, e := range []error{oauth.ErrAuthorizationPending, oauth.ErrSlowDown.WithHint("x"), oauth.ErrCIBAAccessDenied, oauth.ErrExpiredToken} {
		if !oauth.PollAnswer(e) {
			t.Errorf("%v is a poll answer", e)
		}
	}
	if oauth.PollAnswer(errString("invalid_grant")) {
		t.Error("invalid_grant is no poll answer")
	}
}

type errString string

func (e errString) Error() string { return string(e) }
