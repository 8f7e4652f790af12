package rar

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions/agents"
)

// The authorization_details parser and checks read attacker input: they
// must never panic, and what they accept must stay within the bounds.

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
	`[]`, `{}`, ``, `[`, `]`, `[{]`, `[{"type":}]`,
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
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
	})
}

func FuzzCheck(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	s := New(nil)
	types := registry()
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
	})
}
