package oauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"

	"github.com/identityd/identityd/persistence"
)

// Token exchange (RFC 8693) in two forms, one fosite handler:
//
//   - workload identity federation: the subject token is a JWT from a
//     registered platform issuer, verified by a Federation (the workload
//     extension), and the token is issued to the agent its subject maps to.
//     No client secret: the handler lets fosite skip client authentication
//     for this form only;
//   - agent-to-agent delegation: an authenticated agent holding a2a_exchange
//     at trust verified or higher exchanges an identityd access token (the
//     subject) for a narrower one of its own, whose act claim (§4.1) says
//     who acts for whom, hop by hop.

// RFC 8693 identifiers.
const (
	GrantTokenExchange   = persistence.GrantTokenExchange
	TokenTypeJWT         = "urn:ietf:params:oauth:token-type:jwt"
	TokenTypeAccessToken = "urn:ietf:params:oauth:token-type:access_token"
)

// ErrInvalidTarget is RFC 8707 §2's error, which RFC 8693 §2.2.2 uses for
// an audience or resource the server will not issue for.
var ErrInvalidTarget = &fosite.RFC6749Error{
	ErrorField:       "invalid_target",
	DescriptionField: "The requested audience or resource is not acceptable.",
	CodeField:        http.StatusBadRequest,
}

// Federated is who a verified platform token stands for.
type Federated struct {
	AgentClientID string
	Scopes        []string  // the mapping's
	Issuer        string    // the token's iss
	Subject       string    // the token's sub
	IssuedAt      time.Time // the token's iat
}

// Federation verifies platform identity tokens.
type Federation interface {
	// Verify checks a subject token against the registered issuers and
	// mappings; a refusal is an RFC 6749 error saying why.
	Verify(ctx context.Context, subjectToken string) (*Federated, error)
}

// DelegationPolicy decides who may exchange another's token.
type DelegationPolicy interface {
	// MayDelegate returns nil when client may act for others, or why not.
	MayDelegate(client *persistence.Client) error
}

// ClaimAct names the act claim (RFC 8693 §4.1) in introspection.
const ClaimAct = "act"

type tokenExchange struct {
	federation Federation
	delegation DelegationPolicy
	strategy   oauth2.AccessTokenStrategy
	store      Storage
	helper     *oauth2.HandleHelper
	ttl        time.Duration
	maxDepth   int
	details    DetailsPolicy
}

var _ fosite.TokenEndpointHandler = (*tokenExchange)(nil)

func (*tokenExchange) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne(GrantTokenExchange)
}

// CanSkipClientAuth is true for the federation form: the platform token is
// the credential.
func (*tokenExchange) CanSkipClientAuth(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetRequestForm().Get("subject_token_type") == TokenTypeJWT
}

func (x *tokenExchange) HandleTokenEndpointRequest(ctx context.Context, req fosite.AccessRequester) error {
	form := req.GetRequestForm()
	if err := requireParams(form, "subject_token", "subject_token_type"); err != nil {
		return err
	}
	if t := form.Get("requested_token_type"); t != "" && t != TokenTypeAccessToken {
		return fosite.ErrInvalidRequest.WithHint(DescriptionText("Only access tokens are issued: requested_token_type '" + t + "' is not supported."))
	}
	audience, err := targets(form)
	if err != nil {
		return err
	}
	ar, ok := req.(*fosite.AccessRequest)
	if !ok {
		return fosite.ErrServerError.WithDebug("unexpected request type")
	}
	session, ok := ar.GetSession().(*Session)
	if !ok {
		return fosite.ErrServerError.WithDebug("unexpected session type")
	}
	lifetime := x.ttl
	var allowed []string      // the scopes the new token may hold
	var permittedAud []string // nil: any audience may be asked for
	switch form.Get("subject_token_type") {
	case TokenTypeJWT:
		if allowed, err = x.federate(ctx, ar, session); err != nil {
			return err
		}
	case TokenTypeAccessToken:
		if allowed, permittedAud, lifetime, err = x.delegate(ctx, ar, session); err != nil {
			return err
		}
	default:
		return fosite.ErrInvalidRequest.WithHint(DescriptionText("subject_token_type must be '" + TokenTypeJWT + "' (a platform identity token) or '" +
			TokenTypeAccessToken + "' (an identityd access token)."))
	}

	requested := ar.GetRequestedScopes()
	if len(requested) == 0 {
		requested = allowed
	}
	for _, s := range requested {
		if !slices.Contains(allowed, s) {
			return fosite.ErrInvalidScope.WithHint(DescriptionText("The scope '" + s + "' is not available to this exchange."))
		}
	}
	ar.SetRequestedScopes(requested)
	for _, s := range requested {
		ar.GrantScope(s)
	}
	if len(audience) == 0 {
		audience = permittedAud // a delegated token keeps its subject's audience
	}
	for _, a := range audience {
		if permittedAud != nil && !slices.Contains(permittedAud, a) {
			return ErrInvalidTarget.WithHint(DescriptionText("The audience '" + a + "' is not among the subject token's."))
		}
		ar.GrantAudience(a)
	}
	session.SetExpiresAt(fosite.AccessToken, time.Now().UTC().Add(lifetime))
	return nil
}

// federate checks a platform token and makes its mapped agent the client.
func (x *tokenExchange) federate(ctx context.Context, ar *fosite.AccessRequest, session *Session) ([]string, error) {
	form := ar.GetRequestForm()
	if r, ok := ctx.Value(fosite.RequestContextKey).(*http.Request); ok {
		if _, _, basic := r.BasicAuth(); basic || form.Has("client_secret") {
			return nil, fosite.ErrInvalidRequest.WithHint("A workload identity exchange takes no client secret: the subject token is the credential.")
		}
	}
	if x.federation == nil {
		return nil, fosite.ErrInvalidRequest.WithHint("Workload identity federation is not configured.")
	}
	fed, err := x.federation.Verify(ctx, form.Get("subject_token"))
	if err != nil {
		return nil, err
	}
	c, err := x.store.GetClient(ctx, fed.AgentClientID)
	if errors.Is(err, fosite.ErrNotFound) {
		return nil, fosite.ErrInvalidRequest.WithHint("The agent the subject token maps to is not active.")
	} else if err != nil {
		return nil, fosite.ErrServerError.WithWrap(err)
	}
	client := c.(*persistence.Client)
	if id := form.Get("client_id"); id != "" && id != client.ID {
		return nil, fosite.ErrInvalidClient.WithHint("The client_id does not match the agent the subject token maps to.")
	}
	if !client.GetGrantTypes().Has(GrantTokenExchange) {
		return nil, fosite.ErrUnauthorizedClient.WithHint("The client the subject token maps to may not use token exchange.")
	}
	// A platform token from before the agent's last recovery may have been
	// stolen before its kill: never again. iat has whole seconds, so the
	// recovery's own second counts as before.
	if a := client.Agent; a != nil && !a.RecoveredAt.IsZero() && fed.IssuedAt.Before(a.RecoveredAt.Truncate(time.Second).Add(time.Second)) {
		return nil, fosite.ErrInvalidRequest.WithHint("The subject_token was issued before the agent it maps to was last recovered; use a fresh one.")
	}
	ar.Client = client
	session.SetSubject(client.ID)
	session.Exchange = &Provenance{Issuer: fed.Issuer, Subject: fed.Subject}
	return intersect(fed.Scopes, client.Scopes), nil
}

// delegate checks an agent's exchange of another principal's token and
// returns the scopes, audiences and lifetime the new token may have.
func (x *tokenExchange) delegate(ctx context.Context, ar *fosite.AccessRequest, session *Session) ([]string, []string, time.Duration, error) {
	form := ar.GetRequestForm()
	client, ok := ar.GetClient().(*persistence.Client)
	if !ok {
		return nil, nil, 0, fosite.ErrInvalidClient
	}
	if x.delegation == nil {
		return nil, nil, 0, fosite.ErrUnauthorizedClient.WithHint("Token exchange between agents is not configured.")
	}
	if err := x.delegation.MayDelegate(client); err != nil {
		return nil, nil, 0, err
	}
	if !client.GetGrantTypes().Has(GrantTokenExchange) {
		return nil, nil, 0, fosite.ErrUnauthorizedClient.WithHint("The client may not use token exchange.")
	}
	subject, subjectChain, err := x.activeToken(ctx, form.Get("subject_token"))
	if err != nil {
		return nil, nil, 0, fosite.ErrInvalidRequest.WithHint("The subject_token is not an active access token.")
	}
	if t := form.Get("actor_token"); t != "" || form.Get("actor_token_type") != "" {
		if form.Get("actor_token_type") != TokenTypeAccessToken {
			return nil, nil, 0, fosite.ErrInvalidRequest.WithHint("An actor_token needs actor_token_type '" + TokenTypeAccessToken + "'.")
		}
		actor, _, err := x.activeToken(ctx, t)
		if err != nil || actor.GetClient().GetID() != client.ID {
			return nil, nil, 0, fosite.ErrInvalidRequest.WithHint("The actor_token must be an active access token of the authenticated client.")
		}
	}
	subjectSession := subject.GetSession().(*Session)
	act := &Actor{Subject: client.ID, Act: subjectSession.Act}
	if depth := act.depth(); depth > x.maxDepth {
		return nil, nil, 0, fosite.ErrInvalidRequest.WithHintf("The delegation chain would be %d hops long; at most %d are allowed.", depth, x.maxDepth)
	}
	sc := subject.GetClient().(*persistence.Client)
	session.SetSubject(subjectSession.GetSubject())
	session.Act = act
	session.Chain = append(subjectChain, ChainLink{ClientID: sc.ID, PrincipalID: sc.PrincipalID})
	session.Exchange = &Provenance{SubjectClientID: sc.ID}
	session.DelegationID = subjectSession.DelegationID // a person's delegation binds every token derived from it
	session.SessionID = subjectSession.SessionID       // and so does a person's SSO session: ended, signed out or disabled
	session.DelegationEnds = subjectSession.DelegationEnds
	// grantDetails narrows or inherits the entries the subject token holds
	// now; none is an empty list, so that nothing can be added to them.
	session.delegated = true
	session.inherited = []any{}
	if held, ok := subjectSession.claims[ClaimAuthorizationDetails].([]any); ok {
		session.inherited = held
	}
	// The new token lives no longer than the one it derives from.
	lifetime := min(x.ttl, time.Until(subjectSession.GetExpiresAt(fosite.AccessToken)))
	var aud []string
	if ga := subject.GetGrantedAudience(); len(ga) > 0 {
		aud = ga
	}
	return intersect(subject.GetGrantedScopes(), client.Scopes), aud, lifetime, nil
}

// activeToken returns an access token's request as introspection sees it
// (active, its chain intact, narrowed to what its principals hold now), and
// the chain of principals it depends on.
func (x *tokenExchange) activeToken(ctx context.Context, token string) (fosite.Requester, []ChainLink, error) {
	stored, err := x.store.GetAccessTokenSession(ctx, x.strategy.AccessTokenSignature(ctx, token), NewSession())
	if err != nil {
		return nil, nil, err
	}
	if err := x.strategy.ValidateAccessToken(ctx, stored, token); err != nil {
		return nil, nil, err
	}
	links, err := chainClients(ctx, x.store, stored)
	if err != nil {
		return nil, nil, err
	}
	narrow(stored, x.details, links)
	return stored, stored.GetSession().(*Session).Chain, nil
}

func (x *tokenExchange) PopulateTokenEndpointResponse(ctx context.Context, req fosite.AccessRequester, resp fosite.AccessResponder) error {
	if !x.CanHandleTokenEndpointRequest(ctx, req) {
		return fosite.ErrUnknownRequest
	}
	if _, err := x.helper.IssueAccessToken(ctx, x.ttl, req, resp); err != nil {
		return err
	}
	resp.SetExtra("issued_token_type", TokenTypeAccessToken)
	return nil
}

// GrantFacts describes an issued token for the audit trail: its grant,
// scopes and authorization_details, and for an exchange what it was based
// on (the platform token's issuer and subject, or the subject token's
// client and the act claim).
func GrantFacts(req fosite.AccessRequester) map[string]any {
	facts := map[string]any{"grantType": strings.Join(req.GetGrantTypes(), " "), "scopes": []string(req.GetGrantedScopes())}
	if d := GrantedDetails(req); d != nil {
		facts["authorizationDetails"] = d
	}
	if s, ok := req.GetSession().(*Session); ok {
		if s.Exchange != nil {
			facts["exchange"] = s.Exchange
		}
		if s.Act != nil {
			facts["act"] = s.Act
		}
		if s.DelegationID != "" {
			facts["delegationId"] = s.DelegationID
		}
	}
	return facts
}

// chainClients returns, as they are now, the principals a delegated token
// depends on (its subject token's client and the earlier actors), checking
// that each still exists as the same principal: killing, recovering or
// deleting any of them ends the token (fosite.ErrNotFound).
func chainClients(ctx context.Context, store fosite.ClientManager, req fosite.Requester) ([]*persistence.Client, error) {
	s, ok := req.GetSession().(*Session)
	if !ok {
		return nil, fosite.ErrServerError.WithDebug("unexpected session type")
	}
	out := make([]*persistence.Client, 0, len(s.Chain))
	for _, link := range s.Chain {
		c, err := store.GetClient(ctx, link.ClientID)
		if err != nil {
			return nil, err
		}
		if c.(*persistence.Client).PrincipalID != link.PrincipalID {
			return nil, fosite.ErrNotFound
		}
		out = append(out, c.(*persistence.Client))
	}
	return out, nil
}

// targets reads audience (RFC 8693 §2.1) and resource (RFC 8707) values:
// both name where the token will be used; a resource is an absolute URI
// without a fragment.
func targets(form url.Values) ([]string, error) {
	var out []string
	for _, a := range form["audience"] { // each value one audience, spaces and all (RFC 8693 §2.1)
		if a != "" {
			out = append(out, a)
		}
	}
	for _, r := range form["resource"] {
		if r == "" {
			continue // an empty parameter is an omitted one (RFC 6749 §3.2)
		}
		u, err := url.Parse(r)
		if err != nil || !u.IsAbs() || u.Fragment != "" {
			return nil, ErrInvalidTarget.WithHint(DescriptionText("The resource '" + r + "' is not an absolute URI without a fragment."))
		}
		out = append(out, r)
	}
	return out, nil
}

func requireParams(form url.Values, names ...string) error {
	for _, n := range names {
		if form.Get(n) == "" {
			return fosite.ErrInvalidRequest.WithHint(fmt.Sprintf("The '%s' parameter is required.", n))
		}
	}
	return nil
}

func intersect(a, b []string) []string {
	out := []string{}
	for _, s := range a {
		if slices.Contains(b, s) && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
