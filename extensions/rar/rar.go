// Package rar holds rich authorization requests (RFC 9396): the registry of
// authorization_details types with their JSON Schemas, the checks an entry
// must pass, and the ceiling an agent's capabilities and trust level put on
// what it may be granted.
package rar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateRARType(ctx context.Context, t *persistence.RARType) error
	GetRARType(ctx context.Context, name string) (*persistence.RARType, error)
	ListRARTypes(ctx context.Context, p persistence.Page) ([]persistence.RARType, int, error)
	ReplaceRARType(ctx context.Context, t *persistence.RARType) error
	DeleteRARType(ctx context.Context, name string) error
	RARTypes(ctx context.Context) (map[string]*persistence.RARType, error)
}

// Service manages the registry and checks details against it.
type Service struct {
	store Store
	now   func() time.Time

	mu       sync.Mutex
	compiled map[string]compiledSchema // by type name
}

type compiledSchema struct {
	text   string // the schema it was compiled from
	schema *jsonschema.Schema
}

// New returns a Service.
func New(store Store) *Service {
	return &Service{store: store, now: extensions.Now, compiled: map[string]compiledSchema{}}
}

// Input is what an admin sets when registering or replacing a type.
type Input struct {
	Type                 string
	DisplayName          string
	Description          string
	AllowedActions       []string
	AllowedLocations     []string
	ReadOnlyActions      []string
	RequiredCapabilities []string
	Schema               json.RawMessage
}

// typeName is the syntax of type names (ours: RFC 9396 leaves it open):
// one URL path segment, so that /api/v1/rar/types/{type} names it as it is;
// URN-style names (urn:example:payment) fit.
var typeName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.:-]{0,63}$`)

// actionName is the syntax of actions.
var actionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$`)

const (
	maxActions   = 50
	maxLocations = 50
	maxLocation  = 512
)

// check validates an input and returns the record it describes, its schema
// compiled.
func (s *Service) check(in Input) (*persistence.RARType, *jsonschema.Schema, error) {
	var v extensions.ValidationError
	switch {
	case !typeName.MatchString(in.Type):
		v.Add("type", "must be 1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter")
	case in.Type == oauth.TypeHITLApproval:
		v.Add("type", "is reserved: %s is built in (human-in-the-loop approvals)", oauth.TypeHITLApproval)
	}
	v.CheckText("displayName", in.DisplayName, false, 200)
	v.CheckText("description", in.Description, false, 2000)
	actions := distinct(&v, "allowedActions", in.AllowedActions, maxActions, func(a string) string {
		if !actionName.MatchString(a) {
			return "must be 1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit"
		}
		return ""
	})
	locations := distinct(&v, "allowedLocations", in.AllowedLocations, maxLocations, func(l string) string {
		if u, err := url.Parse(l); err != nil || !u.IsAbs() || len(l) > maxLocation || strings.ContainsFunc(l, isSpaceOrControl) {
			return fmt.Sprintf("must be an absolute URI of at most %d characters", maxLocation)
		}
		return ""
	})
	readOnly := distinct(&v, "readOnlyActions", in.ReadOnlyActions, maxActions, func(a string) string {
		if !slices.Contains(in.AllowedActions, a) {
			return "must be one of allowedActions"
		}
		return ""
	})
	caps := distinct(&v, "requiredCapabilities", in.RequiredCapabilities, len(agents.Capabilities), func(c string) string {
		if !agents.KnownCapability(c) {
			return "must be one of " + strings.Join(agents.Capabilities, ", ")
		}
		return ""
	})
	var compiled *jsonschema.Schema
	if len(in.Schema) == 0 || string(in.Schema) == "null" {
		v.Add("schema", "is required: a JSON Schema object")
	} else if sch, err := compileNew(in.Schema); err != nil {
		v.Add("schema", "%s", err.Error())
	} else {
		compiled = sch
	}
	if err := v.Err(); err != nil {
		return nil, nil, err
	}
	now := s.now()
	return &persistence.RARType{
		Type: in.Type, DisplayName: strings.TrimSpace(in.DisplayName), Description: in.Description,
		AllowedActions: actions, AllowedLocations: locations, ReadOnlyActions: readOnly, RequiredCapabilities: caps,
		Schema: string(in.Schema), CreatedAt: now, UpdatedAt: now,
	}, compiled, nil
}

func isSpaceOrControl(r rune) bool { return r <= ' ' || r == 0x7f }

// distinct checks each item of a list (problem returns "" when it is fine)
// and returns the list without repeats, in order.
func distinct(v *extensions.ValidationError, field string, items []string, max int, problem func(string) string) []string {
	if len(items) > max {
		v.Add(field, "must list at most %d items", max)
		return nil
	}
	for i, it := range items {
		if p := problem(it); p != "" {
			v.Add(fmt.Sprintf("%s[%d]", field, i), "%s", p)
		}
	}
	return extensions.Distinct(items)
}

// ErrTypeLimit refuses a type past persistence.MaxRARTypes.
var ErrTypeLimit = extensions.Conflict("type_limit_reached",
	fmt.Sprintf("At most %d authorization details types can be registered.", persistence.MaxRARTypes), nil)

// Create registers a type. A taken name is a type_exists conflict.
func (s *Service) Create(ctx context.Context, in Input) (*persistence.RARType, error) {
	t, _, err := s.check(in)
	if err != nil {
		return nil, err
	}
	switch err := s.store.CreateRARType(ctx, t); {
	case errors.Is(err, persistence.ErrTooMany):
		return nil, ErrTypeLimit
	case errors.Is(err, persistence.ErrDuplicate):
		return nil, extensions.Conflict("type_exists", "A type of this name is registered.", map[string]any{"type": t.Type})
	case err != nil:
		return nil, err
	}
	return t, nil
}

// Get reads one type.
func (s *Service) Get(ctx context.Context, name string) (*persistence.RARType, error) {
	return s.store.GetRARType(ctx, name)
}

// List returns one page of types, by name.
func (s *Service) List(ctx context.Context, p persistence.Page) ([]persistence.RARType, int, error) {
	return s.store.ListRARTypes(ctx, p)
}

// Replace sets every field of an existing type. Tokens already issued keep
// what they were granted.
func (s *Service) Replace(ctx context.Context, name string, in Input) (*persistence.RARType, error) {
	if in.Type == "" {
		in.Type = name
	} else if in.Type != name {
		return nil, &extensions.ValidationError{Fields: map[string]string{"type": "must equal the type named in the path, or be omitted"}}
	}
	t, _, err := s.check(in)
	if err != nil {
		return nil, err
	}
	old, err := s.store.GetRARType(ctx, name)
	if err != nil {
		return nil, err
	}
	t.CreatedAt = old.CreatedAt
	if err := s.store.ReplaceRARType(ctx, t); err != nil {
		return nil, err
	}
	return t, nil
}

// Delete removes a type. Tokens already issued keep what they were granted.
func (s *Service) Delete(ctx context.Context, name string) error {
	return s.store.DeleteRARType(ctx, name)
}

// TypeNames lists the registered types, sorted: what discovery advertises
// (RFC 9396 §10.1, authorization_details_types_supported).
func (s *Service) TypeNames(ctx context.Context) ([]string, error) {
	types, err := s.store.RARTypes(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(types))
	for n := range types {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// schemaOf returns a registered type's compiled schema, compiling it once
// per version of its text.
func (s *Service) schemaOf(t *persistence.RARType) (*jsonschema.Schema, error) {
	s.mu.Lock()
	c, ok := s.compiled[t.Type]
	s.mu.Unlock()
	if ok && c.text == t.Schema {
		return c.schema, nil
	}
	sch, err := compileSchema([]byte(t.Schema))
	if err != nil {
		return nil, fmt.Errorf("stored schema of type %q: %w", t.Type, err)
	}
	s.mu.Lock()
	if len(s.compiled) > 2*persistence.MaxRARTypes { // deleted types linger; start over
		clear(s.compiled)
	}
	s.compiled[t.Type] = compiledSchema{text: t.Schema, schema: sch}
	s.mu.Unlock()
	return sch, nil
}
