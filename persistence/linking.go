package persistence

import (
	"context"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// Auth events of account linking.
const (
	EventLinkStarted      = "identity_link_started" // a linking token was issued
	EventLinkFailed       = "identity_link_failed"  // a wrong password or code; reason says which
	EventIdentityLinked   = "identity_linked"       // data: provider
	EventIdentityUnlinked = "identity_unlinked"     // data: provider
)

// Proofs a linking token asks for (the spec's verificationRequired).
const (
	VerifyPassword  = "password"
	VerifyEmailCode = "email_code"
)

// LinkingToken lets the person who proves that an account is theirs (its
// password, or the code e-mailed to it: CodeHash) add a sign-in method,
// Provider, to it. Only keyed hashes of the token and code are kept. For an
// upstream provider the link adds the upstream identity (Issuer, Subject)
// of a sign-in through it, whose pending link (UpstreamLinkID, see
// UpstreamLink) is spent with the token.
type LinkingToken struct {
	ID             string     `db:"id"`
	TokenHash      []byte     `db:"token_hash"`
	UserID         string     `db:"user_id"`
	ClientID       string     `db:"client_id"`
	Provider       string     `db:"provider"`
	Verification   string     `db:"verification"`
	CodeHash       []byte     `db:"code_hash"`
	UpstreamLinkID *string    `db:"upstream_link_id"`
	Issuer         string     `db:"issuer"`
	Subject        string     `db:"subject"`
	Attempts       int        `db:"attempts"`
	CreatedAt      time.Time  `db:"created_at"`
	ExpiresAt      time.Time  `db:"expires_at"`
	UsedAt         *time.Time `db:"used_at"`
}

const linkingTokenColumns = `id, token_hash, user_id, client_id, provider, verification, code_hash, upstream_link_id,
	issuer, subject, attempts, created_at, expires_at, used_at`

// ErrLastIdentity: the identity is the person's last way to sign in.
var ErrLastIdentity = errors.New("the last identity")

// CreateLinkingToken stores a token with the e-mail that carries its code
// (nil for a password proof) and its events, in one transaction.
func (s *Store) CreateLinkingToken(ctx context.Context, t *LinkingToken, mail *Mail, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO linking_tokens (`+linkingTokenColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			t.ID, t.TokenHash, t.UserID, t.ClientID, t.Provider, t.Verification, t.CodeHash, t.UpstreamLinkID,
			t.Issuer, t.Subject, t.Attempts, t.CreatedAt.UTC(), t.ExpiresAt.UTC(), utcPtr(t.UsedAt)); err != nil {
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

// LinkingTokenByHash reads a token by its hash, used or not (the caller
// checks UsedAt, ExpiresAt and Attempts); unknown is ErrNotFound.
func (s *Store) LinkingTokenByHash(ctx context.Context, hash []byte) (*LinkingToken, error) {
	var t LinkingToken
	if err := s.conn(ctx).GetContext(ctx, &t, s.q(`SELECT `+linkingTokenColumns+` FROM linking_tokens WHERE token_hash = ?`), hash); err != nil {
		return nil, mapError(err)
	}
	return &t, nil
}

// FailLinkingToken counts a wrong proof against an unused token, with its
// events, and answers the count.
func (s *Store) FailLinkingToken(ctx context.Context, id string, events ...AuthEvent) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE linking_tokens SET attempts = attempts + 1 WHERE id = ? AND used_at IS NULL`), id); err != nil {
			return nil, err
		}
		if err := tx.GetContext(ctx, &n, s.q(`SELECT attempts FROM linking_tokens WHERE id = ?`), id); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
	return n, err
}

// CompleteLink spends a token at at, if it is unused, alive and below
// maxAttempts wrong proofs (else ErrChallengeUsed), with the upstream link
// it carries (spent too), and records the identity, the events and the
// notice to the account, all in one transaction. An upstream identity
// that another person holds is ErrDuplicate.
func (s *Store) CompleteLink(ctx context.Context, t *LinkingToken, maxAttempts int, at time.Time, id Identity, notice *Mail, events ...AuthEvent) error {
	return s.InTx(ctx, func(ctx context.Context) error {
		res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE linking_tokens SET used_at = ?
			WHERE id = ? AND used_at IS NULL AND attempts < ? AND expires_at > ?`), at.UTC(), t.ID, maxAttempts, at.UTC())
		if err != nil {
			return mapError(err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return mapError(err)
		} else if n != 1 {
			return ErrChallengeUsed
		}
		if t.UpstreamLinkID != nil {
			if ok, err := s.UseUpstreamLink(ctx, *t.UpstreamLinkID, at); err != nil {
				return err
			} else if !ok {
				return ErrChallengeUsed
			}
		}
		if err := s.AddIdentity(ctx, id); err != nil {
			return err
		}
		if notice != nil {
			if err := s.QueueMail(ctx, notice); err != nil {
				return err
			}
		}
		return s.AppendAuthEvents(ctx, events...)
	})
}

// Unlink removes a person's identities of provider (the password's also
// clears the password), unless they are the person's last way to sign in
// (ErrLastIdentity), with the events, in one transaction that holds the
// person's row: two unlinks at once cannot leave them with none. It
// answers the providers that remain; a provider the person has not is
// ErrNotFound.
func (s *Store) Unlink(ctx context.Context, userID, provider string, at time.Time, events ...AuthEvent) ([]string, error) {
	var remaining []string
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var locked string
		if err := tx.GetContext(ctx, &locked, s.q(`SELECT id FROM users WHERE id = ?`+s.forUpdate()), userID); err != nil {
			return nil, err
		}
		var providers []string
		if err := tx.SelectContext(ctx, &providers, s.q(`SELECT DISTINCT provider FROM user_identities WHERE user_id = ? ORDER BY provider`), userID); err != nil {
			return nil, err
		}
		for _, p := range providers {
			if p != provider {
				remaining = append(remaining, p)
			}
		}
		switch {
		case len(remaining) == len(providers):
			return nil, ErrNotFound
		case len(remaining) == 0:
			return nil, ErrLastIdentity
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM user_identities WHERE user_id = ? AND provider = ?`), userID, provider); err != nil {
			return nil, err
		}
		switch provider {
		case IdentityPassword:
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE users SET password_hash = NULL, updated_at = ? WHERE id = ?`), at.UTC(), userID); err != nil {
				return nil, err
			}
		case IdentityPasskey: // the identity is the passkeys
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM passkeys WHERE user_id = ?`), userID); err != nil {
				return nil, err
			}
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
	return remaining, err
}

// DeleteExpiredLinkingTokens removes tokens that expired before now.
func (s *Store) DeleteExpiredLinkingTokens(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM linking_tokens WHERE expires_at < ?`), now.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	n, err := res.RowsAffected()
	return n, mapError(err)
}
