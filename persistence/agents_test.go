package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newAgent(name, trust string) *persistence.Agent {
	n := now()
	id := uuid.Must(uuid.NewV7()).String()
	return &persistence.Agent{
		ID: id, ClientID: persistence.AgentClientPrefix + name, SecretHash: []byte("h"), Name: name, Type: "autonomous",
		Capabilities: []string{"read_users"}, Scopes: []string{"users:read"}, TrustLevel: trust,
		Status: persistence.AgentActive, CreatedAt: n, UpdatedAt: n,
	}
}

func auditEntry(agentID, action string, at time.Time) persistence.AuditEntry {
	return persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: agentID, CreatedAt: at, Action: action, Actor: persistence.Actor{ClientID: "admin"},
		Details: persistence.JSONObject{"reason": action}}
}

func TestAgents(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		a := newAgent("one", "sandboxed")
		if err := s.CreateAgent(ctx, a, auditEntry(a.ID, "created", now())); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateAgent(ctx, newAgent("one", "sandboxed")); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("duplicate client id: %v", err)
		}
		for i, trust := range []string{"registered", "registered", "verified"} {
			b := newAgent(fmt.Sprintf("other%d", i), trust)
			b.CreatedAt = b.CreatedAt.Add(time.Duration(i+1) * time.Second)
			if err := s.CreateAgent(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		list, total, err := s.ListAgents(ctx, persistence.AgentFilter{TrustLevel: "registered"}, persistence.Page{Limit: 1})
		if err != nil || total != 2 || len(list) != 1 || list[0].ClientID != "agt_other0" {
			t.Fatalf("filtered list %v %d %v", list, total, err)
		}
		if _, total, _ := s.ListAgents(ctx, persistence.AgentFilter{}, persistence.Page{Limit: 10}); total != 4 {
			t.Fatalf("total %d", total)
		}

		// The agent is a client while active, bound to its epoch.
		c, err := s.GetClient(ctx, "agt_one")
		if err != nil {
			t.Fatal(err)
		}
		pc := c.(*persistence.Client)
		if pc.Kind != persistence.KindAgent || pc.RecordID != a.ID || pc.PrincipalID != a.ID+"#0" || pc.Agent == nil || pc.Agent.TrustLevel != "sandboxed" || !c.GetScopes().Has("users:read") {
			t.Fatalf("client %+v", pc)
		}
		sig := persistence.TokenKeyPrefix(now()) + "a"
		if err := s.CreateAccessTokenSession(ctx, sig, tokenRequestFor(pc, now().Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, sig, &fosite.DefaultSession{}); err != nil {
			t.Fatalf("token of an active agent: %v", err)
		}

		// Killed: no client, no token; the change and its audit entry land together.
		if _, err := s.UpdateAgent(ctx, a.ID, func(x *persistence.Agent) ([]persistence.AuditEntry, error) {
			k := now()
			x.Status, x.KilledAt = persistence.AgentKilled, &k
			return []persistence.AuditEntry{auditEntry(a.ID, "killed", now().Add(time.Second))}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetClient(ctx, "agt_one"); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("killed agent is a client: %v", err)
		}
		if _, err := s.GetAccessTokenSession(ctx, sig, &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("token of a killed agent: %v", err)
		}
		// Recovered with a new epoch: the old token stays dead.
		if _, err := s.UpdateAgent(ctx, a.ID, func(x *persistence.Agent) ([]persistence.AuditEntry, error) {
			x.Status, x.KilledAt, x.Epoch = persistence.AgentActive, nil, x.Epoch+1
			return []persistence.AuditEntry{auditEntry(a.ID, "recovered", now().Add(2*time.Second))}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if c, err := s.GetClient(ctx, "agt_one"); err != nil || c.(*persistence.Client).PrincipalID != a.ID+"#1" {
			t.Fatalf("recovered client %v %v", c, err)
		}
		if _, err := s.GetAccessTokenSession(ctx, sig, &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("a pre-kill token works after recovery: %v", err)
		}

		// A failing change writes neither the agent nor its audit.
		if _, err := s.UpdateAgent(ctx, a.ID, func(x *persistence.Agent) ([]persistence.AuditEntry, error) {
			x.Name = "changed"
			return []persistence.AuditEntry{auditEntry(a.ID, "never", now())}, errors.New("refused")
		}); err == nil {
			t.Fatal("failing update succeeded")
		}

		entries, total, err := s.ListAgentAudit(ctx, a.ID, persistence.AuditFilter{}, persistence.Page{Limit: 10})
		if err != nil || total != 3 || entries[0].Action != "recovered" || entries[2].Action != "created" || entries[1].Details["reason"] != "killed" {
			t.Fatalf("audit %+v %d %v", entries, total, err)
		}
		entries, total, _ = s.ListAgentAudit(ctx, a.ID, persistence.AuditFilter{Actions: []string{"killed", "recovered"}}, persistence.Page{Limit: 10})
		if total != 2 || len(entries) != 2 {
			t.Fatalf("action filter: %d", total)
		}
		_, total, _ = s.ListAgentAudit(ctx, a.ID, persistence.AuditFilter{From: now().Add(500 * time.Millisecond), To: now().Add(1500 * time.Millisecond)}, persistence.Page{Limit: 10})
		if total != 1 {
			t.Fatalf("time filter: %d", total)
		}

		// Deleted: gone, its trail kept.
		if err := s.DeleteAgent(ctx, a.ID, auditEntry(a.ID, "deleted", now().Add(3*time.Second))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAgent(ctx, a.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("deleted agent: %v", err)
		}
		if _, total, _ := s.ListAgentAudit(ctx, a.ID, persistence.AuditFilter{}, persistence.Page{Limit: 10}); total != 4 {
			t.Fatalf("audit after delete: %d", total)
		}
	})
}

func tokenRequestFor(c *persistence.Client, exp time.Time) *fosite.Request {
	req := fosite.NewRequest()
	req.ID = uuid.NewString()
	req.RequestedAt = now()
	req.Client = c
	sess := &fosite.DefaultSession{Subject: c.ID}
	sess.SetExpiresAt(fosite.AccessToken, exp)
	req.Session = sess
	return req
}
