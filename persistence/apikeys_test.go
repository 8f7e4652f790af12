package persistence_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// API keys: stored, found by hash (and from the cache), revoked once and
// seen revoked at once, their last use moved only forward, and gone with
// their owner or application; usage counts that add up across writers.
func TestAPIKeyStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		app := newApplication("app_keys")
		if err := s.CreateApplication(ctx, app); err != nil {
			t.Fatal(err)
		}
		ada := newUser("ada@example.com")
		if err := s.CreateUser(ctx, ada); err != nil {
			t.Fatal(err)
		}
		t0 := now()
		key := func(hash string, owner *string) *persistence.APIKey {
			return &persistence.APIKey{ID: uuid.Must(uuid.NewV7()).String(), ApplicationID: app.ID, UserID: owner, Name: "ci", KeyHash: []byte(hash),
				Hint: "idk_x_…abcd", Scopes: persistence.StringList{"orders:read"}, Metadata: persistence.JSONObject{"plan": "gold"}, IssuedBy: "sa_x", CreatedAt: t0}
		}
		k := key("hash-one", &ada.ID)
		if err := s.CreateAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		// A missing owner is a missing reference, not a 500.
		ghost := uuid.NewString()
		if err := s.CreateAPIKey(ctx, key("hash-ghost", &ghost)); !errors.Is(err, persistence.ErrMissingReference) {
			t.Fatalf("missing owner: %v", err)
		}
		// Exactly one owner.
		if err := s.CreateAPIKey(ctx, key("hash-none", nil)); err == nil {
			t.Fatal("a key without an owner was stored")
		}
		if err := s.CreateAPIKey(ctx, key("hash-one", &ada.ID)); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("same hash twice: %v", err)
		}
		got, err := s.APIKeyByHash(ctx, []byte("hash-one"))
		if err != nil || got.ID != k.ID || *got.UserID != ada.ID || got.Metadata["plan"] != "gold" || got.RevokedAt != nil || !got.CreatedAt.Equal(t0) {
			t.Fatalf("by hash: %+v %v", got, err)
		}
		if _, err := s.APIKeyByHash(ctx, []byte("nope")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown hash: %v", err)
		}
		if _, err := s.GetAPIKey(ctx, uuid.NewString(), k.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("another application's key: %v", err)
		}
		list, total, err := s.ListAPIKeys(ctx, app.ID, persistence.Page{Limit: 10})
		if err != nil || total != 1 || len(list) != 1 || !bytes.Equal(list[0].KeyHash, k.KeyHash) {
			t.Fatalf("list: %v %d %v", list, total, err)
		}

		// Revoked: the cached copy goes; revoking again keeps the first time.
		r1, err := s.RevokeAPIKey(ctx, app.ID, k.ID, t0.Add(time.Minute))
		if err != nil || r1.RevokedAt == nil {
			t.Fatalf("revoke: %v", err)
		}
		if got, _ := s.APIKeyByHash(ctx, []byte("hash-one")); got.RevokedAt == nil || !got.RevokedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("after the revocation: %+v", got)
		}
		if r2, err := s.RevokeAPIKey(ctx, app.ID, k.ID, t0.Add(time.Hour)); err != nil || !r2.RevokedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("revoke again: %+v %v", r2, err)
		}

		// Concurrent revocation and lookups: every lookup after the
		// revocation returned sees it.
		k2 := key("hash-two", &ada.ID)
		if err := s.CreateAPIKey(ctx, k2); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		done := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-done:
						if got, err := s.APIKeyByHash(ctx, []byte("hash-two")); err != nil || got.RevokedAt == nil {
							t.Errorf("after the revocation: %+v %v", got, err)
						}
						return
					default:
						if _, err := s.APIKeyByHash(ctx, []byte("hash-two")); err != nil {
							t.Errorf("lookup: %v", err)
							return
						}
					}
				}
			})
		}
		if _, err := s.RevokeAPIKey(ctx, app.ID, k2.ID, t0); err != nil {
			t.Fatal(err)
		}
		close(done)
		wg.Wait()

		// Last use: moved forward only.
		if err := s.TouchAPIKeys(ctx, map[string]time.Time{k.ID: t0.Add(2 * time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if err := s.TouchAPIKeys(ctx, map[string]time.Time{k.ID: t0.Add(time.Minute), uuid.NewString(): t0}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetAPIKey(ctx, app.ID, k.ID); got.LastUsedAt == nil || !got.LastUsedAt.Equal(t0.Add(2*time.Minute)) {
			t.Fatalf("last used: %+v", got.LastUsedAt)
		}

		// Gone with the person, and no cache keeps them.
		k3 := key("hash-three", &ada.ID)
		if err := s.CreateAPIKey(ctx, k3); err != nil {
			t.Fatal(err)
		}
		if _, err := s.APIKeyByHash(ctx, []byte("hash-three")); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteUser(ctx, ada.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.APIKeyByHash(ctx, []byte("hash-three")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's key: %v", err)
		}
	})
}

func TestUsageStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		m := time.Date(2026, 3, 4, 10, 20, 0, 0, time.UTC)
		day := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
		row := func(g string, at time.Time, n int64) persistence.UsageCount {
			return persistence.UsageCount{SubjectKind: persistence.UsageServiceAccount, SubjectID: "sa", Granularity: g, Bucket: at, Count: n}
		}
		// Writers adding to the same buckets at once (replicas flushing): the sum.
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := s.AddUsage(ctx, []persistence.UsageCount{row(persistence.UsageMinute, m, 3), row(persistence.UsageDay, day, 3)}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if err := s.AddUsage(ctx, []persistence.UsageCount{row(persistence.UsageMinute, m.Add(time.Minute), 1)}); err != nil {
			t.Fatal(err)
		}
		got, err := s.UsageSeries(ctx, persistence.UsageServiceAccount, "sa", persistence.UsageMinute, m, m.Add(time.Hour))
		if err != nil || len(got) != 2 || got[0].Count != 24 || got[1].Count != 1 || !got[0].Bucket.Equal(m) {
			t.Fatalf("minutes: %+v %v", got, err)
		}
		got, err = s.UsageSeries(ctx, persistence.UsageServiceAccount, "sa", persistence.UsageDay, day, day.AddDate(0, 0, 1))
		if err != nil || len(got) != 1 || got[0].Count != 24 {
			t.Fatalf("days: %+v %v", got, err)
		}
		if n, err := s.DeleteUsageBefore(ctx, persistence.UsageMinute, m.Add(time.Minute)); err != nil || n != 1 {
			t.Fatalf("sweep: %d %v", n, err)
		}
	})
}
