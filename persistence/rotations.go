package persistence

import (
	"context"
	"sort"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/storage"
)

// Rotations is the store as fosite's refresh grant handler sees it. A
// refresh's writes (the used token made inactive, the new access and
// refresh tokens, the token_refreshed event) wait in the context of
// fosite's transaction and are committed by the group commit, with
// concurrent refreshes and tokens: one commit for many refreshes, where a
// transaction each would queue on SQLite's single writer for an fsync
// each. The used token's rotation is still checked in that commit, row by
// row: a token rotated meanwhile fails its own refresh alone
// (fosite.ErrInactiveToken), and nothing of it is written. Everything else
// (the reads before; reuse's revocation of a family) is the store's, in a
// unit of work as usual.
type Rotations struct{ *Store }

var (
	_ oauth2.TokenRevocationStorage = Rotations{}
	_ storage.Transactional         = Rotations{}
)

// Refreshes is the store for fosite's refresh grant handler.
func (s *Store) Refreshes() Rotations { return Rotations{s} }

// rotation is one refresh's pending writes.
type rotation struct {
	signature, requestID string       // the token used
	token                *tokenRow    // the new access token
	audit                []AuditEntry // committed with it (WithTokenAudit)
	refresh              []any        // the new refresh token, refreshColumns
	event                []any        // token_refreshed, authEventColumns
	lost                 bool         // set by the commit: rotated meanwhile
}

type rotationKey struct{}

func rotationFrom(ctx context.Context) *rotation {
	r, _ := ctx.Value(rotationKey{}).(*rotation)
	return r
}

// BeginTX implements storage.Transactional: a unit of work (for what is
// not a rotation) and a pending rotation. Within a unit, the rotation
// joins it instead.
func (r Rotations) BeginTX(ctx context.Context) (context.Context, error) {
	within := unitFrom(ctx) != nil
	ctx, err := r.Store.BeginTX(ctx)
	if err != nil || within {
		return ctx, err
	}
	return context.WithValue(ctx, rotationKey{}, &rotation{}), nil
}

// Commit implements storage.Transactional: the unit's writes, if any, and
// then the rotation's through the group commit.
func (r Rotations) Commit(ctx context.Context) error {
	if err := r.Store.Commit(ctx); err != nil {
		return err
	}
	rot := rotationFrom(ctx)
	if rot == nil || rot.signature == "" {
		return nil
	}
	if err := r.tokens.write(ctx, tokenWrite{token: rot.token, audit: rot.audit, rotation: rot}); err != nil {
		return err
	}
	if rot.lost {
		return fosite.ErrInactiveToken
	}
	return nil
}

// Rollback implements storage.Transactional: the rotation is dropped.
func (r Rotations) Rollback(ctx context.Context) error {
	if rot := rotationFrom(ctx); rot != nil {
		*rot = rotation{}
	}
	return r.Store.Rollback(ctx)
}

// RotateRefreshToken implements oauth2.RefreshTokenStorage: the token used
// is made inactive at the commit, if it is still active then and of
// requestID.
func (r Rotations) RotateRefreshToken(ctx context.Context, requestID, signature string) error {
	rot := rotationFrom(ctx)
	if rot == nil {
		return r.Store.RotateRefreshToken(ctx, requestID, signature)
	}
	rot.signature, rot.requestID = signature, requestID
	return nil
}

// CreateAccessTokenSession implements oauth2.AccessTokenStorage: within a
// rotation, the token is written with it.
func (r Rotations) CreateAccessTokenSession(ctx context.Context, signature string, req fosite.Requester) error {
	rot := rotationFrom(ctx)
	if rot == nil {
		return r.Store.CreateAccessTokenSession(ctx, signature, req)
	}
	row, err := newTokenRow(signature, req)
	if err != nil {
		return err
	}
	rot.token = row
	rot.audit, _ = ctx.Value(tokenAuditKey{}).([]AuditEntry)
	return nil
}

// CreateRefreshTokenSession implements oauth2.RefreshTokenStorage: within
// a rotation, the token and its token_refreshed event are written with it.
func (r Rotations) CreateRefreshTokenSession(ctx context.Context, signature, accessSignature string, req fosite.Requester) error {
	rot := rotationFrom(ctx)
	if rot == nil {
		return r.Store.CreateRefreshTokenSession(ctx, signature, accessSignature, req)
	}
	f, err := newFlowRow(signature, req, fosite.RefreshToken)
	if err != nil {
		return err
	}
	row := refreshRow{flowRow: *f, AccessSignature: accessSignature, Subject: req.GetSession().GetSubject()}
	rot.refresh = row.args()
	e := row.event(EventTokenRefreshed)
	rot.event = e.args()
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

// commitRotations commits a batch holding rotations in one transaction:
// each rotation first makes its used token inactive (in signature order,
// so that concurrent batches lock rows in one order), and one that finds
// it rotated meanwhile is lost and writes nothing; then the rows of the
// others go in by the multi-row INSERTs. On SQLite the transaction queues
// on the units' lock like a unit of work.
func (w *tokenWriter) commitRotations(ctx context.Context, batch []tokenWrite) error {
	if w.s.unitLock != nil {
		w.s.unitLock <- struct{}{}
		defer func() { <-w.s.unitLock }()
	}
	tx, err := w.s.db.BeginTx(ctx, nil)
	if err != nil {
		return mapError(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	rotate, err := w.prepared(ctx, "rotate", func() string {
		return `UPDATE refresh_tokens SET active = ? WHERE signature = ? AND request_id = ? AND active = ?`
	})
	if err != nil {
		return mapError(err)
	}
	rotate = tx.StmtContext(ctx, rotate)
	order := make([]*rotation, 0, len(batch))
	for _, b := range batch {
		if b.rotation != nil {
			order = append(order, b.rotation)
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i].signature < order[j].signature })
	for _, rot := range order {
		res, err := rotate.ExecContext(ctx, false, rot.signature, rot.requestID, true)
		if err != nil {
			return mapError(err)
		}
		rot.lost = affectedOne(res) != nil
	}
	kept := make([]tokenWrite, 0, len(batch))
	refresh := rowSet{table: "refresh_tokens", columns: refreshColumns}
	events := rowSet{table: "auth_events", columns: authEventColumns}
	for _, b := range batch {
		if rot := b.rotation; rot != nil {
			if rot.lost {
				continue
			}
			if rot.refresh != nil {
				refresh.args = append(refresh.args, rot.refresh...)
				refresh.n++
			}
			if rot.event != nil {
				events.args = append(events.args, rot.event...)
				events.n++
			}
		}
		kept = append(kept, b)
	}
	tokens, audit := w.rowSets(kept)
	if err := w.insert(ctx, tx, tokens, audit, refresh, events); err != nil {
		return mapError(err)
	}
	return mapError(tx.Commit())
}

// hasRotation tells whether a batch holds a refresh's rotation.
func hasRotation(batch []tokenWrite) bool {
	for _, b := range batch {
		if b.rotation != nil {
			return true
		}
	}
	return false
}
