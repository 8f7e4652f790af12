package persistence_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// PostgreSQL gives up a transaction to resolve a conflict with another: a
// serialization failure (40001) or a deadlock (40P01). Both are provoked
// for real here, and map to ErrUnavailable (callers answer 503 with
// Retry-After, never 500) and ErrConflict (the storage's health is not in
// question).
func TestTransactionConflicts(t *testing.T) {
	db := dbtest.Postgres(t)
	if db == nil {
		t.Skip("TEST_DATABASE_URL is not set: PostgreSQL only")
	}
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE conflicts (id integer PRIMARY KEY, n integer NOT NULL);
		INSERT INTO conflicts VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	begin := func(level sql.IsolationLevel) *sql.Tx {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}
	exec := func(tx *sql.Tx, q string) error {
		_, err := tx.ExecContext(ctx, q)
		return err
	}
	expectConflict := func(what string, err error) {
		t.Helper()
		mapped := persistence.MapError(err)
		if err == nil || !persistence.Unavailable(mapped) || !errors.Is(mapped, persistence.ErrConflict) {
			t.Fatalf("%s: %v maps to %v, want unavailable and a conflict", what, err, mapped)
		}
	}

	t.Run("serialization failure", func(t *testing.T) {
		// Write skew: each reads both rows, then writes the one the other
		// read. One commits; the other cannot be serialized after it.
		a, b := begin(sql.LevelSerializable), begin(sql.LevelSerializable)
		for _, tx := range []*sql.Tx{a, b} {
			var sum int
			if err := tx.QueryRowContext(ctx, "SELECT SUM(n) FROM conflicts").Scan(&sum); err != nil {
				t.Fatal(err)
			}
		}
		if err := exec(a, "UPDATE conflicts SET n = n + 1 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		err := exec(b, "UPDATE conflicts SET n = n + 1 WHERE id = 2")
		if err == nil {
			if err = a.Commit(); err != nil {
				t.Fatal(err)
			}
			err = b.Commit()
		}
		expectConflict("write skew", err)
	})

	t.Run("deadlock", func(t *testing.T) {
		// Each holds one row and asks for the other's: PostgreSQL ends one
		// of them (after deadlock_timeout, 1 s by default).
		a, b := begin(sql.LevelReadCommitted), begin(sql.LevelReadCommitted)
		if err := exec(a, "UPDATE conflicts SET n = n + 1 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if err := exec(b, "UPDATE conflicts SET n = n + 1 WHERE id = 2"); err != nil {
			t.Fatal(err)
		}
		errs := make([]error, 2)
		var wg sync.WaitGroup
		wg.Go(func() {
			if errs[0] = exec(a, "UPDATE conflicts SET n = n + 1 WHERE id = 2"); errs[0] != nil {
				_ = a.Rollback() // frees row 1 for b
			}
		})
		wg.Go(func() {
			if errs[1] = exec(b, "UPDATE conflicts SET n = n + 1 WHERE id = 1"); errs[1] != nil {
				_ = b.Rollback()
			}
		})
		wg.Wait()
		if (errs[0] == nil) == (errs[1] == nil) {
			t.Fatalf("want one transaction ended, got %v and %v", errs[0], errs[1])
		}
		expectConflict("deadlock", errors.Join(errs[0], errs[1]))
	})
}
