package persistence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
)

// OpenFGA's SQLite datastore runs every query unprepared, so the driver
// parses and plans it again each time: a fifth of the server's CPU under a
// load of checks. Its connections therefore keep their prepared statements
// by query text (OpenFGA's queries come from a few templates; the cache is
// bounded anyway). modernc.org/sqlite resets a reused statement when its
// rows close, and database/sql uses a connection for one query at a time.

// maxCachedStmts bounds one connection's statement cache.
const maxCachedStmts = 128

// stmtCachingConnector opens connections of drv on dsn that cache their
// statements.
type stmtCachingConnector struct {
	drv driver.Driver
	dsn string
}

func (c stmtCachingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &stmtCachingConn{Conn: conn, stmts: map[string]driver.Stmt{}}, nil
}

func (c stmtCachingConnector) Driver() driver.Driver { return c.drv }

// openCachingSQLite opens a pool of modernc.org/sqlite connections on dsn
// whose statements are cached.
func openCachingSQLite(dsn string) (*sql.DB, error) {
	probe, err := sql.Open("sqlite", dsn) // the registered driver; opens no connection
	if err != nil {
		return nil, err
	}
	drv := probe.Driver()
	_ = probe.Close()
	return sql.OpenDB(stmtCachingConnector{drv: drv, dsn: dsn}), nil
}

type stmtCachingConn struct {
	driver.Conn
	stmts map[string]driver.Stmt
}

var errNoContextDriver = errors.New("the driver's connection lacks a context method")

func (c *stmtCachingConn) stmt(ctx context.Context, query string) (driver.Stmt, error) {
	if s, ok := c.stmts[query]; ok {
		return s, nil
	}
	p, ok := c.Conn.(driver.ConnPrepareContext)
	if !ok {
		return nil, errNoContextDriver
	}
	s, err := p.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if len(c.stmts) >= maxCachedStmts {
		for q, old := range c.stmts { // drop one; which matters little
			_ = old.Close()
			delete(c.stmts, q)
			break
		}
	}
	c.stmts[query] = s
	return s, nil
}

// QueryContext runs query with its cached statement.
func (c *stmtCachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	s, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	q, ok := s.(driver.StmtQueryContext)
	if !ok {
		return nil, errNoContextDriver
	}
	return q.QueryContext(ctx, args)
}

// ExecContext runs query with its cached statement.
func (c *stmtCachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	e, ok := s.(driver.StmtExecContext)
	if !ok {
		return nil, errNoContextDriver
	}
	return e.ExecContext(ctx, args)
}

func (c *stmtCachingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *stmtCachingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	return nil, errNoContextDriver
}

func (c *stmtCachingConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *stmtCachingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *stmtCachingConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// Close closes the cached statements, then the connection.
func (c *stmtCachingConn) Close() error {
	for q, s := range c.stmts {
		_ = s.Close()
		delete(c.stmts, q)
	}
	return c.Conn.Close()
}
