package persistence_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func ptr[T any](v T) *T { return &v }

func intentEntry(client, task, chain, parent, action string, depth int, at time.Time) persistence.AuditEntry {
	e := persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: uuid.NewString(), ClientID: client, CreatedAt: at,
		Action: "api_call", Details: persistence.JSONObject{}}
	e.TaskID, e.ChainID, e.Intent.Action, e.Depth, e.Initiator = ptr(task), ptr(chain), ptr(action), ptr(depth), ptr("user:1")
	if parent != "" {
		e.ParentTaskID = ptr(parent)
	}
	return e
}

func TestIntentQueries(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		base := now().Add(-time.Hour)
		// A chain written out of order: depth 2 first, then 0, then 1.
		entries := []persistence.AuditEntry{
			intentEntry("agt_b", "t3", "c1", "t2", "notify", 2, base.Add(1*time.Second)),
			intentEntry("agt_a", "t1", "c1", "", "plan", 0, base.Add(2*time.Second)),
			intentEntry("agt_a", "t2", "c1", "t1", "lookup", 1, base.Add(3*time.Second)),
			intentEntry("agt_a", "t2", "c1", "t1", "lookup", 1, base.Add(4*time.Second)),
			intentEntry("agt_c", "t9", "c2", "", "plan", 0, base.Add(-48*time.Hour)),
		}
		plain := persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: uuid.NewString(), ClientID: "agt_a",
			CreatedAt: base, Action: "api_call", Details: persistence.JSONObject{}}
		if err := s.AppendAudit(ctx, append(entries, plain)...); err != nil {
			t.Fatal(err)
		}

		task, err := s.IntentByTask(ctx, "t2", 10)
		if err != nil || len(task) != 2 || !task[0].CreatedAt.Before(task[1].CreatedAt) {
			t.Fatalf("task: %+v %v", task, err)
		}
		if one, _ := s.IntentByTask(ctx, "t2", 1); len(one) != 1 {
			t.Fatalf("limit ignored: %d", len(one))
		}
		trace, err := s.IntentByChain(ctx, "c1", 100)
		if err != nil {
			t.Fatal(err)
		}
		var hops []string
		for _, e := range trace {
			hops = append(hops, fmt.Sprintf("%d:%s", *e.Depth, *e.TaskID))
		}
		if strings.Join(hops, " ") != "0:t1 1:t2 1:t2 2:t3" {
			t.Fatalf("trace order %v", hops)
		}
		if *trace[1].ParentTaskID != "t1" || trace[0].ParentTaskID != nil {
			t.Fatalf("parents %v %v", trace[0].ParentTaskID, trace[1].ParentTaskID)
		}

		search := func(f persistence.IntentFilter) int {
			t.Helper()
			_, total, err := s.SearchIntent(ctx, f, persistence.Page{Limit: 50})
			if err != nil {
				t.Fatal(err)
			}
			return total
		}
		for name, c := range map[string]struct {
			f    persistence.IntentFilter
			want int
		}{
			"all intent entries (not the plain one)": {persistence.IntentFilter{}, 5},
			"by client":                              {persistence.IntentFilter{ClientID: "agt_a"}, 3},
			"by action":                              {persistence.IntentFilter{Action: "plan"}, 2},
			"by initiator":                           {persistence.IntentFilter{Initiator: "user:1"}, 5},
			"by days":                                {persistence.IntentFilter{From: base.Add(-time.Minute), To: base.Add(time.Minute)}, 4},
			"client and action":                      {persistence.IntentFilter{ClientID: "agt_a", Action: "lookup"}, 2},
			"nothing in an old window":               {persistence.IntentFilter{From: base.Add(-30 * 24 * time.Hour), To: base.Add(-29 * 24 * time.Hour)}, 0},
		} {
			if got := search(c.f); got != c.want {
				t.Errorf("%s: %d, want %d", name, got, c.want)
			}
		}
		page, total, _ := s.SearchIntent(ctx, persistence.IntentFilter{}, persistence.Page{Limit: 2, Offset: 1})
		if total != 5 || len(page) != 2 || !page[0].CreatedAt.After(page[1].CreatedAt) {
			t.Fatalf("page %d %d", total, len(page))
		}
	})
}

// BenchmarkIntentSearch fills the audit trail with a million intent entries
// (1,000 agents, 100 actions, 50 initiators, 30 days) and measures the
// intent queries the admin API runs; it reports p50 and p99 per query kind.
// It runs only with -bench (make bench).
func BenchmarkIntentSearch(b *testing.B) {
	for name, dbURL := range dbtest.URLs(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s := dbtest.Store(b, dbURL)
			const n = 1_000_000
			start := time.Now().UTC().Add(-30 * 24 * time.Hour)
			rng := rand.New(rand.NewPCG(1, 2))
			batch := make([]persistence.AuditEntry, 0, 200)
			for i := range n {
				at := start.Add(time.Duration(i) * (30 * 24 * time.Hour / n)) // 2.592 s apart; i × 30 days would overflow
				chain := fmt.Sprintf("chain-%d", i/4)
				e := intentEntry(fmt.Sprintf("agt_%d", rng.IntN(1000)), fmt.Sprintf("task-%d", i/2), chain, "", fmt.Sprintf("action-%d", rng.IntN(100)), i%4, at)
				e.Initiator = ptr(fmt.Sprintf("user:%d", rng.IntN(50)))
				batch = append(batch, e)
				if len(batch) == cap(batch) {
					if err := s.AppendAudit(ctx, batch...); err != nil {
						b.Fatal(err)
					}
					batch = batch[:0]
				}
			}
			if name == "postgres" {
				// The steady state autovacuum reaches on its own: statistics
				// for the planner, a visibility map for index-only counts.
				db, _, err := persistence.Open(ctx, dbURL)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, `VACUUM ANALYZE agent_audit`); err != nil {
					b.Fatal(err)
				}
				db.Close()
			}
			queries := map[string]func(i int) error{
				"search by client and days": func(i int) error {
					d := start.Add(time.Duration(i%28) * 24 * time.Hour).Truncate(24 * time.Hour)
					_, _, err := s.SearchIntent(ctx, persistence.IntentFilter{ClientID: fmt.Sprintf("agt_%d", i%1000), From: d, To: d.Add(48 * time.Hour)}, persistence.Page{Limit: 50})
					return err
				},
				"search by action": func(i int) error {
					_, _, err := s.SearchIntent(ctx, persistence.IntentFilter{Action: fmt.Sprintf("action-%d", i%100)}, persistence.Page{Limit: 50})
					return err
				},
				"search by initiator and days": func(i int) error {
					d := start.Add(time.Duration(i%28) * 24 * time.Hour).Truncate(24 * time.Hour)
					_, _, err := s.SearchIntent(ctx, persistence.IntentFilter{Initiator: fmt.Sprintf("user:%d", i%50), From: d, To: d.Add(24 * time.Hour)}, persistence.Page{Limit: 50})
					return err
				},
				"task": func(i int) error {
					_, err := s.IntentByTask(ctx, fmt.Sprintf("task-%d", (i*7919)%(n/2)), 1000)
					return err
				},
				"chain trace": func(i int) error {
					_, err := s.IntentByChain(ctx, fmt.Sprintf("chain-%d", (i*7919)%(n/4)), 1000)
					return err
				},
			}
			names := make([]string, 0, len(queries))
			for q := range queries {
				names = append(names, q)
			}
			slices.Sort(names)
			b.ResetTimer()
			for _, q := range names {
				var lat []time.Duration
				for i := range 200 {
					t0 := time.Now()
					if err := queries[q](i); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				b.Logf("%-30s p50 %6.2f ms  p99 %6.2f ms", q, ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]))
				b.ReportMetric(ms(lat[len(lat)*99/100]), strings.ReplaceAll(q, " ", "_")+"_p99_ms")
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// One call may carry more entries than one statement can bind (SQLite binds
// at most 32,766 parameters; 3,000 entries need 51,000): they are split.
func TestAppendAuditManyEntries(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		entries := make([]persistence.AuditEntry, 3000)
		for i := range entries {
			entries[i] = intentEntry("agt_bulk", fmt.Sprintf("bulk-%d", i), "bulk", "", "import", 0, now())
		}
		if err := s.AppendAudit(ctx, entries...); err != nil {
			t.Fatal(err)
		}
		if _, total, err := s.SearchIntent(ctx, persistence.IntentFilter{ClientID: "agt_bulk"}, persistence.Page{Limit: 1}); err != nil || total != 3000 {
			t.Fatalf("total %d, %v", total, err)
		}
	})
}
