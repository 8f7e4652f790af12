package persistence

import (
	"context"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Identity providers of the local sign-in methods. An identity records a
// way a person has signed in or may sign in; upstream providers and
// passkeys add theirs.
const (
	IdentityPassword  = "password"
	IdentityOTP       = "otp"
	IdentityMagicLink = "magic_link"
)

// Identity is one way a person signs in: a provider, and the person's
// subject at that provider ("" for the local methods); an upstream
// provider's identity also names the provider's issuer (Issuer, "" for
// the local methods): issuer and subject are the person there.
type Identity struct {
	UserID    string    `db:"user_id"`
	Provider  string    `db:"provider"`
	Subject   string    `db:"subject"`
	Issuer    string    `db:"issuer"`
	CreatedAt time.Time `db:"created_at"`
}

// syncPasswordIdentity keeps the password identity in step with the
// password: a person has it exactly when a password hash is stored.
func (s *Store) syncPasswordIdentity(ctx context.Context, tx *sqlx.Tx, u *User) error {
	if u.PasswordHash == nil {
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM user_identities WHERE user_id = ? AND provider = ?`), u.ID, IdentityPassword)
		return err
	}
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO user_identities (user_id, provider, subject, created_at) VALUES (?, ?, '', ?)
		ON CONFLICT DO NOTHING`), u.ID, IdentityPassword, u.UpdatedAt.UTC())
	return err
}

// UserIdentities lists a person's identities, oldest first.
func (s *Store) UserIdentities(ctx context.Context, userID string) ([]Identity, error) {
	var out []Identity
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT user_id, provider, subject, issuer, created_at FROM user_identities
		WHERE user_id = ? ORDER BY created_at, provider, subject`), userID)
	return out, mapError(err)
}

// Kinds of e-mailed challenges.
const (
	ChallengeOTP       = "otp"
	ChallengeMagicLink = "magic_link"
	ChallengeStepUpOTP = "mfa_otp" // a second factor's code; FlowID is its mfa_pending row
)

// EmailChallenge is an e-mailed one-time code or magic link. SecretHash is
// a keyed hash of the secret (of the challenge id and the code, for a code:
// six digits repeat across challenges); the secret itself is only in the
// e-mail. A challenge belongs to one application (ClientID) and either a
// hosted sign-in flow (FlowID) or the embedded API (RedirectURI and
// CodeChallenge, for the code it ends in). UserID is nil for a sign-up.
type EmailChallenge struct {
	ID            string     `db:"id"`
	Kind          string     `db:"kind"`
	SecretHash    []byte     `db:"secret_hash"`
	Email         string     `db:"email"`
	UserID        *string    `db:"user_id"`
	ClientID      string     `db:"client_id"`
	FlowID        *string    `db:"flow_id"`
	RedirectURI   string     `db:"redirect_uri"`
	CodeChallenge string     `db:"code_challenge"`
	Attempts      int        `db:"attempts"`
	CreatedAt     time.Time  `db:"created_at"`
	ExpiresAt     time.Time  `db:"expires_at"`
	UsedAt        *time.Time `db:"used_at"`
}

const emailChallengeColumns = `id, kind, secret_hash, email, user_id, client_id, flow_id, redirect_uri, code_challenge,
	attempts, created_at, expires_at, used_at`

// CreateEmailChallenge stores a challenge with the e-mail that carries it
// (the outbox sends it once committed) and its events, in one transaction.
// Earlier unused challenges of its kind for the same e-mail, application
// and flow end (a new code replaces the last one).
func (s *Store) CreateEmailChallenge(ctx context.Context, c *EmailChallenge, mail *Mail, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		flow := `flow_id IS NULL`
		args := []any{c.CreatedAt.UTC(), strings.ToLower(c.Email), c.ClientID, c.Kind}
		if c.FlowID != nil {
			flow, args = `flow_id = ?`, append(args, *c.FlowID)
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE email_challenges SET used_at = ?
			WHERE email_key = ? AND client_id = ? AND kind = ? AND used_at IS NULL AND `+flow), args...); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO email_challenges (`+emailChallengeColumns+`, email_key)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			c.ID, c.Kind, c.SecretHash, c.Email, c.UserID, c.ClientID, c.FlowID, c.RedirectURI, c.CodeChallenge,
			c.Attempts, c.CreatedAt.UTC(), c.ExpiresAt.UTC(), utcPtr(c.UsedAt), strings.ToLower(c.Email)); err != nil {
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

// PendingOTP is the newest unused code of kind for an e-mail in an
// application, of a hosted flow or step-up (flowID) or of the embedded API
// (""); none is ErrNotFound. Expiry and attempts are the caller's rules.
func (s *Store) PendingOTP(ctx context.Context, kind, email, clientID, flowID string) (*EmailChallenge, error) {
	flow, args := `flow_id IS NULL`, []any{strings.ToLower(email), clientID, kind}
	if flowID != "" {
		flow, args = `flow_id = ?`, append(args, flowID)
	}
	var c EmailChallenge
	err := s.conn(ctx).GetContext(ctx, &c, s.q(`SELECT `+emailChallengeColumns+` FROM email_challenges
		WHERE email_key = ? AND client_id = ? AND kind = ? AND used_at IS NULL AND `+flow+`
		ORDER BY created_at DESC LIMIT 1`), args...)
	if err != nil {
		return nil, mapError(err)
	}
	return &c, nil
}

// MagicLinkByHash reads a magic link by the hash of its token; an unknown
// one is ErrNotFound.
func (s *Store) MagicLinkByHash(ctx context.Context, hash []byte) (*EmailChallenge, error) {
	var c EmailChallenge
	err := s.conn(ctx).GetContext(ctx, &c, s.q(`SELECT `+emailChallengeColumns+` FROM email_challenges
		WHERE secret_hash = ? AND kind = ?`), hash, ChallengeMagicLink)
	if err != nil {
		return nil, mapError(err)
	}
	return &c, nil
}

// FailEmailChallenge counts a wrong code against a challenge and answers
// the attempts made so far; a challenge already used answers 0.
func (s *Store) FailEmailChallenge(ctx context.Context, id string) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE email_challenges SET attempts = attempts + 1 WHERE id = ? AND used_at IS NULL`), id)
		if err != nil {
			return nil, err
		}
		if changed, err := res.RowsAffected(); err != nil || changed == 0 {
			return nil, err
		}
		return nil, tx.GetContext(ctx, &n, s.q(`SELECT attempts FROM email_challenges WHERE id = ?`), id)
	})
	return n, err
}

// Spend is an e-mailed challenge that a sign-in spends, if it is still
// unused, alive and below MaxAttempts wrong codes, and the identity it
// proved, recorded unless it is already (nil: none).
type Spend struct {
	Challenge   string
	MaxAttempts int
	Identity    *Identity
}

const identityColumns = `user_id, provider, subject, created_at`

// SpendChallenge spends an e-mailed challenge at at and records the
// identity it proved (see Spend), without opening a session (a step-up
// comes first); ErrChallengeUsed when it can no longer be used.
func (s *Store) SpendChallenge(ctx context.Context, sp Spend, at time.Time) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) { return nil, s.writeFlow(ctx, tx, sp.flow(at.UTC())) })
}

// flow spends the challenge at at: its guard, and the identity's row.
func (sp Spend) flow(at time.Time) *flowWrite {
	f := &flowWrite{lostErr: ErrChallengeUsed, guard: &statement{table: "email_challenges", set: "used_at = ?",
		where: "id = ? AND used_at IS NULL AND attempts < ? AND expires_at > ?", args: []any{at, sp.Challenge, sp.MaxAttempts, at}, key: sp.Challenge}}
	if id := sp.Identity; id != nil {
		f.rows = append(f.rows, row{table: "user_identities", columns: identityColumns, suffix: " ON CONFLICT DO NOTHING",
			args: []any{id.UserID, id.Provider, id.Subject, id.CreatedAt.UTC()}})
	}
	return f
}

// DeleteExpiredEmailChallenges removes challenges that expired before now.
func (s *Store) DeleteExpiredEmailChallenges(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM email_challenges WHERE expires_at < ?`), now.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	n, err := res.RowsAffected()
	return n, mapError(err)
}

// OriginRegistered tells whether some application lists origin among its
// web origins (a CORS preflight names no application).
func (s *Store) OriginRegistered(ctx context.Context, origin string) (bool, error) {
	query := `SELECT EXISTS (SELECT 1 FROM applications, json_each(applications.web_origins) WHERE json_each.value = ?)`
	if s.dialect == Postgres {
		query = `SELECT EXISTS (SELECT 1 FROM applications WHERE web_origins @> jsonb_build_array(?::text))`
	}
	var found bool
	err := s.conn(ctx).GetContext(ctx, &found, s.q(query), origin)
	return found, mapError(err)
}
