// Package jit is just-in-time privileges for agents (issue 15): an agent
// asks for scopes for a bounded time; a small rule table grants them at
// once, or a person approves them through a HITL request; revocation,
// expiry and a kill end them, and the tokens that carry them, at once.
// No HTTP here (handlers/jit.go).
package jit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateJITRule(ctx context.Context, r *persistence.JITRule) error
	JITRules(ctx context.Context) ([]persistence.JITRule, error)
	DeleteJITRule(ctx context.Context, id string) error
	CreateJITGrant(ctx context.Context, g *persistence.JITGrant, audit ...persistence.AuditEntry) error
	GetJITGrant(ctx context.Context, id string) (*persistence.JITGrant, error)
	JITGrantByRequest(ctx context.Context, requestID string) (*persistence.JITGrant, error)
	UpdateJITGrant(ctx context.Context, id string, fn func(*persistence.JITGrant) ([]persistence.AuditEntry, error)) (*persistence.JITGrant, error)
	OpenJITGrants(ctx context.Context, agentID string) ([]string, error)
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// Bounds.
const (
	MaxDurationSeconds = 86400 // a day: longer is not "just in time"
	MaxRules           = 200
	MaxScopes          = 20
)

// Audit actions on the agent's trail.
const (
	ActionRequested = "jit_requested"
	ActionActivated = "jit_activated"
	ActionDenied    = "jit_denied"
	ActionExpired   = "jit_expired"
	ActionRevoked   = "jit_revoked"
)

// Refusals.
var (
	ErrNotAllowed     = extensions.NewError(http.StatusForbidden, "jit_not_allowed", "No rule grants these scopes for this long to this agent, and no HITL policy asks a person; ask an admin for a rule or a policy.", nil)
	ErrNotActive      = extensions.Conflict("grant_not_active", "Only an active grant can be revoked.", nil)
	ErrTooManyRules   = extensions.Conflict("too_many_rules", "There are as many rules as the server allows; delete some first.", map[string]any{"max": MaxRules})
	errForbiddenScope = "is never granted just in time (admin, agents:*, tokens:introspect, roles:manage and users:admin are not)"
)

// neverGranted are the scopes that reach admin, or another principal's
// account, in one more step: an agent never holds them just in time
// (issue 39: roles:manage assigned approver roles, users:admin changes
// the address a password reset is mailed to).
var neverGranted = []string{oauth.ScopeAdmin, oauth.ScopeIntrospect, "roles:manage", "users:admin"}

// Grantable tells whether a scope may ever be granted just in time: a
// known scope, none of neverGranted, no agents:* scope.
func Grantable(scope string) bool {
	return oauth.KnownScope(scope) && !slices.Contains(neverGranted, scope) && !strings.HasPrefix(scope, "agents:")
}

// Service applies the rules and calls the store.
type Service struct {
	store Store
	hitl  *hitl.Service
	now   func() time.Time
}

// New returns a Service, and has approvals tell it of every HITL decision
// (a grant pending on a request is activated or denied with it).
func New(store Store, approvals *hitl.Service) *Service {
	s := &Service{store: store, hitl: approvals, now: extensions.Now}
	approvals.OnDecided(s.decided)
	return s
}

// RuleInput is a rule as a caller sends it.
type RuleInput struct {
	Scope              string
	MaxDurationSeconds int
	MinTrustLevel      string
}

// CreateRule adds a rule.
func (s *Service) CreateRule(ctx context.Context, in RuleInput) (*persistence.JITRule, error) {
	var v extensions.ValidationError
	switch {
	case !oauth.KnownScope(in.Scope):
		v.Add("scope", "%q is not a known scope", in.Scope)
	case !Grantable(in.Scope):
		v.Add("scope", "%q %s", in.Scope, errForbiddenScope)
	}
	if in.MaxDurationSeconds < 1 || in.MaxDurationSeconds > MaxDurationSeconds {
		v.Add("maxDurationSeconds", "must be an integer from 1 to %d", MaxDurationSeconds)
	}
	if !slices.Contains(agents.TrustLevels, in.MinTrustLevel) {
		v.Add("minTrustLevel", "must be one of %s", strings.Join(agents.TrustLevels, ", "))
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	rules, err := s.store.JITRules(ctx)
	if err != nil {
		return nil, err
	}
	if len(rules) >= MaxRules {
		return nil, ErrTooManyRules
	}
	r := &persistence.JITRule{ID: uuid.Must(uuid.NewV7()).String(), Scope: in.Scope, MaxDurationSeconds: in.MaxDurationSeconds,
		MinTrustLevel: in.MinTrustLevel, CreatedAt: s.now()}
	return r, s.store.CreateJITRule(ctx, r)
}

// Rules lists the rules, oldest first.
func (s *Service) Rules(ctx context.Context) ([]persistence.JITRule, error) {
	return s.store.JITRules(ctx)
}

// DeleteRule removes a rule; grants made under it stay until they end.
func (s *Service) DeleteRule(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	return s.store.DeleteJITRule(ctx, id)
}

// Agent is the agent that asks.
type Agent struct {
	hitl.Agent
	TrustLevel string
}

// RequestInput is what an agent asks for.
type RequestInput struct {
	Action          string
	Resource        string
	Scopes          []string
	DurationSeconds int
	Context         map[string]any
}

// Request records a grant: pending_approval with a linked HITL request when
// a policy matches action and resource (a person decides, even where a
// rule would grant); else active at once when rules cover every scope for
// the duration and the agent's trust level; else refused (403
// jit_not_allowed). Grant and request are written in one transaction.
func (s *Service) Request(ctx context.Context, agent Agent, in RequestInput) (*persistence.JITGrant, error) {
	var v extensions.ValidationError
	v.CheckText("action", in.Action, true, hitl.MaxActionLength)
	v.CheckText("resource", in.Resource, true, hitl.MaxResourceLength)
	switch {
	case len(in.Scopes) == 0:
		v.Add("scopes", "must name at least one scope")
	case len(in.Scopes) > MaxScopes:
		v.Add("scopes", "must name at most %d scopes", MaxScopes)
	}
	for _, sc := range in.Scopes {
		if !Grantable(sc) {
			v.Add("scopes", "%q %s", sc, errForbiddenScope)
			break
		}
	}
	if in.DurationSeconds < 1 || in.DurationSeconds > MaxDurationSeconds {
		v.Add("duration", "must be an integer from 1 to %d (seconds)", MaxDurationSeconds)
	}
	if in.Context != nil {
		if b, err := json.Marshal(in.Context); err != nil || len(b) > hitl.MaxContextBytes || extensions.JSONDepth(in.Context) > hitl.MaxContextDepth {
			v.Add("context", "must be a JSON object of at most %d bytes, nested at most %d deep", hitl.MaxContextBytes, hitl.MaxContextDepth)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	now := s.now()
	g := &persistence.JITGrant{ID: uuid.Must(uuid.NewV7()).String(), AgentID: agent.ID, ClientID: agent.ClientID, Action: in.Action,
		Resource: in.Resource, Scopes: extensions.Distinct(in.Scopes), DurationSeconds: in.DurationSeconds, Context: in.Context, CreatedAt: now}
	if g.Context == nil {
		g.Context = persistence.JSONObject{}
	}
	policy, err := s.hitl.Match(ctx, in.Action, in.Resource)
	if err != nil {
		return nil, err
	}
	if policy == nil {
		missing, err := s.uncovered(ctx, g.Scopes, in.DurationSeconds, agent.TrustLevel)
		if err != nil {
			return nil, err
		}
		if len(missing) > 0 {
			return nil, ErrNotAllowed.With(map[string]any{"uncovered": missing})
		}
		exp := now.Add(time.Duration(in.DurationSeconds) * time.Second)
		g.Status, g.ActivatedAt, g.ExpiresAt = persistence.JITActive, &now, &exp
		return g, s.store.CreateJITGrant(ctx, g, s.entry(g, agent.Actor, ActionActivated, now, map[string]any{"automatic": true, "expiresAt": exp}))
	}
	g.Status = persistence.JITPending
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		req, err := s.hitl.Request(ctx, agent.Agent, hitl.RequestInput{Action: in.Action, Resource: in.Resource,
			Context: map[string]any{"jitGrantId": g.ID, "scopes": []string(g.Scopes), "durationSeconds": in.DurationSeconds, "agentContext": map[string]any(g.Context)}})
		if err != nil {
			return err
		}
		if req == nil { // the policy went meanwhile: ask again
			return errors.New("the matching HITL policy was deleted during the request; try again")
		}
		g.HITLRequestID = &req.ID
		return s.store.CreateJITGrant(ctx, g, s.entry(g, agent.Actor, ActionRequested, now, map[string]any{"requestId": req.ID}))
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

// uncovered answers the scopes that no rule covers for duration at trust.
func (s *Service) uncovered(ctx context.Context, scopes []string, duration int, trust string) ([]string, error) {
	rules, err := s.store.JITRules(ctx)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, sc := range scopes {
		if !slices.ContainsFunc(rules, func(r persistence.JITRule) bool {
			return r.Scope == sc && duration <= r.MaxDurationSeconds && agents.AtLeast(trust, r.MinTrustLevel)
		}) {
			missing = append(missing, sc)
		}
	}
	return missing, nil
}

func (s *Service) entry(g *persistence.JITGrant, actor persistence.Actor, action string, at time.Time, details map[string]any) persistence.AuditEntry {
	d := map[string]any{"grantId": g.ID, "scopes": []string(g.Scopes), "action": g.Action, "resource": g.Resource, "durationSeconds": g.DurationSeconds}
	for k, v := range details {
		d[k] = v
	}
	return persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: g.AgentID, ClientID: g.ClientID, CreatedAt: at.UTC(),
		Action: action, Actor: actor, Details: d}
}

// Status is a grant's status at now: an active grant past its expiry has
// expired, to the instant.
func Status(g *persistence.JITGrant, now time.Time) string {
	if g.Status == persistence.JITActive && g.ExpiresAt != nil && !now.Before(*g.ExpiresAt) {
		return persistence.JITExpired
	}
	return g.Status
}

// decided activates or ends the grant a HITL request decides (hitl's
// OnDecided, in the decision's transaction).
func (s *Service) decided(ctx context.Context, r *persistence.HITLRequest) error {
	g, err := s.store.JITGrantByRequest(ctx, r.ID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	_, err = s.store.UpdateJITGrant(ctx, g.ID, func(g *persistence.JITGrant) ([]persistence.AuditEntry, error) {
		if g.Status != persistence.JITPending {
			return nil, nil
		}
		at := s.now()
		if r.DecidedAt != nil {
			at = *r.DecidedAt
		}
		switch r.Status {
		case persistence.HITLApproved:
			exp := at.Add(time.Duration(g.DurationSeconds) * time.Second)
			g.Status, g.ActivatedAt, g.ExpiresAt = persistence.JITActive, &at, &exp
			return []persistence.AuditEntry{s.entry(g, r.DecidedBy, ActionActivated, at, map[string]any{"requestId": r.ID, "expiresAt": exp})}, nil
		case persistence.HITLExpired:
			g.Status, g.EndedAt = persistence.JITExpired, &at
			return []persistence.AuditEntry{s.entry(g, persistence.Actor{}, ActionExpired, at, map[string]any{"requestId": r.ID})}, nil
		default:
			g.Status, g.EndedAt, g.EndedBy, g.Reason = persistence.JITDenied, &at, r.DecidedBy, r.Reason
			return []persistence.AuditEntry{s.entry(g, r.DecidedBy, ActionDenied, at, map[string]any{"requestId": r.ID, "reason": r.Reason})}, nil
		}
	})
	return err
}

// Get reads one of the agent's grants as it is now (its request's due
// timeout written first); another agent's grant is not found.
func (s *Service) Get(ctx context.Context, agentID, id string) (*persistence.JITGrant, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	g, err := s.store.GetJITGrant(ctx, id)
	if err != nil {
		return nil, err
	}
	if g.AgentID != agentID {
		return nil, persistence.ErrNotFound
	}
	if g.Status == persistence.JITPending && g.HITLRequestID != nil {
		if _, err := s.hitl.Get(ctx, agentID, *g.HITLRequestID); err != nil && !errors.Is(err, persistence.ErrNotFound) {
			return nil, err
		}
		return s.store.GetJITGrant(ctx, id)
	}
	return g, nil
}

// Revoke ends an active grant at once: once answered, no replica lets a
// token carrying its scopes through. reason is required.
func (s *Service) Revoke(ctx context.Context, actor persistence.Actor, id, reason string) (*persistence.JITGrant, error) {
	var v extensions.ValidationError
	v.CheckText("reason", reason, true, hitl.MaxReasonLength)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateJITGrant(ctx, id, func(g *persistence.JITGrant) ([]persistence.AuditEntry, error) {
		now := s.now()
		if st := Status(g, now); st != persistence.JITActive {
			return nil, ErrNotActive.With(map[string]any{"status": st})
		}
		g.Status, g.EndedAt, g.EndedBy, g.Reason = persistence.JITRevoked, &now, actor, reason
		return []persistence.AuditEntry{s.entry(g, actor, ActionRevoked, now, map[string]any{"reason": reason})}, nil
	})
}

// RevokeAll revokes the agent's pending and active grants, recorded with
// its kill (actor, reason): call it in the kill's unit of work.
func (s *Service) RevokeAll(ctx context.Context, agentID string, actor persistence.Actor, reason string) error {
	ids, err := s.store.OpenJITGrants(ctx, agentID)
	if err != nil {
		return err
	}
	for _, id := range ids {
		_, err := s.store.UpdateJITGrant(ctx, id, func(g *persistence.JITGrant) ([]persistence.AuditEntry, error) {
			now := s.now()
			if st := Status(g, now); st != persistence.JITActive && st != persistence.JITPending {
				return nil, nil
			}
			g.Status, g.EndedAt, g.EndedBy, g.Reason = persistence.JITRevoked, &now, actor, "agent killed: "+reason
			return []persistence.AuditEntry{s.entry(g, actor, ActionRevoked, now, map[string]any{"reason": g.Reason, "killed": true})}, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
