package persistence

import (
	"context"
	"time"
)

// MFAPending is a sign-in waiting for its second factor (see the
// mfa_pending table). HandleHash is the keyed hash of the embedded API's
// mfaSessionId (nil for a hosted flow, which FlowID names).
type MFAPending struct {
	ID            string     `db:"id"`
	HandleHash    []byte     `db:"handle_hash"`
	UserID        string     `db:"user_id"`
	ClientID      string     `db:"client_id"`
	FlowID        *string    `db:"flow_id"`
	AMR           StringList `db:"amr"`
	Factors       StringList `db:"factors"`
	Risk          StringList `db:"risk"`
	CodeChallenge string     `db:"code_challenge"`
	CreatedAt     time.Time  `db:"created_at"`
	ExpiresAt     time.Time  `db:"expires_at"`
	UsedAt        *time.Time `db:"used_at"`
}

const mfaPendingColumns = `id, handle_hash, user_id, client_id, flow_id, amr, factors, risk, code_challenge, created_at, expires_at, used_at`

// CreateMFAPending stores a sign-in waiting for its second factor; a
// hosted flow's earlier one ends (one step-up per flow at a time).
func (s *Store) CreateMFAPending(ctx context.Context, p *MFAPending) error {
	return s.InTx(ctx, func(ctx context.Context) error {
		if p.FlowID != nil {
			if _, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE mfa_pending SET used_at = ? WHERE flow_id = ? AND used_at IS NULL`),
				p.CreatedAt.UTC(), *p.FlowID); err != nil {
				return mapError(err)
			}
		}
		_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO mfa_pending (`+mfaPendingColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			p.ID, p.HandleHash, p.UserID, p.ClientID, p.FlowID, p.AMR, p.Factors, p.Risk, p.CodeChallenge,
			p.CreatedAt.UTC(), p.ExpiresAt.UTC(), utcPtr(p.UsedAt))
		return mapError(err)
	})
}

// MFAPendingByHandle reads the step-up of an embedded mfaSessionId's hash;
// none is ErrNotFound.
func (s *Store) MFAPendingByHandle(ctx context.Context, hash []byte) (*MFAPending, error) {
	var p MFAPending
	if err := s.conn(ctx).GetContext(ctx, &p, s.q(`SELECT `+mfaPendingColumns+` FROM mfa_pending WHERE handle_hash = ?`), hash); err != nil {
		return nil, mapError(err)
	}
	return &p, nil
}

// MFAPendingOfFlow reads a hosted flow's unused step-up; none is
// ErrNotFound.
func (s *Store) MFAPendingOfFlow(ctx context.Context, flowID string) (*MFAPending, error) {
	var p MFAPending
	if err := s.conn(ctx).GetContext(ctx, &p, s.q(`SELECT `+mfaPendingColumns+` FROM mfa_pending
		WHERE flow_id = ? AND used_at IS NULL ORDER BY created_at DESC LIMIT 1`), flowID); err != nil {
		return nil, mapError(err)
	}
	return &p, nil
}

// UseMFAPending spends a step-up, if unused and alive at now, and reports
// whether this call did.
func (s *Store) UseMFAPending(ctx context.Context, id string, now time.Time) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE mfa_pending SET used_at = ? WHERE id = ? AND used_at IS NULL AND expires_at > ?`),
		now.UTC(), id, now.UTC())
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	return n == 1, mapError(err)
}

// DeleteExpiredMFAPending removes step-ups that expired before now.
func (s *Store) DeleteExpiredMFAPending(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM mfa_pending WHERE expires_at < ?`), now.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	n, err := res.RowsAffected()
	return n, mapError(err)
}
