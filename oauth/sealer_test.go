package oauth

import (
	"bytes"
	"errors"
	"testing"
)

func TestSealer(t *testing.T) {
	secret := []byte("a system secret for this test only")
	s := NewSealer(secret, "totp secret")
	plain := []byte("JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP")
	sealed := s.Seal(plain, []byte("user-1"))
	if bytes.Contains(sealed, plain) || len(sealed) != 12+len(plain)+16 {
		t.Fatalf("sealed %d bytes: %x", len(sealed), sealed)
	}
	if again := s.Seal(plain, []byte("user-1")); bytes.Equal(again, sealed) {
		t.Fatal("two seals of one value are equal: the nonce is not fresh")
	}
	got, err := s.Open(sealed, []byte("user-1"))
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open: %q %v", got, err)
	}
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)-1] ^= 1
	for name, c := range map[string]struct {
		s       *Sealer
		sealed  []byte
		binding string
	}{
		"another binding": {s, sealed, "user-2"},
		"another purpose": {NewSealer(secret, "mail outbox"), sealed, "user-1"},
		"another secret":  {NewSealer([]byte("another system secret"), "totp secret"), sealed, "user-1"},
		"altered":         {s, flipped, "user-1"},
		"truncated":       {s, sealed[:20], "user-1"},
		"empty":           {s, nil, "user-1"},
	} {
		if _, err := c.s.Open(c.sealed, []byte(c.binding)); !errors.Is(err, ErrSealBroken) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
