package oauth

import (
	"context"
	"errors"
	"slices"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"

	"github.com/identityd/identityd/persistence"
)

// Introspection is the access-token half of fosite's CoreValidator
// (refresh tokens are not introspected: only their client holds them), and
// revocation is fosite's TokenRevocationHandler narrowed to what RFC 7009
// asks: an access token alone, or a refresh token with its whole family.

type accessTokenValidator struct {
	strategy oauth2.AccessTokenStrategy
	store    Storage
	details  DetailsPolicy
}

var _ fosite.TokenIntrospector = (*accessTokenValidator)(nil)

func (v *accessTokenValidator) IntrospectToken(ctx context.Context, token string, _ fosite.TokenUse, ar fosite.AccessRequester, scopes []string) (fosite.TokenUse, error) {
	stored, err := v.store.GetAccessTokenSession(ctx, v.strategy.AccessTokenSignature(ctx, token), ar.GetSession())
	if errors.Is(err, fosite.ErrNotFound) {
		return "", fosite.ErrRequestUnauthorized.WithHint("The access token is not active.")
	} else if err != nil {
		// A store failure is not an inactive token: callers answer 5xx, not 401.
		return "", fosite.ErrServerError.WithWrap(err)
	}
	if err := v.strategy.ValidateAccessToken(ctx, stored, token); err != nil {
		return "", err
	}
	chain, err := chainClients(ctx, v.store, stored)
	if errors.Is(err, fosite.ErrNotFound) {
		return "", fosite.ErrRequestUnauthorized.WithHint("The access token is not active.")
	} else if err != nil {
		return "", fosite.ErrServerError.WithWrap(err)
	}
	if s, ok := stored.GetSession().(*Session); ok && len(s.JITGrants) > 0 {
		// A token carrying just-in-time scopes ends with its grants:
		// revoked, expired, or its agent killed.
		if c, ok := stored.GetClient().(*persistence.Client); !ok || !grantsHold(c, s.JITGrants) {
			return "", fosite.ErrRequestUnauthorized.WithHint("The access token is not active.")
		}
	}
	narrow(stored, v.details, chain)
	for _, s := range scopes {
		if !fosite.ExactScopeStrategy(stored.GetGrantedScopes(), s) {
			return "", fosite.ErrInvalidScope.WithHintf("The token was not granted scope '%s'.", s)
		}
	}
	ar.Merge(stored)
	return fosite.AccessToken, nil
}

// narrow makes a token mean no more than its client, and every principal of
// its delegation chain, may hold now: its scopes shrink to those they all
// still have (a scope removed from a service account, or an agent demoted
// or stripped of a capability, bites at once) and its authorization_details
// to the entries whose conditions they all still meet. What introspection
// shows is rebuilt from these alone: an agent's current identity claims,
// the details held, and a delegated token's act claim.
func narrow(req fosite.Requester, details DetailsPolicy, chain []*persistence.Client) {
	client, ok := req.GetClient().(*persistence.Client)
	r, isReq := req.(*fosite.Request)
	s, isSession := req.GetSession().(*Session)
	if !ok || !isReq || !isSession {
		return
	}
	holders := append([]*persistence.Client{client}, chain...)
	effective := make(fosite.Arguments, 0, len(r.GrantedScope))
	for _, scope := range r.GrantedScope {
		// A person's own scopes (openid, email, ...) in a delegated token
		// are the person's, held while the delegation lives (checked with
		// the token); every other scope also by the agents that hold it.
		if s.DelegationID != "" && slices.Contains(persistence.ApplicationScopes, scope) {
			effective = append(effective, scope)
			continue
		}
		if !slices.ContainsFunc(holders, func(c *persistence.Client) bool { return !c.GetScopes().Has(scope) }) {
			effective = append(effective, scope)
		}
	}
	r.GrantedScope = effective
	claims := map[string]any{}
	if a := client.Agent; a != nil {
		claims["agent_id"], claims["trust_level"], claims["capabilities"] = client.RecordID, a.TrustLevel, a.Capabilities
	}
	if s.Details != nil {
		held := []any{}
		for _, d := range s.Details {
			if details != nil && !slices.ContainsFunc(holders, func(c *persistence.Client) bool { return !details.Holds(c, d.Condition) }) {
				held = append(held, d.Entry)
			}
		}
		claims[ClaimAuthorizationDetails] = held
	}
	if s.Act != nil {
		claims[ClaimAct] = s.Act
	}
	s.claims = claims
}

type accessTokenRevoker struct {
	strategy oauth2.AccessTokenStrategy
	refresh  oauth2.RefreshTokenStrategy
	store    oauth2.TokenRevocationStorage
}

var _ fosite.RevocationHandler = (*accessTokenRevoker)(nil)

// RevokeToken follows RFC 7009 §2.1–2.2: an unknown or expired token is
// answered with success; a token of another client is refused. A refresh
// token takes its family with it (§2.1: the access tokens of its grant).
func (r *accessTokenRevoker) RevokeToken(ctx context.Context, token string, _ fosite.TokenType, client fosite.Client) error {
	if token == "" {
		return fosite.ErrInvalidRequest.WithHint("The 'token' parameter is required.")
	}
	signature := r.strategy.AccessTokenSignature(ctx, token)
	stored, err := r.store.GetAccessTokenSession(ctx, signature, nil)
	if errors.Is(err, fosite.ErrNotFound) {
		return r.revokeRefreshToken(ctx, token, client)
	} else if err != nil {
		return fosite.ErrTemporarilyUnavailable.WithWrap(err)
	}
	if stored.GetClient().GetID() != client.GetID() {
		return fosite.ErrUnauthorizedClient.WithHint("The token was issued to another client.")
	}
	if err := r.store.DeleteAccessTokenSession(ctx, signature); err != nil {
		return fosite.ErrTemporarilyUnavailable.WithWrap(err)
	}
	return nil
}

// revokeRefreshToken revokes the family of a refresh token of client; an
// unknown one is no error.
func (r *accessTokenRevoker) revokeRefreshToken(ctx context.Context, token string, client fosite.Client) error {
	stored, err := r.store.GetRefreshTokenSession(ctx, r.refresh.RefreshTokenSignature(ctx, token), nil)
	if errors.Is(err, fosite.ErrNotFound) {
		return nil
	} else if err != nil && !errors.Is(err, fosite.ErrInactiveToken) {
		return fosite.ErrTemporarilyUnavailable.WithWrap(err)
	}
	if stored.GetClient().GetID() != client.GetID() {
		return fosite.ErrUnauthorizedClient.WithHint("The token was issued to another client.")
	}
	if err := r.store.RevokeRefreshToken(ctx, stored.GetID()); err != nil {
		return fosite.ErrTemporarilyUnavailable.WithWrap(err)
	}
	return nil
}
