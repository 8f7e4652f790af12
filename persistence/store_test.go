package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/ory/fosite"
	"github.com/pressly/goose/v3"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
	"github.com/identityd/identityd/schema"
)

// The conformance suite: every store test runs on SQLite, and on PostgreSQL
// when TEST_DATABASE_URL is set, each in a fresh database.

func openStore(t testing.TB, dbURL string) *persistence.Store { return dbtest.Store(t, dbURL) }

// migratedTo opens dbURL with the migrations applied up to version only,
// for a test of a later migration on data from before it; the provider
// moves it up or down. The database is closed when the test ends.
func migratedTo(t *testing.T, dbURL string, version int64) (*sqlx.DB, *goose.Provider) {
	t.Helper()
	ctx := context.Background()
	db, dialect, err := persistence.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sub, _ := fs.Sub(schema.FS, string(dialect))
	gd := goose.DialectSQLite3
	if dialect == persistence.Postgres {
		gd = goose.DialectPostgres
	}
	p, err := goose.NewProvider(gd, db.DB, sub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatal(err)
	}
	return db, p
}

func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

func newAccount(clientID string, scopes ...string) *persistence.ServiceAccount {
	n := now()
	return &persistence.ServiceAccount{
		ID: uuid.Must(uuid.NewV7()).String(), ClientID: clientID, SecretHash: []byte("hash-" + clientID),
		Name: "account " + clientID, Scopes: scopes, RedirectURIs: []string{"https://app.example/cb"},
		CreatedAt: n, UpdatedAt: n,
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, dialect, err := persistence.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if applied, err := persistence.Migrate(ctx, db.DB, dialect); err != nil || len(applied) == 0 {
			t.Fatalf("first migrate applied %v, err %v", applied, err)
		}
		if applied, err := persistence.Migrate(ctx, db.DB, dialect); err != nil || len(applied) != 0 {
			t.Fatalf("second migrate applied %v, err %v", applied, err)
		}
	})
}

func TestServiceAccounts(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)

		sa := newAccount("sa_one", "users:read", "admin")
		if err := s.CreateServiceAccount(ctx, sa); err != nil {
			t.Fatal(err)
		}
		dup := newAccount("sa_one")
		if err := s.CreateServiceAccount(ctx, dup); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("duplicate client id: got %v, want ErrDuplicate", err)
		}

		got, err := s.GetServiceAccount(ctx, sa.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ClientID != "sa_one" || !slices.Equal(got.Scopes, []string{"users:read", "admin"}) ||
			!slices.Equal(got.RedirectURIs, sa.RedirectURIs) || string(got.SecretHash) != "hash-sa_one" {
			t.Fatalf("read back %+v", got)
		}
		if !got.CreatedAt.Equal(sa.CreatedAt) || got.RotatedAt != nil {
			t.Fatalf("times: created %v want %v, rotated %v", got.CreatedAt, sa.CreatedAt, got.RotatedAt)
		}
		if _, err := s.GetServiceAccountByClientID(ctx, "sa_one"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetServiceAccountByClientID(ctx, "sa_none"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown client: %v", err)
		}
		if _, err := s.GetServiceAccount(ctx, uuid.NewString()); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}

		for _, scope := range []string{"admin", "users:read"} {
			if ok, err := s.AnyServiceAccountWithScope(ctx, scope); err != nil || !ok {
				t.Fatalf("AnyServiceAccountWithScope(%s) = %v, %v", scope, ok, err)
			}
		}
		if ok, err := s.AnyServiceAccountWithScope(ctx, "orgs:write"); err != nil || ok {
			t.Fatalf("AnyServiceAccountWithScope(orgs:write) = %v, %v", ok, err)
		}

		// An update whose function fails changes nothing.
		boom := errors.New("boom")
		if _, err := s.UpdateServiceAccount(ctx, sa.ID, func(a *persistence.ServiceAccount) error {
			a.Name = "changed"
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("update error: %v", err)
		}
		if got, _ := s.GetServiceAccount(ctx, sa.ID); got.Name != sa.Name {
			t.Fatalf("aborted update was written: %q", got.Name)
		}
		rotated := now()
		up, err := s.UpdateServiceAccount(ctx, sa.ID, func(a *persistence.ServiceAccount) error {
			a.Name, a.Scopes, a.SecretHash, a.RotatedAt = "renamed", []string{"orgs:read"}, []byte("new"), &rotated
			return nil
		})
		if err != nil || up.Name != "renamed" {
			t.Fatalf("update: %+v %v", up, err)
		}
		got, _ = s.GetServiceAccount(ctx, sa.ID)
		if got.Name != "renamed" || !slices.Equal(got.Scopes, []string{"orgs:read"}) || string(got.SecretHash) != "new" ||
			got.RotatedAt == nil || !got.RotatedAt.Equal(rotated) {
			t.Fatalf("after update %+v", got)
		}
		if _, err := s.UpdateServiceAccount(ctx, uuid.NewString(), func(*persistence.ServiceAccount) error { return nil }); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("update unknown: %v", err)
		}
	})
}

func TestListServiceAccountsPages(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		var ids []string
		for i := range 7 {
			sa := newAccount(fmt.Sprintf("sa_%d", i))
			sa.CreatedAt = sa.CreatedAt.Add(time.Duration(i) * time.Second)
			if err := s.CreateServiceAccount(ctx, sa); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sa.ID)
		}
		var seen []string
		for offset := 0; offset < 9; offset += 3 {
			page, total, err := s.ListServiceAccounts(ctx, persistence.Page{Limit: 3, Offset: offset})
			if err != nil || total != 7 {
				t.Fatalf("page at %d: total %d, err %v", offset, total, err)
			}
			for _, sa := range page {
				seen = append(seen, sa.ID)
			}
		}
		if !slices.Equal(seen, ids) {
			t.Fatalf("pages gave %v, want %v (oldest first)", seen, ids)
		}
		if _, _, err := s.ListServiceAccounts(ctx, persistence.Page{Limit: 0}); err == nil {
			t.Fatal("a zero limit was accepted")
		}
	})
}

func TestSettings(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		if _, err := s.Setting(ctx, "k"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unset setting: %v", err)
		}
		if v, err := s.SetSettingOnce(ctx, "k", "first"); err != nil || v != "first" {
			t.Fatalf("first SetSettingOnce: %q %v", v, err)
		}
		if v, err := s.SetSettingOnce(ctx, "k", "second"); err != nil || v != "first" {
			t.Fatalf("second SetSettingOnce: %q %v (first writer must win)", v, err)
		}
		if err := s.SetSetting(ctx, "k", "third"); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.Setting(ctx, "k"); v != "third" {
			t.Fatalf("SetSetting did not replace: %q", v)
		}

	})
}

func tokenRequest(sa *persistence.ServiceAccount, exp time.Time, scopes ...string) *fosite.Request {
	req := fosite.NewRequest()
	req.ID = uuid.NewString()
	req.RequestedAt = now()
	req.Client = &persistence.Client{ID: sa.ClientID, PrincipalID: sa.ID}
	req.GrantedScope = scopes
	sess := &fosite.DefaultSession{Subject: sa.ClientID, Extra: map[string]any{"k": "v"}}
	sess.SetExpiresAt(fosite.AccessToken, exp)
	req.Session = sess
	return req
}

func TestAccessTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		sa := newAccount("sa_tok", "users:read")
		if err := s.CreateServiceAccount(ctx, sa); err != nil {
			t.Fatal(err)
		}
		client, err := s.GetClient(ctx, "sa_tok")
		if err != nil || client.GetID() != "sa_tok" || !client.GetScopes().Has("users:read") || client.IsPublic() {
			t.Fatalf("GetClient: %+v %v", client, err)
		}
		if _, err := s.GetClient(ctx, "nobody"); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("unknown client: %v", err)
		}

		exp := now().Add(time.Hour)
		req := tokenRequest(sa, exp, "users:read")
		if err := s.CreateAccessTokenSession(ctx, "sig1", req); err != nil {
			t.Fatal(err)
		}
		sess := &fosite.DefaultSession{}
		got, err := s.GetAccessTokenSession(ctx, "sig1", sess)
		if err != nil {
			t.Fatal(err)
		}
		if got.GetID() != req.ID || got.GetClient().GetID() != "sa_tok" || !slices.Equal(got.GetGrantedScopes(), []string{"users:read"}) ||
			!got.GetRequestedAt().Equal(req.RequestedAt) || sess.Subject != "sa_tok" || sess.Extra["k"] != "v" ||
			!sess.GetExpiresAt(fosite.AccessToken).Equal(exp) {
			t.Fatalf("read back %+v session %+v", got, sess)
		}
		if _, err := s.GetAccessTokenSession(ctx, "nosig", &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("unknown signature: %v", err)
		}

		// Revocation deletes the token.
		if err := s.DeleteAccessTokenSession(ctx, "sig1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, "sig1", &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("revoked token still found: %v", err)
		}

		// Sweeping removes expired rows only. Signatures begin with the time
		// of issue; the lifetime bounds which rows can have expired.
		ttl := time.Hour
		issued := func(ago time.Duration) string { return persistence.TokenKeyPrefix(now().Add(-ago)) + "-sig" }
		for sig, exp := range map[string]time.Time{
			issued(2 * time.Hour):       now().Add(-time.Hour),        // expired: swept
			issued(90 * time.Minute):    now().Add(time.Hour),         // an older, longer lifetime: kept
			issued(time.Minute) + "old": now().Add(-30 * time.Second), // expired, issued within the lifetime: left for a later sweep
		} {
			if err := s.CreateAccessTokenSession(ctx, sig, tokenRequest(sa, exp)); err != nil {
				t.Fatal(err)
			}
		}
		live := issued(time.Second)
		if err := s.CreateAccessTokenSession(ctx, live, tokenRequest(sa, now().Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
		if n, err := s.DeleteExpiredTokens(ctx, now(), ttl); err != nil || n != 1 {
			t.Fatalf("swept %d, %v", n, err)
		}
		if _, err := s.GetAccessTokenSession(ctx, issued(2*time.Hour), &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("expired token not swept: %v", err)
		}
		if _, err := s.GetAccessTokenSession(ctx, live, &fosite.DefaultSession{}); err != nil {
			t.Fatalf("live token swept: %v", err)
		}

		// Deleting the account takes its tokens with it.
		if _, err := s.DeleteServiceAccount(ctx, sa.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, live, &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("token of a deleted account: %v", err)
		}
		if _, err := s.DeleteServiceAccount(ctx, sa.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		// Nor does an account made again under the same client id revive them.
		if err := s.CreateServiceAccount(ctx, newAccount("sa_tok")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, live, &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("token revived by a new account with the same client id: %v", err)
		}
	})
}

// Concurrent token writes are grouped into shared commits; each caller must
// still get its own outcome, and one bad row must not fail the others.
func TestConcurrentTokenWrites(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		sa := newAccount("c")
		if err := s.CreateServiceAccount(ctx, sa); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateAccessTokenSession(ctx, "taken", tokenRequest(sa, now().Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
		const n = 300
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sig := fmt.Sprintf("sig-%d", i)
				if i == n/2 {
					sig = "taken" // a duplicate signature in the middle of a batch
				}
				errs[i] = s.CreateAccessTokenSession(ctx, sig, tokenRequest(sa, now().Add(time.Hour)))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if i == n/2 {
				if !errors.Is(err, persistence.ErrDuplicate) {
					t.Errorf("duplicate signature: got %v, want ErrDuplicate", err)
				}
				continue
			}
			if err != nil {
				t.Errorf("write %d: %v", i, err)
				continue
			}
			if _, err := s.GetAccessTokenSession(ctx, fmt.Sprintf("sig-%d", i), &fosite.DefaultSession{}); err != nil {
				t.Errorf("token %d not stored: %v", i, err)
			}
		}
	})
}

// Two stores on one PostgreSQL database stand for two replicas: once a
// change made through one has returned, the other must not serve the old
// value from its cache, not even for a moment.
func TestCacheAcrossReplicas(t *testing.T) {
	dbURL, ok := dbtest.URLs(t)["postgres"]
	if !ok {
		t.Skip("TEST_DATABASE_URL is not set")
	}
	ctx := context.Background()
	a, b := openStore(t, dbURL), openStore(t, dbURL)
	sa := newAccount("sa_shared", "users:read")
	if err := a.CreateServiceAccount(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateAccessTokenSession(ctx, "shared", tokenRequest(sa, now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	// b caches the client and the token.
	if c, err := b.GetClient(ctx, "sa_shared"); err != nil || string(c.GetHashedSecret()) != "hash-sa_shared" {
		t.Fatalf("b reads %v %v", c, err)
	}
	if _, err := b.GetAccessTokenSession(ctx, "shared", &fosite.DefaultSession{}); err != nil {
		t.Fatal(err)
	}

	// A rotation through a is seen by b as soon as it returns.
	if _, err := a.UpdateServiceAccount(ctx, sa.ID, func(x *persistence.ServiceAccount) error {
		x.SecretHash = []byte("rotated")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c, err := b.GetClient(ctx, "sa_shared"); err != nil || string(c.GetHashedSecret()) != "rotated" {
		t.Fatalf("b serves the old secret after the rotation returned: %v %v", c, err)
	}
	// So is a revocation.
	if _, err := b.GetAccessTokenSession(ctx, "shared", &fosite.DefaultSession{}); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteAccessTokenSession(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetAccessTokenSession(ctx, "shared", &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
		t.Fatalf("b serves a revoked token: %v", err)
	}
	// And a deletion.
	if _, err := a.DeleteServiceAccount(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetClient(ctx, "sa_shared"); !errors.Is(err, fosite.ErrNotFound) {
		t.Fatalf("b serves a deleted client: %v", err)
	}
}

// A command beside a SQLite server (another process on the same file)
// changes a client and announces it: the server's next epoch check drops
// what it cached. Without the announcement the server keeps its copy, which
// is why the command announces.
func TestSQLiteEpochDropsCache(t *testing.T) {
	ctx := context.Background()
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "identityd.db")
	server, command := openStore(t, dbURL), openStore(t, dbURL)
	sa := newAccount("sa_epoch", "admin")
	if err := server.CreateServiceAccount(ctx, sa); err != nil {
		t.Fatal(err)
	}
	secret := func() string {
		t.Helper()
		c, err := server.GetClient(ctx, "sa_epoch")
		if err != nil {
			t.Fatal(err)
		}
		return string(c.GetHashedSecret())
	}
	seen := server.PollEpoch("")
	if secret() != "hash-sa_epoch" {
		t.Fatal("the server does not read the client")
	}
	if _, err := command.UpdateServiceAccount(ctx, sa.ID, func(x *persistence.ServiceAccount) error {
		x.SecretHash = []byte("reset")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if seen = server.PollEpoch(seen); secret() != "hash-sa_epoch" {
		t.Fatal("the cache was dropped without an announcement: this test proves nothing")
	}
	if err := command.AnnounceToServers(ctx); err != nil {
		t.Fatal(err)
	}
	if server.PollEpoch(seen) == seen {
		t.Fatal("the epoch did not move")
	}
	if got := secret(); got != "reset" {
		t.Fatalf("after the epoch moved the server reads %q", got)
	}
}

// The lease is the guarantee; the NOTIFY sent at commit makes other
// replicas drop a changed record long before the commit wait ends.
func TestEvictionMessagesArriveBeforeTheCommitWaitEnds(t *testing.T) {
	dbURL, ok := dbtest.URLs(t)["postgres"]
	if !ok {
		t.Skip("TEST_DATABASE_URL is not set")
	}
	ctx := context.Background()
	a, b := openStore(t, dbURL), openStore(t, dbURL)
	sa := newAccount("sa_notified", "users:read")
	if err := a.CreateServiceAccount(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetClient(ctx, "sa_notified"); err != nil { // cached on b
		t.Fatal(err)
	}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		if _, err := a.UpdateServiceAccount(ctx, sa.ID, func(x *persistence.ServiceAccount) error {
			x.SecretHash = []byte("rotated")
			return nil
		}); err != nil {
			t.Error(err)
		}
	}()
	for {
		c, err := b.GetClient(ctx, "sa_notified")
		if err != nil {
			t.Fatal(err)
		}
		if string(c.GetHashedSecret()) == "rotated" {
			break
		}
		// Without the message, b's entry would live out its lease (500 ms);
		// half of it is a generous bound for a message on loopback.
		if time.Since(start) > 250*time.Millisecond {
			t.Fatal("b still serves the old secret 250 ms after the change: no eviction message arrived")
		}
		time.Sleep(2 * time.Millisecond)
	}
	<-done
}

// Replicas starting together on a fresh PostgreSQL database migrate it once
// between them; none fails on a migration another is applying.
func TestConcurrentMigrations(t *testing.T) {
	dbURL, ok := dbtest.URLs(t)["postgres"]
	if !ok {
		t.Skip("TEST_DATABASE_URL is not set")
	}
	ctx := context.Background()
	const replicas = 8
	dbs := make([]*sqlx.DB, replicas)
	for i := range dbs {
		db, _, err := persistence.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs[i] = db
	}
	start := make(chan struct{})
	errs := make(chan error, replicas)
	var wg sync.WaitGroup
	for _, db := range dbs {
		wg.Go(func() {
			<-start // all at once, connections ready
			_, err := persistence.Migrate(ctx, db.DB, persistence.Postgres)
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Every pooled SQLite connection runs with the settings Open promises:
// write-ahead log, full synchronous commits, foreign keys, temporary
// storage in memory (a multi-row INSERT's statement journal otherwise
// spills to a temporary file, opened and written for every statement), and
// the log's file trimmed only past 256 MiB.
func TestSQLiteConnectionSettings(t *testing.T) {
	ctx := context.Background()
	db, _, err := persistence.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "identityd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conns := make([]*sqlx.Conn, 3) // held at once: three different connections
	for i := range conns {
		if conns[i], err = db.Connx(ctx); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
	}
	for i, c := range conns {
		for pragma, want := range map[string]string{"journal_mode": "wal", "synchronous": "2", "foreign_keys": "1", "temp_store": "2",
			"journal_size_limit": "268435456"} {
			var got string
			if err := c.GetContext(ctx, &got, "PRAGMA "+pragma); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("connection %d: %s = %s, want %s", i, pragma, got, want)
			}
		}
	}
}
