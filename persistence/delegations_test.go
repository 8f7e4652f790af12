package persistence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Delegations: created with their audit and events, found by their
// auth_req_id hash, updated under the row lock (two changes at once are
// serialized: one sees the other's), listed with filters read as of now,
// and a delegated token's check of its delegation follows revocation, the
// person's status and deletion.
func TestDelegationStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		t0 := now()
		ag := newAgent("assistant", "registered")
		u := newUser("pat@example.com")
		if err := s.CreateAgent(ctx, ag); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateUser(ctx, u); err != nil {
			t.Fatal(err)
		}
		details := `[{"type":"calendar","actions":["read"],"n":1.50}]`
		mk := func(hash string, exp time.Time) *persistence.Delegation {
			d := &persistence.Delegation{ID: uuid.Must(uuid.NewV7()).String(), AgentID: ag.ID, ClientID: ag.ClientID, UserID: u.ID,
				Scopes: persistence.StringList{"openid", "users:read"}, AuthorizationDetails: &details, BindingMessage: "W4SCT",
				Status: persistence.DelegationPending, AuthReqHash: []byte(hash), PollInterval: 5, LifetimeSeconds: 3600, CreatedAt: t0, ExpiresAt: exp}
			uid := u.ID
			if err := s.CreateDelegation(ctx, d, []persistence.AuditEntry{auditEntry(ag.ID, "delegation_requested", t0)},
				persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: "delegation_requested", UserID: &uid, ClientID: ag.ClientID, Data: persistence.JSONObject{}, CreatedAt: t0}); err != nil {
				t.Fatal(err)
			}
			return d
		}
		d := mk("hash-one", t0.Add(time.Minute))
		lapsed := mk("hash-two", t0.Add(-time.Second))
		if err := s.CreateDelegation(ctx, &persistence.Delegation{ID: uuid.Must(uuid.NewV7()).String(), AgentID: ag.ID, ClientID: ag.ClientID,
			UserID: u.ID, Status: "pending", AuthReqHash: []byte("hash-one"), PollInterval: 5, CreatedAt: t0, ExpiresAt: t0}, nil); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a second row with one hash: %v", err)
		}
		got, err := s.DelegationByHash(ctx, []byte("hash-one"))
		if err != nil || got.ID != d.ID || *got.AuthorizationDetails != details || got.BindingMessage != "W4SCT" || !got.ExpiresAt.Equal(d.ExpiresAt) {
			t.Fatalf("by hash: %+v %v", got, err)
		}
		if _, err := s.GetDelegation(ctx, "not-a-uuid"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a malformed id: %v", err)
		}

		// Two changes at once: each sees the other's (row lock).
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.UpdateDelegation(ctx, d.ID, func(x *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
					x.PollInterval++
					return nil, nil, nil
				}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got, _ := s.GetDelegation(ctx, d.ID); got.PollInterval != 13 {
			t.Fatalf("interval %d after 8 serialized updates", got.PollInterval)
		}
		refused := errors.New("refused")
		if _, err := s.UpdateDelegation(ctx, d.ID, func(x *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
			x.Status = persistence.DelegationActive
			return nil, nil, refused
		}); !errors.Is(err, refused) {
			t.Fatal(err)
		}

		// Filters, as of now: the lapsed pending one reads expired.
		list := func(f persistence.DelegationFilter) int {
			t.Helper()
			out, total, err := s.ListDelegations(ctx, f, persistence.Page{Limit: 10}, now())
			if err != nil || len(out) != total {
				t.Fatalf("list %+v: %d %d %v", f, len(out), total, err)
			}
			return total
		}
		if list(persistence.DelegationFilter{UserID: u.ID}) != 2 || list(persistence.DelegationFilter{Status: "pending"}) != 1 ||
			list(persistence.DelegationFilter{Status: "expired"}) != 1 || list(persistence.DelegationFilter{AgentID: "junk"}) != 0 {
			t.Fatal("filters")
		}
		_ = lapsed

		// A token bound to the delegation lives while it is active.
		approve := func(status string) {
			if _, err := s.UpdateDelegation(ctx, d.ID, func(x *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
				at := now()
				x.Status, x.DecidedAt, x.ExpiresAt = status, &at, at.Add(time.Hour)
				return nil, nil, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		approve(persistence.DelegationActive)
		live := func() bool {
			ok, err := persistence.DelegationLiveForTest(ctx, s, d.ID)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if !live() || !live() { // the second from the cache
			t.Fatal("active delegation not live")
		}
		if _, err := s.UpdateUser(ctx, u.ID, func(x *persistence.User) ([]persistence.DirectoryEvent, error) {
			x.Status = "disabled"
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if live() {
			t.Fatal("live after the person was disabled")
		}
		if _, err := s.UpdateUser(ctx, u.ID, func(x *persistence.User) ([]persistence.DirectoryEvent, error) { x.Status = "active"; return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if !live() {
			t.Fatal("not live after the person was enabled again")
		}
		approve(persistence.DelegationRevoked)
		if live() {
			t.Fatal("live after revocation")
		}
		ids, err := s.OpenDelegations(ctx, ag.ID)
		if err != nil || len(ids) != 1 || ids[0] != lapsed.ID {
			t.Fatalf("open: %v %v", ids, err)
		}
		if err := s.DeleteUser(ctx, u.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetDelegation(ctx, d.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's delegation: %v", err)
		}
	})
}
