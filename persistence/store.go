package persistence

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// Store is the one implementation of every store interface of identityd and
// of the fosite storage the enabled handlers need.
type Store struct {
	db      *sqlx.DB
	dialect Dialect
	tokens  *tokenWriter
}

// New wraps an open database. Close stops the background token writer.
func New(db *sqlx.DB, dialect Dialect) *Store {
	s := &Store{db: db, dialect: dialect}
	s.tokens = newTokenWriter(s)
	return s
}

// Dialect reports which database the store runs on.
func (s *Store) Dialect() Dialect { return s.dialect }

// Close flushes pending token writes and closes the database.
func (s *Store) Close() error {
	s.tokens.close()
	return s.db.Close()
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// q rebinds a query written with `?` to the dialect's placeholders.
func (s *Store) q(query string) string { return s.db.Rebind(query) }

// inTx runs fn in a transaction, committing on nil and rolling back otherwise.
func (s *Store) inTx(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return mapError(err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return mapError(err)
	}
	return mapError(tx.Commit())
}

// forUpdate locks the selected row until the transaction ends. SQLite needs
// no clause: its write transactions begin IMMEDIATE and hold the database lock.
func (s *Store) forUpdate() string {
	if s.dialect == Postgres {
		return " FOR UPDATE"
	}
	return ""
}

// StringList is a list of strings stored as a JSON array (jsonb in
// PostgreSQL, TEXT in SQLite).
type StringList []string

// Value implements driver.Valuer. A string, not []byte: lib/pq would send
// bytes as bytea, which jsonb refuses.
func (l StringList) Value() (driver.Value, error) {
	if l == nil {
		return "[]", nil
	}
	b, err := json.Marshal([]string(l))
	return string(b), err
}

// Scan implements sql.Scanner.
func (l *StringList) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		*l = StringList{}
		return nil
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		return fmt.Errorf("StringList: cannot scan %T", src)
	}
	var out []string
	if err := json.Unmarshal(b, &out); err != nil {
		return err
	}
	if out == nil {
		out = []string{}
	}
	*l = out
	return nil
}

// Page is the window of a list query.
type Page struct {
	Limit  int
	Offset int
}

var errInvalidPage = errors.New("invalid page")

func (p Page) valid() error {
	if p.Limit <= 0 || p.Offset < 0 {
		return errInvalidPage
	}
	return nil
}
