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
	GrantTokenExchange   = "urn:ietf:params:oauth:grant-type:token-exchange"
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
	Scopes        []string // the mapping's
	Issuer        string   // the token's iss
	Subject       string   // the token's sub
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

// Session extras the exchange sets: the act claim (shown), and, never
// shown, the principals a delegated token depends on and how it came to be.
const (
	ClaimAct            = "act"
	sessionChain        = "identityd_chain"    // [][2]string{client id, principal id} of the subject and earlier actors
	sessionExchange     = "identityd_exchange" // provenance: issuer and subject, or the subject token's client
	sessionSubjectGrant = "identityd_subject_details"
)

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
	session := ar.GetSession().(*fosite.DefaultSession)
	session.Extra = map[string]any{}
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
func (x *tokenExchange) federate(ctx context.Context, ar *fosite.AccessRequest, session *fosite.DefaultSession) ([]string, error) {
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
	ar.Client = client
	session.SetSubject(client.ID)
	session.Extra[sessionExchange] = map[string]any{"issuer": fed.Issuer, "subject": fed.Subject}
	return intersect(fed.Scopes, client.Scopes), nil
}

// delegate checks an agent's exchange of another principal's token and
// returns the scopes, audiences and lifetime the new token may have.
func (x *tokenExchange) delegate(ctx context.Context, ar *fosite.AccessRequest, session *fosite.DefaultSession) ([]string, []string, time.Duration, error) {
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
	subject, subjectChain, err := x.activeToken(ctx, form.Get("subject_token"))
	if err != nil {
		return nil, nil, 0, fosite.ErrInvalidRequest.WithHint("The subject_token is not an active access token.")
	}
	if t := form.Get("actor_token"); t != "" || form.Has("actor_token_type") {
		if form.Get("actor_token_type") != TokenTypeAccessToken {
			return nil, nil, 0, fosite.ErrInvalidRequest.WithHint("An actor_token needs actor_token_type '" + TokenTypeAccessToken + "'.")
		}
		actor, _, err := x.activeToken(ctx, t)
		if err != nil || actor.GetClient().GetID() != client.ID {
			return nil, nil, 0, fosite.ErrInvalidRequest.WithHint("The actor_token must be an active access token of the authenticated client.")
		}
	}
	subjectSession := subject.GetSession().(*fosite.DefaultSession)
	prior, _ := subjectSession.Extra[ClaimAct].(map[string]any)
	if depth := actDepth(prior) + 1; depth > x.maxDepth {
		return nil, nil, 0, fosite.ErrInvalidRequest.WithHintf("The delegation chain would be %d hops long; at most %d are allowed.", depth, x.maxDepth)
	}
	act := map[string]any{"sub": client.ID}
	if prior != nil {
		act[ClaimAct] = prior
	}
	sc := subject.GetClient().(*persistence.Client)
	chain := append(subjectChain, [2]string{sc.ID, sc.PrincipalID})
	session.SetSubject(subjectSession.GetSubject())
	session.Extra[ClaimAct] = act
	session.Extra[sessionChain] = chain
	session.Extra[sessionExchange] = map[string]any{"subjectClientId": sc.ID}
	// grantDetails narrows or inherits these; none is an empty list, so
	// that nothing can be added to what the subject token holds.
	inherited, _ := subjectSession.Extra[ClaimAuthorizationDetails].([]any)
	session.Extra[sessionSubjectGrant] = append([]any{}, inherited...)
	// The new token lives no longer than the one it derives from.
	lifetime := min(x.ttl, time.Until(subjectSession.GetExpiresAt(fosite.AccessToken)))
	var aud []string
	if ga := subject.GetGrantedAudience(); len(ga) > 0 {
		aud = ga
	}
	return intersect(subject.GetGrantedScopes(), client.Scopes), aud, lifetime, nil
}

// activeToken returns an access token's request as introspection sees it
// (active, its chain intact, narrowed to its client now), and the chain of
// principals it depends on.
func (x *tokenExchange) activeToken(ctx context.Context, token string) (fosite.Requester, [][2]string, error) {
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
	chain := chainOf(stored.GetSession().(*fosite.DefaultSession).Extra[sessionChain])
	narrowToClient(stored, x.details, links...)
	return stored, chain, nil
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
	if ds, ok := req.GetSession().(*fosite.DefaultSession); ok {
		if x, ok := ds.Extra[sessionExchange]; ok {
			facts["exchange"] = x
		}
		if act, ok := ds.Extra[ClaimAct]; ok {
			facts["act"] = act
		}
	}
	return facts
}

// chainClients returns, as they are now, the principals a delegated token
// depends on (its subject token's client and the earlier actors), checking
// that each still exists as the same principal: killing, recovering or
// deleting any of them ends the token (fosite.ErrNotFound).
func chainClients(ctx context.Context, store fosite.ClientManager, req fosite.Requester) ([]*persistence.Client, error) {
	ds, ok := req.GetSession().(*fosite.DefaultSession)
	if !ok {
		return nil, nil
	}
	var out []*persistence.Client
	for _, link := range chainOf(ds.Extra[sessionChain]) {
		c, err := store.GetClient(ctx, link[0])
		if err != nil {
			return nil, err
		}
		if c.(*persistence.Client).PrincipalID != link[1] {
			return nil, fosite.ErrNotFound
		}
		out = append(out, c.(*persistence.Client))
	}
	return out, nil
}

// chainOf reads a session's chain, as stored ([][2]string) or as decoded
// from the database ([]any of []any).
func chainOf(v any) [][2]string {
	switch v := v.(type) {
	case [][2]string:
		return slices.Clone(v)
	case []any:
		out := make([][2]string, 0, len(v))
		for _, link := range v {
			pair, _ := link.([]any)
			if len(pair) != 2 {
				continue
			}
			a, _ := pair[0].(string)
			b, _ := pair[1].(string)
			out = append(out, [2]string{a, b})
		}
		return out
	}
	return nil
}

// actDepth counts the actors in an act claim.
func actDepth(act map[string]any) int {
	n := 0
	for act != nil {
		n++
		act, _ = act[ClaimAct].(map[string]any)
	}
	return n
}

// targets reads audience (RFC 8693 §2.1) and resource (RFC 8707) values:
// both name where the token will be used; a resource is an absolute URI
// without a fragment.
func targets(form url.Values) ([]string, error) {
	out := fosite.GetAudiences(form)
	for _, r := range form["resource"] {
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
