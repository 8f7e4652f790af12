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

// SecretHasher is a keyed HMAC-SHA-256 digest of server-generated secrets,
// compared in constant time, under a key of its own purpose; for client
// secrets it is the fosite.Hasher. The secrets it hashes carry 256 bits of
// entropy, so a slow password hash would add nothing but latency.
type SecretHasher struct{ key []byte }

var _ fosite.Hasher = (*SecretHasher)(nil)

// Purposes of the secret hashers' keys (HKDF labels, see DeriveKey).
const (
	PurposeClientSecret = "client secret"
	PurposeInviteToken  = "invite token"
)

// NewSecretHasher is the client-secret hasher.
func NewSecretHasher(systemSecret []byte) *SecretHasher {
	return NewHasher(systemSecret, PurposeClientSecret)
}

// NewHasher keys a hasher with the key derived from the system secret for
// one purpose: a digest made for one purpose matches no other.
func NewHasher(systemSecret []byte, purpose string) *SecretHasher {
	return &SecretHasher{key: DeriveKey(systemSecret, purpose)}
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
