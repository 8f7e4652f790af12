package persistence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newRARType(name string) *persistence.RARType {
	n := now()
	return &persistence.RARType{
		Type: name, DisplayName: "Type " + name, AllowedActions: []string{"read", "write"},
		AllowedLocations: []string{"https://api.example/"}, ReadOnlyActions: []string{"read"},
		RequiredCapabilities: []string{"write_users"}, Schema: `{"type": "object", "required": ["amount"]}`,
		CreatedAt: n, UpdatedAt: n,
	}
}

func TestRARTypes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)

		if set, err := s.RARTypes(ctx); err != nil || len(set) != 0 {
			t.Fatalf("empty registry: %v %v", set, err)
		}
		pay := newRARType("payment_initiation")
		if err := s.CreateRARType(ctx, pay); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateRARType(ctx, newRARType("payment_initiation")); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("duplicate name: got %v, want ErrDuplicate", err)
		}
		got, err := s.GetRARType(ctx, "payment_initiation")
		if err != nil {
			t.Fatal(err)
		}
		var schema map[string]any
		if err := json.Unmarshal([]byte(got.Schema), &schema); err != nil || schema["type"] != "object" {
			t.Fatalf("schema read back as %q (%v)", got.Schema, err)
		}
		if got.DisplayName != pay.DisplayName || !slices.Equal(got.AllowedActions, pay.AllowedActions) ||
			!slices.Equal(got.ReadOnlyActions, pay.ReadOnlyActions) || !slices.Equal(got.RequiredCapabilities, pay.RequiredCapabilities) ||
			!slices.Equal(got.AllowedLocations, pay.AllowedLocations) || !got.CreatedAt.Equal(pay.CreatedAt) {
			t.Fatalf("read back %+v", got)
		}
		if _, err := s.GetRARType(ctx, "none"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown type: %v", err)
		}

		// The cached set follows every change at once.
		if set, err := s.RARTypes(ctx); err != nil || len(set) != 1 || set["payment_initiation"] == nil {
			t.Fatalf("set after create: %v %v", set, err)
		}
		if err := s.CreateRARType(ctx, newRARType("account_information")); err != nil {
			t.Fatal(err)
		}
		if set, _ := s.RARTypes(ctx); len(set) != 2 {
			t.Fatalf("set after a second create has %d types", len(set))
		}
		pay.AllowedActions = []string{"read"}
		pay.Schema = `{"type": "object"}`
		pay.UpdatedAt = now()
		if err := s.ReplaceRARType(ctx, pay); err != nil {
			t.Fatal(err)
		}
		if set, _ := s.RARTypes(ctx); !slices.Equal(set["payment_initiation"].AllowedActions, []string{"read"}) {
			t.Fatalf("set after replace: %+v", set["payment_initiation"])
		}
		if err := s.ReplaceRARType(ctx, newRARType("none")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("replace unknown: %v", err)
		}

		list, total, err := s.ListRARTypes(ctx, persistence.Page{Limit: 1, Offset: 0})
		if err != nil || total != 2 || len(list) != 1 || list[0].Type != "account_information" {
			t.Fatalf("first page: %v total %d err %v", list, total, err)
		}
		list, _, _ = s.ListRARTypes(ctx, persistence.Page{Limit: 1, Offset: 1})
		if len(list) != 1 || list[0].Type != "payment_initiation" {
			t.Fatalf("second page: %v", list)
		}

		if err := s.DeleteRARType(ctx, "payment_initiation"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteRARType(ctx, "payment_initiation"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if set, _ := s.RARTypes(ctx); len(set) != 1 || set["payment_initiation"] != nil {
			t.Fatalf("set after delete: %v", set)
		}
	})
}

func TestRARTypesAcrossReplicas(t *testing.T) {
	dbURL, ok := dbtest.URLs(t)["postgres"]
	if !ok {
		t.Skip("TEST_DATABASE_URL is not set")
	}
	ctx := context.Background()
	a, b := openStore(t, dbURL), openStore(t, dbURL)
	if set, err := b.RARTypes(ctx); err != nil || len(set) != 0 { // cached empty on b
		t.Fatalf("%v %v", set, err)
	}
	if err := a.CreateRARType(ctx, newRARType("payment_initiation")); err != nil {
		t.Fatal(err)
	}
	if set, _ := b.RARTypes(ctx); set["payment_initiation"] == nil {
		t.Fatal("b does not see a type registered through a once the registration returned")
	}
	if err := a.DeleteRARType(ctx, "payment_initiation"); err != nil {
		t.Fatal(err)
	}
	if set, _ := b.RARTypes(ctx); len(set) != 0 {
		t.Fatal("b still sees a deleted type once the deletion returned")
	}
}

// The registry is bounded (the token endpoint keeps it in memory). SQLite
// only: on PostgreSQL each registration waits out the cache lease.
func TestRARTypeLimit(t *testing.T) {
	dbURL := dbtest.URLs(t)["sqlite"]
	ctx := context.Background()
	s := openStore(t, dbURL)
	for i := range persistence.MaxRARTypes {
		if err := s.CreateRARType(ctx, newRARType(fmt.Sprintf("type_%04d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateRARType(ctx, newRARType("one_too_many")); !errors.Is(err, persistence.ErrTooMany) {
		t.Fatalf("type %d: got %v, want ErrTooMany", persistence.MaxRARTypes+1, err)
	}
}

// Granted details are stored in token sessions and audit entries; their
// numbers read back with their value, beyond what a float64 holds.
func TestDetailsNumbersReadBack(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		details := map[string]any{"n": json.Number("12345678901234567890"), "f": json.Number("1.50"), "big": json.Number("1e400")}
		agentID := uuid.NewString()
		e := persistence.AuditEntry{ID: uuid.NewString(), AgentID: agentID, ClientID: "agt_1", CreatedAt: now(), Action: "token_issued", Details: details}
		if err := s.AppendAudit(ctx, e); err != nil {
			t.Fatal(err)
		}
		entries, _, err := s.ListAgentAudit(ctx, agentID, persistence.AuditFilter{}, persistence.Page{Limit: 10})
		if err != nil || len(entries) != 1 {
			t.Fatalf("%v %v", entries, err)
		}
		got := entries[0].Details
		for name, want := range map[string]string{"n": "12345678901234567890", "f": "1.50"} {
			if n, ok := got[name].(json.Number); !ok || n.String() != want {
				t.Fatalf("%s read back as %#v, want %s", name, got[name], want)
			}
		}
		if n, ok := got["big"].(json.Number); !ok || (n.String() != "1e400" && len(n.String()) != 401) { // jsonb writes digits
			t.Fatalf("big read back as %#v", got["big"])
		}

		sa := newAccount("sa_numbers")
		if err := s.CreateServiceAccount(ctx, sa); err != nil {
			t.Fatal(err)
		}
		req := tokenRequest(sa, now().Add(time.Hour))
		req.Session.(*fosite.DefaultSession).Extra = map[string]any{"authorization_details": []any{details}}
		if err := s.CreateAccessTokenSession(ctx, "numbers", req); err != nil {
			t.Fatal(err)
		}
		sess := &fosite.DefaultSession{}
		if _, err := s.GetAccessTokenSession(ctx, "numbers", sess); err != nil {
			t.Fatalf("a session with large numbers does not read back: %v", err)
		}
		if n := sess.Extra["authorization_details"].([]any)[0].(map[string]any)["n"]; n != json.Number("12345678901234567890") {
			t.Fatalf("n read back as %#v", n)
		}
	})
}
