package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// HITLPolicy says which agent actions need a person's approval (issue 15).
type HITLPolicy struct {
	ID                string    `db:"id"`
	Name              string    `db:"name"`
	ActionPattern     string    `db:"action_pattern"`
	ResourcePattern   string    `db:"resource_pattern"`
	ApprovalMode      string    `db:"approval_mode"`
	TimeoutSeconds    int       `db:"timeout_seconds"`
	ApproverType      string    `db:"approver_type"`
	ApproverID        string    `db:"approver_id"`
	AutoDenyOnTimeout bool      `db:"auto_deny_on_timeout"`
	Priority          float64   `db:"priority"`
	CreatedAt         time.Time `db:"created_at"`
	UpdatedAt         time.Time `db:"updated_at"`
}

const hitlPolicyColumns = `id, name, action_pattern, resource_pattern, approval_mode, timeout_seconds, approver_type, approver_id,
	auto_deny_on_timeout, priority, created_at, updated_at`

// hitlPolicyOrder is the evaluation order: higher priority first, then
// creation order (ids are UUIDv7, increasing within a process).
const hitlPolicyOrder = ` ORDER BY priority DESC, created_at, id`

// HITLRequest is an agent's request for approval, with a copy of what its
// policy said when it was made. Status is as written: a pending request
// past ExpiresAt has timed out whatever it says (extensions/hitl reads it).
type HITLRequest struct {
	ID                string     `db:"id"`
	AgentID           string     `db:"agent_id"`
	ClientID          string     `db:"client_id"`
	PolicyID          *string    `db:"policy_id"`
	PolicyName        string     `db:"policy_name"`
	Action            string     `db:"action"`
	Resource          string     `db:"resource"`
	Context           JSONObject `db:"context"`
	ApprovalMode      string     `db:"approval_mode"`
	ApproverType      string     `db:"approver_type"`
	ApproverID        string     `db:"approver_id"`
	AutoDenyOnTimeout bool       `db:"auto_deny_on_timeout"`
	Status            string     `db:"status"`
	CreatedAt         time.Time  `db:"created_at"`
	ExpiresAt         time.Time  `db:"expires_at"`
	DecidedAt         *time.Time `db:"decided_at"`
	DecidedBy         Actor      `db:"decided_by"`
	Reason            string     `db:"reason"`
	RedeemedAt        *time.Time `db:"redeemed_at"`
	// The one call the approval is for (issue 39): its method, its path
	// (with the query, canonical), its body as canonical JSON ("" for none)
	// and their digest; all "" when the request names no call. UsedAt: the
	// redeemed token has been spent on it.
	CallMethod string     `db:"call_method"`
	CallPath   string     `db:"call_path"`
	CallBody   string     `db:"call_body"`
	CallDigest string     `db:"call_digest"`
	UsedAt     *time.Time `db:"used_at"`
}

// HITL request statuses (spec: HITL request).
const (
	HITLPending  = "pending_approval"
	HITLApproved = "approved"
	HITLDenied   = "denied"
	HITLExpired  = "expired"
)

const hitlRequestColumns = `id, agent_id, client_id, policy_id, policy_name, action, resource, context, approval_mode, approver_type,
	approver_id, auto_deny_on_timeout, status, created_at, expires_at, decided_at, decided_by, reason, redeemed_at,
	call_method, call_path, call_body, call_digest, used_at`

// HITLSignal is the signal (Store.Await) raised when a HITL request
// changes: on this replica after the commit, on the others by NOTIFY.
func HITLSignal(requestID string) string { return "hitl:" + requestID }

// CreateHITLPolicy inserts a policy.
func (s *Store) CreateHITLPolicy(ctx context.Context, p *HITLPolicy) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO hitl_policies (`+hitlPolicyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			p.ID, p.Name, p.ActionPattern, p.ResourcePattern, p.ApprovalMode, p.TimeoutSeconds, p.ApproverType, p.ApproverID,
			p.AutoDenyOnTimeout, p.Priority, p.CreatedAt.UTC(), p.UpdatedAt.UTC())
		return []string{evictHITL}, err
	})
}

// GetHITLPolicy reads one policy.
func (s *Store) GetHITLPolicy(ctx context.Context, id string) (*HITLPolicy, error) {
	var p HITLPolicy
	if err := s.conn(ctx).GetContext(ctx, &p, s.q(`SELECT `+hitlPolicyColumns+` FROM hitl_policies WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &p, nil
}

// ListHITLPolicies returns one page of policies in evaluation order, and
// the total.
func (s *Store) ListHITLPolicies(ctx context.Context, p Page) ([]HITLPolicy, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM hitl_policies`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []HITLPolicy{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+hitlPolicyColumns+` FROM hitl_policies`+hitlPolicyOrder+` LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// HITLPolicies returns every policy in evaluation order (their number is
// bounded by extensions/hitl), from the cache when it can: every agent's
// M2M call and every request reads them. The slice is shared: read-only.
func (s *Store) HITLPolicies(ctx context.Context) ([]HITLPolicy, error) {
	cache := s.cacheFor(ctx)
	if list := cachedSet(cache, &cache.hitl); list != nil {
		return list, nil
	}
	rs := cache.begin()
	out := []HITLPolicy{}
	if err := s.conn(ctx).SelectContext(ctx, &out, `SELECT `+hitlPolicyColumns+` FROM hitl_policies`+hitlPolicyOrder); err != nil {
		return nil, mapError(err)
	}
	putSet(cache, &cache.hitl, rs, out)
	return out, nil
}

// UpdateHITLPolicy reads the policy under a row lock, lets fn change it and
// writes it back in one transaction.
func (s *Store) UpdateHITLPolicy(ctx context.Context, id string, fn func(*HITLPolicy) error) (*HITLPolicy, error) {
	var out *HITLPolicy
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var p HITLPolicy
		if err := tx.GetContext(ctx, &p, s.q(`SELECT `+hitlPolicyColumns+` FROM hitl_policies WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		if err := fn(&p); err != nil {
			return nil, err
		}
		_, err := tx.ExecContext(ctx, s.q(`UPDATE hitl_policies SET name = ?, action_pattern = ?, resource_pattern = ?, approval_mode = ?,
			timeout_seconds = ?, approver_type = ?, approver_id = ?, auto_deny_on_timeout = ?, priority = ?, updated_at = ? WHERE id = ?`),
			p.Name, p.ActionPattern, p.ResourcePattern, p.ApprovalMode, p.TimeoutSeconds, p.ApproverType, p.ApproverID,
			p.AutoDenyOnTimeout, p.Priority, p.UpdatedAt.UTC(), p.ID)
		out = &p
		return []string{evictHITL}, err
	})
	return out, err
}

// DeleteHITLPolicy removes a policy; requests made under it keep their copy.
func (s *Store) DeleteHITLPolicy(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM hitl_policies WHERE id = ?`), id)
		if err != nil {
			return nil, err
		}
		return []string{evictHITL}, affectedOne(res)
	})
}

// CreateHITLRequest inserts a request and its audit entries in one transaction.
func (s *Store) CreateHITLRequest(ctx context.Context, r *HITLRequest, audit ...AuditEntry) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO hitl_requests (`+hitlRequestColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			r.ID, r.AgentID, r.ClientID, r.PolicyID, r.PolicyName, r.Action, r.Resource, r.Context, r.ApprovalMode, r.ApproverType,
			r.ApproverID, r.AutoDenyOnTimeout, r.Status, r.CreatedAt.UTC(), r.ExpiresAt.UTC(), utcPtr(r.DecidedAt), r.DecidedBy, r.Reason, utcPtr(r.RedeemedAt),
			r.CallMethod, r.CallPath, r.CallBody, r.CallDigest, utcPtr(r.UsedAt))
		if err != nil {
			return nil, err
		}
		return nil, s.insertAudit(ctx, tx, audit)
	})
}

// GetHITLRequest reads one request.
func (s *Store) GetHITLRequest(ctx context.Context, id string) (*HITLRequest, error) {
	var r HITLRequest
	if err := s.conn(ctx).GetContext(ctx, &r, s.q(`SELECT `+hitlRequestColumns+` FROM hitl_requests WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &r, nil
}

// UpdateHITLRequest reads the request under a row lock, lets fn change it
// and name the audit entries the change makes, and writes both in one
// transaction; two decisions on one request are thus serialized, and the
// second sees the first. At commit the request's signal (HITLSignal) is
// raised on every replica, without a lease wait: no cache holds requests.
func (s *Store) UpdateHITLRequest(ctx context.Context, id string, fn func(*HITLRequest) ([]AuditEntry, error)) (*HITLRequest, error) {
	var out *HITLRequest
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var r HITLRequest
		if err := tx.GetContext(ctx, &r, s.q(`SELECT `+hitlRequestColumns+` FROM hitl_requests WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		audit, err := fn(&r)
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE hitl_requests SET status = ?, decided_at = ?, decided_by = ?, reason = ?, redeemed_at = ?, used_at = ? WHERE id = ?`),
			r.Status, utcPtr(r.DecidedAt), r.DecidedBy, r.Reason, utcPtr(r.RedeemedAt), utcPtr(r.UsedAt), r.ID)
		if err != nil {
			return nil, err
		}
		out = &r
		return []string{evictSignal + HITLSignal(r.ID)}, s.insertAudit(ctx, tx, audit)
	})
	return out, err
}

// PendingHITLRequests lists the ids of an agent's requests still written
// as pending (some may have timed out), at most limit; with before set,
// only those that expired before it.
func (s *Store) PendingHITLRequests(ctx context.Context, agentID string, before time.Time, limit int) ([]string, error) {
	query, args := `SELECT id FROM hitl_requests WHERE status = ?`, []any{HITLPending}
	if agentID != "" {
		query, args = query+` AND agent_id = ?`, append(args, agentID)
	}
	if !before.IsZero() {
		query, args = query+` AND expires_at < ?`, append(args, before.UTC())
	}
	out := []string{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(query+` ORDER BY expires_at, id LIMIT ?`), append(args, limit)...)
	return out, mapError(err)
}

// RoleHolders lists up to limit people holding role, by id.
func (s *Store) RoleHolders(ctx context.Context, role string, limit int) ([]User, error) {
	out := []User{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+userColumns+` FROM users
		WHERE id IN (SELECT user_id FROM user_roles WHERE role = ?) ORDER BY id LIMIT ?`), role, limit)
	return out, mapError(err)
}

// OpenHITLRequest reads the agent's newest request for the call digest
// names (action on resource) that still stands at now: pending, or
// approved and not yet redeemed, before its expiry. ErrNotFound when there
// is none.
func (s *Store) OpenHITLRequest(ctx context.Context, agentID, action, resource, digest string, now time.Time) (*HITLRequest, error) {
	var r HITLRequest
	err := s.conn(ctx).GetContext(ctx, &r, s.q(`SELECT `+hitlRequestColumns+` FROM hitl_requests
		WHERE agent_id = ? AND action = ? AND resource = ? AND call_digest = ? AND expires_at > ?
		AND (status = ? OR (status = ? AND redeemed_at IS NULL)) ORDER BY created_at DESC, id DESC LIMIT 1`),
		agentID, action, resource, digest, now.UTC(), HITLPending, HITLApproved)
	if err != nil {
		return nil, mapError(err)
	}
	return &r, nil
}
