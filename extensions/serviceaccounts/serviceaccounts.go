// Package serviceaccounts holds the rules for service accounts: what a valid
// account is, how credentials are made and rotated, and the bootstrap admin.
package serviceaccounts

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateServiceAccount(ctx context.Context, sa *persistence.ServiceAccount) error
	GetServiceAccount(ctx context.Context, id string) (*persistence.ServiceAccount, error)
	GetServiceAccountByClientID(ctx context.Context, clientID string) (*persistence.ServiceAccount, error)
	ListServiceAccounts(ctx context.Context, p persistence.Page) ([]persistence.ServiceAccount, int, error)
	UpdateServiceAccount(ctx context.Context, id string, fn func(*persistence.ServiceAccount) error) (*persistence.ServiceAccount, error)
	DeleteServiceAccount(ctx context.Context, id string) (*persistence.ServiceAccount, error)
	AnyServiceAccountWithScope(ctx context.Context, scope string) (bool, error)
}

// Limits on what an account may hold.
const (
	maxName         = 200
	maxDescription  = 2000
	maxRedirectURIs = 20
)

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	hasher extensions.Hasher
	now    func() time.Time
}

// New returns a Service.
func New(store Store, hasher extensions.Hasher) *Service {
	return &Service{store: store, hasher: hasher, now: extensions.Now}
}

// Input is what a caller may set on an account.
type Input struct {
	Name         string
	Description  string
	Scopes       []string
	RedirectURIs []string
	Tier         string // "": usage.DefaultTier
}

// Patch changes the fields that are not nil.
type Patch struct {
	Name         *string
	Description  *string
	Scopes       *[]string
	RedirectURIs *[]string
	Tier         *string
}

// validate checks every field and reports every problem at once; it also
// removes duplicate scopes and redirect URIs, keeping the first.
func (in *Input) validate() error {
	var v extensions.ValidationError
	v.CheckText("name", in.Name, true, maxName)
	v.CheckText("description", in.Description, false, maxDescription)
	in.Name = strings.TrimSpace(in.Name)
	// Problems name the index the caller sent; duplicates go afterwards.
	for i, s := range in.Scopes {
		if !oauth.KnownScope(s) {
			v.Add(fmt.Sprintf("scopes[%d]", i), "unknown scope %q", s)
		}
	}
	for i, u := range in.RedirectURIs {
		if err := extensions.CheckHTTPSURL(u); err != nil {
			v.Add(fmt.Sprintf("redirectUris[%d]", i), "%s", err)
		}
	}
	if in.Tier == "" {
		in.Tier = usage.DefaultTier
	} else if !usage.Known(in.Tier) {
		v.Add("tier", "must be free, startup or enterprise")
	}
	in.Scopes, in.RedirectURIs = extensions.Distinct(in.Scopes), extensions.Distinct(in.RedirectURIs)
	if len(in.RedirectURIs) > maxRedirectURIs {
		v.Add("redirectUris", "at most %d redirect URIs", maxRedirectURIs)
	}
	return v.Err()
}

// NewClientID returns a fresh client id: "sa_" and 128 random bits.
func NewClientID() string { return "sa_" + strings.ToLower(rand.Text()) }

// Create makes an account with a fresh client id and secret. The secret is
// returned here once and stored only as its keyed hash.
func (s *Service) Create(ctx context.Context, in Input) (*persistence.ServiceAccount, string, error) {
	if err := in.validate(); err != nil {
		return nil, "", err
	}
	return s.create(ctx, NewClientID(), oauth.NewSecret(), in)
}

func (s *Service) create(ctx context.Context, clientID, secret string, in Input) (*persistence.ServiceAccount, string, error) {
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, "", err
	}
	now := s.now()
	sa := &persistence.ServiceAccount{
		ID: uuid.Must(uuid.NewV7()).String(), ClientID: clientID, SecretHash: hash,
		Name: in.Name, Description: in.Description, Scopes: in.Scopes, RedirectURIs: in.RedirectURIs, Tier: in.Tier,
		CreatedAt: now, UpdatedAt: now,
	}
	if err := s.store.CreateServiceAccount(ctx, sa); err != nil {
		return nil, "", err
	}
	return sa, secret, nil
}

// Get reads one account.
func (s *Service) Get(ctx context.Context, id string) (*persistence.ServiceAccount, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetServiceAccount(ctx, id)
}

// GetByClientID reads one account by its client id.
func (s *Service) GetByClientID(ctx context.Context, clientID string) (*persistence.ServiceAccount, error) {
	return s.store.GetServiceAccountByClientID(ctx, clientID)
}

// List returns one page of accounts and the total.
func (s *Service) List(ctx context.Context, p persistence.Page) ([]persistence.ServiceAccount, int, error) {
	return s.store.ListServiceAccounts(ctx, p)
}

// Update applies a patch under the row lock, validating the result.
func (s *Service) Update(ctx context.Context, id string, p Patch) (*persistence.ServiceAccount, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateServiceAccount(ctx, id, func(sa *persistence.ServiceAccount) error {
		in := Input{Name: sa.Name, Description: sa.Description, Scopes: sa.Scopes, RedirectURIs: sa.RedirectURIs, Tier: sa.Tier}
		if p.Name != nil {
			in.Name = *p.Name
		}
		if p.Description != nil {
			in.Description = *p.Description
		}
		if p.Scopes != nil {
			in.Scopes = *p.Scopes
		}
		if p.RedirectURIs != nil {
			in.RedirectURIs = *p.RedirectURIs
		}
		if p.Tier != nil {
			if !usage.Known(*p.Tier) { // "" too: only absence means the default
				var v extensions.ValidationError
				v.Add("tier", "must be free, startup or enterprise")
				return v.Err()
			}
			in.Tier = *p.Tier
		}
		if err := in.validate(); err != nil {
			return err
		}
		sa.Name, sa.Description, sa.Scopes, sa.RedirectURIs, sa.Tier = in.Name, in.Description, in.Scopes, in.RedirectURIs, in.Tier
		sa.UpdatedAt = s.now()
		return nil
	})
}

// Rotate replaces the secret. The old one stops working when this returns:
// only the new hash is stored.
func (s *Service) Rotate(ctx context.Context, id string) (*persistence.ServiceAccount, string, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, "", persistence.ErrNotFound
	}
	secret := oauth.NewSecret()
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, "", err
	}
	sa, err := s.store.UpdateServiceAccount(ctx, id, func(sa *persistence.ServiceAccount) error {
		now := s.now()
		sa.SecretHash, sa.UpdatedAt, sa.RotatedAt = hash, now, &now
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return sa, secret, nil
}

// Delete removes the account and its tokens.
func (s *Service) Delete(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	_, err := s.store.DeleteServiceAccount(ctx, id)
	return err
}

// MinAdminSecretLength is the shortest IDENTITYD_ADMIN_CLIENT_SECRET accepted:
// the secret is stored as a fast keyed hash, so it must carry real entropy.
const MinAdminSecretLength = 32

// EnsureAdmin creates or updates the account with this client id so that it
// has this secret and every scope, admin included. Running it twice changes
// nothing the second time but updatedAt.
func (s *Service) EnsureAdmin(ctx context.Context, clientID, secret string) (*persistence.ServiceAccount, error) {
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, err
	}
	existing, err := s.store.GetServiceAccountByClientID(ctx, clientID)
	if errors.Is(err, persistence.ErrNotFound) {
		sa, _, err := s.create(ctx, clientID, secret, Input{Name: "admin", Description: "Bootstrap admin (IDENTITYD_ADMIN_CLIENT_ID)", Scopes: slices.Clone(oauth.Scopes)})
		if !errors.Is(err, persistence.ErrDuplicate) {
			return sa, err
		}
		// Another replica created it at the same moment: update it below.
		if existing, err = s.store.GetServiceAccountByClientID(ctx, clientID); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	return s.store.UpdateServiceAccount(ctx, existing.ID, func(sa *persistence.ServiceAccount) error {
		sa.SecretHash, sa.Scopes, sa.UpdatedAt = hash, slices.Clone(oauth.Scopes), s.now()
		return nil
	})
}

// GenerateAdminIfNone creates an admin account with fresh credentials when no
// account holds the admin scope, and returns the client id and secret to show
// once; ok is false when an admin exists already.
func (s *Service) GenerateAdminIfNone(ctx context.Context) (clientID, secret string, ok bool, err error) {
	exists, err := s.store.AnyServiceAccountWithScope(ctx, oauth.ScopeAdmin)
	if err != nil || exists {
		return "", "", false, err
	}
	sa, secret, err := s.create(ctx, NewClientID(), oauth.NewSecret(), Input{Name: "admin", Description: "Generated bootstrap admin", Scopes: slices.Clone(oauth.Scopes)})
	if err != nil {
		return "", "", false, err
	}
	return sa.ClientID, secret, true, nil
}

// ResetAdmin issues a fresh secret for the bootstrap admin, for an operator
// who lost it (`identityd admin reset`): the account with clientID when one
// is configured (created, or given every scope again, as at a start), else
// the oldest account holding the admin scope (the generated bootstrap admin,
// unless it was deleted), or a new admin when no account holds the scope.
// The old secret stops working when this returns.
func (s *Service) ResetAdmin(ctx context.Context, clientID string) (*persistence.ServiceAccount, string, error) {
	if clientID != "" {
		secret := oauth.NewSecret()
		sa, err := s.EnsureAdmin(ctx, clientID, secret)
		return sa, secret, err
	}
	for page := (persistence.Page{Limit: 200}); ; page.Offset += page.Limit {
		list, total, err := s.store.ListServiceAccounts(ctx, page) // oldest first
		if err != nil {
			return nil, "", err
		}
		for _, sa := range list {
			if slices.Contains(sa.Scopes, oauth.ScopeAdmin) {
				return s.Rotate(ctx, sa.ID)
			}
		}
		if page.Offset+page.Limit >= total {
			break
		}
	}
	id, secret, created, err := s.GenerateAdminIfNone(ctx)
	if err != nil {
		return nil, "", err
	}
	if !created { // an admin appeared meanwhile: reset that one
		return s.ResetAdmin(ctx, "")
	}
	sa, err := s.store.GetServiceAccountByClientID(ctx, id)
	return sa, secret, err
}
