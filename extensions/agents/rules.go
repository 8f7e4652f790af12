// Package agents holds the rules for AI agents: types, capabilities, trust
// levels, the scopes they allow, and the kill switch.
package agents

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Agent types (spec: Agent).
var Types = []string{"autonomous", "user-delegated", "service"}

// Trust levels, lowest first (spec: Agent trust level).
const (
	Sandboxed  = "sandboxed"
	Registered = "registered"
	Verified   = "verified"
	Privileged = "privileged"
)

// TrustLevels lists the levels in order.
var TrustLevels = []string{Sandboxed, Registered, Verified, Privileged}

func rank(level string) int { return slices.Index(TrustLevels, level) }

// AtLeast tells whether trust level is min or higher (both known levels).
func AtLeast(level, min string) bool {
	return rank(level) >= 0 && rank(min) >= 0 && rank(level) >= rank(min)
}

// The built-in capabilities (spec: Agent). Only these are accepted: a name no
// route checks would grant nothing and hide a typo.
const (
	ReadUsers         = "read_users"
	WriteUsers        = "write_users"
	ReadTickets       = "read_tickets"
	SendNotifications = "send_notifications"
	ManageSessions    = "manage_sessions"
	ReadAnalytics     = "read_analytics"
	Delegate          = "delegate"
	A2AExchange       = "a2a_exchange"
)

// grant is a scope a capability allows from a trust level up.
type grant struct {
	scope    string
	minTrust string
}

// capabilityScopes is the one table of what each capability allows; it is
// copied in docs/decisions.md. Sandboxed agents get read scopes only;
// registered ones standard writes; verified ones delegation writes (and
// agent-to-agent exchange, checked at token exchange); privileged ones the
// admin-class scope of session management. No agent ever holds `admin`.
var capabilityScopes = map[string][]grant{
	ReadUsers:         {{"users:read", Sandboxed}},
	WriteUsers:        {{"users:write", Registered}},
	ReadTickets:       nil, // checked as a capability by the routes that serve tickets
	SendNotifications: nil, // likewise
	ManageSessions:    {{"users:admin", Privileged}},
	ReadAnalytics:     {{"analytics:read", Sandboxed}},
	Delegate:          {{"delegations:read", Registered}, {"delegations:write", Verified}},
	A2AExchange:       nil, // allows token exchange between agents, from verified up
}

// Capabilities lists the built-in capabilities, in the spec's order.
var Capabilities = []string{ReadUsers, WriteUsers, ReadTickets, SendNotifications, ManageSessions, ReadAnalytics, Delegate, A2AExchange}

// KnownCapability tells whether c is a built-in capability.
func KnownCapability(c string) bool { _, ok := capabilityScopes[c]; return ok }

// ScopesFor derives the scopes an agent may obtain from its capabilities and
// trust level, in catalog order.
func ScopesFor(capabilities []string, trust string) []string {
	out := []string{}
	for _, c := range capabilities {
		for _, g := range capabilityScopes[c] {
			if rank(trust) >= rank(g.minTrust) && !slices.Contains(out, g.scope) {
				out = append(out, g.scope)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Grantor tells whether the caller that gives capabilities holds a scope.
type Grantor func(scope string) bool

// AnyScope is a grantor that holds every scope: an admin.
func AnyScope(string) bool { return true }

// CheckGiven refuses capabilities given by a caller that does not hold
// every scope they allow, at any trust level (a promotion later derives
// them without asking again): an agents:write caller gives no more than
// it holds (issue 39). The refusal names the first scope missing.
func CheckGiven(given []string, by Grantor) error {
	for _, c := range given {
		for _, g := range capabilityScopes[c] {
			if !by(g.scope) {
				return extensions.NewError(http.StatusForbidden, "insufficient_scope",
					"The access token lacks a scope the capability allows; a caller gives no capability beyond its own scopes.",
					map[string]any{"requiredScope": g.scope, "capability": c})
			}
		}
	}
	return nil
}

// CheckTrustChange says whether an agent may move from one level to
// another: promotion one step at a time, demotion to any lower level. A
// refusal is a conflict (409): the request is valid, the agent's state is not.
func CheckTrustChange(from, to string) error {
	details := map[string]any{"from": from, "to": to, "next": nextLevel(from)}
	switch {
	case rank(to) < 0:
		return fmt.Errorf("unknown trust level %q", to)
	case to == from:
		return extensions.Conflict("trust_level_unchanged", "The agent is already at this trust level.", details)
	case rank(to) > rank(from)+1:
		return extensions.Conflict("trust_level_skipped", "Promotion goes one level at a time.", details)
	}
	return nil
}

func nextLevel(level string) string {
	if r := rank(level); r >= 0 && r+1 < len(TrustLevels) {
		return TrustLevels[r+1]
	}
	return ""
}

// Delegation decides who may exchange another principal's token for one of
// its own (RFC 8693 delegation): agents holding a2a_exchange at trust level
// verified or higher (spec: Agent trust level).
type Delegation struct{}

// MayDelegate implements oauth.DelegationPolicy.
func (Delegation) MayDelegate(c *persistence.Client) error {
	switch a := c.Agent; {
	case a == nil:
		return fosite.ErrUnauthorizedClient.WithHint("Only agents exchange tokens on behalf of others.")
	case !slices.Contains(a.Capabilities, A2AExchange):
		return fosite.ErrUnauthorizedClient.WithHint("The agent lacks the capability 'a2a_exchange'.")
	case rank(a.TrustLevel) < rank(Verified):
		return fosite.ErrUnauthorizedClient.WithHintf("Agent-to-agent exchange needs trust level verified or higher; the agent is %s.", a.TrustLevel)
	}
	return nil
}
