package agents

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateAgent(ctx context.Context, a *persistence.Agent, audit ...persistence.AuditEntry) error
	GetAgent(ctx context.Context, id string) (*persistence.Agent, error)
	ListAgents(ctx context.Context, f persistence.AgentFilter, p persistence.Page) ([]persistence.Agent, int, error)
	UpdateAgent(ctx context.Context, id string, fn func(*persistence.Agent) ([]persistence.AuditEntry, error)) (*persistence.Agent, error)
	DeleteAgent(ctx context.Context, id string, audit ...persistence.AuditEntry) error
	GetAgentByClientID(ctx context.Context, clientID string) (*persistence.Agent, error)
	AppendAudit(ctx context.Context, entries ...persistence.AuditEntry) error
	IntentByTask(ctx context.Context, taskID string, limit int) ([]persistence.AuditEntry, error)
	IntentByChain(ctx context.Context, chainID string, limit int) ([]persistence.AuditEntry, error)
	SearchIntent(ctx context.Context, f persistence.IntentFilter, p persistence.Page) ([]persistence.AuditEntry, int, error)
	ListAgentAudit(ctx context.Context, agentID string, f persistence.AuditFilter, p persistence.Page) ([]persistence.AuditEntry, int, error)
}

// Audit actions.
const (
	ActionCreated             = "created"
	ActionUpdated             = "updated"
	ActionDeleted             = "deleted"
	ActionTrustChanged        = "trust_changed"
	ActionCapabilitiesUpdated = "capabilities_updated"
	ActionKilled              = "killed"
	ActionRecovered           = "recovered"
	ActionTokenIssued         = "token_issued"
	ActionTokenRefused        = "token_refused"
	ActionBackchannelRefused  = "backchannel_refused" // a CIBA request refused (issue 16)
	ActionAPICall             = "api_call"
)

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	hasher extensions.Hasher
	now    func() time.Time
}

// New returns a Service.
func New(store Store, hasher extensions.Hasher) *Service {
	return &Service{store: store, hasher: hasher, now: extensions.Now}
}

// Input is what a caller sets when registering an agent.
type Input struct {
	Name         string
	Type         string
	Description  string
	Capabilities []string
}

// Patch changes the fields that are not nil.
type Patch struct {
	Name        *string
	Description *string
}

func checkCapabilities(v *extensions.ValidationError, caps []string) []string {
	for i, c := range caps {
		if !KnownCapability(c) {
			v.Add(fmt.Sprintf("capabilities[%d]", i), "unknown capability %q (known: %s)", c, strings.Join(Capabilities, ", "))
		}
	}
	return extensions.Distinct(caps)
}

func (s *Service) entry(agentID, clientID string, actor persistence.Actor, action string, details map[string]any) persistence.AuditEntry {
	return persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: agentID, ClientID: clientID, CreatedAt: s.now(),
		Action: action, Actor: actor, Details: details}
}

// NewClientID returns a fresh agent client id: the agent prefix and 128
// random bits.
func NewClientID() string { return persistence.AgentClientPrefix + strings.ToLower(rand.Text()) }

// Create registers an agent: sandboxed, active, with fresh credentials. The
// secret is returned here once. The capabilities are the grantor's to give
// (CheckGiven).
func (s *Service) Create(ctx context.Context, actor persistence.Actor, by Grantor, in Input) (*persistence.Agent, string, error) {
	var v extensions.ValidationError
	v.CheckText("name", in.Name, true, 200)
	v.CheckText("description", in.Description, false, 2000)
	if !slices.Contains(Types, in.Type) {
		v.Add("type", "must be one of %s", strings.Join(Types, ", "))
	}
	caps := checkCapabilities(&v, in.Capabilities)
	if err := v.Err(); err != nil {
		return nil, "", err
	}
	if err := CheckGiven(caps, by); err != nil {
		return nil, "", err
	}
	secret := oauth.NewSecret()
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, "", err
	}
	now := s.now()
	a := &persistence.Agent{
		ID: uuid.Must(uuid.NewV7()).String(), ClientID: NewClientID(), SecretHash: hash,
		Name: strings.TrimSpace(in.Name), Description: in.Description, Type: in.Type,
		Capabilities: caps, Scopes: ScopesFor(caps, Sandboxed), TrustLevel: Sandboxed, Status: persistence.AgentActive,
		CreatedAt: now, UpdatedAt: now,
	}
	audit := s.entry(a.ID, a.ClientID, actor, ActionCreated, map[string]any{"name": a.Name, "type": a.Type, "capabilities": caps})
	if err := s.store.CreateAgent(ctx, a, audit); err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// Get reads one agent; an id that is no UUID is simply not found.
func (s *Service) Get(ctx context.Context, id string) (*persistence.Agent, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetAgent(ctx, id)
}

// List returns one page of agents matching the filter, whose values must
// be known ones.
func (s *Service) List(ctx context.Context, f persistence.AgentFilter, p persistence.Page) ([]persistence.Agent, int, error) {
	var v extensions.ValidationError
	if f.Status != "" && f.Status != persistence.AgentActive && f.Status != persistence.AgentKilled {
		v.Add("status", "must be active or killed")
	}
	if f.TrustLevel != "" && rank(f.TrustLevel) < 0 {
		v.Add("trustLevel", "must be one of %s", strings.Join(TrustLevels, ", "))
	}
	if f.Type != "" && !slices.Contains(Types, f.Type) {
		v.Add("type", "must be one of %s", strings.Join(Types, ", "))
	}
	if err := v.Err(); err != nil {
		return nil, 0, err
	}
	return s.store.ListAgents(ctx, f, p)
}

// update runs fn on the agent under its row lock.
func (s *Service) update(ctx context.Context, id string, fn func(*persistence.Agent) ([]persistence.AuditEntry, error)) (*persistence.Agent, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateAgent(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
		audit, err := fn(a)
		a.UpdatedAt = s.now()
		return audit, err
	})
}

// Update changes name and description.
func (s *Service) Update(ctx context.Context, actor persistence.Actor, id string, p Patch) (*persistence.Agent, error) {
	return s.update(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
		var v extensions.ValidationError
		changed := map[string]any{}
		if p.Name != nil {
			v.CheckText("name", *p.Name, true, 200)
			a.Name, changed["name"] = strings.TrimSpace(*p.Name), strings.TrimSpace(*p.Name)
		}
		if p.Description != nil {
			v.CheckText("description", *p.Description, false, 2000)
			a.Description, changed["description"] = *p.Description, *p.Description
		}
		if err := v.Err(); err != nil {
			return nil, err
		}
		return []persistence.AuditEntry{s.entry(a.ID, a.ClientID, actor, ActionUpdated, changed)}, nil
	})
}

// SetCapabilities replaces the agent's capabilities and so its scopes.
// Those it adds are the grantor's to give (CheckGiven); those it keeps or
// takes away are not checked.
func (s *Service) SetCapabilities(ctx context.Context, actor persistence.Actor, by Grantor, id string, caps []string) (*persistence.Agent, error) {
	var v extensions.ValidationError
	caps = checkCapabilities(&v, caps)
	if err := v.Err(); err != nil {
		return nil, err
	}
	return s.update(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
		from := a.Capabilities
		added := slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return slices.Contains(from, c) })
		if err := CheckGiven(added, by); err != nil {
			return nil, err
		}
		a.Capabilities, a.Scopes = caps, ScopesFor(caps, a.TrustLevel)
		return []persistence.AuditEntry{s.entry(a.ID, a.ClientID, actor, ActionCapabilitiesUpdated, map[string]any{"from": from, "to": caps})}, nil
	})
}

// ChangeTrust moves the agent to another trust level: up one step, or down
// any number. reason is required and recorded.
func (s *Service) ChangeTrust(ctx context.Context, actor persistence.Actor, id, level, reason string) (*persistence.Agent, error) {
	var v extensions.ValidationError
	if rank(level) < 0 {
		v.Add("trustLevel", "must be one of %s", strings.Join(TrustLevels, ", "))
	}
	v.CheckText("reason", reason, true, 1000)
	if err := v.Err(); err != nil {
		return nil, err
	}
	return s.update(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
		if err := CheckTrustChange(a.TrustLevel, level); err != nil {
			return nil, err
		}
		from := a.TrustLevel
		a.TrustLevel, a.Scopes = level, ScopesFor(a.Capabilities, level)
		return []persistence.AuditEntry{s.entry(a.ID, a.ClientID, actor, ActionTrustChanged, map[string]any{"from": from, "to": level, "reason": reason})}, nil
	})
}

// Kill disables the agent at once: its secret stops working and every token
// it holds is refused (its client is gone from every lookup). reason is
// required and recorded.
func (s *Service) Kill(ctx context.Context, actor persistence.Actor, id, reason string) (*persistence.Agent, error) {
	var v extensions.ValidationError
	v.CheckText("reason", reason, true, 1000)
	if err := v.Err(); err != nil {
		return nil, err
	}
	return s.update(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
		if a.Status == persistence.AgentKilled {
			return nil, extensions.Conflict("agent_killed", "The agent is already killed.", map[string]any{"killedAt": a.KilledAt})
		}
		now := s.now()
		a.Status, a.KilledAt = persistence.AgentKilled, &now
		return []persistence.AuditEntry{s.entry(a.ID, a.ClientID, actor, ActionKilled, map[string]any{"reason": reason})}, nil
	})
}

// Recover re-enables a killed agent with a new secret and a new epoch: the
// secret and the tokens from before the kill never work again.
func (s *Service) Recover(ctx context.Context, actor persistence.Actor, id, reason string) (*persistence.Agent, string, error) {
	var v extensions.ValidationError
	v.CheckText("reason", reason, false, 1000)
	if err := v.Err(); err != nil {
		return nil, "", err
	}
	secret := oauth.NewSecret()
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, "", err
	}
	a, err := s.update(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
		if a.Status != persistence.AgentKilled {
			return nil, extensions.Conflict("agent_active", "The agent is not killed.", nil)
		}
		now := s.now()
		a.Status, a.KilledAt, a.RecoveredAt, a.SecretHash, a.Epoch = persistence.AgentActive, nil, &now, hash, a.Epoch+1
		details := map[string]any{}
		if reason != "" {
			details["reason"] = reason
		}
		return []persistence.AuditEntry{s.entry(a.ID, a.ClientID, actor, ActionRecovered, details)}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// Delete removes the agent; its audit trail stays, with a last entry.
func (s *Service) Delete(ctx context.Context, actor persistence.Actor, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	a, err := s.store.GetAgent(ctx, id)
	if err != nil {
		return err
	}
	return s.store.DeleteAgent(ctx, id, s.entry(a.ID, a.ClientID, actor, ActionDeleted, map[string]any{}))
}

// Audit returns one page of the agent's audit trail, newest first. The
// agent must exist.
func (s *Service) Audit(ctx context.Context, id string, f persistence.AuditFilter, p persistence.Page) ([]persistence.AuditEntry, int, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return nil, 0, err
	}
	return s.store.ListAgentAudit(ctx, id, f, p)
}

// TokenIssued is the audit entry of a token the agent got, with the facts
// of its grant (oauth.GrantFacts); the caller has it committed with the
// token itself (persistence.WithTokenAudit).
func (s *Service) TokenIssued(agentID, clientID, ip string, grant map[string]any, intent persistence.Intent) persistence.AuditEntry {
	e := s.entry(agentID, clientID, persistence.Actor{}, ActionTokenIssued, grant)
	e.IP, e.Intent = ip, intent
	return e
}

// APICall is the audit entry of one API call made with an agent's token.
func (s *Service) APICall(ctx context.Context, agentID, clientID, ip, endpoint string, status int, intent persistence.Intent) error {
	e := s.entry(agentID, clientID, persistence.Actor{}, ActionAPICall, map[string]any{})
	e.IP, e.Endpoint, e.Status, e.Intent = ip, endpoint, &status, intent
	return s.store.AppendAudit(ctx, e)
}

// TokenRefused records a refused token request that names an agent's
// client id (unknown ids are not recorded: there is no trail to put them
// on). A caller that did not authenticate as the agent is not the agent:
// its entry is marked unauthenticated and carries none of its intent
// headers, which anyone could have sent.
func (s *Service) TokenRefused(ctx context.Context, clientID, ip, grantType, errorCode string, authenticated bool, intent persistence.Intent) error {
	a, err := s.store.GetAgentByClientID(ctx, clientID)
	if err != nil {
		if errors.Is(err, persistence.ErrNotFound) {
			return nil
		}
		return err
	}
	e := s.entry(a.ID, a.ClientID, persistence.Actor{}, ActionTokenRefused, map[string]any{
		"grantType": grantType, "error": errorCode, "agentStatus": a.Status, "authenticated": authenticated})
	e.IP = ip
	if authenticated {
		e.Intent = intent
	}
	return s.store.AppendAudit(ctx, e)
}

// BackchannelRefused records a refused CIBA backchannel request of an
// agent that authenticated (an unauthenticated caller is nobody's to
// record): the error code, the address, its intent headers. Who the agent
// named is not kept: an unknown login_hint may be anyone's address.
func (s *Service) BackchannelRefused(ctx context.Context, agentID, clientID, ip, errorCode string, intent persistence.Intent) error {
	e := s.entry(agentID, clientID, persistence.Actor{}, ActionBackchannelRefused, map[string]any{"error": errorCode})
	e.IP, e.Intent = ip, intent
	return s.store.AppendAudit(ctx, e)
}

// IntentByTask returns the audit entries of one task, oldest first.
func (s *Service) IntentByTask(ctx context.Context, taskID string, limit int) ([]persistence.AuditEntry, error) {
	return s.store.IntentByTask(ctx, taskID, limit)
}

// IntentByChain returns the audit entries of one chain, hop by hop: by
// depth, then time.
func (s *Service) IntentByChain(ctx context.Context, chainID string, limit int) ([]persistence.AuditEntry, error) {
	return s.store.IntentByChain(ctx, chainID, limit)
}

// SearchIntent finds intent entries, newest first.
func (s *Service) SearchIntent(ctx context.Context, f persistence.IntentFilter, p persistence.Page) ([]persistence.AuditEntry, int, error) {
	return s.store.SearchIntent(ctx, f, p)
}

var _ oauth.DelegationPolicy = Delegation{}
