package persistence_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/ory/fosite"
	"github.com/ory/fosite/storage"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// A unit of work commits everything made with its context together, or
// nothing: records, tokens and audit entries (which leave the group commit
// for it), and reads within it see its own writes.
func TestUnitOfWork(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ag := newAgent("unit", "sandboxed")
		if err := s.CreateAgent(ctx, ag); err != nil {
			t.Fatal(err)
		}
		c, err := s.GetClient(ctx, ag.ClientID)
		if err != nil {
			t.Fatal(err)
		}
		client := c.(*persistence.Client)
		errStop := errors.New("stop")

		// Rolled back: the account, the token and the audit entry are gone.
		sig := persistence.TokenKeyPrefix(now()) + "rolled-back"
		err = s.InTx(ctx, func(ctx context.Context) error {
			if err := s.CreateServiceAccount(ctx, newAccount("sa_unit_rollback")); err != nil {
				return err
			}
			if _, err := s.GetServiceAccountByClientID(ctx, "sa_unit_rollback"); err != nil {
				t.Errorf("a unit does not read its own write: %v", err)
			}
			if err := s.CreateAccessTokenSession(ctx, sig, tokenRequestFor(client, now().Add(time.Hour))); err != nil {
				return err
			}
			if err := s.AppendAudit(ctx, auditEntry(ag.ID, "in_unit", now())); err != nil {
				return err
			}
			return errStop
		})
		if !errors.Is(err, errStop) {
			t.Fatalf("InTx returned %v, want fn's error", err)
		}
		if _, err := s.GetServiceAccountByClientID(ctx, "sa_unit_rollback"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a rolled-back account: %v", err)
		}
		if _, err := s.GetAccessTokenSession(ctx, sig, &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("a rolled-back token: %v", err)
		}
		if entries, _, err := s.ListAgentAudit(ctx, ag.ID, persistence.AuditFilter{Actions: []string{"in_unit"}}, persistence.Page{Limit: 10}); err != nil || len(entries) != 0 {
			t.Fatalf("a rolled-back audit entry: %v %v", entries, err)
		}

		// Committed, with a nested unit joining the outer one.
		sig = persistence.TokenKeyPrefix(now()) + "committed"
		err = s.InTx(ctx, func(ctx context.Context) error {
			if err := s.CreateServiceAccount(ctx, newAccount("sa_unit_commit")); err != nil {
				return err
			}
			return s.InTx(ctx, func(ctx context.Context) error {
				if err := s.CreateAccessTokenSession(ctx, sig, tokenRequestFor(client, now().Add(time.Hour))); err != nil {
					return err
				}
				return s.AppendAudit(ctx, auditEntry(ag.ID, "in_unit", now()))
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetServiceAccountByClientID(ctx, "sa_unit_commit"); err != nil {
			t.Fatalf("a committed account: %v", err)
		}
		if _, err := s.GetAccessTokenSession(ctx, sig, &fosite.DefaultSession{}); err != nil {
			t.Fatalf("a committed token: %v", err)
		}
		if entries, _, err := s.ListAgentAudit(ctx, ag.ID, persistence.AuditFilter{Actions: []string{"in_unit"}}, persistence.Page{Limit: 10}); err != nil || len(entries) != 1 {
			t.Fatalf("committed audit entries: %v %v", entries, err)
		}

		// An inner failure fails the whole unit.
		err = s.InTx(ctx, func(ctx context.Context) error {
			if err := s.CreateServiceAccount(ctx, newAccount("sa_unit_inner")); err != nil {
				return err
			}
			return s.CreateServiceAccount(ctx, newAccount("sa_unit_commit")) // taken
		})
		if !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a duplicate in a unit: %v", err)
		}
		if _, err := s.GetServiceAccountByClientID(ctx, "sa_unit_inner"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("the unit's first write survived its failure: %v", err)
		}

		// A change in a unit evicts the cache once the unit commits, not
		// before, and a unit's reads never fill the cache.
		err = s.InTx(ctx, func(ctx context.Context) error {
			_, err := s.UpdateAgent(ctx, ag.ID, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
				a.TrustLevel = "registered"
				return nil, nil
			})
			if err != nil {
				return err
			}
			if c, err := s.GetClient(ctx, ag.ClientID); err != nil || c.(*persistence.Client).Agent.TrustLevel != "registered" {
				t.Errorf("in the unit the client reads %+v, %v", c, err)
			}
			return errStop
		})
		if !errors.Is(err, errStop) {
			t.Fatal(err)
		}
		if c, err := s.GetClient(ctx, ag.ClientID); err != nil || c.(*persistence.Client).Agent.TrustLevel != "sandboxed" {
			t.Fatalf("after a rolled-back change the client reads %+v, %v", c, err)
		}
	})
}

// fosite's storage.Transactional: begin, commit, roll back through the context.
func TestTransactional(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := openStore(t, dbURL)
		var tx storage.Transactional = s
		for _, commit := range []bool{true, false} {
			id := map[bool]string{true: "sa_tx_commit", false: "sa_tx_rollback"}[commit]
			ctx, err := tx.BeginTX(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.CreateServiceAccount(ctx, newAccount(id)); err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.GetServiceAccountByClientID(context.Background(), id)
			if commit != (err == nil) {
				t.Fatalf("commit %v: read back %v", commit, err)
			}
			// Rolling back after the end is a no-op, as fosite may do.
			if err := tx.Rollback(ctx); err != nil {
				t.Fatalf("rollback after the end: %v", err)
			}
		}
		if err := tx.Commit(context.Background()); err == nil {
			t.Fatal("commit without a unit succeeded")
		}
	})
}

// Storage failures map to ErrUnavailable; verdicts do not.
func TestUnavailableErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"admin shutdown", &pq.Error{Code: "57P01"}, true},
		{"cannot connect now", &pq.Error{Code: "57P03"}, true},
		{"disk full", &pq.Error{Code: "53100"}, true},
		{"too many connections", &pq.Error{Code: "53300"}, true},
		{"connection failure", &pq.Error{Code: "08006"}, true},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"unique violation", &pq.Error{Code: "23505"}, false},
		{"syntax error", &pq.Error{Code: "42601"}, false},
		{"invalid text", &pq.Error{Code: "22021"}, false},
	} {
		if got := persistence.Unavailable(persistence.MapError(c.err)); got != c.want {
			t.Errorf("%s: unavailable %v, want %v", c.name, got, c.want)
		}
	}
	// A database that is not there.
	_, _, err := persistence.Open(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err == nil || !persistence.Unavailable(err) {
		t.Fatalf("open on a closed port: %v, want unavailable", err)
	}
}

// A failed step inside a unit undoes itself only: the unit goes on, and a
// caller may try again (PostgreSQL aborts a whole transaction on an error
// unless the step runs under a savepoint).
func TestUnitSurvivesAFailedStep(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		if err := s.CreateAgent(ctx, newAgent("taken", "sandboxed")); err != nil {
			t.Fatal(err)
		}
		err := s.InTx(ctx, func(ctx context.Context) error {
			if err := s.CreateAgent(ctx, newAgent("taken", "sandboxed")); !errors.Is(err, persistence.ErrDuplicate) {
				t.Errorf("a duplicate in a unit: %v", err)
			}
			return s.CreateAgent(ctx, newAgent("fresh", "sandboxed"))
		})
		if err != nil {
			t.Fatalf("the unit after a failed step: %v", err)
		}
		if _, err := s.GetAgentByClientID(ctx, persistence.AgentClientPrefix+"fresh"); err != nil {
			t.Fatalf("the step after the failed one: %v", err)
		}
	})
}

// A unit that changes several cached records commits once and waits one
// lease (PostgreSQL; SQLite waits none).
func TestUnitWaitsOneLease(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		one, two := newAgent("lease-one", "sandboxed"), newAgent("lease-two", "sandboxed")
		for _, a := range []*persistence.Agent{one, two} {
			if err := s.CreateAgent(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		promote := func(ctx context.Context, id string) error {
			_, err := s.UpdateAgent(ctx, id, func(a *persistence.Agent) ([]persistence.AuditEntry, error) {
				a.TrustLevel = "registered"
				return nil, nil
			})
			return err
		}
		before := s.LeaseWaits()
		if err := s.InTx(ctx, func(ctx context.Context) error {
			if err := promote(ctx, one.ID); err != nil {
				return err
			}
			return promote(ctx, two.ID)
		}); err != nil {
			t.Fatal(err)
		}
		want := int64(1)
		if strings.HasPrefix(dbURL, "sqlite") {
			want = 0
		}
		if got := s.LeaseWaits() - before; got != want {
			t.Fatalf("a unit changing two agents waited %d leases, want %d", got, want)
		}
	})
}
