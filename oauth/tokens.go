package oauth

import (
	"context"
	"errors"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"

	"github.com/identityd/identityd/persistence"
)

// identityd issues access tokens only (no refresh tokens, no codes yet), so
// introspection and revocation are the access-token halves of fosite's
// CoreValidator and TokenRevocationHandler, asking for no more storage than
// that.

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
	narrowToClient(stored, v.details, chain...)
	for _, s := range scopes {
		if !fosite.ExactScopeStrategy(stored.GetGrantedScopes(), s) {
			return "", fosite.ErrInvalidScope.WithHintf("The token was not granted scope '%s'.", s)
		}
	}
	ar.Merge(stored)
	return fosite.AccessToken, nil
}

// narrowToClient makes a token mean no more than its client may hold now: its
// scopes shrink to those the client (and, for a delegated token, every
// principal of its chain) still has (a scope removed from a
// service account, or an agent demoted or stripped of a capability, bites at
// once), its authorization_details to the entries whose conditions the
// client still meets, and an agent's token carries the agent's current
// identity claims; a delegated token keeps its act claim. The session's extras are rebuilt from these alone:
// introspection returns them at the top level.
func narrowToClient(req fosite.Requester, details DetailsPolicy, chain ...*persistence.Client) {
	client, ok := req.GetClient().(*persistence.Client)
	r, isReq := req.(*fosite.Request)
	if !ok || !isReq {
		return
	}
	effective := make(fosite.Arguments, 0, len(r.GrantedScope))
	for _, s := range r.GrantedScope {
		if client.GetScopes().Has(s) && chainHolds(chain, s) {
			effective = append(effective, s)
		}
	}
	r.GrantedScope = effective
	ds, ok := r.GetSession().(*fosite.DefaultSession)
	if !ok {
		return
	}
	var extra map[string]any
	if client.Kind == persistence.KindAgent {
		extra = agentClaims(client)
	}
	if entries, bound := ds.Extra[ClaimAuthorizationDetails]; bound {
		if extra == nil {
			extra = map[string]any{}
		}
		extra[ClaimAuthorizationDetails] = heldDetails(details, client, entries, ds.Extra[sessionDetailConditions])
	}
	if act, ok := ds.Extra[ClaimAct]; ok {
		if extra == nil {
			extra = map[string]any{}
		}
		extra[ClaimAct] = act
	}
	ds.Extra = extra
}

// chainHolds tells whether every principal of a delegation chain holds
// scope s (true for no chain).
func chainHolds(chain []*persistence.Client, s string) bool {
	for _, c := range chain {
		if !c.GetScopes().Has(s) {
			return false
		}
	}
	return true
}

// agentClaims are what an agent's token says about the agent.
func agentClaims(c *persistence.Client) map[string]any {
	return map[string]any{"agent_id": c.RecordID, "trust_level": c.TrustLevel, "capabilities": c.Capabilities}
}

type accessTokenRevoker struct {
	strategy oauth2.AccessTokenStrategy
	store    oauth2.AccessTokenStorage
}

var _ fosite.RevocationHandler = (*accessTokenRevoker)(nil)

// RevokeToken follows RFC 7009 §2.1–2.2: an unknown or expired token is
// answered with success; a token of another client is refused.
func (r *accessTokenRevoker) RevokeToken(ctx context.Context, token string, _ fosite.TokenType, client fosite.Client) error {
	if token == "" {
		return fosite.ErrInvalidRequest.WithHint("The 'token' parameter is required.")
	}
	signature := r.strategy.AccessTokenSignature(ctx, token)
	stored, err := r.store.GetAccessTokenSession(ctx, signature, nil)
	if errors.Is(err, fosite.ErrNotFound) {
		return nil
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
