package persistence

import (
	"context"
	"errors"
	"strings"
	"sync"
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

// PasskeyAndOwner reads a credential by the id its authenticator gives,
// with the person it belongs to (a sign-in needs both: one lookup, not
// two); none is ErrNotFound.
func (s *Store) PasskeyAndOwner(ctx context.Context, credentialID []byte) (*Passkey, *User, error) {
	var row struct {
		P Passkey `db:"p"`
		U User    `db:"u"`
	}
	if err := s.conn(ctx).GetContext(ctx, &row, s.q(passkeyAndOwnerQuery), credentialID); err != nil {
		return nil, nil, mapError(err)
	}
	return &row.P, &row.U, nil
}

// passkeyAndOwnerQuery names each column as sqlx maps it into PasskeyAndOwner's
// row: "p.id" is Passkey.ID, "u.id" User.ID.
var passkeyAndOwnerQuery = `SELECT ` + qualified("p", passkeyColumns) + `, ` + qualified("u", userColumns) +
	` FROM passkeys p JOIN users u ON u.id = p.user_id WHERE p.credential_id = ?`

// qualified is columns of the table aliased a, each named "a.column".
func qualified(a, columns string) string {
	out := strings.Split(columns, ",")
	for i, c := range out {
		c = strings.TrimSpace(c)
		out[i] = a + "." + c + ` AS "` + a + "." + c + `"`
	}
	return strings.Join(out, ", ")
}

// UserPasskeys lists a person's credentials, oldest first.
func (s *Store) UserPasskeys(ctx context.Context, userID string) ([]Passkey, error) {
	out := []Passkey{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+passkeyColumns+` FROM passkeys WHERE user_id = ? ORDER BY created_at, id`), userID)
	return out, mapError(err)
}

// PasskeyUse is a verified assertion as it counts, with the sign-in it
// opens (Opening.Passkey) or on its own (UsePasskey): the passkey's counter
// moved from Seen to Count, if it is still active and still at Seen. Of
// two assertions checked against one counter, one counts; the other is
// ErrPasskeyUseLost. (Its ceremony was taken before it was verified:
// TakePasskeyChallenge.)
type PasskeyUse struct {
	PasskeyID   string
	Seen, Count int64
	BackedUp    bool
}

// ErrPasskeyUseLost: a passkey's counter moved, or the passkey was revoked,
// between its assertion's check and its use.
var ErrPasskeyUseLost = errors.New("the passkey's counter changed meanwhile")

// flow is the use's guard.
func (u PasskeyUse) flow(at time.Time) *flowWrite {
	return &flowWrite{lostErr: ErrPasskeyUseLost,
		guard: &statement{table: "passkeys", set: "sign_count = ?, backed_up = ?, last_used_at = ?", where: "id = ? AND status = ? AND sign_count = ?",
			args: []any{u.Count, u.BackedUp, at, u.PasskeyID, PasskeyActive, u.Seen}, key: u.PasskeyID},
	}
}

// UsePasskey counts a verified assertion on its own (a sign-in that opens
// no session yet); ErrPasskeyUseLost when it cannot count.
func (s *Store) UsePasskey(ctx context.Context, u PasskeyUse, at time.Time) error {
	return s.commitFlow(ctx, u.flow(at.UTC()))
}

// RevokePasskey marks a credential a clone, with the notice to its owner
// (nil: none) and the events; one already revoked is ErrNotFound.
func (s *Store) RevokePasskey(ctx context.Context, id string, notice *Mail, events ...AuthEvent) error {
	return s.InTx(ctx, func(ctx context.Context) error {
		res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE passkeys SET status = ? WHERE id = ? AND status = ?`), PasskeyRevoked, id, PasskeyActive)
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

// maxCeremonies bounds the ceremonies a SQLite server holds at once (about
// a kilobyte each): past it, begin answers 503 until some end or expire.
const maxCeremonies = 32768

// ceremonyMemory holds SQLite's ceremonies (PutPasskeyChallenge).
type ceremonyMemory struct {
	mu sync.Mutex
	m  map[string]PasskeyChallenge
}

// PutPasskeyChallenge stores a ceremony begun, for TakePasskeyChallenge.
// On PostgreSQL it is a row, committed before begin answers, so that any
// replica can finish it. On SQLite (one node) it is held in this process's
// memory: a ceremony lives minutes and is used once, and a row written and
// deleted for each was three of a passkey sign-in's writes on the single
// writer; a restart loses the ceremonies under way, which are begun again.
func (s *Store) PutPasskeyChallenge(ctx context.Context, c *PasskeyChallenge) error {
	if s.dialect == Postgres {
		return s.commitFlow(ctx, &flowWrite{rows: []row{{table: "passkey_challenges", columns: passkeyChallengeColumns,
			args: []any{c.Challenge, c.Kind, c.UserID, c.ClientID, c.Session, c.CreatedAt.UTC(), c.ExpiresAt.UTC()}}}})
	}
	m := &s.ceremonies
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string]PasskeyChallenge{}
	}
	if len(m.m) >= maxCeremonies {
		m.sweep(time.Now())
		if len(m.m) >= maxCeremonies {
			return errors.Join(ErrUnavailable, errors.New("too many passkey ceremonies under way"))
		}
	}
	if _, taken := m.m[c.Challenge]; taken {
		return ErrDuplicate
	}
	m.m[c.Challenge] = *c
	return nil
}

// TakePasskeyChallenge removes and answers a ceremony of kind, once: of two
// finishes with one challenge, one gets it. Expiry is the caller's rule
// (an expired ceremony is taken too, so that it cannot be tried again);
// none is ErrNotFound.
func (s *Store) TakePasskeyChallenge(ctx context.Context, challenge, kind string) (*PasskeyChallenge, error) {
	if s.dialect == Postgres {
		var c PasskeyChallenge
		err := s.conn(ctx).GetContext(ctx, &c, s.q(`DELETE FROM passkey_challenges WHERE challenge = ? AND kind = ? RETURNING `+passkeyChallengeColumns), challenge, kind)
		if err != nil {
			return nil, mapError(err)
		}
		return &c, nil
	}
	m := &s.ceremonies
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.m[challenge]
	if !ok || c.Kind != kind {
		return nil, ErrNotFound
	}
	delete(m.m, challenge)
	return &c, nil
}

// DeleteExpiredPasskeyChallenges removes the ceremonies that expired
// before now.
func (s *Store) DeleteExpiredPasskeyChallenges(ctx context.Context, now time.Time) (int64, error) {
	if s.dialect == Postgres {
		return s.deleteExpired(ctx, now, "passkey_challenges")
	}
	m := &s.ceremonies
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sweep(now), nil
}

// sweep drops the ceremonies expired before now; hold mu.
func (m *ceremonyMemory) sweep(now time.Time) int64 {
	var n int64
	for k, c := range m.m {
		if c.ExpiresAt.Before(now) {
			delete(m.m, k)
			n++
		}
	}
	return n
}
