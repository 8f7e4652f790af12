package persistence

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Under a steady stream of writes the write-ahead log must not grow without
// end: the checkpointer restarts it once it passes the threshold.
func TestWALStaysBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "wal.db")
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
	defer s.Close()
	s.walRestartPages = 200 // 800 KiB
	// journal_size_limit trims the file to 64 MiB, far above this test's
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
