package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// JITRule lets a scope be granted just in time without a person: up to
// MaxDurationSeconds, to agents of MinTrustLevel or higher (issue 15).
type JITRule struct {
	ID                 string    `db:"id"`
	Scope              string    `db:"scope"`
	MaxDurationSeconds int       `db:"max_duration_seconds"`
	MinTrustLevel      string    `db:"min_trust_level"`
	CreatedAt          time.Time `db:"created_at"`
}

const jitRuleColumns = `id, scope, max_duration_seconds, min_trust_level, created_at`

// JITGrant is a just-in-time grant of scopes to an agent. Status is as
// written: an active grant past ExpiresAt has expired (extensions/jit).
type JITGrant struct {
	ID              string     `db:"id"`
	AgentID         string     `db:"agent_id"`
	ClientID        string     `db:"client_id"`
	Action          string     `db:"action"`
	Resource        string     `db:"resource"`
	Scopes          StringList `db:"scopes"`
	DurationSeconds int        `db:"duration_seconds"`
	Context         JSONObject `db:"context"`
	Status          string     `db:"status"`
	HITLRequestID   *string    `db:"hitl_request_id"`
	CreatedAt       time.Time  `db:"created_at"`
	ActivatedAt     *time.Time `db:"activated_at"`
	ExpiresAt       *time.Time `db:"expires_at"`
	EndedAt         *time.Time `db:"ended_at"`
	EndedBy         Actor      `db:"ended_by"`
	Reason          string     `db:"reason"`
}

// JIT grant statuses (spec: JIT grant).
const (
	JITPending = "pending_approval"
	JITActive  = "active"
	JITDenied  = "denied"
	JITExpired = "expired"
	JITRevoked = "revoked"
)

const jitGrantColumns = `id, agent_id, client_id, action, resource, scopes, duration_seconds, context, status, hitl_request_id,
	created_at, activated_at, expires_at, ended_at, ended_by, reason`

// LiveGrant is an active grant as the token path sees it (AgentFacts).
type LiveGrant struct {
	ID        string     `db:"id"`
	Scopes    StringList `db:"scopes"`
	ExpiresAt time.Time  `db:"expires_at"`
}

// CreateJITRule inserts a rule.
func (s *Store) CreateJITRule(ctx context.Context, r *JITRule) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO jit_rules (`+jitRuleColumns+`) VALUES (?, ?, ?, ?, ?)`),
			r.ID, r.Scope, r.MaxDurationSeconds, r.MinTrustLevel, r.CreatedAt.UTC())
		return nil, err
	})
}

// JITRules lists every rule, oldest first (their number is bounded by extensions/jit).
func (s *Store) JITRules(ctx context.Context) ([]JITRule, error) {
	out := []JITRule{}
	err := s.conn(ctx).SelectContext(ctx, &out, `SELECT `+jitRuleColumns+` FROM jit_rules ORDER BY created_at, id`)
	return out, mapError(err)
}

// DeleteJITRule removes a rule; grants made under it stay.
func (s *Store) DeleteJITRule(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM jit_rules WHERE id = ?`), id)
		if err != nil {
			return nil, err
		}
		return nil, affectedOne(res)
	})
}

// grantEvictions: a grant that changes changes what its agent's client
// may hold, on every replica (the commit waits out their leases).
func grantEvictions(g *JITGrant) []string { return []string{evictClient + g.ClientID} }

// CreateJITGrant inserts a grant and its audit entries in one transaction.
func (s *Store) CreateJITGrant(ctx context.Context, g *JITGrant, audit ...AuditEntry) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO jit_grants (`+jitGrantColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			g.ID, g.AgentID, g.ClientID, g.Action, g.Resource, g.Scopes, g.DurationSeconds, g.Context, g.Status, g.HITLRequestID,
			g.CreatedAt.UTC(), utcPtr(g.ActivatedAt), utcPtr(g.ExpiresAt), utcPtr(g.EndedAt), g.EndedBy, g.Reason)
		if err != nil {
			return nil, err
		}
		var evict []string
		if g.Status == JITActive {
			evict = grantEvictions(g)
		}
		return evict, s.insertAudit(ctx, tx, audit)
	})
}

// GetJITGrant reads one grant.
func (s *Store) GetJITGrant(ctx context.Context, id string) (*JITGrant, error) {
	var g JITGrant
	if err := s.conn(ctx).GetContext(ctx, &g, s.q(`SELECT `+jitGrantColumns+` FROM jit_grants WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &g, nil
}

// JITGrantByRequest reads the grant a HITL request decides, if any.
func (s *Store) JITGrantByRequest(ctx context.Context, requestID string) (*JITGrant, error) {
	var g JITGrant
	if err := s.conn(ctx).GetContext(ctx, &g, s.q(`SELECT `+jitGrantColumns+` FROM jit_grants WHERE hitl_request_id = ?`), requestID); err != nil {
		return nil, mapError(err)
	}
	return &g, nil
}

// UpdateJITGrant reads the grant under a row lock, lets fn change it and
// name the audit entries the change makes, and writes both in one
// transaction. Its agent's cached client is evicted: with PostgreSQL the
// commit waits out other replicas' leases, so once a revocation is
// answered no replica lets the grant's tokens through (see cache).
func (s *Store) UpdateJITGrant(ctx context.Context, id string, fn func(*JITGrant) ([]AuditEntry, error)) (*JITGrant, error) {
	var out *JITGrant
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var g JITGrant
		if err := tx.GetContext(ctx, &g, s.q(`SELECT `+jitGrantColumns+` FROM jit_grants WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		audit, err := fn(&g)
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE jit_grants SET status = ?, activated_at = ?, expires_at = ?, ended_at = ?, ended_by = ?, reason = ? WHERE id = ?`),
			g.Status, utcPtr(g.ActivatedAt), utcPtr(g.ExpiresAt), utcPtr(g.EndedAt), g.EndedBy, g.Reason, g.ID)
		if err != nil {
			return nil, err
		}
		out = &g
		return grantEvictions(&g), s.insertAudit(ctx, tx, audit)
	})
	return out, err
}

// OpenJITGrants lists the ids of an agent's grants written as pending or
// active (some may have expired).
func (s *Store) OpenJITGrants(ctx context.Context, agentID string) ([]string, error) {
	out := []string{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT id FROM jit_grants WHERE agent_id = ? AND status IN (?, ?) ORDER BY created_at, id`),
		agentID, JITPending, JITActive)
	return out, mapError(err)
}

// liveGrants are the agent's active grants unexpired at now.
func (s *Store) liveGrants(ctx context.Context, agentID string, now time.Time) ([]LiveGrant, error) {
	out := []LiveGrant{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT id, scopes, expires_at FROM jit_grants WHERE agent_id = ? AND status = ? AND expires_at > ?`),
		agentID, JITActive, now.UTC())
	return out, mapError(err)
}
