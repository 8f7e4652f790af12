// Package workload holds workload identity federation: the issuers whose
// identity tokens (Kubernetes service-account tokens, cloud workload
// tokens) identityd accepts in a token exchange, the mappings from their
// subjects to agents, and the verification of those tokens.
package workload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateWorkloadIssuer(ctx context.Context, is *persistence.WorkloadIssuer) error
	GetWorkloadIssuer(ctx context.Context, id string) (*persistence.WorkloadIssuer, error)
	ListWorkloadIssuers(ctx context.Context, p persistence.Page) ([]persistence.WorkloadIssuer, int, error)
	UpdateWorkloadIssuer(ctx context.Context, id string, fn func(*persistence.WorkloadIssuer) error) (*persistence.WorkloadIssuer, error)
	DeleteWorkloadIssuer(ctx context.Context, id string) error
	WorkloadIssuers(ctx context.Context) (map[string]*persistence.WorkloadIssuer, error)
	CreateWorkloadMapping(ctx context.Context, m *persistence.WorkloadMapping) error
	GetWorkloadMapping(ctx context.Context, id string) (*persistence.WorkloadMapping, error)
	WorkloadMappingFor(ctx context.Context, issuerID, subject string) (*persistence.WorkloadMapping, error)
	ListWorkloadMappings(ctx context.Context, issuerID string, p persistence.Page) ([]persistence.WorkloadMapping, int, error)
	DeleteWorkloadMapping(ctx context.Context, id string) error
	GetAgentByClientID(ctx context.Context, clientID string) (*persistence.Agent, error)
}

// Platforms an issuer may name (spec: "kubernetes"; the cloud platforms it
// names). The platform is descriptive: every one is verified the same way,
// as an OpenID Connect issuer of JWTs (docs/decisions.md).
var Platforms = []string{"kubernetes", "aws", "gcp", "azure"}

// MatchExact is the one subject match type: the token's sub equals the
// mapping's subjectPattern (spec: "exact").
const MatchExact = "exact"

// Bounds.
const (
	DefaultMaxTokenAge = 3600
	maxTokenAgeLimit   = 86400
	maxListItems       = 50
	maxItemLength      = 512
)

// Service manages issuers and mappings and verifies platform tokens.
type Service struct {
	store  Store
	now    func() time.Time
	client *http.Client // fetches key sets

	mu   sync.Mutex
	sets map[string]*keySet // by issuer id: JWKS caches and verifiers
}

// New returns a Service.
func New(store Store) *Service {
	return &Service{store: store, now: extensions.Now, client: keySetClient(), sets: map[string]*keySet{}}
}

// IssuerInput is what an admin sets on an issuer; nil fields are left as
// they are by Update (Create needs them all but maxTokenAgeSeconds).
type IssuerInput struct {
	Name               *string
	IssuerURL          *string
	JWKSURI            *string
	Platform           *string
	AllowedAudiences   *[]string
	AllowedSubjects    *[]string
	MaxTokenAgeSeconds *int
}

// apply checks an input and writes it onto is; create requires every field.
func apply(is *persistence.WorkloadIssuer, in IssuerInput, create bool) error {
	var v extensions.ValidationError
	required := func(field string, present bool) bool {
		if !present && create {
			v.Add(field, "is required")
		}
		return present
	}
	if required("name", in.Name != nil) {
		v.CheckText("name", *in.Name, true, 200)
		is.Name = strings.TrimSpace(*in.Name)
	}
	if required("issuerUrl", in.IssuerURL != nil) {
		if err := extensions.CheckHTTPSURL(*in.IssuerURL); err != nil {
			v.Add("issuerUrl", "%s", err.Error())
		}
		is.IssuerURL = *in.IssuerURL
	}
	if required("jwksUri", in.JWKSURI != nil) {
		if err := extensions.CheckHTTPSURL(*in.JWKSURI); err != nil {
			v.Add("jwksUri", "%s", err.Error())
		}
		is.JWKSURI = *in.JWKSURI
	}
	if required("platform", in.Platform != nil) {
		if !slices.Contains(Platforms, *in.Platform) {
			v.Add("platform", "must be one of %s", strings.Join(Platforms, ", "))
		}
		is.Platform = *in.Platform
	}
	if required("allowedAudiences", in.AllowedAudiences != nil) {
		is.AllowedAudiences = checkList(&v, "allowedAudiences", *in.AllowedAudiences)
	}
	if required("allowedSubjects", in.AllowedSubjects != nil) {
		is.AllowedSubjects = checkList(&v, "allowedSubjects", *in.AllowedSubjects)
	}
	switch {
	case in.MaxTokenAgeSeconds != nil:
		if n := *in.MaxTokenAgeSeconds; n < 1 || n > maxTokenAgeLimit {
			v.Add("maxTokenAgeSeconds", "must be from 1 to %d", maxTokenAgeLimit)
		}
		is.MaxTokenAgeSeconds = *in.MaxTokenAgeSeconds
	case create:
		is.MaxTokenAgeSeconds = DefaultMaxTokenAge
	}
	return v.Err()
}

// checkList checks a non-empty list of strings and drops repeats.
func checkList(v *extensions.ValidationError, field string, items []string) []string {
	if len(items) == 0 || len(items) > maxListItems {
		v.Add(field, "must list 1 to %d values", maxListItems)
		return nil
	}
	for i, it := range items {
		if strings.TrimSpace(it) == "" || len(it) > maxItemLength || strings.ContainsFunc(it, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			v.Add(fmt.Sprintf("%s[%d]", field, i), "must be 1 to %d characters, no control characters", maxItemLength)
		}
	}
	return extensions.Distinct(items)
}

// errIssuerExists and errIssuerInUse are the conflicts of the issuer API.
var (
	errIssuerExists = extensions.Conflict("issuer_exists", "An issuer with this issuerUrl is registered.", nil)
	errIssuerInUse  = extensions.Conflict("issuer_has_mappings", "Mappings use this issuer; delete them first.", nil)
)

// CreateIssuer registers an issuer.
func (s *Service) CreateIssuer(ctx context.Context, in IssuerInput) (*persistence.WorkloadIssuer, error) {
	now := s.now()
	is := &persistence.WorkloadIssuer{ID: uuid.Must(uuid.NewV7()).String(), CreatedAt: now, UpdatedAt: now}
	if err := apply(is, in, true); err != nil {
		return nil, err
	}
	if err := s.store.CreateWorkloadIssuer(ctx, is); errors.Is(err, persistence.ErrDuplicate) {
		return nil, errIssuerExists
	} else if err != nil {
		return nil, err
	}
	return is, nil
}

// GetIssuer reads one issuer; an id that is no UUID is not found.
func (s *Service) GetIssuer(ctx context.Context, id string) (*persistence.WorkloadIssuer, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetWorkloadIssuer(ctx, id)
}

// ListIssuers returns one page of issuers.
func (s *Service) ListIssuers(ctx context.Context, p persistence.Page) ([]persistence.WorkloadIssuer, int, error) {
	return s.store.ListWorkloadIssuers(ctx, p)
}

// UpdateIssuer changes the fields given. The next exchange uses them (a new
// jwksUri is fetched afresh).
func (s *Service) UpdateIssuer(ctx context.Context, id string, in IssuerInput) (*persistence.WorkloadIssuer, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	is, err := s.store.UpdateWorkloadIssuer(ctx, id, func(is *persistence.WorkloadIssuer) error {
		is.UpdatedAt = s.now()
		return apply(is, in, false)
	})
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, errIssuerExists
	}
	return is, err
}

// DeleteIssuer removes an issuer that no mapping uses.
func (s *Service) DeleteIssuer(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	if err := s.store.DeleteWorkloadIssuer(ctx, id); errors.Is(err, persistence.ErrInUse) {
		return errIssuerInUse
	} else if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.sets, id)
	s.mu.Unlock()
	return nil
}

// MappingInput is what an admin sets on a mapping.
type MappingInput struct {
	IssuerID         string
	AgentClientID    string
	SubjectPattern   string
	SubjectMatchType string
	Scopes           []string
}

var errMappingExists = extensions.Conflict("mapping_exists", "A mapping of this subject at this issuer exists.", nil)

// CreateMapping maps an issuer's subject to an existing agent. The scopes
// must be in the catalog; an exchange grants them only as far as the
// agent's own capabilities allow.
func (s *Service) CreateMapping(ctx context.Context, in MappingInput) (*persistence.WorkloadMapping, error) {
	var v extensions.ValidationError
	if in.SubjectMatchType == "" {
		in.SubjectMatchType = MatchExact
	}
	if in.SubjectMatchType != MatchExact {
		v.Add("subjectMatchType", "must be %q", MatchExact)
	}
	v.CheckText("subjectPattern", in.SubjectPattern, true, maxItemLength)
	for i, sc := range in.Scopes {
		if !oauth.KnownScope(sc) {
			v.Add(fmt.Sprintf("scopes[%d]", i), "unknown scope %q", sc)
		}
	}
	scopes := extensions.Distinct(in.Scopes)
	if _, err := s.GetIssuer(ctx, in.IssuerID); errors.Is(err, persistence.ErrNotFound) {
		v.Add("issuerId", "no issuer has this id")
	} else if err != nil {
		return nil, err
	}
	if _, err := s.store.GetAgentByClientID(ctx, in.AgentClientID); errors.Is(err, persistence.ErrNotFound) {
		v.Add("agentClientId", "no agent has this client id")
	} else if err != nil {
		return nil, err
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	m := &persistence.WorkloadMapping{
		ID: uuid.Must(uuid.NewV7()).String(), IssuerID: in.IssuerID, AgentClientID: in.AgentClientID,
		SubjectPattern: in.SubjectPattern, SubjectMatchType: in.SubjectMatchType, Scopes: scopes, CreatedAt: s.now(),
	}
	switch err := s.store.CreateWorkloadMapping(ctx, m); {
	case errors.Is(err, persistence.ErrDuplicate):
		return nil, errMappingExists
	case errors.Is(err, persistence.ErrMissingReference): // the issuer or agent was deleted since it was read
		return nil, fmt.Errorf("issuer or agent deleted meanwhile: %w", persistence.ErrNotFound)
	case err != nil:
		return nil, err
	}
	return m, nil
}

// GetMapping reads one mapping.
func (s *Service) GetMapping(ctx context.Context, id string) (*persistence.WorkloadMapping, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetWorkloadMapping(ctx, id)
}

// ListMappings returns one page of mappings, of one issuer when issuerID is
// set (an id that is no UUID matches none).
func (s *Service) ListMappings(ctx context.Context, issuerID string, p persistence.Page) ([]persistence.WorkloadMapping, int, error) {
	if issuerID != "" {
		if _, err := uuid.Parse(issuerID); err != nil {
			return []persistence.WorkloadMapping{}, 0, nil
		}
	}
	return s.store.ListWorkloadMappings(ctx, issuerID, p)
}

// DeleteMapping removes a mapping; the next exchange of its subject is refused.
func (s *Service) DeleteMapping(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	return s.store.DeleteWorkloadMapping(ctx, id)
}
