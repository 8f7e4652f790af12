package rar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/persistence/dbtest"
)

// The authorization_details parser and checks read attacker input: they
// must never panic, and what they accept must stay within the bounds and be
// what the stores hold: accepted details are stored with the token and in
// the audit, so on PostgreSQL (when TEST_DATABASE_URL is set) jsonb must
// take them, and checks against types stored on either dialect must answer
// as against the types in memory.

var fuzzSeeds = []string{
	`[{"type":"payment_initiation","actions":["initiate"],"locations":["https://pay.example/payments"],"instructedAmount":{"currency":"EUR","amount":"45.00"},"creditorAccount":{"iban":"DE02100100109307118603"}}]`,
	`[{"type":"account_information","actions":["read"],"datatypes":["balances"],"identifier":"acc-1","privileges":["p"]}]`,
	`[{"type":"payment_initiation","actions":"initiate"}]`,
	`[{"type":"account_information","x":{"k":1,"k":2}}]`,
	`[{"type":"\u00e9\u20ac\ud83d\ude00","n":1e400}]`,
	`[{"type":"a"}] trailing`,
	`[` + strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40) + `]`,
	`[1,"two",null,true,{"type":null}]`,
	"[{\"type\":\"\xc3\x28\"}]",
	`[{"type":"account_information","k":"\u0000"}]`, `[{"type":"account_information","\u0000":1}]`,
	`[{"type":"account_information","n":1e131072}]`, `[{"type":"account_information","n":1e-16384,"m":1e131071}]`,
	`[{"type":"account_information","k":"\ud800"}]`, `[{"type":"account_information","k":"\uFFFD\ud83d\ude00"}]`,
	`[]`, `{}`, ``, `[`, `]`, `[{]`, `[{"type":}]`,
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	pg := dbtest.Postgres(f)
	f.Fuzz(func(t *testing.T, text string) {
		entries, err := Parse([]byte(text))
		if err != nil {
			if pe := (*ParseError)(nil); !errors.As(err, &pe) {
				t.Fatalf("error of another kind: %T %v", err, err)
			}
			return
		}
		if len(entries) == 0 || len(entries) > MaxDetailsEntries || len(text) > MaxDetailsBytes {
			t.Fatalf("accepted %d entries from %d bytes", len(entries), len(text))
		}
		// What is accepted is JSON that reads back the same way.
		b, err := json.Marshal(entries)
		if err != nil {
			t.Fatalf("accepted entries do not encode: %v", err)
		}
		again, err := Parse(b)
		if err != nil && len(b) <= MaxDetailsBytes {
			t.Fatalf("re-encoded entries refused: %v (%s)", err, b)
		}
		if err == nil && len(again) != len(entries) {
			t.Fatalf("re-encoded entries: %d, want %d", len(again), len(entries))
		}
		if pg != nil {
			if _, err := pg.ExecContext(context.Background(), `SELECT $1::jsonb`, string(b)); err != nil {
				t.Fatalf("accepted entries that jsonb refuses: %v (%s)", err, b)
			}
		}
	})
}

func FuzzCheck(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	s := New(nil)
	types := registry()
	ctx := context.Background()
	var stored []*Service // the same types, registered on each dialect
	for _, dbURL := range dbtest.URLs(f) {
		on := New(dbtest.Store(f, dbURL))
		for _, ty := range types {
			if _, err := on.Create(ctx, Input{Type: ty.Type, AllowedActions: ty.AllowedActions, AllowedLocations: ty.AllowedLocations,
				ReadOnlyActions: ty.ReadOnlyActions, RequiredCapabilities: ty.RequiredCapabilities, Schema: json.RawMessage(ty.Schema)}); err != nil {
				f.Fatal(err)
			}
		}
		stored = append(stored, on)
	}
	f.Fuzz(func(t *testing.T, text string, sandboxed bool) {
		entries, err := Parse([]byte(text))
		if err != nil {
			return
		}
		ceiling := Ceiling{Agent: true, Capabilities: []string{agents.WriteUsers}, TrustLevel: agents.Registered}
		if sandboxed {
			ceiling.TrustLevel = agents.Sandboxed
		}
		problems, conds, err := s.checkAll(types, entries, ceiling)
		if err != nil {
			t.Fatal(err)
		}
		if len(problems) > maxProblems {
			t.Fatalf("%d problems reported", len(problems))
		}
		if len(problems) == 0 && len(conds) != len(entries) {
			t.Fatalf("%d conditions for %d entries", len(conds), len(entries))
		}
		for _, p := range problems {
			if p.Index < 0 || p.Index >= len(entries) || p.Message == "" {
				t.Fatalf("malformed problem %+v", p)
			}
		}
		for _, on := range stored {
			p, c, err := on.Check(ctx, entries, ceiling)
			// %+v: a list read from storage may be empty where one in memory is nil.
			if err != nil || fmt.Sprintf("%+v %+v", p, c) != fmt.Sprintf("%+v %+v", problems, conds) {
				t.Fatalf("against stored types: %v %+v %+v; in memory: %+v %+v", err, p, c, problems, conds)
			}
		}
	})
}
