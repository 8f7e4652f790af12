package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/openid"
	"github.com/ory/fosite/token/jwt"

	"github.com/identityd/identityd/persistence"
)

// keySigner is fosite's jwt.Signer over the key set: it signs with the
// active key of one algorithm (kid in the header, so that verifiers find it
// in JWKS) and verifies against every published key.
type keySigner struct {
	keys *KeySet
	alg  string
}

var _ jwt.Signer = keySigner{}

// sign signs payload as a compact JWS of type typ with the active key.
func (k keySigner) sign(payload []byte, typ string) (string, error) {
	key, ok := k.keys.Signer(k.alg)
	if !ok {
		return "", errors.New("no active " + k.alg + " signing key")
	}
	opts := (&jose.SignerOptions{}).WithType(jose.ContentType(typ)).WithHeader(jose.HeaderKey("kid"), key.KeyID)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.SignatureAlgorithm(k.alg), Key: key.Key}, opts)
	if err != nil {
		return "", err
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

// Generate implements jwt.Signer. Header values other than typ are not
// carried: kid and alg are the key's.
func (k keySigner) Generate(_ context.Context, claims jwt.MapClaims, header jwt.Mapper) (string, string, error) {
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", "", err
	}
	typ := "JWT"
	if t, ok := header.ToMap()["typ"].(string); ok && t != "" {
		typ = t
	}
	token, err := k.sign(payload, typ)
	if err != nil {
		return "", "", err
	}
	return token, token[strings.LastIndexByte(token, '.')+1:], nil
}

// Decode implements jwt.Signer: the token verified with the published key
// its kid names (any algorithm); an expired one is a ValidationError with
// ValidationErrorExpired, as fosite's id_token_hint checks expect.
func (k keySigner) Decode(_ context.Context, token string) (*jwt.Token, error) {
	return jwt.Parse(token, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		set := k.keys.PublicJWKS()
		for _, key := range set.Key(kid) {
			if string(t.Method) == key.Algorithm {
				return key.Key, nil
			}
		}
		return nil, errors.New("no published key for this token")
	})
}

// Validate implements jwt.Signer.
func (k keySigner) Validate(ctx context.Context, token string) (string, error) {
	if _, err := k.Decode(ctx, token); err != nil {
		return "", err
	}
	return k.GetSignature(ctx, token)
}

// GetSignature implements jwt.Signer.
func (keySigner) GetSignature(_ context.Context, token string) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", errors.New("header, body and signature must all be set")
	}
	return parts[2], nil
}

// Hash implements jwt.Signer: RS256 and ES256 both hash with SHA-256.
func (keySigner) Hash(_ context.Context, in []byte) ([]byte, error) {
	sum := sha256.Sum256(in)
	return sum[:], nil
}

// GetSigningMethodLength implements jwt.Signer.
func (keySigner) GetSigningMethodLength(context.Context) int { return sha256.Size }

// idTokens is fosite's ID token strategy, in the algorithm each application
// asks for (idTokenSigningAlg; RS256 when it names none).
type idTokens map[string]openid.DefaultStrategy

var _ openid.OpenIDConnectTokenStrategy = idTokens(nil)

func (s idTokens) GenerateIDToken(ctx context.Context, lifespan time.Duration, req fosite.Requester) (string, error) {
	return s[signingAlg(req.GetClient())].GenerateIDToken(ctx, lifespan, req)
}

// signingAlg is the algorithm an application's tokens are signed with.
func signingAlg(c fosite.Client) string {
	if pc, ok := c.(*persistence.Client); ok && pc.App != nil && pc.App.IDTokenSigningAlg == AlgES256 {
		return AlgES256
	}
	return AlgRS256
}
