// Package dbtest gives tests a fresh database of each dialect: a new SQLite
// file always, and a new PostgreSQL schema when TEST_DATABASE_URL is set.
package dbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq" // PostgreSQL driver

	"github.com/identityd/identityd/extensions/authz"
	"github.com/identityd/identityd/persistence"
)

// URLs returns a fresh database URL per dialect, keyed "sqlite" and (when
// TEST_DATABASE_URL is set) "postgres". Each is dropped when the test ends.
func URLs(t testing.TB) map[string]string {
	t.Helper()
	urls := map[string]string{"sqlite": "sqlite://" + filepath.Join(t.TempDir(), "identityd.db")}
	if base := os.Getenv("TEST_DATABASE_URL"); base != "" {
		urls["postgres"] = freshSchema(t, base)
	}
	return urls
}

// Each runs fn as a subtest once per dialect with a fresh database URL.
func Each(t *testing.T, fn func(t *testing.T, dbURL string)) {
	t.Helper()
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			url, ok := URLs(t)[name]
			if !ok {
				t.Skip("TEST_DATABASE_URL is not set; PostgreSQL runs are skipped")
			}
			fn(t, url)
		})
	}
}

// Like returns a fresh database URL of dbURL's dialect, dropped when the
// test ends: tests that start several servers give each its own database
// unless they mean them to share one.
func Like(t testing.TB, dbURL string) string {
	t.Helper()
	if strings.HasPrefix(dbURL, "sqlite://") {
		return "sqlite://" + filepath.Join(t.TempDir(), "identityd.db")
	}
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		t.Fatal("a PostgreSQL URL without TEST_DATABASE_URL")
	}
	return freshSchema(t, base)
}

// freshSchema creates a schema of its own and returns base with search_path
// set to it (lib/pq passes unknown URL parameters as run-time settings).
func freshSchema(t testing.TB, base string) string {
	t.Helper()
	db, err := sql.Open("postgres", base)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	defer db.Close()
	schema := "t_" + strings.ToLower(rand.Text())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("postgres", base)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Postgres is a connection to a fresh schema of the test PostgreSQL
// (TEST_DATABASE_URL), closed when the test ends; nil without one. Tests
// ask it what PostgreSQL itself accepts.
func Postgres(tb testing.TB) *sql.DB {
	tb.Helper()
	dbURL, ok := URLs(tb)["postgres"]
	if !ok {
		return nil
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// Store opens a migrated store on dbURL, closed when the test ends.
func Store(t testing.TB, dbURL string) *persistence.Store {
	t.Helper()
	ctx := context.Background()
	db, dialect, err := persistence.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := persistence.Migrate(ctx, db.DB, dialect); err != nil {
		t.Fatal(err)
	}
	s, err := persistence.New(ctx, db, dialect, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Engine starts the embedded OpenFGA engine on the database at dbURL (its
// migrations applied), its store ids kept in store's settings; it stops
// when the test ends.
func Engine(t testing.TB, dbURL string, store *persistence.Store) *authz.Engine {
	t.Helper()
	ctx := context.Background()
	db, dialect, err := persistence.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = persistence.MigrateFGA(ctx, db.DB, dialect)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := persistence.OpenFGADatastore(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	e, err := authz.New(ctx, ds, store)
	if err != nil {
		ds.Close()
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}
