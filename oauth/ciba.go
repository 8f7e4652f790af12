package oauth

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/handler/openid"

	"github.com/identityd/identityd/persistence"
)

// OpenID Connect Client-Initiated Backchannel Authentication (CIBA Core
// 1.0), poll mode (issue 16): a user-delegated agent asks for a person's
// delegation at the backchannel endpoint (handlers, extensions/ciba), the
// person decides on a hosted page, and the agent polls the token endpoint
// with the auth_req_id. The polling half is a token-endpoint handler
// modelled on RFC 8628's device-code grant (fosite's later rfc8628
// package): every poll before the decision answers authorization_pending,
// one too soon slow_down, then the token or why not.

// GrantCIBA is CIBA's grant type (CIBA Core §10.1).
const GrantCIBA = persistence.GrantCIBA

// CIBA's token errors (CIBA Core §11), beside RFC 6749's.
var (
	ErrAuthorizationPending = &fosite.RFC6749Error{ErrorField: "authorization_pending", CodeField: http.StatusBadRequest,
		DescriptionField: "The person has not yet decided the authentication request."}
	ErrSlowDown = &fosite.RFC6749Error{ErrorField: "slow_down", CodeField: http.StatusBadRequest,
		DescriptionField: "The request is pending and polled too often: wait at least interval seconds longer."}
	ErrExpiredToken = &fosite.RFC6749Error{ErrorField: "expired_token", CodeField: http.StatusBadRequest,
		DescriptionField: "The auth_req_id has expired: the person did not decide in time."}
	ErrCIBAAccessDenied = &fosite.RFC6749Error{ErrorField: "access_denied", CodeField: http.StatusBadRequest,
		DescriptionField: "The person denied the authentication request."}
)

// PollAnswer tells whether err is a poll's answer about the request's
// state (pending, slow_down, denied, expired), whose bookkeeping (the
// poll's time, a lapsed request's expiry) is kept, unlike a refusal of
// the poll itself.
func PollAnswer(err error) bool {
	for _, e := range []*fosite.RFC6749Error{ErrAuthorizationPending, ErrSlowDown, ErrExpiredToken, ErrCIBAAccessDenied} {
		if fosite.ErrorToRFC6749Error(err).ErrorField == e.ErrorField {
			return true
		}
	}
	return false
}

// DelegatedGrant is what an approved delegation gives its agent's token.
type DelegatedGrant struct {
	DelegationID string
	UserID       string
	Scopes       []string
	Details      []any             // authorization_details entries; nil: none asked
	Conditions   []DetailCondition // one per entry
	ExpiresAt    time.Time         // the delegation's end
	AuthTime     time.Time         // when the person approved
}

// Backchannel is the grant's view of delegations (extensions/ciba).
type Backchannel interface {
	// Poll answers a poll of authReqID by client: the grant, spent once,
	// when the person approved; else a CIBA error (ErrAuthorizationPending,
	// ErrSlowDown, ErrCIBAAccessDenied, ErrExpiredToken) or invalid_grant.
	Poll(ctx context.Context, client *persistence.Client, authReqID string) (*DelegatedGrant, error)
}

type cibaGrant struct {
	backchannel Backchannel
	people      People
	helper      *oauth2.HandleHelper
	ids         *openid.IDTokenHandleHelper
	ttl         time.Duration
}

var _ fosite.TokenEndpointHandler = (*cibaGrant)(nil)

func (*cibaGrant) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne(GrantCIBA)
}

// CanSkipClientAuth is false: CIBA Core §10.1 has the client authenticate
// as at any token request.
func (*cibaGrant) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool { return false }

func (g *cibaGrant) HandleTokenEndpointRequest(ctx context.Context, req fosite.AccessRequester) error {
	client, ok := req.GetClient().(*persistence.Client)
	session, sok := req.GetSession().(*Session)
	if !ok || !sok {
		return fosite.ErrServerError.WithDebug("unexpected client or session type")
	}
	if !client.GetGrantTypes().Has(GrantCIBA) {
		// CIBA Core §11: a client not registered for the grant.
		return fosite.ErrUnauthorizedClient.WithHint("Only user-delegated agents may use the CIBA grant.")
	}
	id := req.GetRequestForm().Get("auth_req_id")
	if id == "" {
		return fosite.ErrInvalidRequest.WithHint("The 'auth_req_id' parameter is required.")
	}
	if g.backchannel == nil {
		return fosite.ErrInvalidGrant.WithHint("The auth_req_id is not valid.")
	}
	grant, err := g.backchannel.Poll(ctx, client, id)
	if err != nil {
		return err
	}
	for _, s := range grant.Scopes {
		req.GrantScope(s)
	}
	req.SetRequestedScopes(grant.Scopes)
	session.SetSubject(grant.UserID)
	session.Act = &Actor{Subject: client.ID} // RFC 8693 §4.1: the agent acts for the person
	session.DelegationID = grant.DelegationID
	if grant.Details != nil {
		session.Details = make([]GrantedDetail, len(grant.Details))
		for i := range grant.Details {
			session.Details[i] = GrantedDetail{Entry: grant.Details[i], Condition: grant.Conditions[i]}
		}
	}
	// The token lives no longer than the delegation.
	session.SetExpiresAt(fosite.AccessToken, minTime(time.Now().UTC().Add(g.ttl), grant.ExpiresAt.UTC()))
	if slices.Contains(grant.Scopes, ScopeOpenID) {
		who, err := person(ctx, g.people, grant.UserID)
		if err == ErrPersonGone {
			return fosite.ErrInvalidGrant.WithHint("The person who approved no longer exists or is disabled.")
		} else if err != nil {
			return fosite.ErrServerError.WithWrap(err)
		}
		claims := session.IDTokenClaims()
		claims.Subject = grant.UserID
		claims.AuthTime = grant.AuthTime.UTC()
		claims.RequestedAt = req.GetRequestedAt().UTC()
		setIDClaims(session, who, req.GetGrantedScopes())
	}
	return nil
}

func (g *cibaGrant) PopulateTokenEndpointResponse(ctx context.Context, req fosite.AccessRequester, resp fosite.AccessResponder) error {
	if !g.CanHandleTokenEndpointRequest(ctx, req) {
		return fosite.ErrUnknownRequest
	}
	lifetime := time.Until(req.GetSession().GetExpiresAt(fosite.AccessToken))
	if _, err := g.helper.IssueAccessToken(ctx, lifetime, req, resp); err != nil {
		return err
	}
	if !req.GetGrantedScopes().Has(ScopeOpenID) {
		return nil
	}
	// CIBA Core §10.1.1: with openid, an ID token for the person.
	session := req.GetSession().(*Session)
	session.IDTokenClaims().AccessTokenHash = g.ids.GetAccessTokenHash(ctx, req, resp)
	return g.ids.IssueExplicitIDToken(ctx, lifetime, req, resp)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
