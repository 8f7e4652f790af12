// Package apikeys issues, lists, revokes and validates the API keys an
// application gives its own end users (issue 18; spec "What the service
// does" 8): keys in a recognisable, checksummed format (format.go), stored
// only as keyed hashes, validated from a cache, their last use written in
// batches. No HTTP here (handlers/apikeys.go).
package apikeys

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	GetApplication(ctx context.Context, id string) (*persistence.Application, error)
	CreateAPIKey(ctx context.Context, k *persistence.APIKey) error
	GetAPIKey(ctx context.Context, appID, id string) (*persistence.APIKey, error)
	ListAPIKeys(ctx context.Context, appID string, p persistence.Page) ([]persistence.APIKey, int, error)
	RevokeAPIKey(ctx context.Context, appID, id string, now time.Time) (*persistence.APIKey, error)
	APIKeyByHash(ctx context.Context, hash []byte) (*persistence.APIKey, error)
	TouchAPIKeys(ctx context.Context, used map[string]time.Time) error
}

// HashPurpose is the purpose of the key API keys are hashed with
// (oauth.DeriveKey): a digest made for it matches no other secret's.
const HashPurpose = "api key"

// Bounds.
const (
	MaxName      = 200
	MaxScopes    = 50
	MaxScope     = 128
	MaxLifetime  = 10 * 366 * 24 * time.Hour
	TouchEvery   = time.Minute // lastUsedAt is kept to this precision
	FlushEvery   = 10 * time.Second
	OwnerUser    = "user"
	OwnerOrg     = "organization"
	ReasonFormat = "malformed" // not a key of identityd's format, or its checksum is wrong
	ReasonNone   = "unknown"   // no such key (or not one the caller may see)
	ReasonRevokd = "revoked"
	ReasonExpird = "expired"
	ReasonOwner  = "owner_disabled" // its person is disabled: valid again if enabled
)

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	hasher *oauth.SecretHasher
	now    func() time.Time

	mu      sync.Mutex
	pending map[string]time.Time // key id → last use not yet written
	written map[string]time.Time // key id → last use written (within TouchEvery)
}

// New returns a Service hashing keys under the key derived from the system
// secret for HashPurpose alone.
func New(store Store, systemSecret []byte) *Service {
	return &Service{store: store, hasher: oauth.NewHasher(systemSecret, HashPurpose), now: extensions.Now,
		pending: map[string]time.Time{}, written: map[string]time.Time{}}
}

// Owner is who a key is for: a person or an organization of the directory.
type Owner struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// Input is what a key is issued with.
type Input struct {
	Name      string
	Scopes    []string
	ExpiresAt *time.Time
	Metadata  map[string]any
	Owner     *Owner
}

// validScope: an RFC 6749 §3.3 scope-token (printable ASCII but space, '"'
// and '\'), at most MaxScope characters. The application's vocabulary is
// its own: identityd stores and answers scopes and never interprets them.
func validScope(s string) bool {
	if s == "" || len(s) > MaxScope {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func (in *Input) validate(now time.Time) error {
	var v extensions.ValidationError
	v.CheckText("name", in.Name, true, MaxName)
	if len(in.Scopes) > MaxScopes {
		v.Add("scopes", "at most %d scopes", MaxScopes)
	}
	for i, s := range in.Scopes {
		if !validScope(s) {
			v.Add(fmt.Sprintf("scopes[%d]", i), "must be 1 to %d printable ASCII characters without spaces, '\"' or '\\' (RFC 6749 §3.3)", MaxScope)
		}
	}
	if in.ExpiresAt != nil && (!in.ExpiresAt.After(now) || in.ExpiresAt.After(now.Add(MaxLifetime))) {
		v.Add("expiresAt", "must be in the future, at most ten years ahead")
	}
	if in.Metadata != nil {
		directory.CheckMetadata(&v, "metadata", in.Metadata)
	}
	switch {
	case in.Owner == nil:
		v.Add("owner", "is required: {\"type\": \"user\" or \"organization\", \"id\": ...}")
	case in.Owner.Type != OwnerUser && in.Owner.Type != OwnerOrg:
		v.Add("owner.type", "must be user or organization")
	default:
		if _, err := uuid.Parse(in.Owner.ID); err != nil {
			v.Add("owner.id", "must be the id of a %s", in.Owner.Type)
		}
	}
	in.Scopes = extensions.Distinct(in.Scopes)
	return v.Err()
}

// Issue makes a key for the application appID; the key is answered here
// once and stored only as its keyed hash. issuedBy is the caller's client id.
func (s *Service) Issue(ctx context.Context, appID, issuedBy string, in Input) (*persistence.APIKey, string, error) {
	now := s.now()
	if err := in.validate(now); err != nil {
		return nil, "", err
	}
	app, err := s.store.GetApplication(ctx, appID)
	if err != nil {
		return nil, "", err
	}
	key := NewKey(Tag(app.ClientID))
	k := &persistence.APIKey{
		ID: uuid.Must(uuid.NewV7()).String(), ApplicationID: app.ID, Name: in.Name, KeyHash: s.hash(key), Hint: Hint(key),
		Scopes: in.Scopes, Metadata: in.Metadata, IssuedBy: issuedBy, CreatedAt: now,
	}
	if k.Scopes == nil {
		k.Scopes = persistence.StringList{}
	}
	if in.ExpiresAt != nil {
		at := in.ExpiresAt.UTC().Truncate(time.Microsecond)
		k.ExpiresAt = &at
	}
	if in.Owner.Type == OwnerUser {
		k.UserID = &in.Owner.ID
	} else {
		k.OrgID = &in.Owner.ID
	}
	if err := s.store.CreateAPIKey(ctx, k); err != nil {
		if errors.Is(err, persistence.ErrMissingReference) {
			// The application was read just now: the owner is what is missing.
			var v extensions.ValidationError
			v.Add("owner.id", "no such %s", in.Owner.Type)
			return nil, "", v.Err()
		}
		return nil, "", err
	}
	return k, key, nil
}

func (s *Service) hash(key string) []byte {
	h, _ := s.hasher.Hash(context.Background(), []byte(key)) // never fails
	return h
}

// Get reads one key of the application.
func (s *Service) Get(ctx context.Context, appID, id string) (*persistence.APIKey, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetAPIKey(ctx, appID, id)
}

// List returns one page of the application's keys and the total.
func (s *Service) List(ctx context.Context, appID string, p persistence.Page) ([]persistence.APIKey, int, error) {
	return s.store.ListAPIKeys(ctx, appID, p)
}

// Revoke revokes one key of the application; once it returns, no replica
// validates the key (the store's commit wait).
func (s *Service) Revoke(ctx context.Context, appID, id string) (*persistence.APIKey, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.RevokeAPIKey(ctx, appID, id, s.now())
}

// Status is what a validation finds.
type Status struct {
	Valid  bool
	Reason string              // when not valid
	Key    *persistence.APIKey // the key found (valid, revoked or expired); nil otherwise
}

// Find looks a presented key up: a malformed one (shape or checksum) is
// refused before any hashing or reading; a found key is confirmed by a
// constant-time comparison of its stored hash. The caller decides whether
// it may see the key's application before answering (Validity).
func (s *Service) Find(ctx context.Context, key string) (Status, error) {
	if !WellFormed(key) {
		return Status{Reason: ReasonFormat}, nil
	}
	h := s.hash(key)
	k, err := s.store.APIKeyByHash(ctx, h)
	if errors.Is(err, persistence.ErrNotFound) {
		return Status{Reason: ReasonNone}, nil
	} else if err != nil {
		return Status{}, err
	}
	// The lookup was by this hash; comparing again in constant time costs
	// nothing and keeps the rule of every secret's check.
	if !hmac.Equal(k.KeyHash, h) {
		return Status{Reason: ReasonNone}, nil
	}
	return Status{Key: k}, nil
}

// Validity completes a found key's status at now, and records its use.
func (s *Service) Validity(st Status) Status {
	k := st.Key
	if k == nil {
		return st
	}
	now := s.now()
	switch {
	case k.RevokedAt != nil:
		st.Reason = ReasonRevokd
	case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
		st.Reason = ReasonExpird
	case k.OwnerDisabled:
		st.Reason = ReasonOwner
	default:
		st.Valid = true
		s.used(k.ID, now)
	}
	return st
}

// used notes a key's use, to be written by the next flush unless its last
// use written is recent (within TouchEvery): at most one write per key a
// minute, whatever the rate of validations.
func (s *Service) used(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.written[id]; ok && at.Sub(w) < TouchEvery {
		return
	}
	s.pending[id] = at
}

// LastUsed is the last use of a key noted here and not yet written, for
// answers that should not lag the flush.
func (s *Service) LastUsed(k *persistence.APIKey) *time.Time {
	s.mu.Lock()
	at, ok := s.pending[k.ID]
	s.mu.Unlock()
	if ok && (k.LastUsedAt == nil || at.After(*k.LastUsedAt)) {
		return &at
	}
	return k.LastUsedAt
}

// Flush writes the noted uses in one transaction. On failure they are kept
// for the next flush.
func (s *Service) Flush(ctx context.Context) error {
	s.mu.Lock()
	taken := s.pending
	s.pending = map[string]time.Time{}
	now := s.now()
	for id, at := range s.written {
		if now.Sub(at) >= TouchEvery {
			delete(s.written, id)
		}
	}
	s.mu.Unlock()
	if len(taken) == 0 {
		return nil
	}
	err := s.store.TouchAPIKeys(ctx, taken)
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, at := range taken {
		if err != nil {
			if p, ok := s.pending[id]; !ok || p.Before(at) {
				s.pending[id] = at
			}
			continue
		}
		s.written[id] = at
	}
	return err
}

// Run flushes every FlushEvery and once more when ctx ends (shutdown).
func (s *Service) Run(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := s.Flush(final); err != nil {
				log.Warn("writing API keys' last use at shutdown failed", "error", err.Error())
			}
			cancel()
			return
		case <-t.C:
			if err := s.Flush(ctx); err != nil && ctx.Err() == nil {
				log.Warn("writing API keys' last use failed; kept for the next flush", "error", err.Error())
			}
		}
	}
}
