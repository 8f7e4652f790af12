package persistence

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
)

// Delegation is a person's delegation to a user-delegated agent (issue
// 16), asked through CIBA: the backchannel request while pending, the
// delegation once decided. Status is as written: a pending or active
// delegation past ExpiresAt has expired (extensions/ciba reads it).
type Delegation struct {
	ID                   string     `db:"id"`
	AgentID              string     `db:"agent_id"`
	ClientID             string     `db:"client_id"`
	UserID               string     `db:"user_id"`
	Scopes               StringList `db:"scopes"`
	AuthorizationDetails *string    `db:"authorization_details"` // the JSON array as granted; nil: none
	BindingMessage       string     `db:"binding_message"`
	Status               string     `db:"status"`
	AuthReqHash          []byte     `db:"auth_req_hash"`
	PollInterval         int        `db:"poll_interval"` // seconds; slow_down adds to it
	LastPollAt           *time.Time `db:"last_poll_at"`
	LifetimeSeconds      int        `db:"lifetime_seconds"` // how long it lasts once approved (asked; once approved, as the person chose)
	CreatedAt            time.Time  `db:"created_at"`
	DecidedAt            *time.Time `db:"decided_at"`
	DecidedBy            Actor      `db:"decided_by"`
	ExpiresAt            time.Time  `db:"expires_at"`
	RedeemedAt           *time.Time `db:"redeemed_at"`
	Reason               string     `db:"reason"`
}

// Delegation statuses (issue 16).
const (
	DelegationPending = "pending"
	DelegationActive  = "active"
	DelegationDenied  = "denied"
	DelegationExpired = "expired"
	DelegationRevoked = "revoked"
)

const delegationColumns = `id, agent_id, client_id, user_id, scopes, authorization_details, binding_message, status, auth_req_hash,
	poll_interval, last_poll_at, lifetime_seconds, created_at, decided_at, decided_by, expires_at, redeemed_at, reason`

// evictDelegation names a delegation's cached state (DelegationState).
const evictDelegation = "delegation:"

// DelegationState is what a delegated token needs of its delegation on
// every use: it is live while active, before its end, and its person active.
type DelegationState struct {
	Status     string    `db:"status"`
	ExpiresAt  time.Time `db:"expires_at"`
	UserStatus string    `db:"user_status"`
}

// DelegationBound is a token session that lives no longer than a
// delegation (GetAccessTokenSession checks it).
type DelegationBound interface {
	DelegationRef() string
}

// DelegationFilter narrows a list; empty fields do not.
type DelegationFilter struct {
	UserID  string
	AgentID string
	Status  string // read as of now: a lapsed pending or active one is expired
}

// CreateDelegation inserts a delegation, its audit entries and auth
// events in one transaction.
func (s *Store) CreateDelegation(ctx context.Context, d *Delegation, audit []AuditEntry, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO delegations (`+delegationColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			d.ID, d.AgentID, d.ClientID, d.UserID, d.Scopes, d.AuthorizationDetails, d.BindingMessage, d.Status, d.AuthReqHash,
			d.PollInterval, utcPtr(d.LastPollAt), d.LifetimeSeconds, d.CreatedAt.UTC(), utcPtr(d.DecidedAt), d.DecidedBy, d.ExpiresAt.UTC(),
			utcPtr(d.RedeemedAt), d.Reason)
		if err != nil {
			return nil, err
		}
		if err := s.insertAudit(ctx, tx, audit); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}

// GetDelegation reads one delegation.
func (s *Store) GetDelegation(ctx context.Context, id string) (*Delegation, error) {
	if uuid.Validate(id) != nil {
		return nil, ErrNotFound // PostgreSQL would refuse the text as a uuid
	}
	var d Delegation
	if err := s.conn(ctx).GetContext(ctx, &d, s.q(`SELECT `+delegationColumns+` FROM delegations WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &d, nil
}

// DelegationByHash reads the delegation whose auth_req_id hashes to hash.
func (s *Store) DelegationByHash(ctx context.Context, hash []byte) (*Delegation, error) {
	var d Delegation
	if err := s.conn(ctx).GetContext(ctx, &d, s.q(`SELECT `+delegationColumns+` FROM delegations WHERE auth_req_hash = ?`), hash); err != nil {
		return nil, mapError(err)
	}
	return &d, nil
}

// UpdateDelegation reads the delegation under a row lock, lets fn change
// it and name the audit entries and auth events the change makes, and
// writes them in one transaction: two decisions, or a decision and a
// redemption, are serialized, and the second sees the first. When an
// active delegation changes, its cached state is evicted: with PostgreSQL
// the commit waits out other replicas' leases, so once a revocation is
// answered no replica lets its tokens through.
func (s *Store) UpdateDelegation(ctx context.Context, id string, fn func(*Delegation) ([]AuditEntry, []AuthEvent, error)) (*Delegation, error) {
	if uuid.Validate(id) != nil {
		return nil, ErrNotFound
	}
	var out *Delegation
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var d Delegation
		if err := tx.GetContext(ctx, &d, s.q(`SELECT `+delegationColumns+` FROM delegations WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		was := d.Status
		audit, events, err := fn(&d)
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE delegations SET status = ?, poll_interval = ?, last_poll_at = ?, lifetime_seconds = ?, decided_at = ?,
			decided_by = ?, expires_at = ?, redeemed_at = ?, reason = ? WHERE id = ?`),
			d.Status, d.PollInterval, utcPtr(d.LastPollAt), d.LifetimeSeconds, utcPtr(d.DecidedAt), d.DecidedBy, d.ExpiresAt.UTC(), utcPtr(d.RedeemedAt), d.Reason, d.ID)
		if err != nil {
			return nil, err
		}
		if err := s.insertAudit(ctx, tx, audit); err != nil {
			return nil, err
		}
		if err := s.insertAuthEvents(ctx, tx, events); err != nil {
			return nil, err
		}
		out = &d
		var evict []string
		if was == DelegationActive { // only an active delegation has tokens, and so a cached state
			evict = []string{evictDelegation + d.ID}
		}
		return evict, nil
	})
	return out, err
}

// ListDelegations returns one page of delegations, oldest first, and the
// total, as of now.
func (s *Store) ListDelegations(ctx context.Context, f DelegationFilter, p Page, now time.Time) ([]Delegation, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var where []string
	var args []any
	if f.UserID != "" {
		if uuid.Validate(f.UserID) != nil {
			return []Delegation{}, 0, nil
		}
		where, args = append(where, `user_id = ?`), append(args, f.UserID)
	}
	if f.AgentID != "" {
		if uuid.Validate(f.AgentID) != nil {
			return []Delegation{}, 0, nil
		}
		where, args = append(where, `agent_id = ?`), append(args, f.AgentID)
	}
	switch f.Status {
	case "":
	case DelegationPending, DelegationActive:
		where, args = append(where, `status = ? AND expires_at > ?`), append(args, f.Status, now.UTC())
	case DelegationExpired:
		where, args = append(where, `(status = ? OR (status IN (?, ?) AND expires_at <= ?))`),
			append(args, DelegationExpired, DelegationPending, DelegationActive, now.UTC())
	default:
		where, args = append(where, `status = ?`), append(args, f.Status)
	}
	clause := ""
	if len(where) > 0 {
		clause = ` WHERE ` + strings.Join(where, ` AND `)
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM delegations`+clause), args...); err != nil {
		return nil, 0, mapError(err)
	}
	out := []Delegation{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+delegationColumns+` FROM delegations`+clause+` ORDER BY created_at, id LIMIT ? OFFSET ?`),
		append(args, p.Limit, p.Offset)...)
	return out, total, mapError(err)
}

// OpenDelegations lists the ids of an agent's delegations (f.AgentID), or
// a person's (f.UserID), written as pending or active (some may have
// expired); f.Status is not read.
func (s *Store) OpenDelegations(ctx context.Context, f DelegationFilter) ([]string, error) {
	column, id := "agent_id", f.AgentID
	if f.UserID != "" {
		column, id = "user_id", f.UserID
	}
	out := []string{}
	if uuid.Validate(id) != nil {
		return out, nil // PostgreSQL would refuse the text as a uuid
	}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT id FROM delegations WHERE `+column+` = ? AND status IN (?, ?) ORDER BY created_at, id`),
		id, DelegationPending, DelegationActive)
	return out, mapError(err)
}

// userDelegationEvictions names the cached states of a person's active
// delegations: a change of the person's status, or their deletion, must
// reach every token delegated by them.
func (s *Store) userDelegationEvictions(ctx context.Context, tx *sqlx.Tx, userID string) ([]string, error) {
	var ids []string
	if err := tx.SelectContext(ctx, &ids, s.q(`SELECT id FROM delegations WHERE user_id = ? AND status = ?`), userID, DelegationActive); err != nil {
		return nil, err
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = evictDelegation + id
	}
	return out, nil
}

// delegationLive tells whether a delegated token's delegation still holds:
// active, before its end, its person active. The state is cached (by id,
// a lease on PostgreSQL) and evicted by every change that ends it.
func (s *Store) delegationLive(ctx context.Context, id string) (bool, error) {
	if uuid.Validate(id) != nil {
		return false, nil
	}
	cache := s.cacheFor(ctx)
	st := cache.delegation(id)
	if st == nil {
		rs := cache.begin()
		st = &DelegationState{}
		err := s.conn(ctx).GetContext(ctx, st, s.q(`SELECT d.status, d.expires_at, u.status AS user_status
			FROM delegations d JOIN users u ON u.id = d.user_id WHERE d.id = ?`), id)
		if errors.Is(mapError(err), ErrNotFound) {
			return false, nil // the person or the agent was deleted
		} else if err != nil {
			return false, mapError(err)
		}
		put(cache, cache.delegations, maxCachedDelegs, rs, id, st)
	}
	return st.Status == DelegationActive && st.UserStatus == "active" && time.Now().Before(st.ExpiresAt), nil
}
