package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// TOTP is a person's authenticator-app second factor. SecretSealed is the
// shared secret sealed by the caller (never in clear); EnabledAt is nil
// while the enrolment awaits its first code. LastStep is the newest time
// step whose code was accepted.
type TOTP struct {
	UserID       string     `db:"user_id"`
	EnrolmentID  string     `db:"enrolment_id"`
	SecretSealed []byte     `db:"secret_sealed"`
	LastStep     int64      `db:"last_step"`
	EnabledAt    *time.Time `db:"enabled_at"`
	CreatedAt    time.Time  `db:"created_at"`
}

const totpColumns = `user_id, enrolment_id, secret_sealed, last_step, enabled_at, created_at`

// Auth event types of the second factor. The spec names the first two
// (Events 2); a failed or replayed code is recorded with a reason, never
// the code.
const (
	EventMFAEnabled          = "USER_MFA_ENABLED"       // TOTP turned on (data: method)
	EventMFADisabled         = "USER_MFA_DISABLED"      // TOTP turned off (data: method, the factor that proved it)
	EventMFAVerifyFailed     = "mfa_verify_failed"      // reason: wrong_code, replayed_code, wrong_recovery_code
	EventMFARecoveryCodeUsed = "mfa_recovery_code_used" // a recovery code was spent (data: remaining)
)

// GetTOTP reads a person's TOTP factor, enabled or pending; none is
// ErrNotFound.
func (s *Store) GetTOTP(ctx context.Context, userID string) (*TOTP, error) {
	var t TOTP
	if err := s.conn(ctx).GetContext(ctx, &t, s.q(`SELECT `+totpColumns+` FROM mfa_totp WHERE user_id = ?`), userID); err != nil {
		return nil, mapError(err)
	}
	return &t, nil
}

// PutPendingTOTP stores a new enrolment awaiting confirmation, replacing
// a pending one; a person whose TOTP is enabled is ErrDuplicate (the
// enabled row stays), an unknown person ErrMissingReference. One upsert:
// two enrolments at once leave one of them, never a refusal.
func (s *Store) PutPendingTOTP(ctx context.Context, t *TOTP) error {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO mfa_totp (`+totpColumns+`) VALUES (?, ?, ?, ?, NULL, ?)
		ON CONFLICT (user_id) DO UPDATE SET enrolment_id = excluded.enrolment_id, secret_sealed = excluded.secret_sealed,
			last_step = excluded.last_step, created_at = excluded.created_at
		WHERE mfa_totp.enabled_at IS NULL`),
		t.UserID, t.EnrolmentID, t.SecretSealed, t.LastStep, t.CreatedAt.UTC())
	if err != nil {
		return mapError(err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return mapError(err)
	} else if n == 0 {
		return ErrDuplicate
	}
	return nil
}

// EnableTOTP turns on the pending enrolment enrolmentID of a person: it
// records step as the last one used (the confirming code cannot be
// replayed), replaces the person's recovery codes with codeHashes, and
// records events, all or nothing. When that enrolment is no longer pending
// (confirmed, or replaced by another, meanwhile) it is ErrNotFound.
func (s *Store) EnableTOTP(ctx context.Context, userID, enrolmentID string, step int64, at time.Time, codeHashes [][]byte, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE mfa_totp SET enabled_at = ?, last_step = ? WHERE user_id = ? AND enrolment_id = ? AND enabled_at IS NULL`),
			at.UTC(), step, userID, enrolmentID)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM mfa_recovery_codes WHERE user_id = ?`), userID); err != nil {
			return nil, err
		}
		for _, h := range codeHashes {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO mfa_recovery_codes (user_id, code_hash, used_at, created_at) VALUES (?, ?, NULL, ?)`),
				userID, h, at.UTC()); err != nil {
				return nil, err
			}
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}

// UseTOTPStep records step as the last one used by the person's enabled
// TOTP, if it is newer than the last: true when this call took it. One
// conditional UPDATE, so of two requests carrying the same code at once,
// one wins (no replay in the race).
func (s *Store) UseTOTPStep(ctx context.Context, userID string, step int64) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE mfa_totp SET last_step = ? WHERE user_id = ? AND enabled_at IS NOT NULL AND last_step < ?`),
		step, userID, step)
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	return n == 1, mapError(err)
}

// UseRecoveryCode spends the person's unused recovery code whose keyed hash
// is codeHash, with its events: true when this call spent it (one
// conditional UPDATE: a code is spent once, whoever races for it).
// remaining is how many unused codes the person has left after it.
func (s *Store) UseRecoveryCode(ctx context.Context, userID string, codeHash []byte, at time.Time, events func(remaining int) []AuthEvent) (bool, error) {
	var used bool
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE mfa_recovery_codes SET used_at = ? WHERE user_id = ? AND code_hash = ? AND used_at IS NULL`),
			at.UTC(), userID, codeHash)
		if err != nil {
			return nil, err
		}
		n, err := res.RowsAffected()
		if err != nil || n == 0 {
			return nil, err
		}
		used = true
		var remaining int
		if err := tx.GetContext(ctx, &remaining, s.q(`SELECT COUNT(*) FROM mfa_recovery_codes WHERE user_id = ? AND used_at IS NULL`), userID); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events(remaining))
	})
	return used && err == nil, err
}

// RecoveryCodesLeft counts the person's unused recovery codes.
func (s *Store) RecoveryCodesLeft(ctx context.Context, userID string) (int, error) {
	var n int
	err := s.conn(ctx).GetContext(ctx, &n, s.q(`SELECT COUNT(*) FROM mfa_recovery_codes WHERE user_id = ? AND used_at IS NULL`), userID)
	return n, mapError(err)
}

// DeleteTOTP turns off a person's enabled TOTP: the factor and the
// recovery codes go, the events are recorded, all or nothing. A person
// without an enabled factor is ErrNotFound.
func (s *Store) DeleteTOTP(ctx context.Context, userID string, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM mfa_totp WHERE user_id = ? AND enabled_at IS NOT NULL`), userID)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM mfa_recovery_codes WHERE user_id = ?`), userID); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}
