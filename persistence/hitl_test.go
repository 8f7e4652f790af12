package persistence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func hitlPolicy(name string, priority float64, at time.Time) *persistence.HITLPolicy {
	return &persistence.HITLPolicy{ID: uuid.Must(uuid.NewV7()).String(), Name: name, ActionPattern: "delete_*", ResourcePattern: "users/*",
		ApprovalMode: "async", TimeoutSeconds: 60, ApproverType: "role", ApproverID: "security", AutoDenyOnTimeout: true, Priority: priority,
		CreatedAt: at, UpdatedAt: at}
}

// Policies in evaluation order, updates under the row lock; requests with
// their audit entries, their signal raised after commit and never for a
// rolled-back change; JIT grants seen by the agent's client while active.
func TestHITLStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		t0 := now()
		a, b, c := hitlPolicy("a", 1, t0), hitlPolicy("b", 5, t0.Add(time.Second)), hitlPolicy("c", 5, t0.Add(2*time.Second))
		for _, p := range []*persistence.HITLPolicy{c, a, b} {
			if err := s.CreateHITLPolicy(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		all, err := s.HITLPolicies(ctx)
		if err != nil || len(all) != 3 || all[0].ID != b.ID || all[1].ID != c.ID || all[2].ID != a.ID {
			t.Fatalf("order: %v %v", all, err)
		}
		if !all[0].AutoDenyOnTimeout || all[0].Priority != 5 {
			t.Fatalf("read back: %+v", all[0])
		}
		page, total, err := s.ListHITLPolicies(ctx, persistence.Page{Limit: 1, Offset: 1})
		if err != nil || total != 3 || len(page) != 1 || page[0].ID != c.ID {
			t.Fatalf("page: %v %d %v", page, total, err)
		}
		if _, err := s.UpdateHITLPolicy(ctx, a.ID, func(p *persistence.HITLPolicy) error { p.Priority = 9.5; return nil }); err != nil {
			t.Fatal(err)
		}
		refused := errors.New("refused")
		if _, err := s.UpdateHITLPolicy(ctx, a.ID, func(p *persistence.HITLPolicy) error { p.Priority = -1; return refused }); !errors.Is(err, refused) {
			t.Fatal(err)
		}
		if p, _ := s.GetHITLPolicy(ctx, a.ID); p.Priority != 9.5 {
			t.Fatalf("priority %v", p.Priority)
		}
		if err := s.DeleteHITLPolicy(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteHITLPolicy(ctx, a.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}

		ag := newAgent("approver-test", "registered")
		if err := s.CreateAgent(ctx, ag); err != nil {
			t.Fatal(err)
		}
		r := &persistence.HITLRequest{ID: uuid.Must(uuid.NewV7()).String(), AgentID: ag.ID, ClientID: ag.ClientID, PolicyID: &b.ID, PolicyName: b.Name,
			Action: "delete_user", Resource: "users/1", Context: persistence.JSONObject{"n": 1}, ApprovalMode: "sync", ApproverType: "role",
			ApproverID: "security", Status: persistence.HITLPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute),
			CallMethod: "DELETE", CallPath: "/api/v1/m2m/users/1", CallBody: `{"a":1}`, CallDigest: "d1"}
		if err := s.CreateHITLRequest(ctx, r, auditEntry(ag.ID, "hitl_requested", t0)); err != nil {
			t.Fatal(err)
		}
		signal, stop := s.Await(persistence.HITLSignal(r.ID))
		defer stop()
		if _, err := s.UpdateHITLRequest(ctx, r.ID, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
			r.Status = persistence.HITLApproved
			return nil, refused
		}); !errors.Is(err, refused) {
			t.Fatal(err)
		}
		select {
		case <-signal:
			t.Fatal("a rolled-back change raised the signal")
		default:
		}
		at := now()
		got, err := s.UpdateHITLRequest(ctx, r.ID, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
			r.Status, r.DecidedAt, r.DecidedBy, r.Reason = persistence.HITLApproved, &at, persistence.Actor{Subject: "u1"}, "ok"
			return []persistence.AuditEntry{auditEntry(ag.ID, "hitl_approved", at)}, nil
		})
		if err != nil || got.Status != persistence.HITLApproved {
			t.Fatal(err)
		}
		select {
		case <-signal:
		default:
			t.Fatal("the committed change did not raise the signal")
		}
		back, err := s.GetHITLRequest(ctx, r.ID)
		if err != nil || back.DecidedBy.Subject != "u1" || back.Reason != "ok" || back.Context["n"] == nil || !back.DecidedAt.Equal(at) ||
			back.CallMethod != "DELETE" || back.CallPath != "/api/v1/m2m/users/1" || back.CallBody != `{"a":1}` || back.CallDigest != "d1" || back.UsedAt != nil {
			t.Fatalf("read back: %+v %v", back, err)
		}
		// Approved and not redeemed, it still stands for the call; not after
		// its expiry, nor for another resource or another call (digest).
		if open, err := s.OpenHITLRequest(ctx, ag.ID, "delete_user", "users/1", "d1", t0); err != nil || open.ID != r.ID {
			t.Fatalf("open request: %v %v", open, err)
		}
		if _, err := s.OpenHITLRequest(ctx, ag.ID, "delete_user", "users/1", "d1", t0.Add(time.Hour)); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("open after expiry: %v", err)
		}
		if _, err := s.OpenHITLRequest(ctx, ag.ID, "delete_user", "users/2", "d1", t0); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("open for another resource: %v", err)
		}
		if _, err := s.OpenHITLRequest(ctx, ag.ID, "delete_user", "users/1", "d2", t0); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("open for another call: %v", err)
		}
		// Its use is written under the row lock.
		used, err := s.UpdateHITLRequest(ctx, r.ID, func(r *persistence.HITLRequest) ([]persistence.AuditEntry, error) {
			r.UsedAt = &at
			return nil, nil
		})
		if back, _ := s.GetHITLRequest(ctx, r.ID); err != nil || used.UsedAt == nil || back.UsedAt == nil || !back.UsedAt.Equal(at) {
			t.Fatalf("used: %+v %v", back, err)
		}
		if _, n, _ := s.ListAgentAudit(ctx, ag.ID, persistence.AuditFilter{Actions: []string{"hitl_requested", "hitl_approved"}}, persistence.Page{Limit: 10}); n != 2 {
			t.Fatalf("%d audit entries", n)
		}

		// A live grant is part of the agent's client until it ends.
		g := &persistence.JITGrant{ID: uuid.Must(uuid.NewV7()).String(), AgentID: ag.ID, ClientID: ag.ClientID, Action: "fix", Resource: "orgs/1",
			Scopes: []string{"orgs:write"}, DurationSeconds: 60, Status: persistence.JITActive, CreatedAt: t0, ActivatedAt: &t0}
		exp := time.Now().Add(time.Minute)
		g.ExpiresAt = &exp
		if err := s.CreateJITGrant(ctx, g); err != nil {
			t.Fatal(err)
		}
		cl, err := s.GetClient(ctx, ag.ClientID)
		if err != nil || !cl.GetScopes().Has("orgs:write") {
			t.Fatalf("client with a live grant: %v %v", cl, err)
		}
		if _, err := s.UpdateJITGrant(ctx, g.ID, func(g *persistence.JITGrant) ([]persistence.AuditEntry, error) {
			g.Status = persistence.JITRevoked
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if cl, _ := s.GetClient(ctx, ag.ClientID); cl.GetScopes().Has("orgs:write") {
			t.Fatal("the revoked grant's scope is still the client's")
		}
		if ids, err := s.OpenJITGrants(ctx, ag.ID); err != nil || len(ids) != 0 {
			t.Fatalf("open grants: %v %v", ids, err)
		}
	})
}
