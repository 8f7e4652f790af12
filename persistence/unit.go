package persistence

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/ory/fosite/storage"
)

// A unit of work is one transaction that travels in a context: every store
// call made with that context runs in it, token and audit writes included
// (they leave the group commit for it), and the cached records its changes
// make stale are evicted once, after its commit, which waits out one lease
// (see cache). A request that changes several records thus commits once and
// waits once; fosite's code and refresh flows get the atomicity they ask
// for through storage.Transactional.
type unit struct {
	tx        *sqlx.Tx
	evictions []string
}

type unitKey struct{}

func unitFrom(ctx context.Context) *unit {
	u, _ := ctx.Value(unitKey{}).(*unit)
	return u
}

// querier is what a query runs on: the context's transaction or the pool.
type querier interface {
	sqlx.ExtContext
	GetContext(ctx context.Context, dest any, query string, args ...any) error
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
}

// conn is where a query made with ctx runs: in its unit of work, if it has
// one, so that the unit reads its own writes.
func (s *Store) conn(ctx context.Context) querier {
	if u := unitFrom(ctx); u != nil {
		return u.tx
	}
	return s.db
}

var _ storage.Transactional = (*Store)(nil)

// BeginTX implements storage.Transactional: the returned context carries a
// new unit of work. Within a unit it joins that one.
func (s *Store) BeginTX(ctx context.Context) (context.Context, error) {
	if unitFrom(ctx) != nil {
		return ctx, nil
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return ctx, mapError(err)
	}
	return context.WithValue(ctx, unitKey{}, &unit{tx: tx}), nil
}

// Commit implements storage.Transactional: it commits the context's unit,
// then evicts and waits as inTx does.
func (s *Store) Commit(ctx context.Context) error {
	u := unitFrom(ctx)
	if u == nil {
		return errors.New("commit without a unit of work")
	}
	if err := s.announce(ctx, u.tx, u.evictions); err != nil {
		_ = u.tx.Rollback()
		return mapError(err)
	}
	if err := u.tx.Commit(); err != nil {
		return mapError(err)
	}
	s.afterCommit(u.evictions)
	return nil
}

// Rollback implements storage.Transactional.
func (s *Store) Rollback(ctx context.Context) error {
	u := unitFrom(ctx)
	if u == nil {
		return errors.New("rollback without a unit of work")
	}
	err := u.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return mapError(err)
}

// InTx runs fn as one unit of work: every store call fn makes with the
// context it is given joins one transaction, committed when fn returns nil
// and rolled back otherwise. Called within a unit, it joins that unit.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	if unitFrom(ctx) != nil {
		return fn(ctx)
	}
	ctx, err := s.BeginTX(ctx)
	if err != nil {
		return err
	}
	if err := fn(ctx); err != nil {
		_ = s.Rollback(ctx)
		return err
	}
	return s.Commit(ctx)
}

// inTx runs fn in the context's unit of work, or in a transaction of its
// own. fn returns the cached records its change makes stale; they are
// evicted after the commit, announced to other replicas at the commit
// (PostgreSQL), and the commit returns only once every other replica's
// lease on them has run out (see cache).
func (s *Store) inTx(ctx context.Context, fn func(tx *sqlx.Tx) ([]string, error)) error {
	return s.InTx(ctx, func(ctx context.Context) error {
		u := unitFrom(ctx)
		evictions, err := fn(u.tx)
		u.evictions = append(u.evictions, evictions...)
		return mapError(err)
	})
}

// afterCommit evicts what a committed change made stale and waits out the
// lease other replicas may hold on it. The change is committed; waiting
// cannot be cancelled into a half-done state, so it ignores any context.
func (s *Store) afterCommit(evictions []string) {
	if len(evictions) == 0 {
		return
	}
	s.cache.evict(evictions...)
	if s.cache.lease > 0 {
		time.Sleep(s.cache.lease)
	}
}
