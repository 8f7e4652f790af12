package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// Invite statuses.
const (
	InviteSent     = "sent"
	InviteAccepted = "accepted"
)

// Keys an invite token's hash is made with (Invite.TokenKey).
const (
	InviteTokenKey       = "invite"        // the invite key, derived for invites alone
	LegacyInviteTokenKey = "client_secret" // the client-secret key: invites made before migration 0007
)

// Invite is an invitation of a person by e-mail, made by a service account.
// TokenHash is the keyed hash of the invite token, made with the key
// TokenKey names; the token is never stored.
type Invite struct {
	ID               string     `db:"id"`
	TokenHash        []byte     `db:"token_hash"`
	TokenKey         string     `db:"token_key"`
	Email            string     `db:"email"`
	UserID           string     `db:"user_id"`
	UserExisted      bool       `db:"user_existed"`
	CreatorClientID  string     `db:"creator_client_id"`
	CreatorPrincipal string     `db:"creator_principal"`
	RedirectURI      string     `db:"redirect_uri"`
	AcceptURI        string     `db:"accept_uri"`
	State            string     `db:"state"`
	AppName          string     `db:"app_name"`
	Metadata         JSONObject `db:"metadata"`
	Status           string     `db:"status"`
	CreatedAt        time.Time  `db:"created_at"`
	ExpiresAt        time.Time  `db:"expires_at"`
	AcceptedAt       *time.Time `db:"accepted_at"`
}

const inviteColumns = `id, token_hash, token_key, email, user_id, user_existed, creator_client_id, creator_principal, redirect_uri,
	accept_uri, state, app_name, metadata, status, created_at, expires_at, accepted_at`

// Mail is a message in the outbox. Sealed holds the message, encrypted; it
// is dropped once the message is sent.
type Mail struct {
	ID            string     `db:"id"`
	Recipient     string     `db:"recipient"`
	Subject       string     `db:"subject"`
	Sealed        []byte     `db:"sealed"`
	Attempts      int        `db:"attempts"`
	NextAttemptAt time.Time  `db:"next_attempt_at"`
	SentAt        *time.Time `db:"sent_at"`
	LastError     string     `db:"last_error"`
	CreatedAt     time.Time  `db:"created_at"`
}

const mailColumns = `id, recipient, subject, sealed, attempts, next_attempt_at, sent_at, last_error, created_at`

// CreateInvite writes an invite with everything it brings in one
// transaction: the user when new (nil when they exist), the e-mail to send,
// and the events. Either all of it is kept or none.
func (s *Store) CreateInvite(ctx context.Context, inv *Invite, newUser *User, mail *Mail, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if newUser != nil {
			if err := s.insertUser(ctx, tx, newUser); err != nil {
				return nil, err
			}
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO invites (`+inviteColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			inv.ID, inv.TokenHash, inv.TokenKey, inv.Email, inv.UserID, inv.UserExisted, inv.CreatorClientID, inv.CreatorPrincipal, inv.RedirectURI,
			inv.AcceptURI, inv.State, inv.AppName, inv.Metadata, inv.Status, inv.CreatedAt.UTC(), inv.ExpiresAt.UTC(), utcPtr(inv.AcceptedAt)); err != nil {
			return nil, err
		}
		if mail != nil {
			if err := s.insertMail(ctx, tx, mail); err != nil {
				return nil, err
			}
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

// InviteByToken reads an invite by the hash of its token and the key that
// made the hash.
func (s *Store) InviteByToken(ctx context.Context, tokenHash []byte, key string) (*Invite, error) {
	var inv Invite
	if err := s.conn(ctx).GetContext(ctx, &inv, s.q(`SELECT `+inviteColumns+` FROM invites WHERE token_hash = ? AND token_key = ?`), tokenHash, key); err != nil {
		return nil, mapError(err)
	}
	return &inv, nil
}

// AcceptInvite consumes a pending invite: once, whoever races for it. It
// reports false when the invite is no longer pending. The user's e-mail is
// marked verified with it (the invite reached them by e-mail), an invited
// user becomes active, and events are recorded, in the same transaction.
func (s *Store) AcceptInvite(ctx context.Context, id string, at time.Time, events ...DirectoryEvent) (bool, error) {
	var accepted bool
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE invites SET status = ?, accepted_at = ? WHERE id = ? AND status = ?`),
			InviteAccepted, at.UTC(), id, InviteSent)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, err
		}
		// An invited user becomes active; a disabled one stays disabled.
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE users SET email_verified = ?, updated_at = ?,
			status = CASE WHEN status = 'invited' THEN 'active' ELSE status END
			WHERE id = (SELECT user_id FROM invites WHERE id = ?)`), true, at.UTC(), id); err != nil {
			return nil, err
		}
		accepted = true
		return nil, s.insertEvents(ctx, tx, events)
	})
	return accepted, err
}

// --- outbox

func (s *Store) insertMail(ctx context.Context, tx *sqlx.Tx, m *Mail) error {
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO mail_outbox (`+mailColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		m.ID, m.Recipient, m.Subject, m.Sealed, m.Attempts, m.NextAttemptAt.UTC(), utcPtr(m.SentAt), m.LastError, m.CreatedAt.UTC())
	return err
}

// QueueMail stores a message on its own (one that announces no record).
func (s *Store) QueueMail(ctx context.Context, m *Mail) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) { return nil, s.insertMail(ctx, tx, m) })
}

// DueMail returns up to limit unsent messages whose next attempt is due.
func (s *Store) DueMail(ctx context.Context, now time.Time, limit int) ([]Mail, error) {
	out := []Mail{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+mailColumns+` FROM mail_outbox
		WHERE sent_at IS NULL AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?`), now.UTC(), limit)
	return out, mapError(err)
}

// ClaimMail takes a due message for one delivery attempt: it moves the
// next attempt to until, if no one else moved it since it was read (other
// replicas deliver from the same outbox). It reports whether it took it.
func (s *Store) ClaimMail(ctx context.Context, m *Mail, until time.Time) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE mail_outbox SET next_attempt_at = ? WHERE id = ? AND next_attempt_at = ? AND sent_at IS NULL`),
		until.UTC(), m.ID, m.NextAttemptAt.UTC())
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// MailSent records a delivery and drops the sealed message.
func (s *Store) MailSent(ctx context.Context, id string, at time.Time) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE mail_outbox SET sent_at = ?, sealed = NULL, attempts = attempts + 1, last_error = '' WHERE id = ?`),
		at.UTC(), id)
	return mapError(err)
}

// MailFailed records a failed attempt and when to try again.
func (s *Store) MailFailed(ctx context.Context, id string, next time.Time, reason string) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE mail_outbox SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? WHERE id = ?`),
		next.UTC(), reason, id)
	return mapError(err)
}

// DeleteSentMail removes the records of messages sent before a time, and
// reports how many.
func (s *Store) DeleteSentMail(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM mail_outbox WHERE sent_at IS NOT NULL AND sent_at < ?`), before.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	return res.RowsAffected()
}

// GetMail reads one outbox entry (tests, operations).
func (s *Store) GetMail(ctx context.Context, id string) (*Mail, error) {
	var m Mail
	if err := s.conn(ctx).GetContext(ctx, &m, s.q(`SELECT `+mailColumns+` FROM mail_outbox WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &m, nil
}
