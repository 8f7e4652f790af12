package persistence

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/handler/openid"
	"github.com/ory/fosite/handler/pkce"
)

// The storage of fosite's authorization code, PKCE, OpenID Connect and
// refresh token handlers. Codes and refresh tokens are keyed by their
// signatures (HMACs computed by fosite's strategies), never by the secret.
// The PKCE and OpenID Connect requests ride on their code's row: fosite
// stores them right after the code, with the same request.
//
// A person's codes and tokens belong to an SSO session (SSOBound): they
// are valid only while it lives, so ending a session, or deleting the
// person (sessions cascade), revokes them all at once, on every replica,
// without a scan (the session's liveness is cached like clients and
// evicted with evictSession). An agent's refresh tokens belong to a
// person's delegation (DelegationBound) in the same way.

var (
	_ oauth2.AuthorizeCodeStorage        = (*Store)(nil)
	_ oauth2.TokenRevocationStorage      = (*Store)(nil)
	_ pkce.PKCERequestStorage            = (*Store)(nil)
	_ openid.OpenIDConnectRequestStorage = (*Store)(nil)
)

// SSOBound is a fosite session that belongs to a person's SSO session
// (oauth.Session): what is issued with it lives no longer than that.
type SSOBound interface {
	SSOSessionID() string
}

// flowRow is what codes and refresh tokens store of their request.
type flowRow struct {
	Signature       string     `db:"signature"`
	RequestID       string     `db:"request_id"`
	ClientID        string     `db:"client_id"`
	PrincipalID     string     `db:"principal_id"`
	SessionID       *string    `db:"session_id"`
	Scopes          StringList `db:"scopes"`
	GrantedScopes   StringList `db:"granted_scopes"`
	Audience        StringList `db:"audience"`
	GrantedAudience StringList `db:"granted_audience"`
	Session         string     `db:"session"`
	Active          bool       `db:"active"`
	RequestedAt     time.Time  `db:"requested_at"`
	ExpiresAt       time.Time  `db:"expires_at"`
}

// newFlowRow is the row of a request about to be stored, expiring with
// the session's expiry of kind.
func newFlowRow(signature string, req fosite.Requester, kind fosite.TokenType) (*flowRow, error) {
	client, ok := req.GetClient().(*Client)
	if !ok {
		return nil, errors.New("a request without a stored client")
	}
	exp := req.GetSession().GetExpiresAt(kind)
	if exp.IsZero() {
		return nil, errors.New(string(kind) + " session has no expiry")
	}
	session, err := json.Marshal(req.GetSession())
	if err != nil {
		return nil, err
	}
	r := &flowRow{
		Signature: signature, RequestID: req.GetID(), ClientID: client.ID, PrincipalID: client.PrincipalID,
		Scopes: StringList(req.GetRequestedScopes()), GrantedScopes: StringList(req.GetGrantedScopes()),
		Audience: StringList(req.GetRequestedAudience()), GrantedAudience: StringList(req.GetGrantedAudience()),
		Session: string(session), Active: true, RequestedAt: req.GetRequestedAt().UTC(), ExpiresAt: exp.UTC(),
	}
	if b, ok := req.GetSession().(SSOBound); ok && b.SSOSessionID() != "" {
		id := b.SSOSessionID()
		r.SessionID = &id
	}
	return r, nil
}

// request rebuilds the stored request with form, its session decoded into
// session (when given), and its client as it is now. A client gone (or made
// again under the same id) or an SSO session ended is fosite.ErrNotFound.
func (s *Store) request(ctx context.Context, r *flowRow, form string, session fosite.Session) (*fosite.Request, error) {
	client, err := s.GetClient(ctx, r.ClientID)
	if err != nil {
		return nil, err
	}
	if client.(*Client).PrincipalID != r.PrincipalID {
		return nil, fosite.ErrNotFound
	}
	if r.SessionID != nil {
		if live, err := s.ssoSessionLive(ctx, *r.SessionID); err != nil {
			return nil, err
		} else if !live {
			return nil, fosite.ErrNotFound
		}
	}
	req := fosite.NewRequest()
	req.ID = r.RequestID
	req.RequestedAt = r.RequestedAt.UTC()
	req.Client = client
	req.RequestedScope = fosite.Arguments(r.Scopes)
	req.GrantedScope = fosite.Arguments(r.GrantedScopes)
	req.RequestedAudience = fosite.Arguments(r.Audience)
	req.GrantedAudience = fosite.Arguments(r.GrantedAudience)
	if form != "" {
		if err := json.Unmarshal([]byte(form), &req.Form); err != nil {
			return nil, err
		}
	}
	if session != nil {
		f := flowFrom(ctx)
		if !f.decodedInto(r.Signature, session) {
			if err := decodeJSON(r.Session, session); err != nil {
				return nil, err
			}
			f.keepDecoded(r.Signature, session)
		}
		req.Session = session
		// A delegation's refresh token lives no longer than the
		// delegation, as its access tokens (GetAccessTokenSession). Read
		// without a session (revocation), it may still be revoked.
		if b, ok := session.(DelegationBound); ok && b.DelegationRef() != "" {
			if live, err := s.delegationLive(ctx, b.DelegationRef()); err != nil {
				return nil, err
			} else if !live {
				return nil, fosite.ErrNotFound
			}
		}
	}
	return req, nil
}

func formJSON(form url.Values) (string, error) {
	if form == nil {
		form = url.Values{}
	}
	b, err := json.Marshal(form)
	return string(b), err
}

// --- authorization codes

type codeRow struct {
	flowRow
	Form            string  `db:"form"`
	PKCE            *string `db:"pkce"`
	OIDC            *string `db:"oidc"`
	AccessSignature *string `db:"access_signature"`
}

const codeColumns = `signature, request_id, client_id, principal_id, session_id, scopes, granted_scopes, audience, granted_audience,
	form, pkce, oidc, session, active, access_signature, requested_at, expires_at`

// CreateAuthorizeCodeSession implements oauth2.AuthorizeCodeStorage.
func (s *Store) CreateAuthorizeCodeSession(ctx context.Context, signature string, req fosite.Requester) error {
	r, err := newFlowRow(signature, req, fosite.AuthorizeCode)
	if err != nil {
		return err
	}
	form, err := formJSON(req.GetRequestForm())
	if err != nil {
		return err
	}
	_, err = s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO authorization_codes (`+codeColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?, NULL, ?, ?)`),
		r.Signature, r.RequestID, r.ClientID, r.PrincipalID, r.SessionID, r.Scopes, r.GrantedScopes, r.Audience, r.GrantedAudience,
		form, r.Session, true, r.RequestedAt, r.ExpiresAt)
	return mapError(err)
}

// code reads a code's row. Within a flow (Grouped) it is read once: a
// code's exchange asks four times (the code twice, its PKCE and OpenID
// Connect requests), and what changes meanwhile its guard finds. A code
// this process issued comes from the cache the first time it is asked for
// (and only then): the row as committed, which only its exchange changes.
func (s *Store) code(ctx context.Context, signature string) (*codeRow, error) {
	f := flowFrom(ctx)
	if r := f.readCode(signature); r != nil {
		return r, nil
	}
	if r := s.cacheFor(ctx).takeCode(signature); r != nil {
		f.keepCode(r)
		return r, nil
	}
	var r codeRow
	err := mapError(s.stmt(ctx, s.codeStmt).GetContext(ctx, &r, signature))
	if errors.Is(err, ErrNotFound) {
		return nil, fosite.ErrNotFound
	} else if err != nil {
		return nil, err
	}
	f.keepCode(&r)
	return &r, nil
}

// GetAuthorizeCodeSession implements oauth2.AuthorizeCodeStorage. A used
// code answers its request with fosite.ErrInvalidatedAuthorizeCode, so that
// fosite revokes what it issued (RFC 6749 §4.1.2).
func (s *Store) GetAuthorizeCodeSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	r, err := s.code(ctx, signature)
	if err != nil {
		return nil, err
	}
	req, err := s.request(ctx, &r.flowRow, r.Form, session)
	if err != nil {
		return nil, err
	}
	if !r.Active {
		return req, fosite.ErrInvalidatedAuthorizeCode
	}
	return req, nil
}

// InvalidateAuthorizeCodeSession implements oauth2.AuthorizeCodeStorage:
// the code is used. A code used meanwhile by a concurrent request is
// fosite.ErrInvalidatedAuthorizeCode.
func (s *Store) InvalidateAuthorizeCodeSession(ctx context.Context, signature string) error {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE authorization_codes SET active = ? WHERE signature = ? AND active = ?`), false, signature, true)
	if err != nil {
		return mapError(err)
	}
	if affectedOne(res) != nil {
		return fosite.ErrInvalidatedAuthorizeCode
	}
	return nil
}

// CreatePKCERequestSession implements pkce.PKCERequestStorage: the
// challenge is kept with its code, which must be stored already.
func (s *Store) CreatePKCERequestSession(ctx context.Context, signature string, req fosite.Requester) error {
	return s.setCodePart(ctx, "pkce", signature, req.GetRequestForm())
}

// GetPKCERequestSession implements pkce.PKCERequestStorage.
func (s *Store) GetPKCERequestSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	r, err := s.code(ctx, signature)
	if err != nil {
		return nil, err
	}
	if r.PKCE == nil {
		return nil, fosite.ErrNotFound
	}
	return s.request(ctx, &r.flowRow, *r.PKCE, session)
}

// DeletePKCERequestSession implements pkce.PKCERequestStorage.
func (s *Store) DeletePKCERequestSession(ctx context.Context, signature string) error {
	return s.setCodePart(ctx, "pkce", signature, nil)
}

// CreateOpenIDConnectSession implements openid.OpenIDConnectRequestStorage,
// keyed by the code's signature (fosite passes the code itself: the
// provider hashes it first, see oauth's codeKeyed), on its code's row.
func (s *Store) CreateOpenIDConnectSession(ctx context.Context, signature string, req fosite.Requester) error {
	return s.setCodePart(ctx, "oidc", signature, req.GetRequestForm())
}

// GetOpenIDConnectSession implements openid.OpenIDConnectRequestStorage;
// the request's session is decoded into requester's.
func (s *Store) GetOpenIDConnectSession(ctx context.Context, signature string, requester fosite.Requester) (fosite.Requester, error) {
	r, err := s.code(ctx, signature)
	if err != nil {
		return nil, err
	}
	if r.OIDC == nil {
		return nil, openid.ErrNoSessionFound
	}
	var session fosite.Session
	if requester != nil {
		session = requester.GetSession()
	}
	return s.request(ctx, &r.flowRow, *r.OIDC, session)
}

// DeleteOpenIDConnectSession implements openid.OpenIDConnectRequestStorage.
func (s *Store) DeleteOpenIDConnectSession(ctx context.Context, signature string) error {
	return s.setCodePart(ctx, "oidc", signature, nil)
}

// setCodePart stores (form) or removes (nil) the PKCE or OpenID Connect
// request of a code; a code not stored is fosite.ErrNotFound.
func (s *Store) setCodePart(ctx context.Context, column, signature string, form url.Values) error {
	var value *string
	if form != nil {
		f, err := formJSON(form)
		if err != nil {
			return err
		}
		value = &f
	}
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE authorization_codes SET `+column+` = ? WHERE signature = ?`), value, signature)
	if err != nil {
		return mapError(err)
	}
	if affectedOne(res) != nil {
		return fosite.ErrNotFound
	}
	return nil
}

// linkCodeAccessToken records on a code, after its exchange, the access
// token it issued (signature): a replay of the code revokes it even when no
// refresh token came with it. Only the family's first access token finds
// its code unlinked.
func (s *Store) linkCodeAccessToken(ctx context.Context, requestID, signature string) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE authorization_codes SET access_signature = ? WHERE request_id = ? AND access_signature IS NULL AND active = ?`),
		signature, requestID, false)
	return mapError(err)
}

// --- refresh tokens

type refreshRow struct {
	flowRow
	AccessSignature string     `db:"access_signature"`
	Subject         string     `db:"subject"`
	UsedAt          *time.Time `db:"used_at"` // first rotated; nil while unused
}

// refreshColumns are a new refresh token's; refreshReadColumns add what
// its rotation sets.
const (
	refreshColumns = `signature, request_id, access_signature, client_id, principal_id, subject, session_id, scopes, granted_scopes,
	audience, granted_audience, session, active, requested_at, expires_at`
	refreshReadColumns = refreshColumns + `, used_at`
)

// CreateRefreshTokenSession implements oauth2.RefreshTokenStorage.
func (s *Store) CreateRefreshTokenSession(ctx context.Context, signature, accessSignature string, req fosite.Requester) error {
	r, err := newFlowRow(signature, req, fosite.RefreshToken)
	if err != nil {
		return err
	}
	_, err = s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO refresh_tokens (`+refreshColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		r.Signature, r.RequestID, accessSignature, r.ClientID, r.PrincipalID, req.GetSession().GetSubject(), r.SessionID,
		r.Scopes, r.GrantedScopes, r.Audience, r.GrantedAudience, r.Session, true, r.RequestedAt, r.ExpiresAt)
	return mapError(err)
}

func (s *Store) refreshToken(ctx context.Context, q querier, signature, lock string) (*refreshRow, error) {
	var r refreshRow
	var err error
	if q == nil {
		err = s.stmt(ctx, s.refreshStmt).GetContext(ctx, &r, signature)
	} else {
		err = q.GetContext(ctx, &r, s.q(`SELECT `+refreshReadColumns+` FROM refresh_tokens WHERE signature = ?`+lock), signature)
	}
	err = mapError(err)
	if errors.Is(err, ErrNotFound) {
		return nil, fosite.ErrNotFound
	}
	return &r, err
}

// GetRefreshTokenSession implements oauth2.RefreshTokenStorage. A rotated
// token answers its request with fosite.ErrInactiveToken: fosite then
// revokes its family (DeleteRefreshTokenSession). Grouped reads with the
// reuse grace window.
func (s *Store) GetRefreshTokenSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	return s.refreshTokenSession(ctx, signature, session, 0)
}

// refreshTokenSession is GetRefreshTokenSession, where a token rotated less
// than grace ago reads as active: presenting it again is an honest retry (a
// lost answer, a concurrent refresh), which gets tokens and revokes nothing.
func (s *Store) refreshTokenSession(ctx context.Context, signature string, session fosite.Session, grace time.Duration) (fosite.Requester, error) {
	r, err := s.refreshToken(ctx, nil, signature, "") // prepared
	if err != nil {
		return nil, err
	}
	req, err := s.request(ctx, &r.flowRow, "", session)
	if err != nil {
		return nil, err
	}
	if !r.Active && !r.inGrace(time.Now(), grace) {
		return req, fosite.ErrInactiveToken
	}
	return req, nil
}

// inGrace tells whether the token was rotated less than grace before now.
func (r *refreshRow) inGrace(now time.Time, grace time.Duration) bool {
	return grace > 0 && r.UsedAt != nil && now.Before(r.UsedAt.Add(grace))
}

// DeleteRefreshTokenSession implements oauth2.RefreshTokenStorage. fosite
// deletes a refresh token only when a rotated one came back: that is reuse
// (RFC 9700 §4.14.2), so the whole family goes with it, and the event log
// records it, in one transaction.
func (s *Store) DeleteRefreshTokenSession(ctx context.Context, signature string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		r, err := s.refreshToken(ctx, tx, signature, s.forUpdate())
		if errors.Is(err, fosite.ErrNotFound) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		evictions, err := s.revokeFamily(ctx, tx, r.RequestID, true)
		if err != nil || r.Active {
			return evictions, err
		}
		return evictions, s.insertAuthEvents(ctx, tx, []AuthEvent{r.event(EventRefreshReuse)})
	})
}

// event is an auth event about the refresh token's person and application.
func (r *refreshRow) event(typ string) AuthEvent {
	e := AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: typ, ClientID: r.ClientID, SessionID: r.SessionID, CreatedAt: time.Now().UTC(),
		Data: JSONObject{"family": r.RequestID}}
	if uuid.Validate(r.Subject) == nil {
		e.UserID = &r.Subject
	}
	if uuid.Validate(r.PrincipalID) == nil {
		e.ApplicationID = &r.PrincipalID
	}
	return e
}

// RotateRefreshToken implements oauth2.RefreshTokenStorage: the token used
// becomes inactive (kept until it expires, to recognise its reuse), the
// time of its first use is kept, and the refresh is recorded in the event
// log. The access tokens issued before live on until they expire. A token
// rotated meanwhile by a concurrent request is fosite.ErrInactiveToken.
func (s *Store) RotateRefreshToken(ctx context.Context, requestID, signature string) error {
	return s.rotateRefreshToken(ctx, requestID, signature, 0)
}

// rotateRefreshToken is RotateRefreshToken, where a token rotated less than
// grace ago rotates again (see refreshTokenSession).
func (s *Store) rotateRefreshToken(ctx context.Context, requestID, signature string, grace time.Duration) error {
	q := s.conn(ctx)
	r, err := s.refreshToken(ctx, q, signature, s.forUpdate())
	if err != nil {
		return err
	}
	if r.RequestID != requestID {
		return fosite.ErrNotFound
	}
	guard := rotation(requestID, signature, time.Now(), grace)
	res, err := q.ExecContext(ctx, s.q(guard.query()), guard.args...)
	if err != nil {
		return mapError(err)
	}
	if affectedOne(res) != nil {
		return fosite.ErrInactiveToken
	}
	return s.insertAuthEvents(ctx, q, []AuthEvent{r.event(EventTokenRefreshed)})
}

// rotation is the guard of a refresh at now: the token used is still
// active, or was first used less than grace ago (an honest retry); it
// becomes inactive, and its first use is kept.
func rotation(requestID, signature string, now time.Time, grace time.Duration) *statement {
	st := &statement{table: "refresh_tokens", set: "active = ?, used_at = COALESCE(used_at, ?)", where: "signature = ? AND request_id = ? AND active = ?",
		args: []any{false, now.UTC(), signature, requestID, true}, key: signature}
	if grace > 0 {
		st.where = "signature = ? AND request_id = ? AND (active = ? OR used_at > ?)"
		st.args = append(st.args, now.Add(-grace).UTC())
	}
	return st
}

// RevokeRefreshToken implements oauth2.TokenRevocationStorage: the family
// of requestID, refresh and access tokens, is revoked.
func (s *Store) RevokeRefreshToken(ctx context.Context, requestID string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		return s.revokeFamily(ctx, tx, requestID, true)
	})
}

// RevokeAccessToken implements oauth2.TokenRevocationStorage: the access
// tokens of the family of requestID are revoked.
func (s *Store) RevokeAccessToken(ctx context.Context, requestID string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		return s.revokeFamily(ctx, tx, requestID, false)
	})
}

// revokeFamily deletes the access tokens of a family (found through its
// refresh tokens and its code) and, with refresh, its refresh tokens; it
// answers the evictions of the access tokens.
func (s *Store) revokeFamily(ctx context.Context, tx *sqlx.Tx, requestID string, refresh bool) ([]string, error) {
	var signatures []string
	if err := tx.SelectContext(ctx, &signatures, s.q(`SELECT access_signature FROM refresh_tokens WHERE request_id = ?
		UNION SELECT access_signature FROM authorization_codes WHERE request_id = ? AND access_signature IS NOT NULL`), requestID, requestID); err != nil {
		return nil, err
	}
	evictions := make([]string, 0, len(signatures))
	for _, sig := range signatures {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM access_tokens WHERE signature = ?`), sig); err != nil {
			return nil, err
		}
		evictions = append(evictions, evictToken+sig)
	}
	if refresh {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM refresh_tokens WHERE request_id = ?`), requestID); err != nil {
			return nil, err
		}
	}
	return evictions, nil
}

// DeleteExpiredFlows removes the codes and refresh tokens that expired
// before now, and reports how many.
func (s *Store) DeleteExpiredFlows(ctx context.Context, now time.Time) (int64, error) {
	return s.deleteExpired(ctx, now, "authorization_codes", "refresh_tokens")
}

// --- SSO session liveness

// ssoSessionLive tells whether an SSO session exists and is before its
// absolute end, from the cache when it can (evicted with evictSession when
// the session ends). Idle sessions are ended by the sweeper.
func (s *Store) ssoSessionLive(ctx context.Context, id string) (bool, error) {
	if uuid.Validate(id) != nil {
		return false, nil // no session has such an id
	}
	cache := s.cacheFor(ctx)
	ss := cache.session(id)
	if ss == nil {
		rs := cache.begin()
		var err error
		ss, err = s.GetSSOSession(ctx, id)
		if errors.Is(err, ErrNotFound) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		cache.putSession(rs, ss)
	}
	return time.Now().Before(ss.ExpiresAt), nil
}

// deleteExpired removes the rows of tables that expired before now (their
// expires_at), and reports how many.
func (s *Store) deleteExpired(ctx context.Context, now time.Time, tables ...string) (int64, error) {
	var total int64
	for _, table := range tables {
		res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM `+table+` WHERE expires_at < ?`), now.UTC())
		if err != nil {
			return total, mapError(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, mapError(err)
		}
		total += n
	}
	return total, nil
}
