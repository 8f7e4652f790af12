package webhooks

import (
	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/ciba"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/extensions/jit"
	"github.com/identityd/identityd/persistence"
)

// EventType is one kind of message an endpoint can ask for.
type EventType struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// From: the event log entries published as this type, "source:type"
	// (see persistence.RouteWebhooks).
	From []string `json:"-"`
}

// TestEvent is the type of the message POST /webhooks/{id}/test sends; no
// endpoint subscribes to it.
const TestEvent = "webhook.test"

// Catalog is every event type, in the order docs/api.md lists them.
var Catalog = []EventType{
	{Name: "user.signed_in", Description: "A person signed in.", From: []string{"auth:" + persistence.EventSignIn}},
	{Name: "user.sign_in_failed", Description: "A sign-in failed (reason: a stable code, never the secret).", From: []string{"auth:" + persistence.EventSignInFailed}},
	{Name: "user.created", Description: "A person was created (admin, invite, or a first sign-in).", From: []string{"directory:" + directory.UserCreated}},
	{Name: "user.updated", Description: "A person's record changed.", From: []string{"directory:" + directory.UserUpdated}},
	{Name: "user.deleted", Description: "A person was deleted.", From: []string{"directory:" + directory.UserDeleted}},
	{Name: "user.mfa_enabled", Description: "A second factor (TOTP or a passkey) was added.", From: []string{"auth:" + persistence.EventMFAEnabled}},
	{Name: "user.mfa_disabled", Description: "A second factor was removed.", From: []string{"auth:" + persistence.EventMFADisabled}},
	{Name: "user.identity_linked", Description: "A sign-in method or upstream identity was linked to a person.", From: []string{"auth:" + persistence.EventIdentityLinked}},
	{Name: "user.identity_unlinked", Description: "A linked identity was removed.", From: []string{"auth:" + persistence.EventIdentityUnlinked}},
	{Name: "user.password_reset", Description: "A person reset their password through an e-mailed link.", From: []string{"auth:" + persistence.EventResetCompleted}},
	{Name: "session.ended", Description: "A sign-in session ended (reason: logout, admin, expired, ...).", From: []string{"auth:" + persistence.EventSessionEnded}},
	{Name: "agent.killed", Description: "An agent was killed (kill switch).", From: []string{"agent:" + agents.ActionKilled}},
	{Name: "agent.recovered", Description: "A killed agent was recovered.", From: []string{"agent:" + agents.ActionRecovered}},
	{Name: "agent.trust_changed", Description: "An agent's trust level changed.", From: []string{"agent:" + agents.ActionTrustChanged}},
	{Name: "hitl.requested", Description: "An agent's action waits for a person's approval.", From: []string{"agent:" + hitl.ActionRequested}},
	{Name: "hitl.decided", Description: "An approval request was approved, denied or timed out.",
		From: []string{"agent:" + hitl.ActionApproved, "agent:" + hitl.ActionDenied, "agent:" + hitl.ActionTimedOut}},
	{Name: "jit.granted", Description: "A just-in-time grant became active.", From: []string{"agent:" + jit.ActionActivated}},
	{Name: "jit.revoked", Description: "A just-in-time grant was revoked.", From: []string{"agent:" + jit.ActionRevoked}},
	{Name: "delegation.decided", Description: "A person approved or denied an agent's delegation request (CIBA).",
		From: []string{"agent:" + ciba.ActionApproved, "agent:" + ciba.ActionDenied}},
	{Name: "delegation.revoked", Description: "A delegation was revoked (by the person, a service account, or a kill).", From: []string{"agent:" + ciba.ActionRevoked}},
	{Name: "invite.sent", Description: "An invitation was sent.", From: []string{"directory:" + directory.InviteSent}},
	{Name: "invite.accepted", Description: "An invitation was accepted.", From: []string{"directory:" + directory.InviteAccepted}},
}

// Routes maps the event logs' entries to the types they are published as
// (for persistence.RouteWebhooks).
func Routes() map[string]string {
	out := map[string]string{}
	for _, t := range Catalog {
		for _, f := range t.From {
			out[f] = t.Name
		}
	}
	return out
}

// known tells whether name is in the catalog.
func known(name string) bool {
	for _, t := range Catalog {
		if t.Name == name {
			return true
		}
	}
	return false
}
