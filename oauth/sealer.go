package oauth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
)

// Sealer encrypts secrets the server must read back (a TOTP secret, unlike
// a client secret, is needed in clear to check a code), AES-256-GCM under a
// key derived from the system secret for one purpose: a copy of the
// database alone reveals none of them. The sealed form is nonce ‖
// ciphertext ‖ tag; the nonce is random (96 bits), which GCM allows for far
// more seals under one key than one purpose makes.
type Sealer struct{ aead cipher.AEAD }

// NewSealer keys a sealer with the key derived for purpose (DeriveKey).
func NewSealer(systemSecret []byte, purpose string) *Sealer {
	block, err := aes.NewCipher(DeriveKey(systemSecret, purpose))
	if err != nil {
		panic(err) // only for a key that is not 16, 24 or 32 bytes; DeriveKey makes 32
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err) // only for a block size other than AES's
	}
	return &Sealer{aead: aead}
}

// Seal encrypts plain, bound to binding (what the sealed value belongs to,
// such as its owner's id): it opens only with the same binding, so a
// sealed value copied to another row is refused.
func (s *Sealer) Seal(plain, binding []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	_, _ = rand.Read(nonce) // never fails: crypto/rand crashes the program rather than return short
	return s.aead.Seal(nonce, nonce, plain, binding)
}

// ErrSealBroken is a sealed value that does not open: altered, sealed under
// another key or purpose, or bound to something else.
var ErrSealBroken = errors.New("sealed value does not open")

// Open decrypts what Seal made with the same binding.
func (s *Sealer) Open(sealed, binding []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, ErrSealBroken
	}
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], binding)
	if err != nil {
		return nil, ErrSealBroken
	}
	return plain, nil
}
