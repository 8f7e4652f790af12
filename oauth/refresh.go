package oauth

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
)

// Refresh tokens serve two kinds of grant through fosite's one refresh
// handler (RFC 6749 §6), its storage and its rotation: a person's code
// flow (offline_access, OpenID Connect Core §11), and a person's
// delegation to a user-delegated agent (CIBA Core §10.1.1, issue 16),
// whose refresh tokens renew the agent's short access tokens until the
// delegation ends. What differs for a delegation is decided here:
//
//   - its session's scopes narrow, as it is read, to what the agent still
//     holds (the person's claims stay: they are the person's, held while
//     the delegation lives), as its access tokens narrow on every use;
//   - fosite's two scope checks (offline_access granted; every scope held
//     by the client) are the code flow's, and are made for it after
//     fosite's handler (refreshDelegation), since a delegation grants
//     neither offline_access nor the person's claims as client scopes;
//   - the new tokens end no later than the delegation.
//
// The delegation's state (active, before its end, the person active) is
// checked where the refresh token is read (persistence: DelegationBound),
// as for its access tokens, from the lease cache every change that ends it
// evicts on every replica before it answers.

// refreshConfig is fosite's configuration as its refresh handler sees it:
// no refresh-token scope to require (refreshDelegation requires
// offline_access of code flows), and the person's claims accepted beside
// the client's scopes (refreshDelegation keeps them to delegations).
type refreshConfig struct{ *fosite.Config }

func (refreshConfig) GetRefreshTokenScopes(context.Context) []string { return nil }

func (refreshConfig) GetScopeStrategy(context.Context) fosite.ScopeStrategy {
	return func(held []string, scope string) bool {
		return fosite.ExactScopeStrategy(held, scope) || personClaim(scope)
	}
}

// personClaim tells whether scope asks for the person's own claims.
func personClaim(scope string) bool {
	return scope != ScopeOfflineAccess && slices.Contains(persistence.ApplicationScopes, scope)
}

// delegatedRefreshes is the flows' storage as the refresh handler reads
// it: a delegated session comes back narrowed to what its agent still
// holds, so that fosite grants the new tokens no more.
type delegatedRefreshes struct{ persistence.Grouped }

func (d delegatedRefreshes) GetRefreshTokenSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	req, err := d.Grouped.GetRefreshTokenSession(ctx, signature, session)
	if err == nil {
		if s, ok := req.GetSession().(*Session); ok && s.DelegationID != "" {
			narrow(req, nil, nil) // scopes only: the session's claims are made again on use
		}
	}
	return req, err
}

// refreshDelegation runs after fosite's refresh handler has restored the
// session and granted its scopes. The scope a refresh asks for may not go
// beyond them (RFC 6749 §6; fosite v0.49 ignores it): within them, the
// grant is answered whole, its scope said in the answer (§3.3). A code
// flow's refresh must have been
// granted offline_access and every scope must be its client's (fosite's
// own checks, which refreshConfig lifts). A delegation's must still grant
// something, and its new tokens end with the delegation.
type refreshDelegation struct{ refreshStep }

var _ fosite.TokenEndpointHandler = refreshDelegation{}

func (refreshDelegation) HandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) error {
	s, ok := req.GetSession().(*Session)
	if !ok {
		return fosite.ErrServerError.WithDebug("unexpected session type")
	}
	for _, scope := range fosite.RemoveEmpty(strings.Split(req.GetRequestForm().Get("scope"), " ")) {
		if !req.GetGrantedScopes().Has(scope) {
			return fosite.ErrInvalidScope.WithHintf("The scope '%s' was not granted to the refresh token.", scope)
		}
	}
	if s.DelegationID == "" {
		if !req.GetGrantedScopes().Has(ScopeOfflineAccess) {
			return fosite.ErrScopeNotGranted.WithHint("The OAuth 2.0 Client was not granted scope offline_access and may thus not perform the 'refresh_token' authorization grant.")
		}
		for _, scope := range req.GetGrantedScopes() {
			if !fosite.ExactScopeStrategy(req.GetClient().GetScopes(), scope) {
				return fosite.ErrInvalidScope.WithHintf("The OAuth 2.0 Client is not allowed to request scope '%s'.", scope)
			}
		}
		return nil
	}
	end := s.DelegationEnds.UTC()
	if !time.Now().Before(end) {
		return fosite.ErrInvalidGrant.WithHint("The delegation has ended.")
	}
	if len(req.GetGrantedScopes()) == 0 {
		return fosite.ErrInvalidGrant.WithHint("The agent no longer holds any scope the delegation grants.")
	}
	if exp := s.GetExpiresAt(fosite.AccessToken); exp.IsZero() || end.Before(exp) {
		s.SetExpiresAt(fosite.AccessToken, end)
	}
	s.SetExpiresAt(fosite.RefreshToken, end)
	return nil
}

// delegationIDToken runs after fosite's OpenID Connect refresh handler,
// which clears the ID token's expiry so that the new one lives the whole
// ID-token lifetime: a delegation's ID token ends with its access token
// instead (the same lifetime here, but capped at the delegation's end), so
// that nothing the agent is given outlives what the person approved.
type delegationIDToken struct{ refreshStep }

var _ fosite.TokenEndpointHandler = delegationIDToken{}

func (delegationIDToken) HandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) error {
	if s, ok := req.GetSession().(*Session); ok && s.DelegationID != "" {
		s.IDTokenClaims().ExpiresAt = s.GetExpiresAt(fosite.AccessToken)
	}
	return nil
}

// refreshStep is what the handlers that only adjust a refresh grant share:
// they take refresh grants, authenticate the client as fosite's refresh
// handler does, and add nothing to the answer.
type refreshStep struct{}

func (refreshStep) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

func (refreshStep) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool {
	return false
}

func (refreshStep) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne("refresh_token")
}
