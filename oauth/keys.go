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
	"fmt"
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
	SigningKeys(ctx context.Context) ([]persistence.SigningKey, error)
	CreateSigningKey(ctx context.Context, k persistence.SigningKey) error
}

// KeySet holds the private signing keys. Only their public halves leave the
// server, through JWKS.
type KeySet struct {
	active map[string]jose.JSONWebKey // by algorithm: the key that signs
	all    []jose.JSONWebKey
}

// LoadKeys reads the stored signing keys and creates an RS256 and an ES256
// key on first start. When replicas start together each may create one; the
// oldest key of each algorithm signs, so they all agree, and JWKS lists every
// key.
func LoadKeys(ctx context.Context, store KeyStore) (*KeySet, error) {
	stored, err := store.SigningKeys(ctx)
	if err != nil {
		return nil, err
	}
	for _, alg := range []string{AlgRS256, AlgES256} {
		if hasAlg(stored, alg) {
			continue
		}
		k, err := generateKey(alg)
		if err != nil {
			return nil, err
		}
		if err := store.CreateSigningKey(ctx, k); err != nil {
			return nil, err
		}
	}
	if stored, err = store.SigningKeys(ctx); err != nil {
		return nil, err
	}
	ks := &KeySet{active: map[string]jose.JSONWebKey{}}
	for _, s := range stored {
		priv, err := x509.ParsePKCS8PrivateKey(s.PrivateDER)
		if err != nil {
			return nil, fmt.Errorf("signing key %s: %w", s.KID, err)
		}
		jwk := jose.JSONWebKey{Key: priv, KeyID: s.KID, Algorithm: s.Alg, Use: "sig"}
		ks.all = append(ks.all, jwk)
		if _, ok := ks.active[s.Alg]; !ok { // stored is oldest first
			ks.active[s.Alg] = jwk
		}
	}
	return ks, nil
}

func hasAlg(keys []persistence.SigningKey, alg string) bool {
	for _, k := range keys {
		if k.Alg == alg {
			return true
		}
	}
	return false
}

func generateKey(alg string) (persistence.SigningKey, error) {
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
	return persistence.SigningKey{
		KID: base64.RawURLEncoding.EncodeToString(tp), Alg: alg, PrivateDER: der, CreatedAt: time.Now().UTC(),
	}, nil
}

// Signer returns the active private key for an algorithm.
func (ks *KeySet) Signer(alg string) (jose.JSONWebKey, bool) {
	k, ok := ks.active[alg]
	return k, ok
}

// PublicJWKS is the JSON Web Key Set published at /.well-known/jwks.json.
func (ks *KeySet) PublicJWKS() jose.JSONWebKeySet {
	set := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(ks.all))}
	for _, k := range ks.all {
		set.Keys = append(set.Keys, k.Public())
	}
	return set
}
