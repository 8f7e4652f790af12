package persistence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
)

// Store is the one implementation of every store interface of identityd and
// of the fosite storage the enabled handlers need.
type Store struct {
	db      *sqlx.DB
	stmts   *stmts // the pool's queries, prepared (see conn)
	dialect Dialect
	tokens  *tokenWriter
	cache   *cache
	signals signals // waits for changes committed here or on other replicas (Await)
	done    chan struct{}
	closed  sync.Once
	wg      sync.WaitGroup

	unitLock        chan struct{}                 // SQLite: held by the unit of work that writes (see BeginTX)
	walRestartPages int                           // SQLite: see checkpoint
	walRestarts     atomic.Int64                  // how often the checkpointer restarted the log
	leaseWaits      atomic.Int64                  // how often a commit waited out a lease
	writes          writeHealth                   // whether commits succeed
	ceremonies      ceremonyMemory                // SQLite: the passkey ceremonies under way (PutPasskeyChallenge)
	hookRoutes      atomic.Pointer[webhookRoutes] // which logged events are webhook messages (RouteWebhooks)

	// Prepared once: the queries of every token request, introspection and
	// federation exchange, which also run in units of work (Store.stmt).
	clientStmt  *sqlx.Stmt
	agentStmt   *sqlx.Stmt
	appStmt     *sqlx.Stmt
	tokenStmt   *sqlx.Stmt
	mappingStmt *sqlx.Stmt
	// people's flows: a code, a refresh token, the person and their roles
	codeStmt, refreshStmt, userStmt, rolesStmt *sqlx.Stmt
}

// New wraps an open, migrated database; rawURL is the URL it was opened
// with (PostgreSQL replicas listen on it for evictions). Close stops the
// background work.
func New(ctx context.Context, db *sqlx.DB, dialect Dialect, rawURL string) (*Store, error) {
	lease := time.Duration(0) // one node: cached entries never go stale unseen
	if dialect == Postgres {
		lease = pgLease
	}
	s := &Store{db: db, stmts: &stmts{db: db, m: map[string]*sqlx.Stmt{}}, dialect: dialect, done: make(chan struct{}), cache: newCache(lease), walRestartPages: walRestartPages}
	var err error
	if s.clientStmt, err = db.PreparexContext(ctx, s.q(`SELECT `+serviceAccountColumns+` FROM service_accounts WHERE client_id = ?`)); err != nil {
		return nil, err
	}
	if s.agentStmt, err = db.PreparexContext(ctx, s.q(`SELECT `+agentColumns+` FROM agents WHERE client_id = ?`)); err != nil {
		return nil, err
	}
	if s.appStmt, err = db.PreparexContext(ctx, s.q(`SELECT `+applicationColumns+` FROM applications WHERE client_id = ?`)); err != nil {
		return nil, err
	}
	if s.tokenStmt, err = db.PreparexContext(ctx, s.q(`SELECT `+tokenColumns+` FROM access_tokens WHERE signature = ?`)); err != nil {
		return nil, err
	}
	if s.mappingStmt, err = db.PreparexContext(ctx, s.q(`SELECT `+mappingColumns+` FROM workload_mappings WHERE issuer_id = ? AND subject_pattern = ?`)); err != nil {
		return nil, err
	}
	for st, query := range map[**sqlx.Stmt]string{
		&s.codeStmt:    `SELECT ` + codeColumns + ` FROM authorization_codes WHERE signature = ?`,
		&s.refreshStmt: `SELECT ` + refreshReadColumns + ` FROM refresh_tokens WHERE signature = ?`,
		&s.userStmt:    `SELECT ` + userColumns + ` FROM users WHERE id = ?`,
		&s.rolesStmt:   s.userRolesQuery(),
	} {
		if *st, err = db.PreparexContext(ctx, s.q(query)); err != nil {
			return nil, err
		}
	}
	if s.tokens, err = newTokenWriter(ctx, s); err != nil {
		return nil, err
	}
	if dialect == SQLite {
		s.unitLock = make(chan struct{}, 1)
		s.wg.Add(3)
		go func() { defer s.wg.Done(); s.moveAuditLoop() }()
		go func() { defer s.wg.Done(); s.checkpoint() }()
		go func() { defer s.wg.Done(); s.watchEpoch() }()
	} else {
		s.wg.Add(1)
		listening := make(chan struct{})
		go func() { defer s.wg.Done(); s.listen(rawURL, listening) }()
		// Serve once evictions are heard (or after a few seconds without:
		// leases keep the caches correct regardless).
		select {
		case <-listening:
		case <-time.After(5 * time.Second):
		}
	}
	return s, nil
}

// checkpoint copies SQLite's write-ahead log into the database file in the
// background, twice a second, without blocking readers or writers
// (PASSIVE). Under a steady stream of writes a passive checkpoint never
// quite catches up, and the log would grow without end (a benchmark grew it
// to 25 GB); so once the log holds more than walRestartPages, a RESTART
// checkpoint holds writers back for the moment it takes to finish, and the
// next write starts the log from the beginning (past walSizeLimit,
// journal_size_limit then trims the file). Close leaves an empty log behind.
func (s *Store) checkpoint() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			var busy, logPages, done int
			err := s.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &logPages, &done)
			if err == nil && logPages > s.walRestartPages {
				// RESTART takes the write lock: the writer runs it in turn.
				err = s.tokens.write(context.Background(), tokenWrite{task: func(ctx context.Context) error {
					s.walRestarts.Add(1)
					return s.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(RESTART)`).Scan(&busy, &logPages, &done)
				}})
			}
			if err != nil {
				slog.Warn("WAL checkpoint failed", "error", err.Error())
			}
		}
	}
}

// walRestartPages is the log size (4 KiB pages: 64 MiB) past which the
// checkpointer makes the log start over.
const walRestartPages = 16384

// walSizeLimit is the size (bytes) to which a restarted log's file is
// trimmed: four times the restart threshold, so that a log that a steady
// load grows past the threshold between two checks keeps its file.
const walSizeLimit = 4 * walRestartPages * 4096

// Close flushes pending token writes and closes the database.
func (s *Store) Close() error {
	s.closed.Do(func() {
		close(s.done)
		s.wg.Wait()
		// The loops have stopped; move what waits, then stop the writer.
		if err := s.moveAudit(context.Background()); err != nil {
			slog.Warn("moving audit entries at close failed; they stay in the inbox", "error", err.Error())
		}
		s.tokens.close()
		s.stmts.close()
		if s.dialect == SQLite {
			_, _ = s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`) // leave an empty log behind
		}
	})
	return s.db.Close()
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// q rebinds a query written with `?` to the dialect's placeholders.
func (s *Store) q(query string) string { return s.db.Rebind(query) }

// affectedOne turns an update or delete that matched no row into ErrNotFound.
func affectedOne(res sql.Result) error {
	n, err := res.RowsAffected()
	if err == nil && n == 0 {
		err = ErrNotFound
	}
	return err
}

// byteOrder orders by a text column byte by byte, as SQLite does by default;
// PostgreSQL would otherwise use the database's collation, and one
// database's "en_US" orders names unlike another's "C".
func (s *Store) byteOrder(column string) string {
	if s.dialect == Postgres {
		return column + ` COLLATE "C"`
	}
	return column
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

// Value implements driver.Valuer.
func (l StringList) Value() (driver.Value, error) {
	if l == nil {
		return "[]", nil
	}
	return jsonValue([]string(l))
}

// Scan implements sql.Scanner.
func (l *StringList) Scan(src any) error {
	out := []string{}
	if err := scanJSON(src, &out); err != nil {
		return err
	}
	if out == nil { // a JSON null
		out = []string{}
	}
	*l = out
	return nil
}

// jsonValue encodes v for a JSON column. A string, not []byte: lib/pq would
// send bytes as bytea, which jsonb refuses.
func jsonValue(v any) (driver.Value, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// scanJSON decodes a JSON column (text in SQLite, jsonb bytes in
// PostgreSQL); a NULL leaves dst as it is. Numbers keep their text
// (json.Number), as in sessions: see decodeSession.
func scanJSON(src, dst any) error {
	switch v := src.(type) {
	case nil:
		return nil
	case string:
		return decodeJSON(v, dst)
	case []byte:
		return decodeJSON(string(v), dst)
	default:
		return fmt.Errorf("cannot scan %T into a JSON column", src)
	}
}

// decodeJSON reads JSON text whose numbers keep their text (json.Number):
// stored claims and audit details read back as they were written, however
// large or precise (a float64 would round them, or fail on 1e400).
func decodeJSON(text string, into any) error {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	return dec.Decode(into)
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
