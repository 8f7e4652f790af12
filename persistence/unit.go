package persistence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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
	begin      func() (*sqlx.Tx, error) // begins tx, on first use
	tx         *sqlx.Tx
	err        error // from beginning
	evictions  []string
	after      []func()
	savepoints int    // open savepoints (inTx)
	unlock     func() // releases the store's unit lock (SQLite), once; nil when not held
}

// release ends the unit's hold on the store's unit lock, if any.
func (u *unit) release() {
	if u.unlock != nil {
		u.unlock()
		u.unlock = nil
	}
}

type unitKey struct{}

func unitFrom(ctx context.Context) *unit {
	u, _ := ctx.Value(unitKey{}).(*unit)
	return u
}

// txn is the unit's transaction, begun on first use: a unit that a request
// opens before its handler runs takes no lock (SQLite) and no connection
// until the handler first reaches the store, after its own slow work
// (password hashing, say). A unit is used by one goroutine at a time.
func (u *unit) txn() (*sqlx.Tx, error) {
	if u.tx == nil && u.err == nil {
		u.tx, u.err = u.begin()
		u.err = mapError(u.err)
	}
	return u.tx, u.err
}

// querier is what a query runs on: the context's transaction or the pool.
type querier interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// conn is where a query made with ctx runs: in its unit of work, if it has
// one, so that the unit reads its own writes; else on the pool, prepared.
func (s *Store) conn(ctx context.Context) querier {
	if u := unitFrom(ctx); u != nil {
		tx, err := u.txn()
		if err != nil {
			return failed{err}
		}
		return tx
	}
	return s.stmts
}

// failed is a querier whose every query fails: a unit that could not begin.
type failed struct{ err error }

func (f failed) GetContext(context.Context, any, string, ...any) error           { return f.err }
func (f failed) SelectContext(context.Context, any, string, ...any) error        { return f.err }
func (f failed) ExecContext(context.Context, string, ...any) (sql.Result, error) { return nil, f.err }

// AfterCommit runs fn once the context's unit of work has committed (not if
// it rolls back), or at once outside a unit: what must not happen before
// the change is visible, such as waking the mail loop.
func (s *Store) AfterCommit(ctx context.Context, fn func()) {
	if u := unitFrom(ctx); u != nil {
		u.after = append(u.after, fn)
		return
	}
	fn()
}

var _ storage.Transactional = (*Store)(nil)

// BeginTX implements storage.Transactional: the returned context carries a
// new unit of work, whose transaction begins on first use. Within a unit it
// joins that one: Commit with the context it returns leaves the commit to
// the unit's owner, and Rollback rolls the whole unit back.
func (s *Store) BeginTX(ctx context.Context) (context.Context, error) {
	if unitFrom(ctx) != nil {
		return context.WithValue(ctx, joinedKey{}, true), nil
	}
	u := &unit{}
	u.begin = func() (*sqlx.Tx, error) {
		if s.unitLock != nil {
			// SQLite has one writer: units queue here, holding no
			// connection, rather than in SQLite's busy handler, which
			// sleeps in milliseconds and, with every pooled connection
			// taken by a waiting unit, starves the one that holds the lock.
			select {
			case s.unitLock <- struct{}{}:
				u.unlock = func() { <-s.unitLock }
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		tx, err := s.db.BeginTxx(ctx, nil)
		if err != nil {
			u.release()
		}
		return tx, err
	}
	return context.WithValue(ctx, unitKey{}, u), nil
}

// Commit implements storage.Transactional: it commits the context's unit,
// then evicts what it changed, waits out other replicas' leases on it (see
// inTx) and runs its AfterCommit functions.
func (s *Store) Commit(ctx context.Context) error {
	u := unitFrom(ctx)
	if u == nil {
		return errors.New("commit without a unit of work")
	}
	if joined(ctx) {
		return nil // the unit's owner commits
	}
	if u.tx != nil {
		if err := s.announce(ctx, u.tx, u.evictions); err != nil {
			_ = u.tx.Rollback()
			u.release()
			return mapError(err)
		}
		err := mapError(u.tx.Commit())
		u.release()
		s.writes.observe(err)
		if err != nil {
			return err
		}
		s.afterCommit(u.evictions)
	}
	for _, fn := range u.after {
		fn()
	}
	return nil
}

// joinedKey marks a context in which BeginTX joined a unit of work.
type joinedKey struct{}

func joined(ctx context.Context) bool { j, _ := ctx.Value(joinedKey{}).(bool); return j }

// Rollback implements storage.Transactional; after the end it does nothing.
// A unit rolled back by a joined context ends there: its owner's Commit
// then answers sql.ErrTxDone.
func (s *Store) Rollback(ctx context.Context) error {
	u := unitFrom(ctx)
	if u == nil {
		return errors.New("rollback without a unit of work")
	}
	if u.tx == nil {
		return nil
	}
	err := u.tx.Rollback()
	u.release()
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
		s.writes.observe(err) // a statement may fail for want of storage before the commit does
		_ = s.Rollback(ctx)
		return err
	}
	return s.Commit(ctx)
}

// inTx runs fn in the context's unit of work, or in a transaction of its
// own. fn returns the cached records its change makes stale; they are
// evicted after the commit, announced to other replicas at the commit
// (PostgreSQL), and the commit returns only once every other replica's
// lease on them has run out (see cache). Within a unit, fn runs under a
// savepoint: its failure undoes its own statements only, and leaves the
// unit usable (PostgreSQL would otherwise refuse every later statement of
// the transaction), so a caller can try again or go on.
func (s *Store) inTx(ctx context.Context, fn func(tx *sqlx.Tx) ([]string, error)) error {
	u := unitFrom(ctx)
	if u == nil { // a transaction of its own: no savepoint needed
		return s.InTx(ctx, func(ctx context.Context) error {
			u := unitFrom(ctx)
			tx, err := u.txn()
			if err != nil {
				return err
			}
			evictions, err := fn(tx)
			u.evictions = append(u.evictions, evictions...)
			return mapError(err)
		})
	}
	tx, err := u.txn()
	if err != nil {
		return err
	}
	u.savepoints++
	defer func() { u.savepoints-- }()
	name := fmt.Sprintf("unit_%d", u.savepoints)
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return mapError(err)
	}
	evictions, err := fn(tx)
	if err != nil {
		if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+name); rerr != nil {
			return mapError(errors.Join(err, rerr))
		}
		return mapError(err)
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return mapError(err)
	}
	u.evictions = append(u.evictions, evictions...)
	return nil
}

// afterCommit evicts what a committed change made stale and waits out the
// lease other replicas may hold on it. The change is committed; waiting
// cannot be cancelled into a half-done state, so it ignores any context.
func (s *Store) afterCommit(evictions []string) {
	if len(evictions) == 0 {
		return
	}
	s.cache.evict(evictions...)
	s.signals.raise(evictions...)
	if s.cache.lease > 0 && needsLease(evictions) {
		s.leaseWaits.Add(1)
		time.Sleep(s.cache.lease)
	}
}
