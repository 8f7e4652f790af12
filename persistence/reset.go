package persistence

import (
	"context"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// Auth events of password reset.
const (
	EventResetRequested = "password_reset_requested" // a forgot-password request (user_id empty for an unknown address)
	EventResetFailed    = "password_reset_failed"    // reason: weak_password, too_many_attempts, token_expired, token_used, ...
	EventResetCompleted = "password_reset"           // the password was changed through an e-mailed token
)

// SessionEndPasswordReset is session_ended's reason when a password reset
// ends every session of the person.
const SessionEndPasswordReset = "password_reset"

// PasswordReset is an e-mailed password-reset token. TokenHash is a keyed
// hash of the token; the token itself is only in the e-mail. Email is the
// address it was sent to; Attempts counts failed resets with it.
type PasswordReset struct {
	ID            string     `db:"id"`
	TokenHash     []byte     `db:"token_hash"`
	UserID        string     `db:"user_id"`
	Email         string     `db:"email"`
	ApplicationID *string    `db:"application_id"`
	ClientID      string     `db:"client_id"`
	Attempts      int        `db:"attempts"`
	CreatedAt     time.Time  `db:"created_at"`
	ExpiresAt     time.Time  `db:"expires_at"`
	UsedAt        *time.Time `db:"used_at"`
}

const passwordResetColumns = `id, token_hash, user_id, email, application_id, client_id, attempts, created_at, expires_at, used_at`

// ErrResetSpent is a reset token that could no longer be spent: used,
// expired or out of attempts before this request got to it.
var ErrResetSpent = errors.New("the reset token can no longer be used")

// CreatePasswordReset stores a reset token with the e-mail that carries
// it (the outbox sends it once committed) and its events, in one
// transaction.
func (s *Store) CreatePasswordReset(ctx context.Context, r *PasswordReset, mail *Mail, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO password_resets (`+passwordResetColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			r.ID, r.TokenHash, r.UserID, r.Email, r.ApplicationID, r.ClientID, r.Attempts, r.CreatedAt.UTC(), r.ExpiresAt.UTC(),
			utcPtr(r.UsedAt)); err != nil {
			return nil, err
		}
		if mail != nil {
			if err := s.insertMail(ctx, tx, mail); err != nil {
				return nil, err
			}
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}

// RecordResetRequest records a forgot-password request that sends
// nothing (an unknown or disabled address) in a transaction of its own, as
// CreatePasswordReset records one that does: the same commit, so that the
// two take the same time.
func (s *Store) RecordResetRequest(ctx context.Context, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) { return nil, s.insertAuthEvents(ctx, tx, events) })
}

// PasswordResetByHash reads a reset token by its hash; an unknown one is
// ErrNotFound.
func (s *Store) PasswordResetByHash(ctx context.Context, hash []byte) (*PasswordReset, error) {
	var r PasswordReset
	if err := s.conn(ctx).GetContext(ctx, &r, s.q(`SELECT `+passwordResetColumns+` FROM password_resets WHERE token_hash = ?`), hash); err != nil {
		return nil, mapError(err)
	}
	return &r, nil
}

// FailPasswordReset counts a failed attempt against a token that is still
// unused, and answers the attempts made so far (0: the token was used
// meanwhile). The failure's events are recorded with it.
func (s *Store) FailPasswordReset(ctx context.Context, id string, events ...AuthEvent) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE password_resets SET attempts = attempts + 1 WHERE id = ? AND used_at IS NULL`), id)
		if err != nil {
			return nil, err
		}
		if changed, err := res.RowsAffected(); err != nil || changed == 0 {
			return nil, err
		}
		if err := tx.GetContext(ctx, &n, s.q(`SELECT attempts FROM password_resets WHERE id = ?`), id); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
	return n, err
}

// SpendPasswordReset spends a reset token at at, if it is still unused,
// alive and below maxAttempts failures (else ErrResetSpent: of two resets
// with one token, one wins), and ends every other unused token of its
// person. Run it in the unit of work that changes the password.
func (s *Store) SpendPasswordReset(ctx context.Context, id string, maxAttempts int, at time.Time) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var r PasswordReset
		if err := tx.GetContext(ctx, &r, s.q(`SELECT `+passwordResetColumns+` FROM password_resets WHERE id = ?`), id); err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE password_resets SET used_at = ?
			WHERE id = ? AND used_at IS NULL AND attempts < ? AND expires_at > ?`), at.UTC(), id, maxAttempts, at.UTC())
		if err != nil {
			return nil, err
		}
		if affectedOne(res) != nil {
			return nil, ErrResetSpent
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE password_resets SET used_at = ? WHERE user_id = ? AND used_at IS NULL`), at.UTC(), r.UserID)
		return nil, err
	})
}

// RevokeUserTokens revokes every refresh token family whose subject is the
// person, and the access tokens of those families (codes and tokens bound
// to an SSO session die with it anyway: see SSOBound; this reaches those
// that are not). It answers how many families it revoked. Agents' families
// are the person's delegations, which the person sees and revokes as such
// (a delegation whose tokens were gone would still read active): they
// are not revoked here.
func (s *Store) RevokeUserTokens(ctx context.Context, userID string) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sqlx.Tx) (evictions []string, err error) {
		n, evictions, err = s.revokeUserFamilies(ctx, tx, userID)
		return evictions, err
	})
	return n, err
}

// revokeUserFamilies is RevokeUserTokens in tx: how many families, and the
// evictions.
func (s *Store) revokeUserFamilies(ctx context.Context, tx *sqlx.Tx, userID string) (int, []string, error) {
	var families []string
	if err := tx.SelectContext(ctx, &families, s.q(`SELECT DISTINCT request_id FROM refresh_tokens WHERE subject = ? AND substr(client_id, 1, ?) <> ?`),
		userID, len(AgentClientPrefix), AgentClientPrefix); err != nil {
		return 0, nil, err
	}
	var evictions []string
	for _, f := range families {
		ev, err := s.revokeFamily(ctx, tx, f, true)
		if err != nil {
			return 0, nil, err
		}
		evictions = append(evictions, ev...)
	}
	return len(families), evictions, nil
}

// DeleteExpiredPasswordResets removes reset tokens that expired before now.
func (s *Store) DeleteExpiredPasswordResets(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM password_resets WHERE expires_at < ?`), now.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	n, err := res.RowsAffected()
	return n, mapError(err)
}
