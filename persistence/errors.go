package persistence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/lib/pq"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Typed store errors. Driver errors are mapped to these in one place, here.
var (
	ErrNotFound = errors.New("not found")
	// ErrDuplicate: a unique key is taken (a name, a client id, an e-mail).
	ErrDuplicate = errors.New("duplicate")
	// ErrMissingReference: the record refers to one that does not exist,
	// or no longer does (a foreign key).
	ErrMissingReference = errors.New("missing reference")
	// ErrUnavailable: the database cannot serve the request now (it is
	// down, restarting, full, read-only or out of connections). Callers
	// answer "try again", never a verdict on the request itself.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrConflict: the database gave up a transaction to resolve a
	// conflict with another (PostgreSQL's serialization failure or
	// deadlock); the same request may well succeed at once. It is joined
	// with ErrUnavailable, so callers answer "try again" (503 with
	// Retry-After), but it says nothing of the storage's health
	// (writeHealth ignores it).
	ErrConflict = errors.New("transaction conflict")
)

// mapError turns driver errors into the typed errors above, joined with the
// cause; others pass as they are.
func mapError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrDuplicate) || errors.Is(err, ErrMissingReference) || errors.Is(err, ErrUnavailable) {
		return err
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch code := string(pqErr.Code); {
		case code == "23505": // unique_violation
			return errors.Join(ErrDuplicate, err)
		case code == "23503": // foreign_key_violation
			return errors.Join(ErrMissingReference, err)
		case code == "40001", code == "40P01": // serialization_failure, deadlock_detected
			return errors.Join(ErrUnavailable, ErrConflict, err)
		case strings.HasPrefix(code, "08"), // connection exceptions
			strings.HasPrefix(code, "53"), // insufficient resources: disk full, out of memory, too many connections
			strings.HasPrefix(code, "57"), // operator intervention: shutdown, crash, cannot connect now
			strings.HasPrefix(code, "58"), // system errors: I/O
			code == "25006":               // read_only_sql_transaction (a standby)
			return errors.Join(ErrUnavailable, err)
		}
		return err
	}
	var liteErr *sqlite.Error
	if errors.As(err, &liteErr) {
		switch liteErr.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return errors.Join(ErrDuplicate, err)
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return errors.Join(ErrMissingReference, err)
		}
		switch liteErr.Code() & 0xff { // the primary result code
		case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_BUSY,
			sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL:
			return errors.Join(ErrUnavailable, err)
		}
		return err
	}
	// No answer from the server at all: refused, reset, timed out, closed.
	var netErr net.Error
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.As(err, &netErr) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, context.DeadlineExceeded) {
		return errors.Join(ErrUnavailable, err)
	}
	return err
}

// Unavailable tells whether err says the storage could not serve a request
// (as opposed to a verdict: not found, duplicate, invalid).
func Unavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
