package oauth

import (
	"bytes"
	"context"
	"testing"
)

func TestSecretHasher(t *testing.T) {
	ctx := context.Background()
	h := NewSecretHasher([]byte("system secret one, long enough...."))
	hash, err := h.Hash(ctx, []byte("s3cret"))
	if err != nil || len(hash) != 32 {
		t.Fatalf("hash %x %v", hash, err)
	}
	if bytes.Contains(hash, []byte("s3cret")) {
		t.Fatal("hash contains the secret")
	}
	if err := h.Compare(ctx, hash, []byte("s3cret")); err != nil {
		t.Fatalf("right secret refused: %v", err)
	}
	for _, wrong := range []string{"s3cre", "s3cret ", "S3cret", ""} {
		if h.Compare(ctx, hash, []byte(wrong)) == nil {
			t.Errorf("wrong secret %q accepted", wrong)
		}
	}
	// Another system secret gives another hash: a stolen table is useless
	// without the key.
	other := NewSecretHasher([]byte("system secret two, long enough...."))
	if other.Compare(ctx, hash, []byte("s3cret")) == nil {
		t.Fatal("hash verified under another key")
	}
}

func TestDeriveKeySeparatesPurposes(t *testing.T) {
	s := []byte("system secret")
	a, b := DeriveKey(s, "access token"), DeriveKey(s, "client secret")
	if len(a) != 32 || bytes.Equal(a, b) || !bytes.Equal(a, DeriveKey(s, "access token")) {
		t.Fatalf("keys %x %x", a, b)
	}
}

func TestNewSecret(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		s := NewSecret()
		if len(s) != 43 || seen[s] {
			t.Fatalf("secret %q (len %d, repeated %v)", s, len(s), seen[s])
		}
		seen[s] = true
	}
}
