package hitl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// TypeApproval is the authorization_details type that redeems an approval
// at the token endpoint: {"type": "hitl_approval", "requestId": "…"}. The
// entry granted names what was approved: requestId, action, resource.
const TypeApproval = oauth.TypeHITLApproval

// Redeem spends an approved request of the agent, once, and returns it.
// It must run in the unit of work that issues the token (the token
// endpoint runs one for such requests), so that a refused token request
// spends nothing and two redemptions cannot both succeed (row lock).
func (s *Service) Redeem(ctx context.Context, agent Agent, id string) (*persistence.HITLRequest, error) {
	r, err := s.Peek(ctx, id)
	if errors.Is(err, persistence.ErrNotFound) || (err == nil && r.AgentID != agent.ID) {
		return nil, errNotRedeemable("names no request of this agent")
	} else if err != nil {
		return nil, err
	}
	return s.store.UpdateHITLRequest(ctx, id, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
		now := s.now()
		switch {
		case Status(r, now) != persistence.HITLApproved:
			return nil, errNotRedeemable("is " + Status(r, now) + ", not approved")
		case r.RedeemedAt != nil:
			return nil, errNotRedeemable("was redeemed already")
		case !now.Before(r.ExpiresAt):
			return nil, errNotRedeemable("is past its validity")
		}
		r.RedeemedAt = &now
		return []persistence.AuditEntry{s.entry(r, agent.Actor, ActionRedeemed, now, map[string]any{"validUntil": r.ExpiresAt})}, nil
	})
}

// notRedeemable is a refusal of Redeem, answered as invalid_authorization_details.
type notRedeemable struct{ why string }

func (e notRedeemable) Error() string { return "the approval " + e.why }

func errNotRedeemable(why string) error { return notRedeemable{why} }

// Details is the token endpoint's authorization_details policy: entries of
// type hitl_approval redeem approvals (the agent's own, once); every other
// entry is the RAR registry's (next).
type Details struct {
	HITL *Service
	Next oauth.DetailsPolicy
}

var _ oauth.DetailsPolicy = Details{}

// Grant implements oauth.DetailsPolicy.
func (d Details) Grant(ctx context.Context, client *persistence.Client, text string) ([]any, []oauth.DetailCondition, error) {
	entries, err := rar.Parse([]byte(text))
	if err != nil {
		return nil, nil, oauth.InvalidDetails(err.Error() + ".")
	}
	var approval map[string]any
	at := -1
	var rest []any
	for i, e := range entries {
		if m, ok := e.(map[string]any); ok && m["type"] == TypeApproval {
			if approval != nil {
				return nil, nil, oauth.InvalidDetails("At most one hitl_approval entry per token.")
			}
			approval, at = m, i
			continue
		}
		rest = append(rest, e)
	}
	if approval == nil {
		if d.Next == nil {
			return nil, nil, oauth.InvalidDetails("No authorization details types are registered.")
		}
		return d.Next.Grant(ctx, client, text)
	}
	id, _ := approval["requestId"].(string)
	for k := range approval {
		if k != "type" && k != "requestId" {
			return nil, nil, oauth.InvalidDetails(fmt.Sprintf("authorization_details[%d]: a hitl_approval entry has only type and requestId, not %s.", at, oauth.DescriptionText(k)))
		}
	}
	if id == "" {
		return nil, nil, oauth.InvalidDetails(fmt.Sprintf("authorization_details[%d]: requestId (a string) is required.", at))
	}
	if client.Kind != persistence.KindAgent || client.Agent == nil {
		return nil, nil, oauth.InvalidDetails("Only the agent that asked may redeem an approval.")
	}
	var granted []any
	var conds []oauth.DetailCondition
	if len(rest) > 0 {
		if d.Next == nil {
			return nil, nil, oauth.InvalidDetails("No authorization details types are registered.")
		}
		b, err := json.Marshal(rest)
		if err != nil {
			return nil, nil, err
		}
		if granted, conds, err = d.Next.Grant(ctx, client, string(b)); err != nil {
			return nil, nil, err
		}
	}
	r, err := d.HITL.Redeem(ctx, Agent{ID: client.RecordID, ClientID: client.ID, Actor: persistence.Actor{Subject: client.ID, ClientID: client.ID, AgentID: client.RecordID}}, id)
	var nr notRedeemable
	if errors.As(err, &nr) {
		return nil, nil, oauth.InvalidDetails(fmt.Sprintf("authorization_details[%d]: %s.", at, nr.Error()))
	} else if err != nil {
		return nil, nil, err
	}
	entry := map[string]any{"type": TypeApproval, "requestId": r.ID, "action": r.Action, "resource": r.Resource}
	if r.CallDigest != "" { // the one call it passes (Use)
		entry["method"], entry["path"], entry["digest"] = r.CallMethod, r.CallPath, r.CallDigest
	}
	until := r.ExpiresAt
	granted = append(granted[:at:at], append([]any{entry}, granted[at:]...)...)
	conds = append(conds[:at:at], append([]oauth.DetailCondition{{Until: &until}}, conds[at:]...)...)
	return granted, conds, nil
}

// Holds implements oauth.DetailsPolicy: an approval holds until its
// validity ends; other entries as the registry says.
func (d Details) Holds(client *persistence.Client, c oauth.DetailCondition) bool {
	if c.Until != nil && !time.Now().Before(*c.Until) {
		return false
	}
	return d.Next == nil || d.Next.Holds(client, c)
}

// ForCall is the request that stands for a gated call the policies match:
// the agent's request for the same call (in.Call's digest) that is still
// pending, or approved and not yet redeemed, if any (a call refused again
// makes no new request, and e-mails nobody again); else a new one. nil
// when no policy matches.
func (s *Service) ForCall(ctx context.Context, agent Agent, in RequestInput) (*persistence.HITLRequest, error) {
	r, err := s.store.OpenHITLRequest(ctx, agent.ID, in.Action, in.Resource, in.Call.Digest(), s.now())
	if err == nil {
		return r, nil
	}
	if !errors.Is(err, persistence.ErrNotFound) {
		return nil, err
	}
	return s.Request(ctx, agent, in)
}

// Approval is the request id of the approval a token's
// authorization_details carry for action on resource ("" for none).
func Approval(details []any, action, resource string) string {
	for _, d := range details {
		if m, ok := d.(map[string]any); ok && m["type"] == TypeApproval && m["action"] == action && m["resource"] == resource {
			id, _ := m["requestId"].(string)
			return id
		}
	}
	return ""
}

// ErrNotThisCall refuses the use of an approval for a call it was not
// given for (another method, path or body), or a second time.
var ErrNotThisCall = errors.New("the approval is not for this call, or was used already")

// Use spends the redeemed approval id of the agent on call, once: the
// call must be the one approved (its digest), the approval redeemed,
// unused and within its validity. Under the request's row lock, so that of
// two calls at once one passes. ErrNotThisCall otherwise.
func (s *Service) Use(ctx context.Context, agent Agent, id string, call Call) error {
	if _, err := uuid.Parse(id); err != nil {
		return ErrNotThisCall
	}
	digest := call.Digest()
	_, err := s.store.UpdateHITLRequest(ctx, id, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
		now := s.now()
		if r.AgentID != agent.ID || r.CallDigest != digest || r.RedeemedAt == nil || r.UsedAt != nil ||
			Status(r, now) != persistence.HITLApproved || !now.Before(r.ExpiresAt) {
			return nil, ErrNotThisCall
		}
		r.UsedAt = &now
		return []persistence.AuditEntry{s.entry(r, agent.Actor, ActionUsed, now, map[string]any{"method": call.Method, "path": call.shown(), "digest": digest})}, nil
	})
	if errors.Is(err, persistence.ErrNotFound) {
		return ErrNotThisCall
	}
	return err
}
