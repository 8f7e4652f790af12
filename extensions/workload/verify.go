package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Algorithms a platform token may be signed with: asymmetric only. "none"
// and the HMAC algorithms are refused before any key is looked at (an HMAC
// "signed" with a public key is the classic forgery).
var algorithms = []string{
	oidc.RS256, oidc.RS384, oidc.RS512, oidc.PS256, oidc.PS384, oidc.PS512,
	oidc.ES256, oidc.ES384, oidc.ES512, oidc.EdDSA,
}

// clockSkew is how far exp, nbf and iat may be off our clock.
const clockSkew = 60 * time.Second

// keysFor returns the key set of an issuer as it is now: a changed URL or
// key set location starts a new one.
func (s *Service) keysFor(is *persistence.WorkloadIssuer) *keySet {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.sets[is.ID]; ks != nil && ks.issuerURL == is.IssuerURL && ks.jwksURI == is.JWKSURI {
		return ks
	}
	ks := &keySet{issuerURL: is.IssuerURL, jwksURI: is.JWKSURI, client: s.client, now: func() time.Time { return s.now() }}
	s.sets[is.ID] = ks
	return ks
}

// refuse is the RFC 8693 §2.2.2 answer to an unacceptable subject token.
func refuse(format string, args ...any) error {
	return fosite.ErrInvalidRequest.WithHint(oauth.DescriptionText("The subject_token is not acceptable: " + fmt.Sprintf(format, args...)))
}

// claims are the registered claims a platform token is judged by.
type claims struct {
	Issuer    string          `json:"iss"`
	Subject   string          `json:"sub"`
	Audience  json.RawMessage `json:"aud"`
	Expiry    *json.Number    `json:"exp"`
	NotBefore *json.Number    `json:"nbf"`
	IssuedAt  *json.Number    `json:"iat"`
}

// Verify implements oauth.Federation. In order: a JWT signed with an
// asymmetric algorithm; a registered issuer; a signature by one of the
// issuer's keys; an allowed audience; exp, nbf and iat within our clock's
// skew, and no older than the issuer allows; an allowed subject with a
// mapping.
func (s *Service) Verify(ctx context.Context, raw string) (*oauth.Federated, error) {
	jws, err := jose.ParseSigned(raw, toJOSE(algorithms))
	if err != nil {
		return nil, refuse("it must be a JWT signed with an asymmetric algorithm (%s).", strings.Join(algorithms, ", "))
	}
	var unverified claims
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &unverified); err != nil {
		return nil, refuse("its payload is not a JSON object of claims.")
	}
	issuers, err := s.store.WorkloadIssuers(ctx)
	if err != nil {
		return nil, fosite.ErrServerError.WithWrap(err)
	}
	is := issuers[unverified.Issuer]
	if is == nil {
		return nil, refuse("the issuer %q is not registered.", unverified.Issuer)
	}
	payload, err := s.keysFor(is).verify(ctx, jws)
	switch {
	case err != nil && (errors.Is(err, errKeysUnavailable) || ctx.Err() != nil):
		return nil, fosite.ErrTemporarilyUnavailable.WithHint(oauth.DescriptionText("The keys of " + is.IssuerURL + " could not be read; retry later.")).WithWrap(err)
	case err != nil:
		return nil, refuse("its signature could not be verified with the keys of %s.", is.IssuerURL)
	}
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil || c.Issuer != is.IssuerURL {
		return nil, refuse("its claims could not be read.")
	}
	audience, err := audiences(c.Audience)
	if err != nil {
		return nil, refuse("its aud claim is neither a string nor an array of strings.")
	}
	if !slices.ContainsFunc(audience, func(a string) bool { return slices.Contains(is.AllowedAudiences, a) }) {
		return nil, refuse("its audience %q is not among the issuer's allowed audiences.", strings.Join(audience, " "))
	}
	now := s.now()
	exp, err1 := unixTime(c.Expiry)
	iat, err2 := unixTime(c.IssuedAt)
	nbf, err3 := unixTime(c.NotBefore)
	switch {
	case err1 != nil || exp.IsZero():
		return nil, refuse("it has no valid exp claim.")
	case now.After(exp.Add(clockSkew)):
		return nil, refuse("it expired at %s.", exp.UTC().Format(time.RFC3339))
	case err3 != nil || now.Add(clockSkew).Before(nbf):
		return nil, refuse("it is not yet valid (nbf).")
	case err2 != nil || iat.IsZero():
		return nil, refuse("it has no valid iat claim.")
	case now.Add(clockSkew).Before(iat):
		return nil, refuse("it was issued in the future (iat).")
	case now.Sub(iat) > time.Duration(is.MaxTokenAgeSeconds)*time.Second:
		return nil, refuse("it is too old: issued %s ago, the issuer allows %ds.", now.Sub(iat).Round(time.Second), is.MaxTokenAgeSeconds)
	case c.Subject == "":
		return nil, refuse("it has no sub claim.")
	case !extensions.ValidText(c.Subject): // the stores hold no NUL
		return nil, refuse("its sub claim holds a NUL character.")
	case !slices.ContainsFunc(is.AllowedSubjects, func(p string) bool { return matchGlob(p, c.Subject) }):
		return nil, refuse("its subject %q is not among the issuer's allowed subjects.", c.Subject)
	}
	m, err := s.store.WorkloadMappingFor(ctx, is.ID, c.Subject)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, refuse("no mapping maps its subject %q to an agent.", c.Subject)
	} else if err != nil {
		return nil, fosite.ErrServerError.WithWrap(err)
	}
	return &oauth.Federated{AgentClientID: m.AgentClientID, Scopes: m.Scopes, Issuer: is.IssuerURL, Subject: c.Subject, IssuedAt: iat}, nil
}

var _ oauth.Federation = (*Service)(nil)

// audiences reads an aud claim: one string or an array of them (RFC 7519 §4.1.3).
func audiences(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	err := json.Unmarshal(raw, &many)
	return many, err
}

// unixTime reads a NumericDate (RFC 7519 §2: seconds, possibly fractional);
// absent is the zero time.
func unixTime(n *json.Number) (time.Time, error) {
	if n == nil {
		return time.Time{}, nil
	}
	f, err := n.Float64()
	if err != nil || f < 0 || f > 1e11 {
		return time.Time{}, errors.New("not a NumericDate")
	}
	return time.Unix(0, int64(f*float64(time.Second))), nil
}

// matchGlob tells whether s matches pattern, where '*' stands for any run of
// characters (none included) and every other character for itself.
func matchGlob(pattern, s string) bool {
	first, rest, star := strings.Cut(pattern, "*")
	if !star {
		return pattern == s
	}
	if !strings.HasPrefix(s, first) {
		return false
	}
	s = s[len(first):]
	parts := strings.Split(rest, "*")
	last := parts[len(parts)-1]
	for _, p := range parts[:len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}

func toJOSE(algs []string) []jose.SignatureAlgorithm {
	out := make([]jose.SignatureAlgorithm, len(algs))
	for i, a := range algs {
		out[i] = jose.SignatureAlgorithm(a)
	}
	return out
}
