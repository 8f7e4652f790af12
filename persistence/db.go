// Package persistence implements every store of identityd, and fosite's
// storage, with sqlx over two dialects: embedded SQLite (modernc.org/sqlite,
// no cgo) and PostgreSQL (lib/pq). Every query is written once with `?`
// placeholders and passed through Rebind.
package persistence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // PostgreSQL driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	_ "modernc.org/sqlite" // embedded SQLite driver

	"github.com/identityd/identityd/schema"
)

// Dialect names the SQL database behind a Store.
type Dialect string

const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// ParseURL splits an IDENTITYD_DATABASE_URL into the dialect and the DSN its
// driver wants. sqlite:///abs/path.db is absolute, sqlite://./rel.db relative.
func ParseURL(raw string) (Dialect, string, error) {
	switch {
	case strings.HasPrefix(raw, "sqlite://"):
		path := strings.TrimPrefix(raw, "sqlite://")
		if q := strings.IndexByte(path, '?'); q >= 0 {
			path = path[:q]
		}
		if path == "" {
			return "", "", errors.New("sqlite URL has no file path")
		}
		return SQLite, path, nil
	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		if _, err := url.Parse(raw); err != nil {
			return "", "", fmt.Errorf("postgres URL: %w", err)
		}
		return Postgres, raw, nil
	default:
		return "", "", errors.New("database URL must start with sqlite:// or postgres://")
	}
}

// uriPath escapes what a file path may hold that a file: URI reads as
// syntax.
var uriPath = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// Open connects to the database named by a URL (see ParseURL). For SQLite the
// file's directory is created, and every connection runs in WAL mode with
// foreign keys on, a busy timeout and full synchronous commits (the token
// writer's connection syncs the log itself: newTokenWriter): a token is
// durable before its response leaves.
func Open(ctx context.Context, rawURL string) (*sqlx.DB, Dialect, error) {
	dialect, dsn, err := ParseURL(rawURL)
	if err != nil {
		return nil, "", err
	}
	var db *sqlx.DB
	switch dialect {
	case SQLite:
		if err := createPrivate(dsn); err != nil {
			return nil, "", err
		}
		db, err = sqlx.Open("sqlite", sqliteDSN(dsn, true, "FULL"))
		if err != nil {
			return nil, "", err
		}
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		db.SetConnMaxLifetime(0)
	case Postgres:
		db, err = sqlx.Open("postgres", dsn)
		if err != nil {
			return nil, "", err
		}
		db.SetMaxOpenConns(32)
		db.SetMaxIdleConns(32)
		db.SetConnMaxIdleTime(5 * time.Minute)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, "", fmt.Errorf("connect to %s: %w", dialect, mapError(err))
	}
	return db, dialect, nil
}

// sqliteDSN is the modernc.org/sqlite DSN of the database file at path with
// the settings every connection of ours runs with. timeFormat writes times
// in SQLite's own text form, which our queries compare; OpenFGA's datastore,
// which opens the same file (fga.go), keeps the driver's default.
// synchronous is FULL but for the token writer's connection, whose commits
// are synced by the writer itself (newTokenWriter).
func sqliteDSN(path string, timeFormat bool, synchronous string) string {
	q := url.Values{}
	// wal_autocheckpoint(0): checkpoints run in the store's background
	// checkpointer, not inside whichever commit crosses the threshold,
	// which would stall the token writer. temp_store(2): temporary
	// storage in memory; a multi-row INSERT in a transaction keeps a
	// statement journal, which past 64 KiB spilled to a temporary file
	// opened and written for every statement (a third of the group
	// commit's INSERT time for refresh grants). journal_size_limit(256
	// MiB): the log file is trimmed only past four times the size at which
	// the checkpointer restarts it. Trimmed at 64 MiB, the log that a
	// steady load grows to 130 MiB between restarts was cut back and grown
	// again every second: the cut took 8–25 ms inside the token writer's
	// commit, and the regrowth made the log's fsyncs update the file's
	// size (docs/benchmarks.md, "The log's trim").
	for _, p := range []string{"journal_mode(WAL)", "foreign_keys(1)", "busy_timeout(10000)", "synchronous(" + synchronous + ")", "wal_autocheckpoint(0)", "journal_size_limit(" + strconv.Itoa(walSizeLimit) + ")", "temp_store(2)"} {
		q.Add("_pragma", p)
	}
	// Write transactions take the lock at BEGIN, so two writers never
	// deadlock on a read-to-write upgrade (which busy_timeout cannot help).
	q.Set("_txlock", "immediate")
	if timeFormat {
		q.Set("_time_format", "sqlite")
	}
	// A file: URI: a path's "?", "#" and "%" would end or change it
	// (a data directory named "a#1" would open "a").
	return "file:" + uriPath.Replace(path) + "?" + q.Encode()
}

// createPrivate creates the SQLite file's directory (0700) and the file
// itself (0600) when they do not exist: the file holds private signing keys,
// secret hashes and perhaps the generated system secret. SQLite gives the
// -wal and -shm files it makes beside it the database file's mode. An
// existing directory or file keeps its mode (an operator may have chosen
// it); a database file others can read is warned about.
func createPrivate(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create database directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		return f.Close()
	}
	if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create database file: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		slog.Warn("the database file can be read by other users; it holds private keys and secret hashes: chmod 600 it and its -wal and -shm files",
			"path", path, "mode", fi.Mode().Perm().String())
	}
	return nil
}

// Migrate applies every embedded migration of the dialect that is not yet
// applied, and reports the versions it applied.
func Migrate(ctx context.Context, db *sql.DB, dialect Dialect) ([]int64, error) {
	sub, err := fs.Sub(schema.FS, string(dialect))
	if err != nil {
		return nil, err
	}
	gd, opts := goose.DialectSQLite3, []goose.ProviderOption(nil)
	if dialect == Postgres {
		// Replicas starting together on a fresh database would otherwise
		// race to apply the same migration: one waits on an advisory lock
		// (polled each second, for up to five minutes) while the other applies.
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
		if err != nil {
			return nil, err
		}
		gd, opts = goose.DialectPostgres, append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(gd, db, sub, opts...)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}
