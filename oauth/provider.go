// Package oauth composes fosite into identityd's authorization server: the
// provider and its configuration, signing keys, the secret hasher, the scope
// catalog, and the token-endpoint handlers and hooks identityd adds.
package oauth

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
	"github.com/ory/fosite/handler/openid"
	"github.com/ory/fosite/handler/pkce"
	"github.com/ory/fosite/storage"
	"github.com/ory/fosite/token/hmac"

	"github.com/identityd/identityd/persistence"
)

// Storage is what the composed handlers need from the store.
type Storage interface {
	fosite.ClientManager
	oauth2.AccessTokenStorage
	oauth2.AuthorizeCodeStorage
	oauth2.TokenRevocationStorage
	pkce.PKCERequestStorage
	openid.OpenIDConnectRequestStorage
	storage.Transactional
	People
	LongestJWTAccessTTL(ctx context.Context) (time.Duration, error)
	Grouped() persistence.Grouped // the flows' writes, group-committed
}

// People is what ID tokens and userinfo read of the directory.
type People interface {
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	UserRoles(ctx context.Context, userID string) ([]persistence.Role, error)
}

// Config is the part of identityd's configuration the provider reads.
type Config struct {
	Issuer          string
	AccessTokenTTL  time.Duration
	RefreshTokenTTL time.Duration // 0: DefaultRefreshTokenTTL
	CodeTTL         time.Duration // 0: AuthorizeCodeTTL (tests shorten it)
	SystemSecret    []byte
	Details         DetailsPolicy    // authorization_details (RFC 9396); nil refuses them
	Federation      Federation       // workload identity federation; nil refuses it
	Delegation      DelegationPolicy // who may exchange another's token; nil: nobody
	MaxDelegation   int              // actors a delegated token's chain may hold
	Backchannel     Backchannel      // CIBA delegations; nil: every auth_req_id is invalid_grant
	// RefreshReuseGrace is how long after its first use a refresh token
	// still refreshes (an honest retry, see persistence.Grouped's
	// WithReuseGrace); 0: never, its reuse revokes its family at once.
	RefreshReuseGrace time.Duration
}

// Provider is fosite composed with identityd's handlers, plus what the HTTP
// layer needs to describe it (metadata, keys).
type Provider struct {
	fosite.OAuth2Provider
	Issuer  string
	Keys    *KeySet
	Hasher  *SecretHasher
	OnIssue func(ctx context.Context, req fosite.AccessRequester) // called for every token issued; may be nil

	strategy           accessTokens
	refresh            oauth2.RefreshTokenStrategy
	people             People
	store              Storage
	grouped            persistence.Grouped
	authenticateClient fosite.ClientAuthenticationStrategy
	minNonce           int // the shortest nonce fosite puts in an ID token
}

// NewAuthorizeRequest is fosite's with a time-ordered (UUIDv7) request id.
// The id names the family of the code and of every token it leads to, and
// each of their tables indexes it: a random id puts each new entry on a
// random page of those indexes, a time-ordered one at their end, where a
// shared commit's rows share pages (docs/benchmarks.md, passkeys).
//
// It also checks what fosite leaves open: a confidential application's
// loopback redirect URI on another port than registered, and state and
// nonce values beyond MaxStateLength or that the token endpoint would refuse.
func (p *Provider) NewAuthorizeRequest(ctx context.Context, r *http.Request) (fosite.AuthorizeRequester, error) {
	ar, err := p.OAuth2Provider.NewAuthorizeRequest(ctx, r)
	if ar == nil {
		return ar, err
	}
	ar.SetID(uuid.Must(uuid.NewV7()).String())
	// fosite lets a loopback redirect URI of any client use any port (RFC
	// 8252 §7.3), a rule for native apps, which listen on whatever port is
	// free: a confidential (web) application's must be registered exactly.
	if c := ar.GetClient(); c != nil && !c.IsPublic() && ar.IsRedirectURIValid() {
		if v := ar.GetRequestForm().Get("redirect_uri"); v != "" && !slices.Contains(c.GetRedirectURIs(), v) {
			return fosite.NewAuthorizeRequest(), fosite.ErrInvalidRequest.WithHint("The 'redirect_uri' parameter does not match any of the OAuth 2.0 Client's pre-registered redirect urls; only public (native) applications may use any loopback port.")
		}
	}
	// state comes back in the redirect and, with nonce, is stored with the
	// sign-in flow and the code: both are capped before anything is. A
	// state too long is not echoed in the error either.
	if len(ar.GetState()) > MaxStateLength {
		if req, ok := ar.(*fosite.AuthorizeRequest); ok {
			req.State = ""
		}
		return ar, fosite.ErrInvalidRequest.WithHintf("The 'state' parameter must be at most %d bytes.", MaxStateLength)
	}
	// The token endpoint refuses to put a nonce shorter than fosite's
	// minimum entropy in an ID token: refused here, before the person
	// signs in for nothing.
	switch nonce := ar.GetRequestForm().Get("nonce"); {
	case err != nil: // fosite's refusal comes first
	case len(nonce) > MaxStateLength:
		return ar, fosite.ErrInvalidRequest.WithHintf("The 'nonce' parameter must be at most %d bytes.", MaxStateLength)
	case nonce != "" && len(nonce) < p.minNonce:
		return ar, fosite.ErrInvalidRequest.WithHintf("The 'nonce' parameter must be at least %d characters long.", p.minNonce)
	}
	return ar, err
}

// MaxStateLength caps the state and nonce parameters of an authorization
// request, in bytes: far above the 32 to 64 characters clients send, far
// below what would bloat every stored flow and redirect.
const MaxStateLength = 2048

// TokenPath is the token endpoint that metadata advertises; introspection and
// revocation live beside it.
const (
	TokenPath      = "/api/v1/oauth/token"
	IntrospectPath = "/api/v1/oauth/introspect"
	RevokePath     = "/api/v1/oauth/revoke"
	JWKSPath       = "/.well-known/jwks.json"
)

// NewProvider composes fosite explicitly and in order: the handlers that
// prepare a request run before fosite's grant handler, the ones that finish
// its response after it.
func NewProvider(cfg Config, store Storage, keys *KeySet) *Provider {
	hasher := NewSecretHasher(cfg.SystemSecret)
	if cfg.RefreshTokenTTL == 0 {
		cfg.RefreshTokenTTL = DefaultRefreshTokenTTL
	}
	if cfg.CodeTTL == 0 {
		cfg.CodeTTL = AuthorizeCodeTTL
	}
	// A retired key stays published as long as what it signed lives: ID
	// tokens (the access-token lifetime) and JWT access tokens (their
	// application's lifetime, read again at every key reload).
	keys.followLifetime(context.Background(), func(ctx context.Context) (time.Duration, error) {
		longest, err := store.LongestJWTAccessTTL(ctx)
		return max(cfg.AccessTokenTTL, longest), err
	})
	fc := &fosite.Config{
		AccessTokenLifespan:        cfg.AccessTokenTTL,
		RefreshTokenLifespan:       cfg.RefreshTokenTTL,
		AuthorizeCodeLifespan:      cfg.CodeTTL,
		IDTokenLifespan:            cfg.AccessTokenTTL,
		AccessTokenIssuer:          cfg.Issuer,
		IDTokenIssuer:              cfg.Issuer,
		TokenURL:                   cfg.Issuer + TokenPath,
		GlobalSecret:               DeriveKey(cfg.SystemSecret, "access token"),
		TokenEntropy:               tokenEntropy,
		ScopeStrategy:              fosite.ExactScopeStrategy,
		AudienceMatchingStrategy:   fosite.DefaultAudienceMatchingStrategy,
		ClientSecretsHasher:        hasher,
		SendDebugMessagesToClients: false,
		// PKCE with S256 for every application, confidential ones too
		// (RFC 9700 §2.1.1; OAuth 2.1): plain is refused.
		EnforcePKCE:                    true,
		EnablePKCEPlainChallengeMethod: false,
		// A refresh token only with offline_access (OpenID Connect Core §11).
		RefreshTokenScopes:     []string{ScopeOfflineAccess},
		OmitRedirectScopeParam: true,
	}
	opaque := orderedAccessTokens{oauth2.NewHMACSHAStrategyUnPrefixed(&hmac.HMACStrategy{Config: fc}, fc)}
	strategy := accessTokens{opaque: opaque, jwt: jwtAccessTokens{keys: keys, issuer: cfg.Issuer}}
	// Codes and refresh tokens: fosite's HMAC tokens, keyed by their own
	// derived secret; time-ordered (orderedCodes).
	fc2 := *fc
	fc2.GlobalSecret = DeriveKey(cfg.SystemSecret, "code and refresh token")
	codes := orderedCodes{oauth2.NewHMACSHAStrategyUnPrefixed(&hmac.HMACStrategy{Config: &fc2}, &fc2)}
	// The flows' writes join the group commit (persistence.Grouped).
	grouped := store.Grouped()
	p := &Provider{Issuer: cfg.Issuer, Keys: keys, Hasher: hasher, strategy: strategy, refresh: codes, people: store, grouped: grouped,
		minNonce: fc.GetMinParameterEntropy(context.Background())}

	// ID tokens in each application's algorithm.
	ids := idTokens{}
	for _, alg := range []string{AlgRS256, AlgES256} {
		ids[alg] = openid.DefaultStrategy{Signer: keySigner{keys: keys, alg: alg}, Config: fc}
	}
	idHelper := &openid.IDTokenHandleHelper{IDTokenStrategy: ids}
	oidcStore := codeKeyed{store: grouped, codes: codes}
	codeGrant := &oauth2.AuthorizeExplicitGrantHandler{
		AccessTokenStrategy: strategy, RefreshTokenStrategy: codes, AuthorizeCodeStrategy: codes,
		CoreStorage: grouped, TokenRevocationStorage: grouped, Config: fc,
	}
	pkceHandler := &pkce.Handler{AuthorizeCodeStrategy: codes, Storage: grouped, Config: fc}
	oidcCode := &openid.OpenIDConnectExplicitHandler{
		OpenIDConnectRequestStorage:   oidcStore,
		OpenIDConnectRequestValidator: openid.NewOpenIDConnectRequestValidator(keySigner{keys: keys, alg: AlgRS256}, fc),
		Config:                        fc,
		IDTokenHandleHelper:           idHelper,
	}
	// One refresh grant for people's code flows and agents' delegations:
	// a delegated session's scopes are narrowed as it is read
	// (delegatedRefreshes), and refreshDelegation checks what fosite's
	// checks leave to us (refreshConfig). A token used again within the
	// reuse grace window refreshes again.
	refreshGrant := &oauth2.RefreshTokenGrantHandler{
		AccessTokenStrategy: strategy, RefreshTokenStrategy: codes, TokenRevocationStorage: delegatedRefreshes{grouped.WithReuseGrace(cfg.RefreshReuseGrace)},
		Config: refreshConfig{fc},
	}
	fc.AuthorizeEndpointHandlers.Append(codeGrant)
	fc.AuthorizeEndpointHandlers.Append(pkceHandler)
	fc.AuthorizeEndpointHandlers.Append(oidcCode)

	fc.TokenEndpointHandlers.Append(&unsupportedGrant{})
	helper := &oauth2.HandleHelper{AccessTokenStrategy: strategy, AccessTokenStorage: store, Config: fc}
	fc.TokenEndpointHandlers.Append(&clientCredentialsScopes{})
	fc.TokenEndpointHandlers.Append(&tokenExchange{
		federation: cfg.Federation, delegation: cfg.Delegation, strategy: strategy, store: store, helper: helper,
		ttl: cfg.AccessTokenTTL, maxDepth: cfg.MaxDelegation, details: cfg.Details,
	})
	fc.TokenEndpointHandlers.Append(&grantDetails{policy: cfg.Details})
	fc.TokenEndpointHandlers.Append(&oauth2.ClientCredentialsGrantHandler{HandleHelper: helper, Config: fc})
	fc.TokenEndpointHandlers.Append(&cibaGrant{backchannel: cfg.Backchannel, people: store, helper: helper, ids: idHelper, ttl: cfg.AccessTokenTTL,
		refresh: codes, store: store})
	fc.TokenEndpointHandlers.Append(jitScopes{}) // after the grant grants the scopes
	fc.TokenEndpointHandlers.Append(expiryCap{}) // after the grant sets the lifetime
	fc.TokenEndpointHandlers.Append(codeGrant)
	fc.TokenEndpointHandlers.Append(pkceHandler)
	fc.TokenEndpointHandlers.Append(refreshGrant)
	fc.TokenEndpointHandlers.Append(refreshDelegation{})
	fc.TokenEndpointHandlers.Append(&refreshPerson{people: store})
	fc.TokenEndpointHandlers.Append(oidcCode)
	fc.TokenEndpointHandlers.Append(&openid.OpenIDConnectRefreshHandler{IDTokenHandleHelper: idHelper, Config: fc})
	fc.TokenEndpointHandlers.Append(delegationIDToken{}) // after the handler above clears the ID token's expiry
	fc.TokenEndpointHandlers.Append(&responseFinisher{p: p})
	fc.TokenIntrospectionHandlers.Append(&accessTokenValidator{strategy: strategy, store: store, details: cfg.Details})
	fc.RevocationHandlers.Append(&accessTokenRevoker{strategy: strategy, refresh: codes, store: store})

	f := fosite.NewOAuth2Provider(store, fc)
	fc.ClientAuthenticationStrategy = secretAuthentication(f)
	p.authenticateClient = fc.ClientAuthenticationStrategy
	p.OAuth2Provider = f
	p.store = store
	return p
}

// GrantTypes are the grants the token endpoint serves.
var GrantTypes = []string{"client_credentials", GrantTokenExchange, "authorization_code", "refresh_token", GrantCIBA}

// Lifetimes of what people's applications receive.
const (
	// AuthorizeCodeTTL is the spec's code lifetime ("Short-lived tokens and codes").
	AuthorizeCodeTTL = 10 * time.Minute
	// DefaultRefreshTokenTTL is a refresh token's lifetime unless its
	// application names one; each use rotates it and starts it anew.
	DefaultRefreshTokenTTL = 30 * 24 * time.Hour
	// MaxAccessTokenTTL bounds an application's access-token lifetime.
	MaxAccessTokenTTL = persistence.MaxAccessTokenTTL
)

// ScopeOfflineAccess asks for a refresh token (OpenID Connect Core §11).
const ScopeOfflineAccess = "offline_access"

// codeKeyed is the OpenID Connect request storage keyed by the code's
// signature: fosite passes the code itself, which is never stored.
type codeKeyed struct {
	store openid.OpenIDConnectRequestStorage
	codes oauth2.AuthorizeCodeStrategy
}

var _ openid.OpenIDConnectRequestStorage = codeKeyed{}

func (k codeKeyed) CreateOpenIDConnectSession(ctx context.Context, code string, req fosite.Requester) error {
	return k.store.CreateOpenIDConnectSession(ctx, k.codes.AuthorizeCodeSignature(ctx, code), req)
}

func (k codeKeyed) GetOpenIDConnectSession(ctx context.Context, code string, req fosite.Requester) (fosite.Requester, error) {
	return k.store.GetOpenIDConnectSession(ctx, k.codes.AuthorizeCodeSignature(ctx, code), req)
}

func (k codeKeyed) DeleteOpenIDConnectSession(ctx context.Context, code string) error {
	return k.store.DeleteOpenIDConnectSession(ctx, k.codes.AuthorizeCodeSignature(ctx, code))
}

// secretAuthentication narrows fosite's client authentication to the two
// methods identityd offers, client_secret_basic and client_secret_post, and
// answers a request without credentials with invalid_client (RFC 6749 §5.2)
// where fosite would say invalid_request. An empty client_secret is an
// omitted one (RFC 6749 §3.2).
func secretAuthentication(f *fosite.Fosite) fosite.ClientAuthenticationStrategy {
	return func(ctx context.Context, r *http.Request, form url.Values) (fosite.Client, error) {
		if form.Get("client_assertion_type") != "" || form.Get("client_assertion") != "" {
			return nil, fosite.ErrInvalidClient.WithHint("Only client_secret_basic and client_secret_post client authentication are supported.")
		}
		_, _, basic := r.BasicAuth()
		if basic && form.Get("client_secret") != "" {
			// RFC 6749 §2.3: one authentication method per request.
			return nil, fosite.ErrInvalidRequest.WithHint("Use one client authentication method: HTTP Basic or client_secret in the body, not both.")
		}
		if id, ok := ctx.Value(vouchedKey{}).(string); ok && id != "" && !basic && form.Get("client_id") == id && form.Get("client_secret") == "" {
			return f.Store.GetClient(ctx, id) // a sign-in this server verified itself (Vouch)
		}
		if !basic && form.Get("client_id") == "" {
			return nil, fosite.ErrInvalidClient.WithHint("Client authentication is required: HTTP Basic, or client_id and client_secret in the body.")
		}
		c, err := f.DefaultClientAuthenticationStrategy(ctx, r, form)
		if persistence.Unavailable(err) {
			// fosite reads any failed lookup as invalid_client; a client
			// with the right secret must not be told it is wrong.
			return nil, Unavailable(err)
		}
		return c, err
	}
}

type vouchedKey struct{}

// Vouch marks ctx as carrying a token request the server makes itself for
// clientID, whose person it has just verified (a passkey's assertion from
// one of the client's web origins, spec "Passkeys"): the request is the
// client's without its secret. Only server code can set it; no request
// from outside carries it.
func Vouch(ctx context.Context, clientID string) context.Context {
	return context.WithValue(ctx, vouchedKey{}, clientID)
}

// Unavailable is the OAuth answer while storage fails: 503
// temporarily_unavailable (RFC 6749 §4.1.2.1's code; RFC 7009 §2.2.1 the
// status), never a verdict on the request or its credentials.
func Unavailable(cause error) *fosite.RFC6749Error {
	return fosite.ErrTemporarilyUnavailable.WithHint("The service cannot serve this request now; retry later.").WithWrap(cause)
}

// AuthenticateClient authenticates the client of an OAuth request as the
// token endpoint does (secretAuthentication, the secret checked):
// introspection and revocation decide from this client alone.
func (p *Provider) AuthenticateClient(ctx context.Context, r *http.Request, form url.Values) (fosite.Client, error) {
	return p.authenticateClient(ctx, r, form)
}

// ScopeIntrospect lets a client introspect tokens issued to other clients:
// what a resource server needs. Our addition to the spec's scope table.
const ScopeIntrospect = "tokens:introspect"

// MayIntrospect tells whether the authenticated client caller may learn
// about a token issued to tokenClientID: its own tokens always, others' only
// with tokens:introspect or admin among its scopes.
func MayIntrospect(caller fosite.Client, tokenClientID string) bool {
	return caller.GetID() == tokenClientID || caller.GetScopes().Has(ScopeIntrospect) || caller.GetScopes().Has(ScopeAdmin)
}

// unsupportedGrant answers any grant type the server does not serve with
// unsupported_grant_type (RFC 6749 §5.2), before client authentication;
// fosite alone would say invalid_request.
type unsupportedGrant struct{}

var _ fosite.TokenEndpointHandler = (*unsupportedGrant)(nil)

func (*unsupportedGrant) HandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) error {
	return fosite.ErrUnsupportedGrantType.WithHint(DescriptionText("The grant type '" + strings.Join(req.GetGrantTypes(), " ") + "' is not supported."))
}

func (*unsupportedGrant) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

func (*unsupportedGrant) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool { return true }

func (*unsupportedGrant) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	gt := req.GetGrantTypes()
	return len(gt) != 1 || !slices.Contains(GrantTypes, gt[0])
}

// clientCredentialsScopes prepares a client_credentials request before
// fosite's grant handler checks it: an omitted scope asks for every scope the
// client holds; each requested scope is granted (the grant handler, next in
// line, refuses the request if the client lacks any); and the token's subject
// is the client, as RFC 9068 §2.2 has it for client credentials.
type clientCredentialsScopes struct{}

var _ fosite.TokenEndpointHandler = (*clientCredentialsScopes)(nil)

func (*clientCredentialsScopes) HandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) error {
	client := req.GetClient()
	if len(req.GetRequestedScopes()) == 0 {
		req.SetRequestedScopes(client.GetScopes())
	}
	for _, s := range req.GetRequestedScopes() {
		req.GrantScope(s)
	}
	session, ok := req.GetSession().(*Session)
	if !ok {
		return fosite.ErrServerError.WithDebug("unexpected session type")
	}
	session.SetSubject(client.GetID())
	return nil
}

func (*clientCredentialsScopes) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

func (*clientCredentialsScopes) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool {
	return false
}

func (*clientCredentialsScopes) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne("client_credentials")
}

// responseFinisher runs after every grant handler. fosite writes token_type
// as "bearer"; the spec writes "Bearer" (RFC 6749 §5.1 makes it case
// insensitive, so both are correct, and we answer as the spec shows).
type responseFinisher struct{ p *Provider }

var _ fosite.TokenEndpointHandler = (*responseFinisher)(nil)

func (*responseFinisher) HandleTokenEndpointRequest(context.Context, fosite.AccessRequester) error {
	return fosite.ErrUnknownRequest
}

func (f *responseFinisher) PopulateTokenEndpointResponse(ctx context.Context, req fosite.AccessRequester, resp fosite.AccessResponder) error {
	if resp.GetAccessToken() == "" {
		return fosite.ErrUnknownRequest
	}
	resp.SetTokenType("Bearer")
	if c, ok := req.GetClient().(*persistence.Client); ok && c.Agent != nil {
		resp.SetExtra("agent_id", c.RecordID)
		resp.SetExtra("trust_level", c.Agent.TrustLevel)
	}
	if d := GrantedDetails(req); d != nil {
		resp.SetExtra(ClaimAuthorizationDetails, d) // RFC 9396 §7
	}
	// fosite truncates the lifetime left to whole seconds (3599); round it so
	// a 3600-second token says 3600.
	if exp := req.GetSession().GetExpiresAt(fosite.AccessToken); !exp.IsZero() {
		resp.SetExpiresIn(time.Until(exp).Round(time.Second))
	}
	if f.p.OnIssue != nil {
		f.p.OnIssue(ctx, req)
	}
	return nil
}

func (*responseFinisher) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool {
	return false
}

// CanHandleTokenEndpointRequest is false: the finisher takes no part in
// deciding a request, and fosite still calls it to populate every response.
func (*responseFinisher) CanHandleTokenEndpointRequest(context.Context, fosite.AccessRequester) bool {
	return false
}
