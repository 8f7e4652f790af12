package persistence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// sqliteStore is a migrated SQLite store in the file at path, closed when
// the test ends.
func sqliteStore(t *testing.T, path string) *Store {
	t.Helper()
	ctx := context.Background()
	db, dialect, err := Open(ctx, "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, db.DB, dialect); err != nil {
		t.Fatal(err)
	}
	s, err := New(ctx, db, dialect, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Under a steady stream of writes the write-ahead log must not grow without
// end: the checkpointer restarts it once it passes the threshold.
func TestWALStaysBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "wal.db")
	s := sqliteStore(t, path)
	s.walRestartPages = 200 // 800 KiB
	// journal_size_limit trims the file to 256 MiB, far above this test's
	// writes, so measure the log's pages instead of the file.
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				batch := make([]AuditEntry, 100)
				for j := range batch {
					batch[j] = AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: uuid.NewString(), ClientID: fmt.Sprintf("agt_%d", w),
						CreatedAt: time.Now().UTC(), Action: "api_call", Details: JSONObject{"i": i}}
				}
				if err := s.AppendAudit(ctx, batch...); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var busy, logPages, done int
	if err := s.db.QueryRow(`PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &logPages, &done); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	// Three seconds of writes fill over a hundred thousand pages when the
	// log never restarts; restarted, it holds what came since the last one.
	if s.walRestarts.Load() == 0 || logPages > 20000 {
		t.Fatalf("restarts %d, the log holds %d pages (%d bytes on disk): it is not being restarted", s.walRestarts.Load(), logPages, st.Size())
	}
}

// The token writer's connection leaves the log's sync to the writer, which
// answers a commit's callers only once the log is synced: by the syncing
// goroutine for a batch of flows, by the writer itself for tokens and audit
// entries alone. When the sync fails, so do their writes, and the next sync
// that succeeds answers the next ones.
func TestWriterAnswersAfterTheLogSync(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sync.db")
	s := sqliteStore(t, path)
	for name, c := range map[string]interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}{"the writer's": s.tokens.db, "the pool's": s.db} {
		var got int
		if err := c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 1, false: 2}[name == "the writer's"]; got != want {
			t.Errorf("%s connection: synchronous = %d, want %d", name, got, want)
		}
	}
	if s.tokens.logPath != path+"-wal" {
		t.Fatalf("the writer syncs %s, want %s", s.tokens.logPath, path+"-wal")
	}
	for _, tc := range []struct {
		name  string
		write func(i int) error
	}{
		{"a flow", func(i int) error {
			return s.commitFlow(ctx, &flowWrite{rows: []row{{table: "system_settings", columns: "key, value", args: []any{fmt.Sprintf("sync_test_%d", i), "x"}}}})
		}},
		{"an audit entry", func(int) error {
			return s.AppendAudit(ctx, AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: uuid.NewString(), ClientID: "agt_sync",
				CreatedAt: time.Now().UTC(), Action: "api_call", Details: JSONObject{}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The syncs happen after a channel send from this goroutine's
			// write (and the writer's to the syncer), so they see the path
			// set here; the answer received sees the file they opened.
			s.tokens.logPath = filepath.Join(t.TempDir(), "missing", "log")
			if s.tokens.log != nil {
				s.tokens.log.Close()
				s.tokens.log = nil
			}
			if err := tc.write(1); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("a write whose sync failed: %v, want ErrUnavailable", err)
			}
			if failing, _ := s.writes.state(); !failing {
				t.Error("a failed sync left the writes reported healthy")
			}
			s.tokens.logPath = path + "-wal"
			if err := tc.write(2); err != nil {
				t.Fatalf("a write after the log syncs again: %v", err)
			}
			if failing, _ := s.writes.state(); failing {
				t.Error("a successful sync left the writes reported failing")
			}
		})
	}
}
