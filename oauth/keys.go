package oauth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/identityd/identityd/persistence"
)

// Signing algorithms identityd keeps a key for.
const (
	AlgRS256 = "RS256"
	AlgES256 = "ES256"
)

// KeyStore is the narrow storage the key set needs.
type KeyStore interface {
	KeyRotator
	SigningKeys(ctx context.Context) ([]persistence.SigningKey, error)
	EnsureSigningKeys(ctx context.Context, keys []persistence.SigningKey) ([]string, error)
	DeleteRetiredSigningKeys(ctx context.Context, before time.Time) (int64, error)
	ReplaceSigningKeyPrivate(ctx context.Context, kid string, old, sealed []byte) (bool, error)
	SigningKeysChanged() <-chan struct{}
	AfterCommit(ctx context.Context, fn func())
}

// KeyRotator is the storage a rotation needs.
type KeyRotator interface {
	RotateSigningKeys(ctx context.Context, keys []persistence.SigningKey, at time.Time) ([]string, error)
}

// KeyReload is how often a key set rereads the stored keys whatever it
// hears, and so the longest a replica that missed a rotation's notice goes
// on signing with the retired key.
const KeyReload = 5 * time.Second

// Key states.
const (
	KeyActive  = "active"  // signs, and is published
	KeyRetired = "retired" // published until what it signed has expired
)

// PurposeSigningKey is the purpose of the key that seals the private
// signing keys at rest (see DeriveKey).
const PurposeSigningKey = "signing key"

// KeySet holds the private signing keys. Only their public halves leave the
// server, through JWKS. It follows the stored keys (see Watch), so a
// rotation made by another replica or by `identityd keys rotate` reaches it.
// The stored private keys are sealed (AES-GCM under a key derived from the
// system secret for this purpose, bound to the key id): a copy of the
// database alone signs nothing.
type KeySet struct {
	store     KeyStore
	seal      *Sealer
	reloading sync.Mutex // one reload at a time: a late one never installs an older read

	mu        sync.RWMutex
	lifetime  func(ctx context.Context) (time.Duration, error) // what is signed lives at most this long; nil: fixed
	retention time.Duration                                    // how long a retired key stays published
	active    map[string]jose.JSONWebKey                       // by algorithm: the key that signs
	keys      []loadedKey                                      // every stored key, oldest first
}

type loadedKey struct {
	jwk       jose.JSONWebKey
	retiredAt *time.Time
}

// LoadKeys reads the stored signing keys and creates an RS256 and an ES256
// key on first start (one each, however many replicas start together).
// Keys an earlier version stored in clear are sealed in place.
func LoadKeys(ctx context.Context, store KeyStore, systemSecret []byte) (*KeySet, error) {
	seal := NewSealer(systemSecret, PurposeSigningKey)
	stored, err := store.SigningKeys(ctx)
	if err != nil {
		return nil, err
	}
	if err := sealClearKeys(ctx, store, seal, stored); err != nil {
		return nil, err
	}
	var missing []persistence.SigningKey
	for _, alg := range []string{AlgRS256, AlgES256} {
		if slices.ContainsFunc(stored, func(k persistence.SigningKey) bool { return k.Alg == alg && k.RetiredAt == nil }) {
			continue
		}
		k, err := generateKey(alg, seal)
		if err != nil {
			return nil, err
		}
		missing = append(missing, k)
	}
	if len(missing) > 0 {
		if _, err := store.EnsureSigningKeys(ctx, missing); err != nil {
			return nil, err
		}
	}
	ks := &KeySet{store: store, seal: seal}
	ks.setSignedLifetime(maxSignedLifetime)
	if err := ks.reload(ctx); err != nil {
		return nil, err
	}
	return ks, nil
}

// maxSignedLifetime is the longest lifetime the configuration can give
// anything signed: a key set's window until its provider names its own.
const maxSignedLifetime = 24 * time.Hour

// setSignedLifetime sets how long what the provider signs lives: a retired
// key stays published that long after its retirement, plus KeyReload (the
// longest a replica may go on signing with it).
func (ks *KeySet) setSignedLifetime(d time.Duration) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.retention = d + KeyReload
}

// followLifetime makes the signed lifetime fn's answer, read at every
// reload (the provider's: JWT access tokens live as long as their
// application says).
func (ks *KeySet) followLifetime(ctx context.Context, fn func(ctx context.Context) (time.Duration, error)) {
	ks.mu.Lock()
	ks.lifetime = fn
	ks.mu.Unlock()
	ks.updateLifetime(ctx)
}

// updateLifetime sets the signed lifetime from its source, if any; on
// failure the last one stays.
func (ks *KeySet) updateLifetime(ctx context.Context) {
	ks.mu.RLock()
	fn := ks.lifetime
	ks.mu.RUnlock()
	if fn == nil {
		return
	}
	d, err := fn(ctx)
	if err != nil {
		slog.Warn("reading the longest signed lifetime failed; the last one stays", "error", err.Error())
		return
	}
	ks.setSignedLifetime(d)
}

// window is how long a retired key stays published.
func (ks *KeySet) window() time.Duration {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	return ks.retention
}

// reload rereads the stored keys; private keys already parsed are reused.
func (ks *KeySet) reload(ctx context.Context) error {
	ks.reloading.Lock()
	defer ks.reloading.Unlock()
	ks.updateLifetime(ctx)
	stored, err := ks.store.SigningKeys(ctx)
	if err != nil {
		return err
	}
	ks.mu.RLock()
	parsed := make(map[string]jose.JSONWebKey, len(ks.keys))
	for _, k := range ks.keys {
		parsed[k.jwk.KeyID] = k.jwk
	}
	ks.mu.RUnlock()
	active := map[string]jose.JSONWebKey{}
	keys := make([]loadedKey, 0, len(stored))
	for _, s := range stored {
		jwk, ok := parsed[s.KID]
		if !ok {
			priv, _, err := openKey(ks.seal, s)
			if errors.Is(err, ErrSealBroken) && s.RetiredAt != nil {
				// Sealed under another system secret, and retired: after
				// the secret changed, `keys rotate` retired the keys it
				// can no longer open (docs/decisions.md). Not published.
				slog.Warn("a retired signing key does not open under the system secret; it is not published", "kid", s.KID)
				continue
			}
			if err != nil {
				return fmt.Errorf("signing key %s: %w", s.KID, err)
			}
			jwk = jose.JSONWebKey{Key: priv, KeyID: s.KID, Algorithm: s.Alg, Use: "sig"}
		}
		keys = append(keys, loadedKey{jwk: jwk, retiredAt: s.RetiredAt})
		if _, ok := active[s.Alg]; !ok && s.RetiredAt == nil { // stored is oldest first
			active[s.Alg] = jwk
		}
	}
	ks.mu.Lock()
	ks.active, ks.keys = active, keys
	ks.mu.Unlock()
	return nil
}

// Watch keeps the key set in step with the stored keys until ctx ends: at
// once when this process or (PostgreSQL) another replica announces a
// change, and every KeyReload regardless (a rotation made against SQLite
// by another process, a missed notice).
func (ks *KeySet) Watch(ctx context.Context) {
	t := time.NewTicker(KeyReload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-ks.store.SigningKeysChanged():
		}
		if err := ks.reload(ctx); err != nil && ctx.Err() == nil {
			slog.Warn("reloading signing keys failed; the loaded ones stay in use", "error", err.Error())
		}
	}
}

// Rotate makes a new key per algorithm the signer and retires the keys that
// signed until now; they stay published for the retention window. The key
// set reloads once the context's unit of work has committed.
func (ks *KeySet) Rotate(ctx context.Context) (added []persistence.SigningKey, retired []string, err error) {
	if added, retired, err = RotateKeys(ctx, ks.store, ks.seal); err != nil {
		return nil, nil, err
	}
	ks.store.AfterCommit(ctx, func() {
		// Not ctx: it carries the unit of work, which has ended.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ks.reload(ctx); err != nil {
			slog.Warn("reloading signing keys after a rotation failed; the next reload retries", "error", err.Error())
		}
	})
	return added, retired, nil
}

// RotateKeys stores a new key per algorithm, sealed with seal, as the
// signer and retires the keys that signed until now (`identityd keys
// rotate`, and Rotate).
func RotateKeys(ctx context.Context, store KeyRotator, seal *Sealer) (added []persistence.SigningKey, retired []string, err error) {
	for _, alg := range []string{AlgRS256, AlgES256} {
		k, err := generateKey(alg, seal)
		if err != nil {
			return nil, nil, err
		}
		added = append(added, k)
	}
	if retired, err = store.RotateSigningKeys(ctx, added, time.Now().UTC().Truncate(time.Microsecond)); err != nil {
		return nil, nil, err
	}
	return added, retired, nil
}

// KeyInfo describes a published key: never its private half.
type KeyInfo struct {
	KID            string
	Alg            string
	State          string // KeyActive or KeyRetired
	CreatedAt      time.Time
	RetiredAt      *time.Time
	PublishedUntil *time.Time // retired keys: when it leaves JWKS
}

// List describes the published keys as stored now, oldest first.
func (ks *KeySet) List(ctx context.Context) ([]KeyInfo, error) {
	stored, err := ks.store.SigningKeys(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]KeyInfo, 0, len(stored))
	for _, s := range stored {
		info := KeyInfo{KID: s.KID, Alg: s.Alg, State: KeyActive, CreatedAt: s.CreatedAt, RetiredAt: s.RetiredAt}
		if s.RetiredAt != nil {
			until := s.RetiredAt.Add(ks.window())
			if !now.Before(until) {
				continue // no longer published; the sweep deletes it
			}
			info.State, info.PublishedUntil = KeyRetired, &until
		}
		out = append(out, info)
	}
	return out, nil
}

// Sweep deletes the retired keys whose window has passed by now.
func (ks *KeySet) Sweep(ctx context.Context, now time.Time) (int64, error) {
	return ks.store.DeleteRetiredSigningKeys(ctx, now.Add(-ks.window()))
}

// generateKey makes a key for alg, its private half sealed.
func generateKey(alg string, seal *Sealer) (persistence.SigningKey, error) {
	var priv crypto.Signer
	var err error
	switch alg {
	case AlgRS256:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	case AlgES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return persistence.SigningKey{}, fmt.Errorf("unsupported algorithm %q", alg)
	}
	if err != nil {
		return persistence.SigningKey{}, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return persistence.SigningKey{}, err
	}
	// The key id is the RFC 7638 thumbprint of the public key.
	tp, err := (&jose.JSONWebKey{Key: priv.Public()}).Thumbprint(crypto.SHA256)
	if err != nil {
		return persistence.SigningKey{}, err
	}
	kid := base64.RawURLEncoding.EncodeToString(tp)
	return persistence.SigningKey{
		KID: kid, Alg: alg, PrivateDER: seal.Seal(der, []byte(kid)), CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}, nil
}

// openKey reads a stored private key: sealed, or (stored by an earlier
// version) in clear, which it reports. A key that neither opens nor
// parses is ErrSealBroken: sealed under another system secret, or altered.
func openKey(seal *Sealer, k persistence.SigningKey) (priv any, clear bool, err error) {
	der, err := seal.Open(k.PrivateDER, []byte(k.KID))
	if err != nil {
		if priv, perr := x509.ParsePKCS8PrivateKey(k.PrivateDER); perr == nil {
			return priv, true, nil
		}
		return nil, false, err
	}
	priv, err = x509.ParsePKCS8PrivateKey(der)
	return priv, false, err
}

// sealClearKeys seals, in place, the stored keys an earlier version kept
// in clear. Replicas starting together seal each once: the update applies
// only while the clear form is stored.
func sealClearKeys(ctx context.Context, store KeyStore, seal *Sealer, stored []persistence.SigningKey) error {
	for i, k := range stored {
		if _, clear, err := openKey(seal, k); err != nil || !clear {
			continue // what does not open is reload's to report
		}
		sealed := seal.Seal(k.PrivateDER, []byte(k.KID))
		if _, err := store.ReplaceSigningKeyPrivate(ctx, k.KID, k.PrivateDER, sealed); err != nil {
			return fmt.Errorf("sealing signing key %s: %w", k.KID, err)
		}
		stored[i].PrivateDER = sealed
	}
	return nil
}

// Signer returns the active private key for an algorithm.
func (ks *KeySet) Signer(alg string) (jose.JSONWebKey, bool) {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	k, ok := ks.active[alg]
	return k, ok
}

// PublicJWKS is the JSON Web Key Set published at /.well-known/jwks.json:
// the active keys, and the retired ones within their window.
func (ks *KeySet) PublicJWKS() jose.JSONWebKeySet {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	now := time.Now()
	set := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(ks.keys))}
	for _, k := range ks.keys {
		if k.retiredAt == nil || now.Before(k.retiredAt.Add(ks.retention)) {
			set.Keys = append(set.Keys, k.jwk.Public())
		}
	}
	return set
}
