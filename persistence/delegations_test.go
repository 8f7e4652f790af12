package persistence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/openid"

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
		ids, err := s.OpenDelegations(ctx, persistence.DelegationFilter{AgentID: ag.ID})
		if err != nil || len(ids) != 1 || ids[0] != lapsed.ID {
			t.Fatalf("open: %v %v", ids, err)
		}
		if ids, err := s.OpenDelegations(ctx, persistence.DelegationFilter{UserID: u.ID}); err != nil || len(ids) != 1 || ids[0] != lapsed.ID {
			t.Fatalf("the person's open delegations: %v %v", ids, err)
		}
		if ids, err := s.OpenDelegations(ctx, persistence.DelegationFilter{UserID: "not-a-uuid"}); err != nil || len(ids) != 0 {
			t.Fatalf("a malformed user id: %v %v", ids, err)
		}
		if err := s.DeleteUser(ctx, u.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetDelegation(ctx, d.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's delegation: %v", err)
		}
	})
}

// delegatedSession is a fosite session bound to a delegation, as
// oauth.Session is for an agent's delegated tokens.
type delegatedSession struct {
	openid.DefaultSession
	DelegationID string `json:"delegation_id,omitempty"`
}

func (s *delegatedSession) DelegationRef() string { return s.DelegationID }

func (s *delegatedSession) Clone() fosite.Session {
	c := *s
	return &c
}

// A user-delegated agent's refresh token lives no longer than its
// delegation: read for a refresh it is not found once the delegation is
// revoked or has ended (on every replica: the state is the lease cache's,
// evicted by the change); read without a session (revocation) it is. A
// password reset's revocation of the person's tokens leaves it alone.
func TestDelegatedRefreshTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		ag := newAgent("assistant", "registered")
		ag.Type = persistence.AgentUserDelegated
		u := newUser("pat@example.com")
		if err := s.CreateAgent(ctx, ag); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateUser(ctx, u); err != nil {
			t.Fatal(err)
		}
		c, err := s.GetClient(ctx, ag.ClientID)
		if err != nil {
			t.Fatal(err)
		}
		if !c.GetGrantTypes().Has(persistence.GrantRefreshToken) || !c.GetGrantTypes().Has(persistence.GrantCIBA) {
			t.Fatalf("a user-delegated agent's grants: %v", c.GetGrantTypes())
		}
		t0 := now()
		d := &persistence.Delegation{ID: uuid.Must(uuid.NewV7()).String(), AgentID: ag.ID, ClientID: ag.ClientID, UserID: u.ID,
			Scopes: persistence.StringList{"openid"}, Status: persistence.DelegationActive, AuthReqHash: []byte("hash"), PollInterval: 5,
			LifetimeSeconds: 86400, CreatedAt: t0, DecidedAt: &t0, ExpiresAt: t0.Add(24 * time.Hour)}
		if err := s.CreateDelegation(ctx, d, nil); err != nil {
			t.Fatal(err)
		}
		req := fosite.NewRequest()
		req.ID, req.RequestedAt, req.Client = uuid.NewString(), t0, c
		req.RequestedScope, req.GrantedScope = fosite.Arguments{"openid"}, fosite.Arguments{"openid"}
		sess := &delegatedSession{DelegationID: d.ID}
		sess.Subject = u.ID
		sess.SetExpiresAt(fosite.AccessToken, t0.Add(time.Hour))
		sess.SetExpiresAt(fosite.RefreshToken, d.ExpiresAt)
		req.Session = sess
		issue(t, s, req, persistence.TokenKeyPrefix(t0)+"delegated-access", "delegated-refresh")
		read := func() error {
			_, err := s.GetRefreshTokenSession(ctx, "delegated-refresh", &delegatedSession{})
			return err
		}
		if err := read(); err != nil {
			t.Fatalf("while active: %v", err)
		}
		if n, err := s.RevokeUserTokens(ctx, u.ID); err != nil || n != 0 || read() != nil {
			t.Fatalf("a password reset revoked a delegation's family: %d %v", n, err)
		}
		set := func(status string, ends time.Time) {
			t.Helper()
			if _, err := s.UpdateDelegation(ctx, d.ID, func(x *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
				x.Status, x.ExpiresAt = status, ends
				return nil, nil, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		set(persistence.DelegationActive, now().Add(-time.Second)) // ended
		if err := read(); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("after the delegation's end: %v", err)
		}
		set(persistence.DelegationActive, now().Add(time.Hour))
		if err := read(); err != nil {
			t.Fatalf("active again: %v", err)
		}
		set(persistence.DelegationRevoked, now().Add(time.Hour))
		if err := read(); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("after revocation: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "delegated-refresh", nil); err != nil {
			t.Fatalf("read to be revoked: %v", err)
		}
	})
}
