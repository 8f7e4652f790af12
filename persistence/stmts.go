package persistence

import (
	"context"
	"database/sql"
	"sync"

	"github.com/jmoiron/sqlx"
)

// stmts runs the pool's queries as prepared statements, each prepared once
// (on each connection, as database/sql does): SQLite parses in our process,
// and parsing was a fifth of a sign-in's CPU; PostgreSQL saves a round
// trip. Queries come in a bounded set of shapes; past maxStmts distinct
// ones (a query built with a list of placeholders, say), the rest run
// unprepared.
type stmts struct {
	db *sqlx.DB
	mu sync.RWMutex
	m  map[string]*sqlx.Stmt
}

const maxStmts = 1024

var _ querier = (*stmts)(nil)

// get is query's statement; nil when the cache is full.
func (c *stmts) get(ctx context.Context, query string) (*sqlx.Stmt, error) {
	c.mu.RLock()
	st := c.m[query]
	c.mu.RUnlock()
	if st != nil {
		return st, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.m[query]; st != nil || len(c.m) >= maxStmts {
		return st, nil
	}
	st, err := c.db.PreparexContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.m[query] = st
	return st, nil
}

func (c *stmts) GetContext(ctx context.Context, dest any, query string, args ...any) error {
	st, err := c.get(ctx, query)
	switch {
	case err != nil:
		return err
	case st == nil:
		return c.db.GetContext(ctx, dest, query, args...)
	}
	return st.GetContext(ctx, dest, args...)
}

func (c *stmts) SelectContext(ctx context.Context, dest any, query string, args ...any) error {
	st, err := c.get(ctx, query)
	switch {
	case err != nil:
		return err
	case st == nil:
		return c.db.SelectContext(ctx, dest, query, args...)
	}
	return st.SelectContext(ctx, dest, args...)
}

func (c *stmts) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.get(ctx, query)
	switch {
	case err != nil:
		return nil, err
	case st == nil:
		return c.db.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}

// close closes the statements.
func (c *stmts) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, st := range c.m {
		st.Close()
		delete(c.m, q)
	}
}
