package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// SignInFlow is one sign-in on the hosted page, from the authorization that
// asked for it to the resumed authorization that ends it. BrowserHash is the
// keyed hash of the secret of the browser's flow cookie, never the secret;
// Request the original authorization request's parameters, form-encoded.
type SignInFlow struct {
	ID          string    `db:"id"`
	BrowserHash []byte    `db:"browser_hash"`
	ClientID    string    `db:"client_id"`
	Request     string    `db:"request"`
	Step        string    `db:"step"`
	Email       string    `db:"email"`
	SessionID   *string   `db:"session_id"`
	CreatedAt   time.Time `db:"created_at"`
	ExpiresAt   time.Time `db:"expires_at"`
}

const signInFlowColumns = `id, browser_hash, client_id, request, step, email, session_id, created_at, expires_at`

// CreateSignInFlow stores a new flow.
func (s *Store) CreateSignInFlow(ctx context.Context, f *SignInFlow) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO signin_flows (`+signInFlowColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		f.ID, f.BrowserHash, f.ClientID, f.Request, f.Step, f.Email, f.SessionID, f.CreatedAt.UTC(), f.ExpiresAt.UTC())
	return mapError(err)
}

// GetSignInFlow reads one flow; an unknown one is ErrNotFound (expiry is
// the caller's rule).
func (s *Store) GetSignInFlow(ctx context.Context, id string) (*SignInFlow, error) {
	var f SignInFlow
	if err := s.conn(ctx).GetContext(ctx, &f, s.q(`SELECT `+signInFlowColumns+` FROM signin_flows WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &f, nil
}

// UpdateSignInFlow moves a flow to its next step: step, e-mail and
// session, in one transaction holding the row; fn sees the row as stored.
func (s *Store) UpdateSignInFlow(ctx context.Context, id string, fn func(*SignInFlow) error) (*SignInFlow, error) {
	var out *SignInFlow
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var f SignInFlow
		if err := tx.GetContext(ctx, &f, s.q(`SELECT `+signInFlowColumns+` FROM signin_flows WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		if err := fn(&f); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE signin_flows SET step = ?, email = ?, session_id = ? WHERE id = ?`),
			f.Step, f.Email, f.SessionID, id); err != nil {
			return nil, err
		}
		out = &f
		return nil, nil
	})
	return out, err
}

// ConsumeSignInFlow deletes a flow and reports whether this call did: of
// two requests that resume one flow, one wins.
func (s *Store) ConsumeSignInFlow(ctx context.Context, id string) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM signin_flows WHERE id = ?`), id)
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	return n == 1, mapError(err)
}

// DeleteExpiredSignInFlows removes flows that expired before now.
func (s *Store) DeleteExpiredSignInFlows(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM signin_flows WHERE expires_at < ?`), now.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	n, err := res.RowsAffected()
	return n, mapError(err)
}
