package oauth

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"

	"github.com/ory/fosite"
)

// NewSecret returns 256 bits from crypto/rand, base64url without padding
// (43 characters): the form of every bearer-style secret identityd issues.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails: crypto/rand crashes the program rather than return short
	return base64.RawURLEncoding.EncodeToString(b)
}

// DeriveKey derives a 32-byte key for one purpose from the system secret
// (HKDF-SHA-256), so that no two uses share a key.
func DeriveKey(systemSecret []byte, purpose string) []byte {
	key, err := hkdf.Key(sha256.New, systemSecret, nil, "identityd "+purpose, 32)
	if err != nil {
		panic(err) // only for lengths beyond HKDF's limit, far above 32 bytes
	}
	return key
}

// SecretHasher is the fosite.Hasher for client secrets: a keyed
// HMAC-SHA-256 digest, compared in constant time. Client secrets are
// server-generated with 256 bits of entropy, so a slow password hash would
// add nothing but latency at the token endpoint.
type SecretHasher struct{ key []byte }

var _ fosite.Hasher = (*SecretHasher)(nil)

// NewSecretHasher keys the hasher with a key derived from the system secret.
func NewSecretHasher(systemSecret []byte) *SecretHasher {
	return &SecretHasher{key: DeriveKey(systemSecret, "client secret")}
}

var errSecretMismatch = errors.New("client secret does not match")

// Hash implements fosite.Hasher.
func (h *SecretHasher) Hash(_ context.Context, data []byte) ([]byte, error) {
	return h.digest(data), nil
}

// Compare implements fosite.Hasher.
func (h *SecretHasher) Compare(_ context.Context, hash, data []byte) error {
	if !hmac.Equal(hash, h.digest(data)) {
		return errSecretMismatch
	}
	return nil
}

func (h *SecretHasher) digest(data []byte) []byte {
	m := hmac.New(sha256.New, h.key)
	m.Write(data)
	return m.Sum(nil)
}
