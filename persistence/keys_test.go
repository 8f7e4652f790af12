package persistence_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func signingKey(kid, alg string) persistence.SigningKey {
	return persistence.SigningKey{KID: kid, Alg: alg, PrivateDER: []byte("der-" + kid), CreatedAt: now()}
}

func activeKids(t *testing.T, s *persistence.Store) map[string][]string {
	t.Helper()
	keys, err := s.SigningKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	active := map[string][]string{}
	for _, k := range keys {
		if k.RetiredAt == nil {
			active[k.Alg] = append(active[k.Alg], k.KID)
		}
	}
	return active
}

// Every algorithm keeps one active key: a first start stores one only where
// none is active, whoever races; a rotation retires the active one and
// stores its successor; retired keys are deleted once their time is up.
func TestSigningKeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)

		// Replicas starting together: each offers its own keys, one set wins.
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				kid := uuid.NewString()
				if _, err := s.EnsureSigningKeys(ctx, []persistence.SigningKey{signingKey("rs-"+kid, "RS256"), signingKey("es-"+kid, "ES256")}); err != nil {
					t.Errorf("ensure %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		first := activeKids(t, s)
		if len(first["RS256"]) != 1 || len(first["ES256"]) != 1 {
			t.Fatalf("active keys after racing first starts: %v", first)
		}
		if stored, err := s.EnsureSigningKeys(ctx, []persistence.SigningKey{signingKey("late", "RS256")}); err != nil || len(stored) != 0 {
			t.Fatalf("a key stored beside an active one: %v %v", stored, err)
		}

		// Rotations racing: each retires what is active; one key per
		// algorithm stays active, and it is the last one stored.
		var mu sync.Mutex
		var retired []string
		for i := range 4 {
			wg.Go(func() {
				kid := uuid.NewString()
				r, err := s.RotateSigningKeys(ctx, []persistence.SigningKey{signingKey("rs-"+kid, "RS256"), signingKey("es-"+kid, "ES256")}, now())
				if err != nil {
					t.Errorf("rotate %d: %v", i, err)
				}
				mu.Lock()
				retired = append(retired, r...)
				mu.Unlock()
			})
		}
		wg.Wait()
		active := activeKids(t, s)
		if len(active["RS256"]) != 1 || len(active["ES256"]) != 1 {
			t.Fatalf("active keys after racing rotations: %v", active)
		}
		keys, _ := s.SigningKeys(ctx)
		if len(keys) != 10 || len(retired) != 8 || !slices.Contains(retired, first["RS256"][0]) || !slices.Contains(retired, first["ES256"][0]) {
			t.Fatalf("%d keys, retired %v (each rotation retires the one before it)", len(keys), retired)
		}
		for _, k := range keys {
			if k.RetiredAt != nil && !slices.Contains(retired, k.KID) {
				t.Fatalf("key %s retired but not reported", k.KID)
			}
		}
		if _, err := s.RotateSigningKeys(ctx, []persistence.SigningKey{signingKey(active["RS256"][0], "RS256")}, now()); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a taken kid: %v", err)
		}
		if again := activeKids(t, s); !slices.Equal(again["RS256"], active["RS256"]) {
			t.Fatalf("a failed rotation changed the active key: %v", again)
		}

		// Deleted: the keys retired before the time, only.
		if n, err := s.DeleteRetiredSigningKeys(ctx, now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("deleted %d keys retired within the hour: %v", n, err)
		}
		if n, err := s.DeleteRetiredSigningKeys(ctx, now().Add(time.Second)); err != nil || n != 8 {
			t.Fatalf("deleted %d retired keys, want 8: %v", n, err)
		}
		if keys, _ := s.SigningKeys(ctx); len(keys) != 2 || keys[0].RetiredAt != nil || keys[1].RetiredAt != nil {
			t.Fatalf("left %+v", keys)
		}
	})
}

// Migration 0007 on a database from before it: of two active keys of an
// algorithm (replicas once started together) the oldest, which signed, stays
// active; invites made before it read as hashed with the client-secret key.
func TestMigrationKeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, _ := migratedTo(t, dbURL, 6)
		exec := func(q string, args ...any) {
			t.Helper()
			if _, err := db.ExecContext(ctx, db.Rebind(q), args...); err != nil {
				t.Fatal(err)
			}
		}
		t0 := now().Add(-time.Hour)
		insertKey := func(kid, alg string, at time.Time) {
			exec(`INSERT INTO signing_keys (kid, alg, private_der, created_at) VALUES (?, ?, ?, ?)`, kid, alg, []byte(kid), at)
		}
		insertKey("rs-old", "RS256", t0)
		insertKey("rs-new", "RS256", t0.Add(time.Second))
		insertKey("es-b", "ES256", t0)
		insertKey("es-a", "ES256", t0) // the same instant: the smaller kid counts as older
		userID := uuid.NewString()
		exec(`INSERT INTO users (id, email, email_key, status, metadata, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)`, userID, "old@example.com", "old@example.com", "invited", "{}", t0, t0)
		exec(`INSERT INTO invites (id, token_hash, email, user_id, user_existed, creator_client_id, creator_principal, redirect_uri, accept_uri, metadata, status, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, uuid.NewString(), []byte("old-hash"), "old@example.com", userID, false, "sa_x", uuid.NewString(),
			"https://app.example/cb", "https://app.example/cb", "{}", "sent", t0, t0.Add(72*time.Hour))

		s := dbtest.Store(t, dbURL)
		if active := activeKids(t, s); !slices.Equal(active["RS256"], []string{"rs-old"}) || !slices.Equal(active["ES256"], []string{"es-a"}) {
			t.Fatalf("active after the migration: %v", active)
		}
		keys, _ := s.SigningKeys(ctx)
		for _, k := range keys {
			if k.RetiredAt != nil && (k.RetiredAt.Before(t0) || k.RetiredAt.After(time.Now().Add(time.Minute))) {
				t.Fatalf("key %s retired at %v", k.KID, k.RetiredAt)
			}
		}
		inv, err := s.InviteByToken(ctx, []byte("old-hash"), persistence.LegacyInviteTokenKey)
		if err != nil || inv.TokenKey != persistence.LegacyInviteTokenKey {
			t.Fatalf("an invite from before the migration: %+v %v", inv, err)
		}
	})
}
