package persistence

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/handler/openid"
	"github.com/ory/fosite/handler/pkce"
	"github.com/ory/fosite/storage"
)

// Grouped is the store as fosite's authorization-code, PKCE, OpenID Connect
// and refresh handlers see it: the writes of an authorization, a code's
// exchange or a refresh wait in its context and are committed by the group
// commit with concurrent ones and with access tokens (one commit for many
// flows), where a transaction each would queue on SQLite's single writer,
// holding its lock through every read and signature, for an fsync each.
//
// Reads go to the store outside any transaction (cached clients and
// sessions). What a flow must find unchanged is checked in the shared
// commit, flow by flow, by its guard: a code still unused, a refresh token
// still active. A flow whose guard fails is lost: nothing of it is written
// but its unguarded updates (a spent PKCE binding), and its owner's Commit
// says so (fosite.ErrInvalidatedAuthorizeCode, after revoking what the code
// issued meanwhile; fosite.ErrInactiveToken). Within a unit of work every
// call is the store's, in the unit.
type Grouped struct {
	*Store
	reuseGrace time.Duration // see WithReuseGrace
}

var (
	_ oauth2.AuthorizeCodeStorage        = Grouped{}
	_ oauth2.TokenRevocationStorage      = Grouped{}
	_ pkce.PKCERequestStorage            = Grouped{}
	_ openid.OpenIDConnectRequestStorage = Grouped{}
	_ storage.Transactional              = Grouped{}
)

// Grouped is the store for fosite's flows; see Grouped.
func (s *Store) Grouped() Grouped { return Grouped{Store: s} }

// WithReuseGrace is g where a refresh token rotated less than grace ago
// still refreshes (0: never): presented again, it is taken for an honest
// retry (an answer lost to a crash or the network, a concurrent refresh of
// the client's), not for theft (RFC 9700 §4.14.2, which leaves the choice
// to us; Auth0's reuse interval, Okta's grace period, Hydra's rotation
// grace period).
func (g Grouped) WithReuseGrace(grace time.Duration) Grouped {
	g.reuseGrace = grace
	return g
}

// GetRefreshTokenSession implements oauth2.RefreshTokenStorage, with the
// reuse grace window.
func (g Grouped) GetRefreshTokenSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	return g.Store.refreshTokenSession(ctx, signature, session, g.reuseGrace)
}

// flowWrite is one flow's pending writes.
type flowWrite struct {
	guard   *statement  // must change one row, else the flow is lost
	lostErr error       // what a lost flow's owner is told
	updates []statement // unguarded: written even when the flow is lost
	then    []statement // written after the guard held, only with the flow
	rows    []row       // new rows of other tables (see Store.OpenSession)
	code    []any       // a new code, codeColumns
	token   *tokenRow   // a new access token
	audit   []AuditEntry
	refresh []any // a new refresh token, refreshColumns
	event   []any // an auth event, authEventColumns
	lost    bool  // set by the commit

	read    *codeRow // the code read in the flow (Store.code)
	newCode *codeRow // the code row of f.code, cached once committed

	// The session last decoded from a row of the flow, and the row: fosite
	// decodes a code's session into the very session it decoded it into
	// before, three times in an exchange (the code again, its PKCE and
	// OpenID Connect requests); from the second time on that is skipped.
	decoded          fosite.Session
	decodedSignature string
}

// decodedInto tells whether the row of signature was decoded into session
// (the same object) in this flow.
func (f *flowWrite) decodedInto(signature string, session fosite.Session) bool {
	return f != nil && f.decoded != nil && f.decodedSignature == signature && samePointer(f.decoded, session)
}

// keepDecoded records that the row of signature was decoded into session.
func (f *flowWrite) keepDecoded(signature string, session fosite.Session) {
	if f != nil && reflect.ValueOf(session).Kind() == reflect.Pointer {
		f.decoded, f.decodedSignature = session, signature
	}
}

func samePointer(a, b fosite.Session) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Kind() == reflect.Pointer && vb.Kind() == reflect.Pointer && va.Type() == vb.Type() && va.Pointer() == vb.Pointer()
}

// join adds o's writes to the flow, whose owner commits them; a flow has
// one guard.
func (f *flowWrite) join(o *flowWrite) error {
	if o.guard != nil {
		if f.guard != nil {
			return errors.New("persistence: a flow takes one guard")
		}
		f.guard, f.lostErr = o.guard, o.lostErr
	}
	f.updates = append(f.updates, o.updates...)
	f.then = append(f.then, o.then...)
	f.rows = append(f.rows, o.rows...)
	return nil
}

// readCode is the flow's code of signature read before, if any.
func (f *flowWrite) readCode(signature string) *codeRow {
	if f == nil || f.read == nil || f.read.Signature != signature {
		return nil
	}
	r := *f.read // callers may change their copy
	return &r
}

// keepCode keeps a code read in the flow.
func (f *flowWrite) keepCode(r *codeRow) {
	if f != nil {
		c := *r
		f.read = &c
	}
}

// statement is an UPDATE of one row: UPDATE table SET set WHERE where, in
// ? form, with args for set's and then where's placeholders; or, with sql,
// any other statement.
type statement struct {
	table, set, where string
	sql               string
	args              []any
	key               string // the key of the row it changes
}

func (st statement) query() string {
	if st.sql != "" {
		return st.sql
	}
	return "UPDATE " + st.table + " SET " + st.set + " WHERE " + st.where
}

// row is a new row of table, for the batch's multi-row INSERT of its
// columns; suffix follows the VALUES (ON CONFLICT DO NOTHING, say).
type row struct {
	table, columns, suffix string
	args                   []any
}

// spend is an unguarded update that only empties columns of the row of
// key: NULLs, nothing to bind but the key.
func spend(table, set, key string) statement {
	return statement{table: table, set: set, where: "signature = ?", args: []any{key}, key: key}
}

// merged is the flow's guard with its unguarded updates folded in, when
// they all empty columns of the guard's row: one statement instead of
// several on the writer's path. If it changes no row (the flow is lost) the
// updates still have to be written on their own.
func (f *flowWrite) merged() (statement, bool) {
	g := *f.guard
	for _, u := range f.updates {
		if u.table != g.table || u.key != g.key || u.where != "signature = ?" {
			return statement{}, false
		}
		g.set += ", " + u.set
	}
	return g, len(f.updates) > 0
}

// rowKey is the signature of the row the flow's statements change.
func (f *flowWrite) rowKey() string {
	if f.guard != nil {
		return f.guard.key
	}
	return f.updates[0].key
}

type flowKey struct{}

// ownerKey marks the context of the flow's owner: the one whose Commit
// writes it (a joined BeginTX hides it).
type ownerKey struct{}

func flowFrom(ctx context.Context) *flowWrite {
	f, _ := ctx.Value(flowKey{}).(*flowWrite)
	return f
}

// BeginTX implements storage.Transactional: a new pending flow, owned by
// the context returned; within a flow it joins it (the owner commits);
// within a unit of work, it joins the unit.
func (g Grouped) BeginTX(ctx context.Context) (context.Context, error) {
	if unitFrom(ctx) != nil {
		return g.Store.BeginTX(ctx)
	}
	if flowFrom(ctx) != nil {
		return context.WithValue(ctx, ownerKey{}, false), nil
	}
	return context.WithValue(context.WithValue(ctx, flowKey{}, &flowWrite{}), ownerKey{}, true), nil
}

func owner(ctx context.Context) bool { o, _ := ctx.Value(ownerKey{}).(bool); return o }

// Commit implements storage.Transactional: the owner's commit writes the
// flow through the group commit; a lost flow is its lostErr.
func (g Grouped) Commit(ctx context.Context) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.Commit(ctx)
	}
	if !owner(ctx) {
		return nil
	}
	if f.guard == nil && f.updates == nil && f.then == nil && f.rows == nil && f.code == nil && f.token == nil {
		return nil
	}
	rs := g.cache.begin()
	if err := g.tokens.write(ctx, tokenWrite{token: f.token, audit: f.audit, flow: f}); err != nil {
		return err
	}
	if !f.lost {
		if f.newCode != nil {
			g.cache.putCode(rs, f.newCode)
		}
		return nil
	}
	if errors.Is(f.lostErr, fosite.ErrInvalidatedAuthorizeCode) && f.token != nil {
		// Used meanwhile by another exchange: what that one issued is
		// revoked, as for any replay (RFC 6749 §4.1.2).
		if err := errors.Join(g.Store.RevokeAccessToken(ctx, f.token.RequestID), g.Store.RevokeRefreshToken(ctx, f.token.RequestID)); err != nil {
			return err
		}
	}
	return f.lostErr
}

// Rollback implements storage.Transactional: the flow's writes are
// dropped, but for its unguarded updates (a PKCE binding spent before).
func (g Grouped) Rollback(ctx context.Context) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.Rollback(ctx)
	}
	*f = flowWrite{updates: f.updates, read: f.read}
	return nil
}

// CreateAuthorizeCodeSession implements oauth2.AuthorizeCodeStorage.
func (g Grouped) CreateAuthorizeCodeSession(ctx context.Context, signature string, req fosite.Requester) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.CreateAuthorizeCodeSession(ctx, signature, req)
	}
	r, err := newFlowRow(signature, req, fosite.AuthorizeCode)
	if err != nil {
		return err
	}
	form, err := formJSON(req.GetRequestForm())
	if err != nil {
		return err
	}
	f.code = []any{r.Signature, r.RequestID, r.ClientID, r.PrincipalID, r.SessionID, r.Scopes, r.GrantedScopes, r.Audience, r.GrantedAudience,
		form, nil, nil, r.Session, true, nil, r.RequestedAt, r.ExpiresAt}
	f.newCode = &codeRow{flowRow: *r, Form: form}
	// As the database gives them back: its own copies, microseconds.
	c := &f.newCode.flowRow
	c.Scopes, c.GrantedScopes, c.Audience, c.GrantedAudience = slices.Clone(c.Scopes), slices.Clone(c.GrantedScopes), slices.Clone(c.Audience), slices.Clone(c.GrantedAudience)
	c.RequestedAt, c.ExpiresAt = c.RequestedAt.Truncate(time.Microsecond), c.ExpiresAt.Truncate(time.Microsecond)
	return nil
}

// Indexes of the PKCE and OpenID Connect requests in a code's arguments.
const codePKCE, codeOIDC = 10, 11

// setCodePart sets a part of the flow's new code, if signature is it.
func (f *flowWrite) setCodePart(i int, signature string, req fosite.Requester) (bool, error) {
	if f == nil || f.code == nil || f.code[0] != signature {
		return false, nil
	}
	form, err := formJSON(req.GetRequestForm())
	f.code[i] = form
	if i == codePKCE {
		f.newCode.PKCE = &form
	} else {
		f.newCode.OIDC = &form
	}
	return true, err
}

// CreatePKCERequestSession implements pkce.PKCERequestStorage.
func (g Grouped) CreatePKCERequestSession(ctx context.Context, signature string, req fosite.Requester) error {
	if ok, err := flowFrom(ctx).setCodePart(codePKCE, signature, req); ok || err != nil {
		return err
	}
	return g.Store.CreatePKCERequestSession(ctx, signature, req)
}

// CreateOpenIDConnectSession implements openid.OpenIDConnectRequestStorage.
func (g Grouped) CreateOpenIDConnectSession(ctx context.Context, signature string, req fosite.Requester) error {
	if ok, err := flowFrom(ctx).setCodePart(codeOIDC, signature, req); ok || err != nil {
		return err
	}
	return g.Store.CreateOpenIDConnectSession(ctx, signature, req)
}

// DeletePKCERequestSession implements pkce.PKCERequestStorage: fosite
// spends the binding before it checks the verifier, so that a wrong one
// cannot be tried again; the update stands even if the flow fails.
func (g Grouped) DeletePKCERequestSession(ctx context.Context, signature string) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.DeletePKCERequestSession(ctx, signature)
	}
	f.updates = append(f.updates, spend("authorization_codes", "pkce = NULL", signature))
	return nil
}

// DeleteOpenIDConnectSession implements openid.OpenIDConnectRequestStorage.
func (g Grouped) DeleteOpenIDConnectSession(ctx context.Context, signature string) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.DeleteOpenIDConnectSession(ctx, signature)
	}
	f.updates = append(f.updates, spend("authorization_codes", "oidc = NULL", signature))
	return nil
}

// InvalidateAuthorizeCodeSession implements oauth2.AuthorizeCodeStorage:
// the guard of a code's exchange, the code still unused; it records the
// access token issued (see linkCodeAccessToken).
func (g Grouped) InvalidateAuthorizeCodeSession(ctx context.Context, signature string) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.InvalidateAuthorizeCodeSession(ctx, signature)
	}
	f.guard = &statement{table: "authorization_codes", set: "active = ?, access_signature = ?", where: "signature = ? AND active = ?",
		args: []any{false, nil, signature, true}, key: signature}
	f.lostErr = fosite.ErrInvalidatedAuthorizeCode
	return nil
}

// RotateRefreshToken implements oauth2.RefreshTokenStorage: the guard of a
// refresh, the token used still active (or used within the reuse grace
// window) and of requestID.
func (g Grouped) RotateRefreshToken(ctx context.Context, requestID, signature string) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.rotateRefreshToken(ctx, requestID, signature, g.reuseGrace)
	}
	f.guard = rotation(requestID, signature, time.Now(), g.reuseGrace)
	f.lostErr = fosite.ErrInactiveToken
	return nil
}

// CreateAccessTokenSession implements oauth2.AccessTokenStorage.
func (g Grouped) CreateAccessTokenSession(ctx context.Context, signature string, req fosite.Requester) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.CreateAccessTokenSession(ctx, signature, req)
	}
	row, err := newTokenRow(signature, req)
	if err != nil {
		return err
	}
	f.token = row
	f.audit, _ = ctx.Value(tokenAuditKey{}).([]AuditEntry)
	if f.guard != nil && errors.Is(f.lostErr, fosite.ErrInvalidatedAuthorizeCode) {
		f.guard.args[1] = signature // a replay of the code must find it
	}
	return nil
}

// CreateRefreshTokenSession implements oauth2.RefreshTokenStorage; a
// rotation's new token comes with its token_refreshed event.
func (g Grouped) CreateRefreshTokenSession(ctx context.Context, signature, accessSignature string, req fosite.Requester) error {
	f := flowFrom(ctx)
	if f == nil {
		return g.Store.CreateRefreshTokenSession(ctx, signature, accessSignature, req)
	}
	fr, err := newFlowRow(signature, req, fosite.RefreshToken)
	if err != nil {
		return err
	}
	row := refreshRow{flowRow: *fr, AccessSignature: accessSignature, Subject: req.GetSession().GetSubject()}
	f.refresh = row.args()
	if errors.Is(f.lostErr, fosite.ErrInactiveToken) {
		e := row.event(EventTokenRefreshed)
		f.event = e.args()
	}
	return nil
}

// args are the row's values in refreshColumns order.
func (r *refreshRow) args() []any {
	return []any{r.Signature, r.RequestID, r.AccessSignature, r.ClientID, r.PrincipalID, r.Subject, r.SessionID,
		r.Scopes, r.GrantedScopes, r.Audience, r.GrantedAudience, r.Session, true, r.RequestedAt, r.ExpiresAt}
}

// args are the event's values in authEventColumns order.
func (e AuthEvent) args() []any {
	if e.Data == nil {
		e.Data = JSONObject{}
	}
	return []any{e.ID, e.Type, e.UserID, e.ApplicationID, e.ClientID, e.SessionID, e.Reason, e.IP, e.UserAgent, e.Data, e.CreatedAt.UTC()}
}

// commitFlows commits a batch holding flows in one transaction: first the
// flows' guards and their unguarded updates (in the order of the rows they
// change, so that concurrent batches lock rows in one order), a flow whose
// guard changes no row being lost; then the rows of the batch but lost flows', by the
// multi-row INSERTs. On SQLite the transaction queues on the units' lock
// like a unit of work.
func (w *tokenWriter) commitFlows(ctx context.Context, batch []tokenWrite) error {
	defer w.prepareLater(ctx) // after the unit lock is given back
	if w.s.unitLock != nil {
		w.s.unitLock <- struct{}{}
		defer func() { <-w.s.unitLock }()
	}
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return mapError(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	exec := func(st statement) (int64, error) {
		q := st.query()
		prepared, err := w.inTx(ctx, tx, q, func() string { return q })
		if err != nil {
			return 0, err
		}
		res, err := prepared.ExecContext(ctx, st.args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	// Every flow's rows are of its one code or refresh token: taken in that
	// order, concurrent batches (PostgreSQL's several writers) lock rows in
	// one order and cannot deadlock.
	var flows []*flowWrite
	for _, b := range batch {
		if f := b.flow; f != nil && (f.guard != nil || f.updates != nil || f.then != nil) {
			flows = append(flows, f)
		}
	}
	sort.Slice(flows, func(i, j int) bool { return flows[i].rowKey() < flows[j].rowKey() })
	for _, f := range flows {
		updates := f.updates
		if f.guard != nil {
			guard, merged := f.merged()
			if !merged {
				guard = *f.guard
			}
			n, err := exec(guard)
			if err != nil {
				return mapError(err)
			}
			f.lost = n != 1
			if merged && !f.lost {
				updates = nil // written with the guard
			}
		}
		for _, st := range updates {
			if _, err := exec(st); err != nil {
				return mapError(err)
			}
		}
		if !f.lost {
			for _, st := range f.then {
				if _, err := exec(st); err != nil {
					return mapError(err)
				}
			}
		}
	}
	kept := make([]tokenWrite, 0, len(batch))
	codes := rowSet{table: "authorization_codes", columns: codeColumns}
	refresh := rowSet{table: "refresh_tokens", columns: refreshColumns}
	events := rowSet{table: "auth_events", columns: authEventColumns}
	// Other tables' rows, in the order their tables first come.
	var others []*rowSet
	other := func(r row) *rowSet {
		for _, set := range others {
			if set.table == r.table && set.columns == r.columns && set.suffix == r.suffix {
				return set
			}
		}
		others = append(others, &rowSet{table: r.table, columns: r.columns, suffix: r.suffix})
		return others[len(others)-1]
	}
	for _, b := range batch {
		if f := b.flow; f != nil {
			if f.lost {
				continue
			}
			for _, r := range f.rows {
				if r.table == events.table {
					events.args = append(events.args, r.args...)
					events.n++
					continue
				}
				set := other(r)
				set.args = append(set.args, r.args...)
				set.n++
			}
			for _, row := range []struct {
				set  *rowSet
				args []any
			}{{&codes, f.code}, {&refresh, f.refresh}, {&events, f.event}} {
				if row.args != nil {
					row.set.args = append(row.set.args, row.args...)
					row.set.n++
				}
			}
		}
		kept = append(kept, b)
	}
	tokens, audit := w.rowSets(kept)
	sets := make([]rowSet, 0, len(others)+5)
	for _, set := range others {
		sets = append(sets, *set)
	}
	if err := w.insert(ctx, tx, append(sets, codes, tokens, audit, refresh, events)...); err != nil {
		return mapError(err)
	}
	w.beforeCommit()
	return mapError(tx.Commit())
}

// hasFlow tells whether a batch holds a flow's writes.
func hasFlow(batch []tokenWrite) bool {
	for _, b := range batch {
		if b.flow != nil {
			return true
		}
	}
	return false
}
