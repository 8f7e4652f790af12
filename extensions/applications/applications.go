// Package applications holds the rules for applications, the OpenID Connect
// clients people sign in through: what a valid registration is, and how
// their credentials are made and rotated (as service accounts' are).
package applications

import (
	"context"
	"crypto/rand"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateApplication(ctx context.Context, a *persistence.Application) error
	GetApplication(ctx context.Context, id string) (*persistence.Application, error)
	GetApplicationByClientID(ctx context.Context, clientID string) (*persistence.Application, error)
	ListApplications(ctx context.Context, p persistence.Page) ([]persistence.Application, int, error)
	UpdateApplication(ctx context.Context, id string, fn func(*persistence.Application) error) (*persistence.Application, error)
	DeleteApplication(ctx context.Context, id string) (*persistence.Application, error)
}

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	hasher extensions.Hasher
	now    func() time.Time
}

// New returns a Service. hasher is the client-secret hasher, the one
// service accounts and agents use (oauth.SecretHasher).
func New(store Store, hasher extensions.Hasher) *Service {
	return &Service{store: store, hasher: hasher, now: extensions.Now}
}

// NewClientID returns a fresh client id: "app_" and 128 random bits.
func NewClientID() string {
	return persistence.ApplicationClientPrefix + strings.ToLower(rand.Text())
}

// Create validates in, fills the defaults and stores a new application with
// a fresh client id and, for a confidential one, a fresh secret, returned
// here once and stored only as its keyed hash ("" for a public one).
func (s *Service) Create(ctx context.Context, in Input) (*persistence.Application, string, error) {
	a := &persistence.Application{ID: uuid.Must(uuid.NewV7()).String(), ClientID: NewClientID()}
	if err := in.apply(a, true); err != nil {
		return nil, "", err
	}
	var secret string
	if a.Type == persistence.AppConfidential {
		secret = oauth.NewSecret()
		hash, err := s.hasher.Hash(ctx, []byte(secret))
		if err != nil {
			return nil, "", err
		}
		a.SecretHash = hash
	}
	a.CreatedAt = s.now()
	a.UpdatedAt = a.CreatedAt
	if err := s.store.CreateApplication(ctx, a); err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// Get reads one application.
func (s *Service) Get(ctx context.Context, id string) (*persistence.Application, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetApplication(ctx, id)
}

// GetByClientID reads one application by its client id.
func (s *Service) GetByClientID(ctx context.Context, clientID string) (*persistence.Application, error) {
	return s.store.GetApplicationByClientID(ctx, clientID)
}

// List returns one page of applications, oldest first, and the total.
func (s *Service) List(ctx context.Context, p persistence.Page) ([]persistence.Application, int, error) {
	return s.store.ListApplications(ctx, p)
}

// Update applies a patch under the row lock and validates the result as a
// whole, as Create does: a field left out keeps its value, and must still
// agree with the ones changed (an rpId with new web origins, say).
func (s *Service) Update(ctx context.Context, id string, in Input) (*persistence.Application, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateApplication(ctx, id, func(a *persistence.Application) error {
		if Reserved(a) {
			return ErrReserved
		}
		if err := in.apply(a, false); err != nil {
			return err
		}
		a.UpdatedAt = s.now()
		return nil
	})
}

// ErrPublicRotate refuses to rotate the secret of a public application,
// which has none.
var ErrPublicRotate = extensions.Conflict("no_secret", "A public application has no client secret to rotate.", nil)

// Rotate replaces a confidential application's secret. The old one stops
// working when this returns: only the new hash is stored, and the cached
// client is evicted on every replica before the answer (as for service
// accounts). Tokens already issued stay valid until they expire.
func (s *Service) Rotate(ctx context.Context, id string) (*persistence.Application, string, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, "", persistence.ErrNotFound
	}
	if err := s.refuseReserved(ctx, id); err != nil {
		return nil, "", err
	}
	secret := oauth.NewSecret()
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, "", err
	}
	a, err := s.store.UpdateApplication(ctx, id, func(a *persistence.Application) error {
		if a.Type == persistence.AppPublic {
			return ErrPublicRotate
		}
		now := s.now()
		a.SecretHash, a.UpdatedAt, a.RotatedAt = hash, now, &now
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// Delete removes the application; its tokens stop working with it.
func (s *Service) Delete(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	if err := s.refuseReserved(ctx, id); err != nil {
		return err
	}
	_, err := s.store.DeleteApplication(ctx, id)
	return err
}

// MFAOf reads an application's stored MFA setting.
func MFAOf(a *persistence.Application) MFA {
	m := MFA{Factors: []string{}}
	m.Policy, _ = a.MFA["policy"].(string)
	if m.Policy == "" {
		m.Policy = MFAOff
	}
	switch fs := a.MFA["factors"].(type) {
	case []any:
		for _, f := range fs {
			if s, ok := f.(string); ok {
				m.Factors = append(m.Factors, s)
			}
		}
	case []string:
		m.Factors = append(m.Factors, fs...)
	}
	return m
}

// storedMFA is the MFA setting as the store keeps it.
func storedMFA(m MFA) persistence.JSONObject {
	return persistence.JSONObject{"policy": m.Policy, "factors": slices.Clone(m.Factors)}
}

// ErrTypeChange is the refusal of a change of an application's type.
var ErrTypeChange = extensions.NewError(http.StatusBadRequest, "invalid_request",
	"An application's type cannot change: register a new application of the other type.", map[string]any{"field": "type"})
