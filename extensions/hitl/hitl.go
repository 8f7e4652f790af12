// Package hitl is human-in-the-loop approval of agent actions (issue 15):
// policies say which actions need a person, agents ask, approvers decide,
// and every step is written to the agent's audit trail in the transaction
// that makes it. No HTTP here (handlers/hitl.go).
package hitl

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateHITLPolicy(ctx context.Context, p *persistence.HITLPolicy) error
	GetHITLPolicy(ctx context.Context, id string) (*persistence.HITLPolicy, error)
	ListHITLPolicies(ctx context.Context, p persistence.Page) ([]persistence.HITLPolicy, int, error)
	HITLPolicies(ctx context.Context) ([]persistence.HITLPolicy, error)
	UpdateHITLPolicy(ctx context.Context, id string, fn func(*persistence.HITLPolicy) error) (*persistence.HITLPolicy, error)
	DeleteHITLPolicy(ctx context.Context, id string) error
	CreateHITLRequest(ctx context.Context, r *persistence.HITLRequest, audit ...persistence.AuditEntry) error
	GetHITLRequest(ctx context.Context, id string) (*persistence.HITLRequest, error)
	UpdateHITLRequest(ctx context.Context, id string, fn func(*persistence.HITLRequest) ([]persistence.AuditEntry, error)) (*persistence.HITLRequest, error)
	PendingHITLRequests(ctx context.Context, agentID string, before time.Time, limit int) ([]string, error)
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetRole(ctx context.Context, name string) (*persistence.Role, error)
	UserRoles(ctx context.Context, userID string) ([]persistence.Role, error)
	Await(key string) (<-chan struct{}, func())
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
	AfterCommit(ctx context.Context, fn func())
	QueueMail(ctx context.Context, m *persistence.Mail) error
	RoleHolders(ctx context.Context, role string, limit int) ([]persistence.User, error)
	GetAgent(ctx context.Context, id string) (*persistence.Agent, error)
	OpenHITLRequest(ctx context.Context, agentID, action, resource, digest string, now time.Time) (*persistence.HITLRequest, error)
}

// Policy fields' values and bounds.
const (
	ModeSync     = "sync"
	ModeAsync    = "async"
	ApproverUser = "user"
	ApproverRole = "role"

	MaxTimeoutSeconds = 3600 // spec: 1 to 3600
	MaxPolicies       = 500  // every request reads them all
	MaxPatternLength  = 200
	MaxActionLength   = 200
	MaxResourceLength = 1000
	MaxContextBytes   = 16 << 10 // the context object, as JSON
	MaxContextDepth   = 16       // how deeply it nests
	MaxReasonLength   = 1000

	// MaxSyncWait bounds how long one sync call holds: below the server's
	// 30-second write timeout. A request still pending then is answered
	// pending_approval, and the agent polls.
	MaxSyncWait = 25 * time.Second
)

// Audit actions on the agent's trail.
const (
	ActionRequested = "hitl_requested"
	ActionApproved  = "hitl_approved"
	ActionDenied    = "hitl_denied"
	ActionTimedOut  = "hitl_timed_out"
	ActionRedeemed  = "hitl_redeemed"
	ActionUsed      = "hitl_used" // the redeemed token passed the call approved
)

// Refusals.
var (
	ErrNotApprover     = extensions.NewError(http.StatusForbidden, "not_approver", "The caller may not decide this request: it is for the policy's approver or an admin.", nil)
	ErrSelfApproval    = extensions.NewError(http.StatusForbidden, "self_approval", "An agent may not decide its own request.", nil)
	ErrAlreadyDecided  = extensions.Conflict("already_decided", "The request has been decided already.", nil)
	ErrRequestExpired  = extensions.Conflict("request_expired", "The request timed out before this decision.", nil)
	ErrTooManyPolicies = extensions.Conflict("too_many_policies", "There are as many policies as the server allows; delete some first.", map[string]any{"max": MaxPolicies})
)

// Service applies the rules and calls the store.
type Service struct {
	store    Store
	now      func() time.Time
	stopping chan struct{} // closed by Stop: sync waits end
	stop     sync.Once
	// decided is told of every request that leaves pending_approval, in
	// the transaction that makes it leave (the JIT grant it decides).
	decided func(ctx context.Context, r *persistence.HITLRequest) error
	outbox  *mail.Outbox // nil: approvers are not e-mailed (Notify)
	issuer  string
}

// New returns a Service.
func New(store Store) *Service {
	return &Service{store: store, now: extensions.Now, stopping: make(chan struct{})}
}

// OnDecided registers fn, told of every request that leaves
// pending_approval (approved, denied, timed out), in the transaction that
// makes it leave. Call it before serving.
func (s *Service) OnDecided(fn func(ctx context.Context, r *persistence.HITLRequest) error) {
	s.decided = fn
}

// change updates a request under its row lock (see UpdateHITLRequest) and,
// when the change ends its wait, tells OnDecided's function in the same
// transaction.
func (s *Service) change(ctx context.Context, id string, fn func(*persistence.HITLRequest) ([]persistence.AuditEntry, error)) (*persistence.HITLRequest, error) {
	var out *persistence.HITLRequest
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		was := ""
		r, err := s.store.UpdateHITLRequest(ctx, id, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
			was = r.Status
			return fn(r)
		})
		if err != nil {
			return err
		}
		out = r
		if was == persistence.HITLPending && r.Status != persistence.HITLPending && s.decided != nil {
			return s.decided(ctx, r)
		}
		return nil
	})
	return out, err
}

// Stop ends every sync wait (they answer what they have): the server is
// shutting down.
func (s *Service) Stop() { s.stop.Do(func() { close(s.stopping) }) }

// Wait holds until the request is no longer pending (a decision on any
// replica, or its timeout), for at most max, and returns it as it then is.
// It reads the request after it begins to listen, so a decision committed
// meanwhile is not missed.
func (s *Service) Wait(ctx context.Context, id string, max time.Duration) (*persistence.HITLRequest, error) {
	deadline := time.Now().Add(max)
	for {
		signal, stop := s.store.Await(persistence.HITLSignal(id))
		r, err := s.store.GetHITLRequest(ctx, id)
		if err != nil {
			stop()
			return nil, err
		}
		now := s.now()
		if r.Status != persistence.HITLPending || !now.Before(r.ExpiresAt) || !time.Now().Before(deadline) {
			stop()
			return s.settle(ctx, r)
		}
		until := min(time.Until(deadline), r.ExpiresAt.Sub(now))
		timer := time.NewTimer(until)
		select {
		case <-signal:
		case <-timer.C:
		case <-s.stopping:
			deadline = time.Now()
		case <-ctx.Done():
			timer.Stop()
			stop()
			return nil, ctx.Err()
		}
		timer.Stop()
		stop()
	}
}

// PolicyInput is a policy's fields as a caller sends them; nil fields are
// not sent (create: defaults or required; patch: unchanged).
type PolicyInput struct {
	Name              *string
	ActionPattern     *string
	ResourcePattern   *string
	ApprovalMode      *string
	TimeoutSeconds    *int
	ApproverType      *string
	ApproverID        *string
	AutoDenyOnTimeout *bool
	Priority          *float64
}

// apply sets in's fields on p and checks the result whole: a patch is
// valid when the policy it leaves is.
func (s *Service) apply(ctx context.Context, p *persistence.HITLPolicy, in PolicyInput) error {
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.Name, in.Name)
	set(&p.ActionPattern, in.ActionPattern)
	set(&p.ResourcePattern, in.ResourcePattern)
	set(&p.ApprovalMode, in.ApprovalMode)
	set(&p.ApproverType, in.ApproverType)
	set(&p.ApproverID, in.ApproverID)
	if in.TimeoutSeconds != nil {
		p.TimeoutSeconds = *in.TimeoutSeconds
	}
	if in.AutoDenyOnTimeout != nil {
		p.AutoDenyOnTimeout = *in.AutoDenyOnTimeout
	}
	if in.Priority != nil {
		p.Priority = *in.Priority
	}
	var v extensions.ValidationError
	v.CheckText("name", p.Name, true, 200)
	p.Name = strings.TrimSpace(p.Name)
	checkPattern(&v, "actionPattern", p.ActionPattern)
	checkPattern(&v, "resourcePattern", p.ResourcePattern)
	if p.ApprovalMode != ModeSync && p.ApprovalMode != ModeAsync {
		v.Add("approvalMode", "must be sync or async")
	}
	if p.TimeoutSeconds < 1 || p.TimeoutSeconds > MaxTimeoutSeconds {
		v.Add("timeoutSeconds", "must be an integer from 1 to %d", MaxTimeoutSeconds)
	}
	if math.IsNaN(p.Priority) || math.IsInf(p.Priority, 0) || math.Abs(p.Priority) > 1e15 {
		v.Add("priority", "must be a number between -1e15 and 1e15")
	}
	switch p.ApproverType {
	case ApproverUser, ApproverRole:
		v.CheckIdentifier("approverId", p.ApproverID, true, 200)
	default:
		v.Add("approverType", "must be user or role")
	}
	if err := v.Err(); err != nil {
		return err
	}
	// The approver must exist now (it may be deleted later: then only an
	// admin can decide, and the policy's list shows whom it names).
	var err error
	if p.ApproverType == ApproverUser {
		if _, perr := uuid.Parse(p.ApproverID); perr != nil {
			err = persistence.ErrNotFound
		} else {
			_, err = s.store.GetUser(ctx, p.ApproverID)
		}
	} else {
		_, err = s.store.GetRole(ctx, p.ApproverID)
	}
	if errors.Is(err, persistence.ErrNotFound) {
		v.Add("approverId", "names no %s", p.ApproverType)
		return v.Err()
	}
	return err
}

// checkPattern checks a glob (see Glob).
func checkPattern(v *extensions.ValidationError, field, pattern string) {
	v.CheckIdentifier(field, pattern, true, MaxPatternLength)
	if _, err := CompileGlob(pattern); err != nil {
		v.Add(field, "is not a valid pattern: %s", err.Error())
	}
}

// CreatePolicy adds a policy; fields not sent take their defaults
// (autoDenyOnTimeout false, priority 0), the others are required.
func (s *Service) CreatePolicy(ctx context.Context, in PolicyInput) (*persistence.HITLPolicy, error) {
	policies, err := s.store.HITLPolicies(ctx)
	if err != nil {
		return nil, err
	}
	if len(policies) >= MaxPolicies {
		return nil, ErrTooManyPolicies
	}
	now := s.now()
	p := &persistence.HITLPolicy{ID: uuid.Must(uuid.NewV7()).String(), CreatedAt: now, UpdatedAt: now}
	var missing extensions.ValidationError
	for field, set := range map[string]bool{"name": in.Name != nil, "actionPattern": in.ActionPattern != nil, "resourcePattern": in.ResourcePattern != nil,
		"approvalMode": in.ApprovalMode != nil, "timeoutSeconds": in.TimeoutSeconds != nil, "approverType": in.ApproverType != nil, "approverId": in.ApproverID != nil} {
		if !set {
			missing.Add(field, "is required")
		}
	}
	if err := missing.Err(); err != nil {
		return nil, err
	}
	if err := s.apply(ctx, p, in); err != nil {
		return nil, err
	}
	return p, s.store.CreateHITLPolicy(ctx, p)
}

// GetPolicy reads one policy; an id that is no UUID is not found.
func (s *Service) GetPolicy(ctx context.Context, id string) (*persistence.HITLPolicy, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetHITLPolicy(ctx, id)
}

// ListPolicies returns one page of policies in evaluation order.
func (s *Service) ListPolicies(ctx context.Context, p persistence.Page) ([]persistence.HITLPolicy, int, error) {
	return s.store.ListHITLPolicies(ctx, p)
}

// UpdatePolicy changes the fields sent. Pending requests keep what their
// policy said when they were made.
func (s *Service) UpdatePolicy(ctx context.Context, id string, in PolicyInput) (*persistence.HITLPolicy, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateHITLPolicy(ctx, id, func(p *persistence.HITLPolicy) error {
		p.UpdatedAt = s.now()
		return s.apply(ctx, p, in)
	})
}

// DeletePolicy removes a policy.
func (s *Service) DeletePolicy(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	return s.store.DeleteHITLPolicy(ctx, id)
}

// Match returns the policy that decides action on resource: the first in
// evaluation order (priority, higher first; then creation order) whose
// patterns both match; nil when none does.
func (s *Service) Match(ctx context.Context, action, resource string) (*persistence.HITLPolicy, error) {
	policies, err := s.store.HITLPolicies(ctx)
	if err != nil {
		return nil, err
	}
	for i := range policies {
		p := &policies[i]
		a, errA := CompileGlob(p.ActionPattern)
		r, errR := CompileGlob(p.ResourcePattern)
		if errA != nil || errR != nil {
			continue // never stored: apply refuses them
		}
		if a.Match(action) && r.Match(resource) {
			c := *p // the store's list is shared
			return &c, nil
		}
	}
	return nil, nil
}

// Agent is the agent that asks: its record, client and actor.
type Agent struct {
	ID       string
	ClientID string
	Actor    persistence.Actor
}

// RequestInput is what an agent asks approval for: an action on a
// resource and, for an approval that a gated call can use, the call
// itself (nil: none).
type RequestInput struct {
	Action   string
	Resource string
	Context  map[string]any
	Call     *Call
}

// Request evaluates the policies for what the agent asks. With a matching
// policy it records a pending request (and its audit entry) and returns
// it with the policy; without one it returns nil, nil: no approval needed.
func (s *Service) Request(ctx context.Context, agent Agent, in RequestInput) (*persistence.HITLRequest, error) {
	var v extensions.ValidationError
	v.CheckIdentifier("action", in.Action, true, MaxActionLength)
	v.CheckIdentifier("resource", in.Resource, true, MaxResourceLength)
	if in.Context != nil {
		if b, err := json.Marshal(in.Context); err != nil || len(b) > MaxContextBytes || extensions.JSONDepth(map[string]any(in.Context)) > MaxContextDepth {
			v.Add("context", "must be a JSON object of at most %d bytes, nested at most %d deep", MaxContextBytes, MaxContextDepth)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	p, err := s.Match(ctx, in.Action, in.Resource)
	if err != nil || p == nil {
		return nil, err
	}
	now := s.now()
	r := &persistence.HITLRequest{
		ID: uuid.Must(uuid.NewV7()).String(), AgentID: agent.ID, ClientID: agent.ClientID, PolicyID: &p.ID, PolicyName: p.Name,
		Action: in.Action, Resource: in.Resource, Context: in.Context, ApprovalMode: p.ApprovalMode,
		ApproverType: p.ApproverType, ApproverID: p.ApproverID, AutoDenyOnTimeout: p.AutoDenyOnTimeout,
		Status: persistence.HITLPending, CreatedAt: now, ExpiresAt: now.Add(time.Duration(p.TimeoutSeconds) * time.Second),
	}
	if r.Context == nil {
		r.Context = persistence.JSONObject{}
	}
	details := map[string]any{"policyId": p.ID, "policyName": p.Name, "expiresAt": r.ExpiresAt}
	if c := in.Call; c != nil {
		r.CallMethod, r.CallPath, r.CallBody, r.CallDigest = c.Method, c.shown(), c.Body, c.Digest()
		details["method"], details["path"], details["digest"] = c.Method, c.Path, r.CallDigest
	}
	e := s.entry(r, agent.Actor, ActionRequested, now, details)
	// The request and its e-mails commit together (the outbox delivers
	// them after the commit).
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		if err := s.store.CreateHITLRequest(ctx, r, e); err != nil {
			return err
		}
		queued, err := s.queueMail(ctx, r)
		if queued {
			s.store.AfterCommit(ctx, s.outbox.Kick)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (s *Service) entry(r *persistence.HITLRequest, actor persistence.Actor, action string, at time.Time, details map[string]any) persistence.AuditEntry {
	d := map[string]any{"requestId": r.ID, "action": r.Action, "resource": r.Resource}
	for k, v := range details {
		d[k] = v
	}
	return persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: r.AgentID, ClientID: r.ClientID, CreatedAt: at.UTC(),
		Action: action, Actor: actor, Details: d}
}

// Status is a request's status at now: a pending request whose time is up
// is denied (autoDenyOnTimeout) or expired, to the instant, whether or not
// the timeout has been written yet.
func Status(r *persistence.HITLRequest, now time.Time) string {
	if r.Status == persistence.HITLPending && !now.Before(r.ExpiresAt) {
		if r.AutoDenyOnTimeout {
			return persistence.HITLDenied
		}
		return persistence.HITLExpired
	}
	return r.Status
}

// TimedOut tells whether a request ended by its timeout (nobody decided).
func TimedOut(r *persistence.HITLRequest, now time.Time) bool {
	if r.Status == persistence.HITLPending {
		return !now.Before(r.ExpiresAt)
	}
	return r.DecidedAt != nil && r.DecidedBy.IsZero() && r.DecidedAt.Equal(r.ExpiresAt)
}

// timeout writes a due timeout on r (locked), dated at its expiry.
func (s *Service) timeout(r *persistence.HITLRequest, now time.Time) []persistence.AuditEntry {
	if r.Status != persistence.HITLPending || now.Before(r.ExpiresAt) {
		return nil
	}
	r.Status = Status(r, now)
	at := r.ExpiresAt
	r.DecidedAt, r.DecidedBy = &at, persistence.Actor{}
	return []persistence.AuditEntry{s.entry(r, persistence.Actor{}, ActionTimedOut, at, map[string]any{"outcome": r.Status})}
}

// settle writes a due timeout of r, and returns r as it now is.
func (s *Service) settle(ctx context.Context, r *persistence.HITLRequest) (*persistence.HITLRequest, error) {
	now := s.now()
	if r.Status != persistence.HITLPending || now.Before(r.ExpiresAt) {
		return r, nil
	}
	return s.change(ctx, r.ID, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
		return s.timeout(r, now), nil
	})
}

// Get reads one of the agent's requests as it is now (a due timeout is
// written first); another agent's request is not found.
func (s *Service) Get(ctx context.Context, agentID, id string) (*persistence.HITLRequest, error) {
	r, err := s.Peek(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.AgentID != agentID {
		return nil, persistence.ErrNotFound
	}
	return s.settle(ctx, r)
}

// Peek reads a request as stored, whoever it belongs to (the approval page
// and the sync wait read it; callers decide who may see it).
func (s *Service) Peek(ctx context.Context, id string) (*persistence.HITLRequest, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetHITLRequest(ctx, id)
}

// Approver is who tries to decide.
type Approver struct {
	Actor   persistence.Actor
	Admin   bool   // holds the admin scope (or is a person acting as admin)
	UserID  string // the person, for a person's token; "" otherwise
	AgentID string // the acting agent's record id, when an agent acts
}

// MayDecide tells whether who may decide r: its approver (the user named,
// or a holder of the role named, as a person signed in), or an admin; never
// an agent, and never the agent that asked.
func (s *Service) MayDecide(ctx context.Context, who Approver, r *persistence.HITLRequest) error {
	switch {
	case who.AgentID != "" && who.AgentID == r.AgentID:
		return ErrSelfApproval
	case who.AgentID != "":
		return ErrNotApprover
	case who.Admin:
		return nil
	case who.UserID == "":
		return ErrNotApprover
	case r.ApproverType == ApproverUser:
		if who.UserID == r.ApproverID {
			return nil
		}
		return ErrNotApprover
	}
	roles, err := s.store.UserRoles(ctx, who.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		return ErrNotApprover
	} else if err != nil {
		return err
	}
	if slices.ContainsFunc(roles, func(x persistence.Role) bool { return x.Name == r.ApproverID }) {
		return nil
	}
	return ErrNotApprover
}

// Decide approves or denies a pending request. Who may is checked first
// (MayDecide: the approver fields never change, so outside the lock); then,
// under the request's row lock, a second decision is refused (409
// already_decided) and so is one after the timeout (409 request_expired).
// reason is required to deny.
func (s *Service) Decide(ctx context.Context, who Approver, id string, approve bool, reason string) (*persistence.HITLRequest, error) {
	var v extensions.ValidationError
	v.CheckText("reason", reason, !approve, MaxReasonLength)
	if err := v.Err(); err != nil {
		return nil, err
	}
	r, err := s.Peek(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.MayDecide(ctx, who, r); err != nil {
		return nil, err
	}
	return s.change(ctx, id, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
		now := s.now()
		if TimedOut(r, now) {
			return nil, ErrRequestExpired.With(map[string]any{"status": Status(r, now), "expiresAt": r.ExpiresAt})
		}
		if r.Status != persistence.HITLPending {
			return nil, ErrAlreadyDecided.With(map[string]any{"status": r.Status})
		}
		action := ActionDenied
		r.Status = persistence.HITLDenied
		if approve {
			action, r.Status = ActionApproved, persistence.HITLApproved
		}
		r.DecidedAt, r.DecidedBy, r.Reason = &now, who.Actor, reason
		return []persistence.AuditEntry{s.entry(r, who.Actor, action, now, map[string]any{"reason": reason, "approver": who.Actor})}, nil
	})
}

// DenyPending denies every request of the agent still pending, recorded
// with its kill (actor, reason): call it in the kill's unit of work.
func (s *Service) DenyPending(ctx context.Context, agentID string, actor persistence.Actor, reason string) error {
	for {
		ids, err := s.store.PendingHITLRequests(ctx, agentID, time.Time{}, 100)
		if err != nil || len(ids) == 0 {
			return err
		}
		for _, id := range ids {
			_, err := s.change(ctx, id, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
				now := s.now()
				if audit := s.timeout(r, now); audit != nil {
					return audit, nil
				}
				if r.Status != persistence.HITLPending {
					return nil, nil
				}
				r.Status, r.DecidedAt, r.DecidedBy, r.Reason = persistence.HITLDenied, &now, actor, "agent killed: "+reason
				return []persistence.AuditEntry{s.entry(r, actor, ActionDenied, now, map[string]any{"reason": r.Reason, "killed": true})}, nil
			})
			if err != nil {
				return err
			}
		}
	}
}

// Sweep writes the timeouts due among pending requests, a batch at a time,
// so that the audit trail tells them even when nobody reads the request.
// Reads never depend on it (Status).
func (s *Service) Sweep(ctx context.Context) error {
	ids, err := s.store.PendingHITLRequests(ctx, "", s.now(), 200)
	if err != nil {
		return err
	}
	for _, id := range ids {
		r, err := s.store.GetHITLRequest(ctx, id)
		if errors.Is(err, persistence.ErrNotFound) {
			continue
		} else if err != nil {
			return err
		}
		if _, err := s.settle(ctx, r); err != nil && !errors.Is(err, persistence.ErrNotFound) {
			return err
		}
	}
	return nil
}
