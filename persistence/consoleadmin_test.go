package persistence_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Migration 0028 on a database from before it (issue 39): the people who
// held the directory role admin keep console administration, as a flag,
// and keep the role; JIT rules for scopes never granted just in time are
// gone, and the open grants carrying them end; the migration goes down
// and up again.
func TestMigrationConsoleAdmin(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, p := migratedTo(t, dbURL, 27)
		exec := func(query string, args ...any) {
			t.Helper()
			if _, err := db.ExecContext(ctx, db.Rebind(query), args...); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
		}
		admin, editor := uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String()
		for _, u := range []struct{ id, email string }{{admin, "ada@example.com"}, {editor, "ed@example.com"}} {
			exec(`INSERT INTO users (id, email, email_key, status, metadata, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				u.id, u.email, u.email, "active", "{}", now(), now())
		}
		for _, role := range []string{"admin", "editor"} {
			exec(`INSERT INTO roles (name, created_at) VALUES (?, ?)`, role, now())
		}
		exec(`INSERT INTO user_roles (user_id, role, assigned_at) VALUES (?, ?, ?)`, admin, "admin", now())
		exec(`INSERT INTO user_roles (user_id, role, assigned_at) VALUES (?, ?, ?)`, editor, "editor", now())

		agentID := uuid.NewString()
		exec(`INSERT INTO agents (id, client_id, secret_hash, name, type, trust_level, status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			agentID, persistence.AgentClientPrefix+"mig", []byte("h"), "mig", "autonomous", "registered", persistence.AgentActive, now(), now())
		kept := uuid.NewString()
		for id, scope := range map[string]string{uuid.NewString(): "roles:manage", uuid.NewString(): "users:admin", kept: "orgs:write"} {
			exec(`INSERT INTO jit_rules (id, scope, max_duration_seconds, min_trust_level, created_at) VALUES (?, ?, ?, ?, ?)`, id, scope, 600, "registered", now())
		}
		grant := func(status, scopes string) string {
			id := uuid.NewString()
			exec(`INSERT INTO jit_grants (id, agent_id, client_id, action, resource, scopes, duration_seconds, status, created_at, expires_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, id, agentID, persistence.AgentClientPrefix+"mig", "a", "r", scopes, 600, status, now(), now().Add(time.Hour))
			return id
		}
		revoked := grant(persistence.JITActive, `["orgs:read", "roles:manage"]`)
		denied := grant(persistence.JITPending, `["users:admin"]`)
		active := grant(persistence.JITActive, `["orgs:write"]`)

		check := func(t *testing.T, s *persistence.Store) {
			t.Helper()
			for id, want := range map[string]bool{admin: true, editor: false} {
				if u, err := s.GetUser(ctx, id); err != nil || u.ConsoleAdmin != want {
					t.Fatalf("console administration of %s: %+v %v, want %v", id, u, err, want)
				}
			}
			if roles, err := s.UserRoles(ctx, admin); err != nil || len(roles) != 1 || roles[0].Name != "admin" {
				t.Fatalf("the admin role is kept as an ordinary role: %v %v", roles, err)
			}
			rules, err := s.JITRules(ctx)
			if err != nil || len(rules) != 1 || rules[0].ID != kept {
				t.Fatalf("rules: %+v %v", rules, err)
			}
			for id, want := range map[string]string{revoked: persistence.JITRevoked, denied: persistence.JITDenied, active: persistence.JITActive} {
				g, err := s.GetJITGrant(ctx, id)
				if err != nil || g.Status != want || (want != persistence.JITActive) != (g.EndedAt != nil) {
					t.Fatalf("grant %s: %+v %v, want %s", id, g, err, want)
				}
			}
		}
		check(t, dbtest.Store(t, dbURL)) // migrated to the newest
		if _, err := p.DownTo(ctx, 27); err != nil {
			t.Fatal(err)
		}
		check(t, dbtest.Store(t, dbURL))
	})
}

// ApproverRole: a role a HITL policy names as approver, or a pending
// request does; not one a decided request named, nor a user approver of
// the same text. Console administration is read back as written.
func TestApproverRoleAndConsoleAdmin(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		t0 := now()
		pol := hitlPolicy("security", 1, t0) // names the role security
		if err := s.CreateHITLPolicy(ctx, pol); err != nil {
			t.Fatal(err)
		}
		user := hitlPolicy("a person", 1, t0)
		user.ApproverType, user.ApproverID = "user", "auditors"
		if err := s.CreateHITLPolicy(ctx, user); err != nil {
			t.Fatal(err)
		}
		ag := newAgent("approver-role", "registered")
		if err := s.CreateAgent(ctx, ag); err != nil {
			t.Fatal(err)
		}
		request := func(role, status string) {
			r := &persistence.HITLRequest{ID: uuid.Must(uuid.NewV7()).String(), AgentID: ag.ID, ClientID: ag.ClientID, PolicyName: "gone",
				Action: "delete_user", Resource: "users/1", Context: persistence.JSONObject{}, ApprovalMode: "async", ApproverType: "role",
				ApproverID: role, Status: status, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
			if err := s.CreateHITLRequest(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		request("oncall", persistence.HITLPending)
		request("former", persistence.HITLApproved)
		for role, want := range map[string]bool{"security": true, "oncall": true, "former": false, "auditors": false, "support": false} {
			if got, err := s.ApproverRole(ctx, role); err != nil || got != want {
				t.Errorf("ApproverRole(%q) = %v, %v; want %v", role, got, err, want)
			}
		}

		u := &persistence.User{ID: uuid.Must(uuid.NewV7()).String(), Email: "ca@example.com", Status: "active", Metadata: persistence.JSONObject{},
			ConsoleAdmin: true, CreatedAt: t0, UpdatedAt: t0}
		if err := s.CreateUser(ctx, u); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetUser(ctx, u.ID); err != nil || !got.ConsoleAdmin {
			t.Fatalf("created: %+v %v", got, err)
		}
		if _, err := s.UpdateUser(ctx, u.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.ConsoleAdmin = false
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetUser(ctx, u.ID); err != nil || got.ConsoleAdmin {
			t.Fatalf("updated: %+v %v", got, err)
		}
	})
}
