package persistence

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
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
	EventSignIn         = "sign_in"           // a person signed in
	EventSignInFailed   = "sign_in_failed"    // reason: a stable code, never the secret
	EventSessionStarted = "session_started"   // written before 2026-11-27: a sign_in now names the session it starts
	EventSessionEnded   = "session_ended"     // reason: logout, admin, user_deleted, expired
	EventTokenRefreshed = "token_refreshed"   //
	EventRefreshReuse   = "refresh_reused"    // a rotated refresh token came back: its family is revoked
	EventLogout         = "logout"            // RP-initiated logout
	EventCodeSent       = "sign_in_code_sent" // an e-mailed one-time code
	EventLinkSent       = "magic_link_sent"   // an e-mailed magic link
	EventUserSignedUp   = "user_signed_up"    // a passwordless sign-in created the person
	EventMFAUnavailable = "mfa_unavailable"   // a risk step-up with no second factor to ask (see signin.finish)
)

// Reasons a session ends (session_ended's reason).
const (
	SessionEndLogout       = "logout"        // the person signed out
	SessionEndAdmin        = "admin"         // an admin ended it
	SessionEndUserDeleted  = "user_deleted"  // the person was deleted
	SessionEndUserDisabled = "user_disabled" // the person was disabled
	SessionEndExpired      = "expired"       // idle or past its absolute end
	SessionEndReplaced     = "replaced"      // the browser signed in again
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

// AppendAuthEvents adds entries to the auth event log, with their webhook
// messages, in the context's unit of work when there is one (with what they
// record: both or neither).
func (s *Store) AppendAuthEvents(ctx context.Context, events ...AuthEvent) error {
	if unitFrom(ctx) == nil && len(events) > 0 {
		// A transaction of its own: the entries and their webhook messages.
		return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) { return nil, s.insertAuthEvents(ctx, tx, events) })
	}
	return s.insertAuthEvents(ctx, s.conn(ctx), events)
}

func (s *Store) insertAuthEvents(ctx context.Context, q querier, events []AuthEvent) error {
	for _, e := range events {
		if e.Data == nil {
			e.Data = JSONObject{}
		}
		if _, err := q.ExecContext(ctx, s.q(`INSERT INTO auth_events (`+authEventColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			e.ID, e.Type, e.UserID, e.ApplicationID, e.ClientID, e.SessionID, e.Reason, e.IP, e.UserAgent, e.Data, e.CreatedAt.UTC()); err != nil {
			return mapError(err)
		}
	}
	return mapError(s.insertWebhooks(ctx, q, authHooks(events)))
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

// Opening is what a sign-in writes as it opens a session: the session with
// its events and the person's last sign-in; with Spend, the e-mailed
// challenge it spends and the identity that proved; with Risk, the sign-in
// as the risk rules remember it.
type Opening struct {
	Session *SSOSession
	Events  []AuthEvent
	Spend   *Spend      // an e-mailed challenge the sign-in spends
	Passkey *PasskeyUse // or a passkey assertion it counts (one guard: not both)
	Risk    *RiskSignIn
}

// ErrChallengeUsed: the e-mailed challenge was used, expired or locked
// before it could be spent (of two requests with one code, one wins).
var ErrChallengeUsed = errors.New("the challenge can no longer be used")

// OpenSession writes an opening, all or nothing: in the context's unit of
// work when there is one; else in the context's flow (Grouped.BeginTX),
// whose owner's Commit writes it with the flow's code; else as a flow of
// its own. A flow's commit is shared with concurrent sign-ins and tokens
// (see Grouped). Its guard is the challenge, still usable at the session's
// auth time (else ErrChallengeUsed), or without one the person, still
// there (else ErrNotFound).
func (s *Store) OpenSession(ctx context.Context, o Opening) error {
	f := o.flow()
	hooks, err := s.webhookRows(ctx, s.conn(ctx), authHooks(o.Events))
	if err != nil {
		return mapError(err)
	}
	f.rows = append(f.rows, hooks...)
	return s.commitFlow(ctx, f)
}

// commitFlow writes a flow's writes, all or nothing: in the context's unit
// of work when there is one; else in the context's flow, whose owner
// commits it; else as a flow of its own in the group commit. A lost flow
// is its lostErr.
func (s *Store) commitFlow(ctx context.Context, f *flowWrite) error {
	if unitFrom(ctx) != nil {
		return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) { return nil, s.writeFlow(ctx, tx, f) })
	}
	if g := flowFrom(ctx); g != nil {
		return g.join(f)
	}
	if err := s.tokens.write(ctx, tokenWrite{flow: f}); err != nil {
		return err
	}
	if f.lost {
		return f.lostErr
	}
	return nil
}

// flow is the opening's writes.
func (o Opening) flow() *flowWrite {
	ss := o.Session
	at := ss.AuthTime.UTC()
	lastSignIn := statement{table: "users", set: "last_sign_in_at = ?", where: "id = ?", args: []any{at, ss.UserID}, key: ss.UserID}
	f := &flowWrite{guard: &lastSignIn, lostErr: ErrNotFound}
	switch {
	case o.Spend != nil:
		f = o.Spend.flow(at)
		f.then = append(f.then, lastSignIn)
	case o.Passkey != nil:
		f = o.Passkey.flow(at)
		f.then = append(f.then, lastSignIn)
	}
	f.rows = append(f.rows, row{table: "sso_sessions", columns: ssoSessionColumns, args: []any{ss.ID, ss.TokenHash, ss.UserID, ss.ApplicationID,
		ss.AMR, ss.ACR, at, ss.IP, ss.UserAgent, ss.CreatedAt.UTC(), ss.LastSeenAt.UTC(), ss.ExpiresAt.UTC()}})
	for _, e := range o.Events {
		f.rows = append(f.rows, row{table: "auth_events", columns: authEventColumns, args: e.args()})
	}
	if r := o.Risk; r != nil {
		then, rows := r.writes()
		f.then, f.rows = append(f.then, then...), append(f.rows, rows...)
	}
	return f
}

// writeFlow writes a flow's statements in a unit of work, in the order of
// the group commit: the guard, what follows it, the new rows.
func (s *Store) writeFlow(ctx context.Context, tx *sqlx.Tx, f *flowWrite) error {
	if g := f.guard; g != nil {
		res, err := tx.ExecContext(ctx, s.q(g.query()), g.args...)
		if err != nil {
			return mapError(err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return cmp.Or(mapError(err), f.lostErr)
		}
	}
	for _, st := range append(f.updates, f.then...) {
		if _, err := tx.ExecContext(ctx, s.q(st.query()), st.args...); err != nil {
			return mapError(err)
		}
	}
	for _, r := range f.rows {
		if _, err := tx.ExecContext(ctx, s.q(rowSet{table: r.table, columns: r.columns, suffix: r.suffix, n: 1}.insert()), r.args...); err != nil {
			return mapError(err)
		}
	}
	return nil
}

// SSOSessionByTokenHash finds the session whose cookie secret hashes to
// hash; none is ErrNotFound. Liveness (idle, absolute end) is the caller's
// rule.
func (s *Store) SSOSessionByTokenHash(ctx context.Context, hash []byte) (*SSOSession, error) {
	cache := s.cacheFor(ctx)
	if ss := cache.sessionByCookie(hash); ss != nil {
		return ss, nil
	}
	rs := cache.begin()
	var ss SSOSession
	if err := s.conn(ctx).GetContext(ctx, &ss, s.q(`SELECT `+ssoSessionColumns+` FROM sso_sessions WHERE token_hash = ?`), hash); err != nil {
		return nil, mapError(err)
	}
	cache.putSession(rs, &ss)
	return &ss, nil
}

// GetSSOSession reads one session by id.
func (s *Store) GetSSOSession(ctx context.Context, id string) (*SSOSession, error) {
	var ss SSOSession
	if err := s.conn(ctx).GetContext(ctx, &ss, s.q(`SELECT `+ssoSessionColumns+` FROM sso_sessions WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &ss, nil
}

// TouchInterval bounds how often a session's lastSeenAt is written: a
// browser that signs in to many applications a minute costs one write.
const TouchInterval = time.Minute

// TouchSSOSession moves the session's lastSeenAt to at, unless it moved
// less than TouchInterval before; it reports whether it wrote.
func (s *Store) TouchSSOSession(ctx context.Context, id string, at time.Time) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE sso_sessions SET last_seen_at = ? WHERE id = ? AND last_seen_at < ?`),
		at.UTC(), id, at.Add(-TouchInterval).UTC())
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, mapError(err)
	}
	if n > 0 {
		s.cacheFor(ctx).touchSession(id, at)
	} else { // touched elsewhere meanwhile: the next use reads the row
		s.cacheFor(ctx).evict(evictSession + id)
	}
	return n > 0, nil
}

// ListUserSSOSessions lists a person's sessions, oldest first.
func (s *Store) ListUserSSOSessions(ctx context.Context, userID string) ([]SSOSession, error) {
	out := []SSOSession{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+ssoSessionColumns+` FROM sso_sessions WHERE user_id = ? ORDER BY created_at, id`), userID)
	return out, mapError(err)
}

// EndSSOSession ends one session: the row goes, a session_ended event
// (with e's user, application, address, reason) is recorded for it with
// the other events, and what depends on the session is evicted after
// commit (evictSession). An unknown or already ended session is
// ErrNotFound.
func (s *Store) EndSSOSession(ctx context.Context, id string, ended AuthEvent, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var ss SSOSession
		if err := tx.GetContext(ctx, &ss, s.q(`SELECT `+ssoSessionColumns+` FROM sso_sessions WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		if err := s.deleteSessions(ctx, tx, []SSOSession{ss}, ended); err != nil {
			return nil, err
		}
		return []string{evictSession + id}, s.insertAuthEvents(ctx, tx, events)
	})
}

// EndUserSSOSessions ends every session of a person (see EndSSOSession)
// and answers how many it ended.
func (s *Store) EndUserSSOSessions(ctx context.Context, userID string, ended AuthEvent) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		evictions, err := s.endUserSessions(ctx, tx, userID, ended)
		n = len(evictions)
		return evictions, err
	})
	return n, err
}

// endUserSessions deletes a person's sessions in tx, records their
// session_ended events and answers their evictions.
func (s *Store) endUserSessions(ctx context.Context, tx *sqlx.Tx, userID string, ended AuthEvent) ([]string, error) {
	var list []SSOSession
	if err := tx.SelectContext(ctx, &list, s.q(`SELECT `+ssoSessionColumns+` FROM sso_sessions WHERE user_id = ?`+s.forUpdate()), userID); err != nil {
		return nil, err
	}
	if err := s.deleteSessions(ctx, tx, list, ended); err != nil {
		return nil, err
	}
	evictions := make([]string, len(list))
	for i, ss := range list {
		evictions[i] = evictSession + ss.ID
	}
	return evictions, nil
}

// deleteSessions removes sessions and records one session_ended event per
// session: ended's reason, address and time, the session's own ids.
func (s *Store) deleteSessions(ctx context.Context, tx *sqlx.Tx, list []SSOSession, ended AuthEvent) error {
	for _, ss := range list {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM sso_sessions WHERE id = ?`), ss.ID); err != nil {
			return err
		}
		e := ended
		e.ID, e.Type, e.UserID, e.SessionID = uuid.NewString(), EventSessionEnded, &ss.UserID, &ss.ID
		if e.ApplicationID == nil {
			e.ApplicationID = ss.ApplicationID
		}
		if e.CreatedAt.IsZero() {
			e.CreatedAt = time.Now()
		}
		if err := s.insertAuthEvents(ctx, tx, []AuthEvent{e}); err != nil {
			return err
		}
	}
	return nil
}

// DeleteExpiredSSOSessions ends the sessions past their absolute end, or
// idle longer than idle, at now (reason "expired"), and answers how many.
func (s *Store) DeleteExpiredSSOSessions(ctx context.Context, now time.Time, idle time.Duration) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var list []SSOSession
		if err := tx.SelectContext(ctx, &list, s.q(`SELECT `+ssoSessionColumns+` FROM sso_sessions WHERE expires_at <= ? OR last_seen_at <= ? LIMIT 1000`),
			now.UTC(), now.Add(-idle).UTC()); err != nil {
			return nil, err
		}
		if err := s.deleteSessions(ctx, tx, list, AuthEvent{Reason: SessionEndExpired, CreatedAt: now}); err != nil {
			return nil, err
		}
		n = len(list)
		evictions := make([]string, len(list))
		for i, ss := range list {
			evictions[i] = evictSession + ss.ID
		}
		return evictions, nil
	})
	return n, err
}
