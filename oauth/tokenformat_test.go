package oauth

import (
	"context"
	"testing"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/token/hmac"

	"github.com/identityd/identityd/persistence"
)

// TestOrderedCodes: a code and its stored signature begin with the time of
// issue, later codes sort after earlier ones, and a code whose time was
// changed or dropped finds no row and does not validate.
func TestOrderedCodes(t *testing.T) {
	ctx := context.Background()
	fc := &fosite.Config{GlobalSecret: DeriveKey([]byte("a system secret"), "code and refresh token"), TokenEntropy: tokenEntropy, AuthorizeCodeLifespan: time.Minute}
	codes := orderedCodes{oauth2.NewHMACSHAStrategyUnPrefixed(&hmac.HMACStrategy{Config: fc}, fc)}
	req := fosite.NewRequest()
	req.Session = &fosite.DefaultSession{}

	var sigs []string
	for range 2 {
		before := persistence.TokenKeyPrefix(time.Now())
		code, sig, err := codes.GenerateAuthorizeCode(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		prefix := code[:persistence.TokenKeyPrefixLen]
		if prefix < before || prefix > persistence.TokenKeyPrefix(time.Now()) || sig[:persistence.TokenKeyPrefixLen] != prefix {
			t.Fatalf("code %q, signature %q: want both to begin with the time of issue", code, sig)
		}
		if got := codes.AuthorizeCodeSignature(ctx, code); got != sig {
			t.Fatalf("signature of the code %q, want %q", got, sig)
		}
		if err := codes.ValidateAuthorizeCode(ctx, req, code); err != nil {
			t.Fatal(err)
		}
		later := persistence.TokenKeyPrefix(time.Now().Add(time.Hour)) + code[persistence.TokenKeyPrefixLen:]
		for _, altered := range []string{later, code[persistence.TokenKeyPrefixLen:]} {
			if codes.AuthorizeCodeSignature(ctx, altered) == sig {
				t.Fatalf("%q has the signature of %q", altered, code)
			}
		}
		if err := codes.ValidateAuthorizeCode(ctx, req, code[persistence.TokenKeyPrefixLen:]); err == nil {
			t.Fatal("a code without its time validated")
		}
		sigs = append(sigs, sig)
		time.Sleep(2 * time.Millisecond)
	}
	if sigs[0] >= sigs[1] {
		t.Fatalf("signatures out of order: %q then %q", sigs[0], sigs[1])
	}
	if codes.AuthorizeCodeSignature(ctx, "0123") != "" || codes.ValidateAuthorizeCode(ctx, req, "0123") == nil {
		t.Fatal("a code shorter than its time was accepted")
	}
}

// TestOrderedRefreshTokens: refresh tokens take the codes' form, and one
// issued in fosite's own form before it is still read as it was.
func TestOrderedRefreshTokens(t *testing.T) {
	ctx := context.Background()
	fc := &fosite.Config{GlobalSecret: DeriveKey([]byte("a system secret"), "code and refresh token"), TokenEntropy: tokenEntropy}
	fositeForm := oauth2.NewHMACSHAStrategyUnPrefixed(&hmac.HMACStrategy{Config: fc}, fc)
	tokens := orderedCodes{fositeForm}
	req := fosite.NewRequest()
	req.Session = &fosite.DefaultSession{}

	before := persistence.TokenKeyPrefix(time.Now())
	token, sig, err := tokens.GenerateRefreshToken(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	prefix := token[:persistence.TokenKeyPrefixLen]
	if prefix < before || prefix > persistence.TokenKeyPrefix(time.Now()) || sig[:persistence.TokenKeyPrefixLen] != prefix || unprefixed(token) {
		t.Fatalf("token %q, signature %q: want both to begin with the time of issue", token, sig)
	}
	if got := tokens.RefreshTokenSignature(ctx, token); got != sig {
		t.Fatalf("signature of the token %q, want %q", got, sig)
	}
	if err := tokens.ValidateRefreshToken(ctx, req, token); err != nil {
		t.Fatal(err)
	}
	// Without its time the token is in fosite's form, and its signature is
	// no row's.
	if stripped := token[persistence.TokenKeyPrefixLen:]; tokens.RefreshTokenSignature(ctx, stripped) == sig {
		t.Fatal("the token without its time has its signature")
	}
	if tokens.RefreshTokenSignature(ctx, "0123") != "" || tokens.ValidateRefreshToken(ctx, req, "0123") == nil {
		t.Fatal("a token shorter than its time was accepted")
	}

	// Issued before the time prefix.
	old, oldSig, err := fositeForm.GenerateRefreshToken(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !unprefixed(old) {
		t.Fatalf("fosite's token %q not told apart", old)
	}
	if got := tokens.RefreshTokenSignature(ctx, old); got != oldSig {
		t.Fatalf("signature of an earlier token %q, want %q", got, oldSig)
	}
	if err := tokens.ValidateRefreshToken(ctx, req, old); err != nil {
		t.Fatal(err)
	}
	altered := map[bool]string{true: "B", false: "A"}[old[0] == 'A'] + old[1:] // another key, the same MAC
	if err := tokens.ValidateRefreshToken(ctx, req, altered); err == nil {
		t.Fatal("an altered earlier token validated")
	}
}
