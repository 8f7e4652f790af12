package persistence

import (
	"database/sql"
	"errors"

	"github.com/lib/pq"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Typed store errors. Driver errors are mapped to these in one place, here.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
)

// mapError turns driver errors into the typed errors above; others pass as
// they are. A broken foreign key is a conflict: the record refers to one that
// is not (or no longer) there.
func mapError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && (pqErr.Code == "23505" || pqErr.Code == "23503") { // unique_violation, foreign_key_violation
		return errors.Join(ErrConflict, err)
	}
	var liteErr *sqlite.Error
	if errors.As(err, &liteErr) {
		switch liteErr.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return errors.Join(ErrConflict, err)
		}
	}
	return err
}
