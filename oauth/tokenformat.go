package oauth

import (
	"context"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"

	"github.com/identityd/identityd/persistence"
)

// orderedAccessTokens is fosite's HMAC access-token strategy with the time of
// issue in front: token = persistence.TokenKeyPrefix (12 hex digits of Unix
// milliseconds) + fosite's "key.signature". The stored signature keeps the
// same prefix, so new rows land at the right edge of the token table's key
// instead of on a random page (half the commit time, measured), and expired
// rows are a key range. The prefix is not secret and carries no authority:
// change it and the lookup misses; fosite's HMAC still guards the rest.
type orderedAccessTokens struct {
	*oauth2.HMACSHAStrategyUnPrefixed
}

const timePrefixLen = 12

var _ oauth2.AccessTokenStrategy = orderedAccessTokens{}

func (s orderedAccessTokens) GenerateAccessToken(ctx context.Context, r fosite.Requester) (string, string, error) {
	token, sig, err := s.HMACSHAStrategyUnPrefixed.GenerateAccessToken(ctx, r)
	if err != nil {
		return "", "", err
	}
	prefix := persistence.TokenKeyPrefix(time.Now())
	return prefix + token, prefix + sig, nil
}

func (s orderedAccessTokens) AccessTokenSignature(ctx context.Context, token string) string {
	if len(token) <= timePrefixLen {
		return ""
	}
	return token[:timePrefixLen] + s.HMACSHAStrategyUnPrefixed.AccessTokenSignature(ctx, token[timePrefixLen:])
}

func (s orderedAccessTokens) ValidateAccessToken(ctx context.Context, r fosite.Requester, token string) error {
	if len(token) <= timePrefixLen {
		return fosite.ErrInvalidTokenFormat
	}
	return s.HMACSHAStrategyUnPrefixed.ValidateAccessToken(ctx, r, token[timePrefixLen:])
}
