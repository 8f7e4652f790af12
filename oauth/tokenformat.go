package oauth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/token/jwt"

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

const timePrefixLen = persistence.TokenKeyPrefixLen

var _ oauth2.AccessTokenStrategy = orderedAccessTokens{}

func (s orderedAccessTokens) GenerateAccessToken(ctx context.Context, r fosite.Requester) (string, string, error) {
	return withTimePrefix(s.HMACSHAStrategyUnPrefixed.GenerateAccessToken(ctx, r))
}

func (s orderedAccessTokens) AccessTokenSignature(ctx context.Context, token string) string {
	return prefixedSignature(ctx, token, s.HMACSHAStrategyUnPrefixed.AccessTokenSignature)
}

func (s orderedAccessTokens) ValidateAccessToken(ctx context.Context, r fosite.Requester, token string) error {
	return validatePrefixed(ctx, r, token, s.HMACSHAStrategyUnPrefixed.ValidateAccessToken)
}

// orderedCodes is fosite's HMAC strategy for codes and refresh tokens in
// the access tokens' form: the time of issue in front of the token and of
// its stored signature. A new row then lands at the right edge of its
// table's key, as a token's does; with random signatures every sign-in
// wrote a page of that index of its own once the table had grown
// (measured in docs/benchmarks.md). A refresh token issued before this
// form (fosite's "key.signature", the dot right after the key) is read as
// it was: refresh tokens outlive an upgrade.
type orderedCodes struct {
	*oauth2.HMACSHAStrategyUnPrefixed
}

var (
	_ oauth2.AuthorizeCodeStrategy = orderedCodes{}
	_ oauth2.RefreshTokenStrategy  = orderedCodes{}
)

func (s orderedCodes) GenerateAuthorizeCode(ctx context.Context, r fosite.Requester) (string, string, error) {
	return withTimePrefix(s.HMACSHAStrategyUnPrefixed.GenerateAuthorizeCode(ctx, r))
}

func (s orderedCodes) AuthorizeCodeSignature(ctx context.Context, token string) string {
	return prefixedSignature(ctx, token, s.HMACSHAStrategyUnPrefixed.AuthorizeCodeSignature)
}

func (s orderedCodes) ValidateAuthorizeCode(ctx context.Context, r fosite.Requester, token string) error {
	return validatePrefixed(ctx, r, token, s.HMACSHAStrategyUnPrefixed.ValidateAuthorizeCode)
}

func (s orderedCodes) GenerateRefreshToken(ctx context.Context, r fosite.Requester) (string, string, error) {
	return withTimePrefix(s.HMACSHAStrategyUnPrefixed.GenerateRefreshToken(ctx, r))
}

func (s orderedCodes) RefreshTokenSignature(ctx context.Context, token string) string {
	if unprefixed(token) {
		return s.HMACSHAStrategyUnPrefixed.RefreshTokenSignature(ctx, token)
	}
	return prefixedSignature(ctx, token, s.HMACSHAStrategyUnPrefixed.RefreshTokenSignature)
}

func (s orderedCodes) ValidateRefreshToken(ctx context.Context, r fosite.Requester, token string) error {
	if unprefixed(token) {
		return s.HMACSHAStrategyUnPrefixed.ValidateRefreshToken(ctx, r, token)
	}
	return validatePrefixed(ctx, r, token, s.HMACSHAStrategyUnPrefixed.ValidateRefreshToken)
}

// tokenEntropy is the random bytes in the key of every HMAC token fosite
// makes for us (fosite.Config.TokenEntropy).
const tokenEntropy = 32

// unprefixed tells a token in fosite's own form, issued before the time
// prefix: its key (the base64url of tokenEntropy bytes) comes first, and
// the dot right after it.
func unprefixed(token string) bool {
	return strings.IndexByte(token, '.') == base64.RawURLEncoding.EncodedLen(tokenEntropy)
}

// prefixedSignature is the stored signature of a token with the time
// prefix: the prefix and fosite's signature (sig) of the rest.
func prefixedSignature(ctx context.Context, token string, sig func(context.Context, string) string) string {
	if len(token) <= timePrefixLen {
		return ""
	}
	return token[:timePrefixLen] + sig(ctx, token[timePrefixLen:])
}

// validatePrefixed checks with fosite's validate what follows a token's
// time prefix.
func validatePrefixed(ctx context.Context, r fosite.Requester, token string, validate func(context.Context, fosite.Requester, string) error) error {
	if len(token) <= timePrefixLen {
		return fosite.ErrInvalidTokenFormat
	}
	return validate(ctx, r, token[timePrefixLen:])
}

// withTimePrefix puts the time of issue (persistence.TokenKeyPrefix) in
// front of a token and its signature.
func withTimePrefix(token, sig string, err error) (string, string, error) {
	if err != nil {
		return "", "", err
	}
	prefix := persistence.TokenKeyPrefix(time.Now())
	return prefix + token, prefix + sig, nil
}

// accessTokens issues opaque tokens (orderedAccessTokens), or RFC 9068 JWT
// access tokens to applications registered with accessTokenFormat jwt. A
// token's shape tells which it is: a JWT has three parts, an opaque token
// two. Both are stored alike, so revocation, a session's end or the
// person's deletion bite at once on identityd's own API.
type accessTokens struct {
	opaque orderedAccessTokens
	jwt    jwtAccessTokens
}

var _ oauth2.AccessTokenStrategy = accessTokens{}

func (a accessTokens) GenerateAccessToken(ctx context.Context, r fosite.Requester) (string, string, error) {
	if c, ok := r.GetClient().(*persistence.Client); ok && c.App != nil && c.App.AccessTokenFormat == FormatJWT {
		return a.jwt.GenerateAccessToken(ctx, r)
	}
	return a.opaque.GenerateAccessToken(ctx, r)
}

func (a accessTokens) AccessTokenSignature(ctx context.Context, token string) string {
	if isJWT(token) {
		return a.jwt.AccessTokenSignature(ctx, token)
	}
	return a.opaque.AccessTokenSignature(ctx, token)
}

func (a accessTokens) ValidateAccessToken(ctx context.Context, r fosite.Requester, token string) error {
	if isJWT(token) {
		return a.jwt.ValidateAccessToken(ctx, r, token)
	}
	return a.opaque.ValidateAccessToken(ctx, r, token)
}

// FormatJWT is the accessTokenFormat of RFC 9068 JWT access tokens.
const FormatJWT = "jwt"

func isJWT(token string) bool { return strings.Count(token, ".") == 2 }

// jwtAccessTokens are RFC 9068 access tokens (typ at+jwt) signed in the
// application's algorithm. The stored signature is the time of issue (iat,
// as TokenKeyPrefix) and the JWS signature, so that rows keep their order
// and the sweeper's key range holds.
type jwtAccessTokens struct {
	keys   *KeySet
	issuer string
}

func (j jwtAccessTokens) GenerateAccessToken(_ context.Context, r fosite.Requester) (string, string, error) {
	s := r.GetSession()
	iat := time.Now().Truncate(time.Second)
	aud := []string(r.GetGrantedAudience())
	if len(aud) == 0 {
		aud = []string{j.issuer} // identityd's own API is the resource
	}
	claims := map[string]any{
		"iss": j.issuer, "sub": s.GetSubject(), "aud": aud, "client_id": r.GetClient().GetID(),
		"iat": iat.Unix(), "exp": s.GetExpiresAt(fosite.AccessToken).Unix(), "jti": uuid.NewString(),
		"scope": strings.Join(r.GetGrantedScopes(), " "),
	}
	if b, ok := s.(persistence.SSOBound); ok && b.SSOSessionID() != "" {
		claims["sid"] = b.SSOSessionID()
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", "", err
	}
	token, err := keySigner{keys: j.keys, alg: signingAlg(r.GetClient())}.sign(payload, "at+jwt")
	if err != nil {
		return "", "", err
	}
	return token, persistence.TokenKeyPrefix(iat) + token[strings.LastIndexByte(token, '.')+1:], nil
}

// AccessTokenSignature reads iat from the (not yet verified) payload: a
// token altered there finds no row.
func (j jwtAccessTokens) AccessTokenSignature(_ context.Context, token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		IAT int64 `json:"iat"`
	}
	if json.Unmarshal(payload, &c) != nil || c.IAT <= 0 {
		return ""
	}
	return persistence.TokenKeyPrefix(time.Unix(c.IAT, 0)) + parts[2]
}

// ValidateAccessToken verifies the signature with a published key; expiry
// and everything else come from the stored request.
func (j jwtAccessTokens) ValidateAccessToken(ctx context.Context, r fosite.Requester, token string) error {
	if _, err := (keySigner{keys: j.keys}).Decode(ctx, token); err != nil {
		var ve *jwt.ValidationError
		if !errors.As(err, &ve) || !ve.Has(jwt.ValidationErrorExpired) {
			return fosite.ErrInvalidTokenFormat.WithWrap(err)
		}
	}
	if exp := r.GetSession().GetExpiresAt(fosite.AccessToken); !exp.IsZero() && exp.Before(time.Now().UTC()) {
		return fosite.ErrTokenExpired.WithHint("The access token expired.")
	}
	return nil
}
