package rar

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Ceiling is who details are checked for. Agents meet the capability
// ceiling (docs/decisions.md): a type's requiredCapabilities must all be
// held, and a sandboxed agent may ask only for a type's readOnlyActions when
// the type marks them. Service accounts meet no ceiling.
type Ceiling struct {
	Agent        bool
	Capabilities []string
	TrustLevel   string
}

// CeilingOf is the ceiling of an agent as it is now; none for no agent.
func CeilingOf(a *persistence.AgentFacts) Ceiling {
	if a == nil {
		return Ceiling{}
	}
	return Ceiling{Agent: true, Capabilities: a.Capabilities, TrustLevel: a.TrustLevel}
}

// Problem is one thing wrong with one entry: where (its index in the array,
// its type when known, and a JSON pointer into the entry) and what.
type Problem struct {
	Index   int    `json:"index"`
	Type    string `json:"type,omitempty"`
	Pointer string `json:"pointer"`
	Message string `json:"message"`
}

func (p Problem) String() string {
	s := fmt.Sprintf("authorization_details[%d]", p.Index)
	if p.Pointer != "" {
		s += " at " + p.Pointer
	}
	return s + ": " + p.Message
}

// Bounds on how much a check reports.
const (
	maxProblemsPerEntry = 10
	maxProblems         = 50
)

// Check checks parsed entries (see Parse) against the registry and the
// ceiling. It returns every problem found (none: the entries may be
// granted) and, per entry, the condition under which a grant keeps holding.
func (s *Service) Check(ctx context.Context, entries []any, ceiling Ceiling) ([]Problem, []oauth.DetailCondition, error) {
	types, err := s.store.RARTypes(ctx)
	if err != nil {
		return nil, nil, err
	}
	return s.checkAll(types, entries, ceiling)
}

// checkAll is Check against a given registry.
func (s *Service) checkAll(types map[string]*persistence.RARType, entries []any, ceiling Ceiling) ([]Problem, []oauth.DetailCondition, error) {
	var err error
	var problems []Problem
	conds := make([]oauth.DetailCondition, len(entries))
	for i, e := range entries {
		var found []Problem
		add := func(typ, pointer, format string, args ...any) {
			if len(found) < maxProblemsPerEntry {
				found = append(found, Problem{Index: i, Type: typ, Pointer: pointer, Message: fmt.Sprintf(format, args...)})
			}
		}
		conds[i], err = s.checkEntry(e, types, ceiling, add)
		if err != nil {
			return nil, nil, err
		}
		problems = append(problems, found...)
		if len(problems) >= maxProblems {
			return problems[:maxProblems], nil, nil
		}
	}
	return problems, conds, nil
}

type addFunc func(typ, pointer, format string, args ...any)

// checkEntry applies the rules to one entry, in order: an object of a
// registered type; the common fields of RFC 9396 §2.2 of the right JSON
// types; actions among the type's allowedActions, locations among its
// allowedLocations when it lists any; the type's schema; the ceiling.
func (s *Service) checkEntry(e any, types map[string]*persistence.RARType, ceiling Ceiling, add addFunc) (oauth.DetailCondition, error) {
	var cond oauth.DetailCondition
	obj, ok := e.(map[string]any)
	if !ok {
		add("", "", "must be a JSON object")
		return cond, nil
	}
	name, ok := obj["type"].(string)
	if !ok {
		add("", "/type", "is required and must be a string")
		return cond, nil
	}
	t := types[name]
	if t == nil {
		add(name, "/type", "type %q is not registered", name)
		return cond, nil
	}
	for _, f := range []string{"locations", "actions", "datatypes", "privileges"} {
		if v, present := obj[f]; present && !isStringArray(v) {
			add(name, "/"+f, "must be an array of strings")
		}
	}
	if v, present := obj["identifier"]; present {
		if _, ok := v.(string); !ok {
			add(name, "/identifier", "must be a string")
		}
	}
	actions := stringsOf(obj["actions"])
	for j, a := range actions {
		if !slices.Contains(t.AllowedActions, a) {
			add(name, fmt.Sprintf("/actions/%d", j), "action %q is not allowed for type %q (allowed: %s)", a, name, listOrNone(t.AllowedActions))
		}
	}
	if len(t.AllowedLocations) > 0 {
		for j, l := range stringsOf(obj["locations"]) {
			if !slices.Contains(t.AllowedLocations, l) {
				add(name, fmt.Sprintf("/locations/%d", j), "location %q is not allowed for type %q (allowed: %s)", l, name, strings.Join(t.AllowedLocations, ", "))
			}
		}
	}
	sch, err := s.schemaOf(t)
	if err != nil {
		return cond, err
	}
	if err := sch.Validate(e); err != nil {
		if ve, ok := err.(*jsonschema.ValidationError); ok {
			for _, leaf := range leaves(ve) {
				add(name, pointer(leaf.InstanceLocation), "%s", leaf.ErrorKind.LocalizedString(printer))
			}
		} else {
			add(name, "", "does not satisfy the schema of type %q", name)
		}
	}
	cond = oauth.DetailCondition{
		Capabilities: t.RequiredCapabilities,
		// An entry that names no actions asks for all of them.
		Writes: len(t.ReadOnlyActions) > 0 && (len(actions) == 0 || slices.ContainsFunc(actions, func(a string) bool { return !slices.Contains(t.ReadOnlyActions, a) })),
	}
	if ceiling.Agent {
		for _, c := range t.RequiredCapabilities {
			if !slices.Contains(ceiling.Capabilities, c) {
				add(name, "", "type %q requires capability %q, which the agent does not hold", name, c)
			}
		}
		if cond.Writes && ceiling.TrustLevel == agents.Sandboxed {
			add(name, "/actions", "a sandboxed agent may ask only for the read-only actions of type %q (%s), and must name them", name, strings.Join(t.ReadOnlyActions, ", "))
		}
	}
	return cond, nil
}

// Grant implements oauth.DetailsPolicy.
func (s *Service) Grant(ctx context.Context, client *persistence.Client, text string) ([]any, []oauth.DetailCondition, error) {
	entries, err := Parse([]byte(text))
	if err != nil {
		return nil, nil, oauth.InvalidDetails(err.Error() + ".")
	}
	problems, conds, err := s.Check(ctx, entries, CeilingOf(client.Agent))
	if err != nil {
		return nil, nil, err
	}
	if len(problems) > 0 {
		return nil, nil, oauth.InvalidDetails(problems[0].String() + ".")
	}
	return entries, conds, nil
}

// Holds implements oauth.DetailsPolicy: the ceiling, checked again on every
// use of a token, against the agent as it is now.
func (s *Service) Holds(client *persistence.Client, c oauth.DetailCondition) bool {
	a := client.Agent
	if a == nil {
		return true
	}
	for _, capability := range c.Capabilities {
		if !slices.Contains(a.Capabilities, capability) {
			return false
		}
	}
	return !c.Writes || a.TrustLevel != agents.Sandboxed
}

var _ oauth.DetailsPolicy = (*Service)(nil)

var printer = message.NewPrinter(language.English)

// leaves returns the innermost causes of a schema validation error: the
// specific failures (a missing property, a wrong type), not the keywords
// that contain them. They are sorted by where they are in the entry, then by
// what they say: the library gathers them from maps, in an order that
// changed from one call to the next, and the token endpoint names the
// first.
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	var out []*jsonschema.ValidationError
	var walk func(*jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			out = append(out, e)
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(e)
	slices.SortStableFunc(out, func(a, b *jsonschema.ValidationError) int {
		return cmp.Or(cmp.Compare(pointer(a.InstanceLocation), pointer(b.InstanceLocation)),
			cmp.Compare(a.ErrorKind.LocalizedString(printer), b.ErrorKind.LocalizedString(printer)))
	})
	return out
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// pointer renders an instance location as a JSON pointer (RFC 6901).
func pointer(loc []string) string {
	var b strings.Builder
	for _, tok := range loc {
		b.WriteByte('/')
		b.WriteString(pointerEscaper.Replace(tok))
	}
	return b.String()
}

func isStringArray(v any) bool {
	arr, ok := v.([]any)
	if !ok {
		return false
	}
	for _, e := range arr {
		if _, ok := e.(string); !ok {
			return false
		}
	}
	return true
}

// stringsOf returns the strings of a JSON array of strings (others are
// skipped: isStringArray reports them).
func stringsOf(v any) []string {
	arr, _ := v.([]any)
	var out []string
	for _, e := range arr {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// firstLeaf locates the first specific failure of a validation error.
func firstLeaf(e *jsonschema.ValidationError) (string, string) {
	l := leaves(e)[0]
	return pointer(l.InstanceLocation), l.ErrorKind.LocalizedString(printer)
}
