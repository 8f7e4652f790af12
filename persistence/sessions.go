package persistence

import (
	"context"
	"time"
)

// SSOSession is a person's single sign-on session in one browser. TokenHash
// is the keyed hash of the cookie's secret, never the secret.
type SSOSession struct {
	ID            string     `db:"id"`
	TokenHash     []byte     `db:"token_hash"`
	UserID        string     `db:"user_id"`
	ApplicationID *string    `db:"application_id"` // the application signed in through first
	AMR           StringList `db:"amr"`            // RFC 8176 method references
	ACR           string     `db:"acr"`
	AuthTime      time.Time  `db:"auth_time"`
	IP            string     `db:"ip"`
	UserAgent     string     `db:"user_agent"`
	CreatedAt     time.Time  `db:"created_at"`
	LastSeenAt    time.Time  `db:"last_seen_at"`
	ExpiresAt     time.Time  `db:"expires_at"` // the absolute end
}

const ssoSessionColumns = `id, token_hash, user_id, application_id, amr, acr, auth_time, ip, user_agent, created_at, last_seen_at, expires_at`

// evictSession is the eviction key of a cached SSO session, by id.
const evictSession = "session:"

// Auth event types.
const (
	EventSignIn         = "sign_in"         // a person signed in
	EventSignInFailed   = "sign_in_failed"  // reason: a stable code, never the secret
	EventSessionStarted = "session_started" //
	EventSessionEnded   = "session_ended"   // reason: logout, admin, user_deleted, expired
	EventTokenRefreshed = "token_refreshed" //
	EventRefreshReuse   = "refresh_reused"  // a rotated refresh token came back: its family is revoked
	EventLogout         = "logout"          // RP-initiated logout
)

// AuthEvent is one entry of the authentication event log.
type AuthEvent struct {
	ID            string     `db:"id"`
	Type          string     `db:"type"`
	UserID        *string    `db:"user_id"`
	ApplicationID *string    `db:"application_id"`
	ClientID      string     `db:"client_id"`
	SessionID     *string    `db:"session_id"`
	Reason        string     `db:"reason"`
	IP            string     `db:"ip"`
	UserAgent     string     `db:"user_agent"`
	Data          JSONObject `db:"data"`
	CreatedAt     time.Time  `db:"created_at"`
}

const authEventColumns = `id, type, user_id, application_id, client_id, session_id, reason, ip, user_agent, data, created_at`

// AppendAuthEvents adds entries to the auth event log, in the context's unit
// of work when there is one (with what they record: both or neither).
func (s *Store) AppendAuthEvents(ctx context.Context, events ...AuthEvent) error {
	for _, e := range events {
		if e.Data == nil {
			e.Data = JSONObject{}
		}
		if _, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO auth_events (`+authEventColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			e.ID, e.Type, e.UserID, e.ApplicationID, e.ClientID, e.SessionID, e.Reason, e.IP, e.UserAgent, e.Data, e.CreatedAt.UTC()); err != nil {
			return mapError(err)
		}
	}
	return nil
}

// ListAuthEvents returns one page of the log, oldest first; userID, when
// not empty, keeps one person's entries.
func (s *Store) ListAuthEvents(ctx context.Context, userID string, p Page) ([]AuthEvent, error) {
	if err := p.valid(); err != nil {
		return nil, err
	}
	out := []AuthEvent{}
	var err error
	if userID == "" {
		err = s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+authEventColumns+` FROM auth_events ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	} else {
		err = s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+authEventColumns+` FROM auth_events WHERE user_id = ? ORDER BY created_at, id LIMIT ? OFFSET ?`), userID, p.Limit, p.Offset)
	}
	return out, mapError(err)
}
