package persistence

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// Passkey states.
const (
	PasskeyActive  = "active"
	PasskeyRevoked = "revoked" // its signature counter went backwards: a clone
)

// Passkey is a person's WebAuthn credential: what verifying its assertions
// needs (the credential id, the COSE public key, the last signature
// counter) and what the person and the rules see of it.
type Passkey struct {
	ID             string     `db:"id"`
	CredentialID   []byte     `db:"credential_id"`
	UserID         string     `db:"user_id"`
	Name           string     `db:"name"`
	PublicKey      []byte     `db:"public_key"`
	SignCount      int64      `db:"sign_count"`
	AAGUID         []byte     `db:"aaguid"`
	Transports     StringList `db:"transports"`
	Attachment     string     `db:"attachment"`  // platform, cross-platform, or "" when not said
	DeviceType     string     `db:"device_type"` // mobile, desktop, security-key
	BackupEligible bool       `db:"backup_eligible"`
	BackedUp       bool       `db:"backed_up"`
	Status         string     `db:"status"`
	CreatedAt      time.Time  `db:"created_at"`
	LastUsedAt     *time.Time `db:"last_used_at"`
}

const passkeyColumns = `id, credential_id, user_id, name, public_key, sign_count, aaguid, transports, attachment, device_type,
	backup_eligible, backed_up, status, created_at, last_used_at`

// IdentityPasskey is the identity of a person who has a passkey: it comes
// with their first and goes with their last.
const IdentityPasskey = "passkey"

// CreatePasskey stores a registered credential, the person's passkey
// identity and the events; a credential id already registered, to anyone,
// is ErrDuplicate.
func (s *Store) CreatePasskey(ctx context.Context, p *Passkey, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO passkeys (`+passkeyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			p.ID, p.CredentialID, p.UserID, p.Name, p.PublicKey, p.SignCount, p.AAGUID, p.Transports, p.Attachment, p.DeviceType,
			p.BackupEligible, p.BackedUp, p.Status, p.CreatedAt.UTC(), utcPtr(p.LastUsedAt)); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO user_identities (user_id, provider, subject, created_at) VALUES (?, ?, '', ?)
			ON CONFLICT DO NOTHING`), p.UserID, IdentityPasskey, p.CreatedAt.UTC()); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}

// HasPasskey tells whether a person has an active passkey.
func (s *Store) HasPasskey(ctx context.Context, userID string) (bool, error) {
	var found bool
	err := s.conn(ctx).GetContext(ctx, &found, s.q(`SELECT EXISTS (SELECT 1 FROM passkeys WHERE user_id = ? AND status = ?)`), userID, PasskeyActive)
	return found, mapError(err)
}

// PasskeyByCredentialID reads a credential by the id its authenticator
// gives; none is ErrNotFound.
func (s *Store) PasskeyByCredentialID(ctx context.Context, credentialID []byte) (*Passkey, error) {
	var p Passkey
	if err := s.conn(ctx).GetContext(ctx, &p, s.q(`SELECT `+passkeyColumns+` FROM passkeys WHERE credential_id = ?`), credentialID); err != nil {
		return nil, mapError(err)
	}
	return &p, nil
}

// UserPasskeys lists a person's credentials, oldest first.
func (s *Store) UserPasskeys(ctx context.Context, userID string) ([]Passkey, error) {
	out := []Passkey{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+passkeyColumns+` FROM passkeys WHERE user_id = ? ORDER BY created_at, id`), userID)
	return out, mapError(err)
}

// PasskeyUse is a verified assertion, counted with what it opens (Opening,
// UsePasskey): its ceremony (the challenge) marked used, if it was not
// already, and the passkey's counter moved from Seen to Count, if it is
// still active and still at Seen. Of two finishes of one ceremony, or two
// assertions checked against one counter, one counts; the other is
// ErrPasskeyUseLost. Expires is the ceremony's end (the used mark is kept
// until then).
type PasskeyUse struct {
	Challenge   string
	Expires     time.Time
	PasskeyID   string
	Seen, Count int64
	BackedUp    bool
}

// ErrPasskeyUseLost: a passkey assertion's ceremony was used, or its
// counter moved, before it could count.
var ErrPasskeyUseLost = errors.New("the passkey ceremony or counter changed meanwhile")

// flow is the use's guard, the ceremony's used mark and its removal. The
// guard needs no committed row of the ceremony (QueuePasskeyChallenge):
// its use is told by the used mark alone.
func (u PasskeyUse) flow(at time.Time) *flowWrite {
	return &flowWrite{lostErr: ErrPasskeyUseLost,
		guard: &statement{sql: `UPDATE passkeys SET sign_count = ?, backed_up = ?, last_used_at = ?
			WHERE id = ? AND status = ? AND sign_count = ?
			AND NOT EXISTS (SELECT 1 FROM passkey_used_challenges WHERE challenge = ?)`,
			args: []any{u.Count, u.BackedUp, at, u.PasskeyID, PasskeyActive, u.Seen, u.Challenge}, key: u.PasskeyID},
		then: usedCeremony(u.Challenge, u.Expires),
	}
}

// usedCeremony marks a ceremony used and removes it (a row queued and not
// yet written stays until it expires: the mark stops its use).
func usedCeremony(challenge string, expires time.Time) []statement {
	return []statement{
		{sql: `INSERT INTO passkey_used_challenges (challenge, expires_at) VALUES (?, ?) ON CONFLICT DO NOTHING`,
			args: []any{challenge, expires.UTC()}, key: challenge},
		{sql: `DELETE FROM passkey_challenges WHERE challenge = ?`, args: []any{challenge}, key: challenge},
	}
}

// UsePasskey counts a verified assertion on its own (a sign-in that opens
// no session yet); ErrPasskeyUseLost when it cannot count.
func (s *Store) UsePasskey(ctx context.Context, u PasskeyUse, at time.Time) error {
	return s.commitFlow(ctx, u.flow(at.UTC()))
}

// RevokePasskey marks a credential a clone, seen in the ceremony of
// challenge, with the notice to its owner (nil: none) and the events, if
// that ceremony was not used already (else ErrPasskeyUseLost: a replay of
// an assertion that counted, not a clone); one already revoked is
// ErrNotFound.
func (s *Store) RevokePasskey(ctx context.Context, id, challenge string, expires time.Time, notice *Mail, events ...AuthEvent) error {
	return s.InTx(ctx, func(ctx context.Context) error {
		used := usedCeremony(challenge, expires)
		res, err := s.conn(ctx).ExecContext(ctx, s.q(used[0].query()), used[0].args...)
		if err != nil {
			return mapError(err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return cmp.Or(mapError(err), ErrPasskeyUseLost)
		}
		if _, err := s.conn(ctx).ExecContext(ctx, s.q(used[1].query()), used[1].args...); err != nil {
			return mapError(err)
		}
		res, err = s.conn(ctx).ExecContext(ctx, s.q(`UPDATE passkeys SET status = ? WHERE id = ? AND status = ?`), PasskeyRevoked, id, PasskeyActive)
		if err != nil {
			return mapError(err)
		}
		if err := affectedOne(res); err != nil {
			return mapError(err)
		}
		if notice != nil {
			if err := s.QueueMail(ctx, notice); err != nil {
				return err
			}
		}
		return s.AppendAuthEvents(ctx, events...)
	})
}

// RenamePasskey renames one of a person's credentials; another's, or none,
// is ErrNotFound.
func (s *Store) RenamePasskey(ctx context.Context, userID, id, name string) (*Passkey, error) {
	var out *Passkey
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE passkeys SET name = ? WHERE id = ? AND user_id = ?`), name, id, userID)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		var p Passkey
		if err := tx.GetContext(ctx, &p, s.q(`SELECT `+passkeyColumns+` FROM passkeys WHERE id = ?`), id); err != nil {
			return nil, err
		}
		out = &p
		return nil, nil
	})
	return out, mapError(err)
}

// DeletePasskey removes one of a person's credentials with its events;
// another's, or none, is ErrNotFound. With the last goes the passkey
// identity, unless it is the person's last way to sign in
// (ErrLastIdentity: the credential stays).
func (s *Store) DeletePasskey(ctx context.Context, userID, id string, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var locked string
		if err := tx.GetContext(ctx, &locked, s.q(`SELECT id FROM users WHERE id = ?`+s.forUpdate()), userID); err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM passkeys WHERE id = ? AND user_id = ?`), id, userID)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		var left, others int
		if err := tx.GetContext(ctx, &left, s.q(`SELECT COUNT(*) FROM passkeys WHERE user_id = ?`), userID); err != nil {
			return nil, err
		}
		if left == 0 {
			if err := tx.GetContext(ctx, &others, s.q(`SELECT COUNT(*) FROM user_identities WHERE user_id = ? AND provider <> ?`), userID, IdentityPasskey); err != nil {
				return nil, err
			}
			if others == 0 {
				return nil, ErrLastIdentity
			}
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM user_identities WHERE user_id = ? AND provider = ?`), userID, IdentityPasskey); err != nil {
				return nil, err
			}
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}

// Events of passkeys, beside USER_MFA_ENABLED and USER_MFA_DISABLED (a
// passkey registered and deleted) and sign_in / sign_in_failed.
const (
	EventPasskeyRegisterFailed = "passkey_registration_failed" // reason: what failed; never the credential
	EventPasskeyCloned         = "passkey_cloned"              // its signature counter did not advance: revoked
)

// Kinds of passkey ceremonies.
const (
	PasskeyRegister     = "register"
	PasskeyAuthenticate = "authenticate"
)

// PasskeyChallenge is a ceremony begun, found by its challenge (base64url,
// as the browser's clientDataJSON carries it): for whom (UserID; nil for a
// usernameless sign-in), in which application, and the WebAuthn library's
// session data, as JSON.
type PasskeyChallenge struct {
	Challenge string    `db:"challenge"`
	Kind      string    `db:"kind"`
	UserID    *string   `db:"user_id"`
	ClientID  string    `db:"client_id"`
	Session   string    `db:"session"`
	CreatedAt time.Time `db:"created_at"`
	ExpiresAt time.Time `db:"expires_at"`
}

const passkeyChallengeColumns = `challenge, kind, user_id, client_id, session, created_at, expires_at`

// CreatePasskeyChallenge stores a ceremony begun, through the group
// commit (a flow of one row).
func (s *Store) CreatePasskeyChallenge(ctx context.Context, c *PasskeyChallenge) error {
	return s.commitFlow(ctx, &flowWrite{rows: []row{{table: "passkey_challenges", columns: passkeyChallengeColumns,
		args: []any{c.Challenge, c.Kind, c.UserID, c.ClientID, c.Session, c.CreatedAt.UTC(), c.ExpiresAt.UTC()}}}})
}

// QueuePasskeyChallenge stores an authentication ceremony begun without
// waiting for its commit: this server finds it at once (PasskeyChallengeOf),
// other replicas once it is committed, milliseconds later. A person takes
// longer than that to answer, and a ceremony lost in a crash is begun
// again; its use never depends on the row (PasskeyUse).
func (s *Store) QueuePasskeyChallenge(ctx context.Context, c *PasskeyChallenge) error {
	f := &flowWrite{rows: []row{{table: "passkey_challenges", columns: passkeyChallengeColumns,
		args: []any{c.Challenge, c.Kind, c.UserID, c.ClientID, c.Session, c.CreatedAt.UTC(), c.ExpiresAt.UTC()}}}}
	if unitFrom(ctx) != nil || flowFrom(ctx) != nil {
		return s.commitFlow(ctx, f)
	}
	kept := *c
	s.ceremonies.Store(c.Challenge, &kept)
	done, err := s.tokens.queue(ctx, tokenWrite{flow: f})
	if err != nil {
		s.ceremonies.Delete(c.Challenge)
		return err
	}
	go func() {
		<-done
		s.ceremonies.Delete(c.Challenge)
	}()
	return nil
}

// PasskeyChallengeOf reads a ceremony of kind by its challenge, stored or
// queued; none, or one used, is ErrNotFound. An authentication's is marked used by its
// use (PasskeyUse) or by DropPasskeyChallenge when it fails.
func (s *Store) PasskeyChallengeOf(ctx context.Context, challenge, kind string) (*PasskeyChallenge, error) {
	// The queue first: a ceremony leaves it only once committed, so one not
	// queued now is in the table if anywhere.
	var queued *PasskeyChallenge
	if q, ok := s.ceremonies.Load(challenge); ok && q.(*PasskeyChallenge).Kind == kind {
		c := *q.(*PasskeyChallenge)
		queued = &c
	}
	var used bool
	if err := s.conn(ctx).GetContext(ctx, &used, s.q(`SELECT EXISTS (SELECT 1 FROM passkey_used_challenges WHERE challenge = ?)`), challenge); err != nil {
		return nil, mapError(err)
	}
	if used { // its row may outlive its use (usedCeremony)
		return nil, ErrNotFound
	}
	var c PasskeyChallenge
	err := s.conn(ctx).GetContext(ctx, &c, s.q(`SELECT `+passkeyChallengeColumns+` FROM passkey_challenges WHERE challenge = ? AND kind = ?`), challenge, kind)
	if errors.Is(err, sql.ErrNoRows) && queued != nil {
		return queued, nil
	}
	if err != nil {
		return nil, mapError(err)
	}
	return &c, nil // the row, once there, is the truth (an admin may have changed it)
}

// DropPasskeyChallenge marks a ceremony that failed used and removes it,
// with the events of its failure: a ceremony is used once, whatever comes
// of it.
func (s *Store) DropPasskeyChallenge(ctx context.Context, challenge string, expires time.Time, events ...AuthEvent) error {
	return s.InTx(ctx, func(ctx context.Context) error {
		for _, st := range usedCeremony(challenge, expires) {
			if _, err := s.conn(ctx).ExecContext(ctx, s.q(st.query()), st.args...); err != nil {
				return mapError(err)
			}
		}
		return s.AppendAuthEvents(ctx, events...)
	})
}

// TakePasskeyChallenge removes and answers a ceremony of kind, once: of two
// finishes with one challenge, one gets it. Expiry is the caller's rule
// (an expired challenge is taken too, so that it cannot be tried again);
// none is ErrNotFound.
func (s *Store) TakePasskeyChallenge(ctx context.Context, challenge, kind string) (*PasskeyChallenge, error) {
	var out *PasskeyChallenge
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var c PasskeyChallenge
		if err := tx.GetContext(ctx, &c, s.q(`SELECT `+passkeyChallengeColumns+` FROM passkey_challenges WHERE challenge = ? AND kind = ?`+s.forUpdate()), challenge, kind); err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM passkey_challenges WHERE challenge = ?`), challenge)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		out = &c
		return nil, nil
	})
	return out, mapError(err)
}

// DeleteExpiredPasskeyChallenges removes ceremonies, and the used marks of
// ceremonies, that expired before now.
func (s *Store) DeleteExpiredPasskeyChallenges(ctx context.Context, now time.Time) (int64, error) {
	return s.deleteExpired(ctx, now, "passkey_challenges", "passkey_used_challenges")
}
