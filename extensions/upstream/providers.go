// Package upstream holds the rules of upstream sign-in providers: OpenID
// Connect providers (a company's SSO, "Continue with Google") that people
// sign in through. Admins register them (providers.go); a sign-in through
// one is the authorization code flow with PKCE S256, state and nonce
// (go-oidc and x/oauth2), and its ID token resolves to a person only
// through the identity bound to the provider's issuer and subject, never
// through the e-mail alone (signin.go). No HTTP here.
package upstream

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateIdentityProvider(ctx context.Context, p *persistence.IdentityProvider) error
	GetIdentityProvider(ctx context.Context, id string) (*persistence.IdentityProvider, error)
	GetIdentityProviderByName(ctx context.Context, name string) (*persistence.IdentityProvider, error)
	ListIdentityProviders(ctx context.Context, p persistence.Page) ([]persistence.IdentityProvider, int, error)
	IdentityProvidersOf(ctx context.Context, clientID string) ([]persistence.IdentityProvider, error)
	UpdateIdentityProvider(ctx context.Context, id string, fn func(*persistence.IdentityProvider) error) (*persistence.IdentityProvider, error)
	DeleteIdentityProvider(ctx context.Context, id string) error
	GetApplicationByClientID(ctx context.Context, clientID string) (*persistence.Application, error)

	CreateUpstreamState(ctx context.Context, st *persistence.UpstreamState) error
	TakeUpstreamState(ctx context.Context, hash []byte, now time.Time) (*persistence.UpstreamState, error)
	UpstreamIdentity(ctx context.Context, provider, issuer, subject string) (*persistence.Identity, error)
	AddIdentity(ctx context.Context, id persistence.Identity) error
	CreateUpstreamLink(ctx context.Context, l *persistence.UpstreamLink, events ...persistence.AuthEvent) error
	UpstreamLinkByHash(ctx context.Context, hash []byte) (*persistence.UpstreamLink, error)

	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	UserIdentities(ctx context.Context, userID string) ([]persistence.Identity, error)
	CreateUser(ctx context.Context, u *persistence.User, events ...persistence.DirectoryEvent) error
	AppendAuthEvents(ctx context.Context, events ...persistence.AuthEvent) error
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// Purposes of the keys this package derives from the system secret.
const (
	PurposeClientSecret = "identity provider client secret" // sealing the providers' client secrets
	PurposeState        = "upstream state"                  // the state's keyed hash
	PurposeNonce        = "upstream nonce"                  // the nonce's keyed hash
	PurposeVerifier     = "upstream pkce verifier"          // sealing the PKCE verifier
	PurposeBrowser      = "upstream browser binding"        // the browser a state belongs to
	PurposeLinkHandle   = "upstream link handle"            // the pending link's handle
)

// CallbackPath is identityd's redirect URI at every upstream provider:
// register Issuer + CallbackPath there.
const CallbackPath = "/signin/provider/callback"

// Config is what the service needs beyond the store.
type Config struct {
	Issuer string       // identityd's issuer: the callback's base
	HTTP   *http.Client // discovery, token and key requests; nil: a client with a 10 s timeout
}

// Service applies the rules.
type Service struct {
	store     Store
	signin    *signin.Service
	issuer    string
	http      *http.Client
	secrets   *oauth.Sealer
	verifiers *oauth.Sealer
	states    *oauth.SecretHasher
	nonces    *oauth.SecretHasher
	browsers  *oauth.SecretHasher
	handles   *oauth.SecretHasher
	now       func() time.Time

	mu         sync.Mutex
	discovered map[string]discovery // by issuer
}

// discovery is a provider's discovered configuration and when it was read.
type discovery struct {
	provider *oidc.Provider
	at       time.Time
}

// discoveryTTL is how long a provider's discovery document is reused.
const discoveryTTL = 10 * time.Minute

// New makes the service.
func New(store Store, signIn *signin.Service, systemSecret []byte, cfg Config) *Service {
	client := cfg.HTTP
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	return &Service{
		store: store, signin: signIn, issuer: strings.TrimSuffix(cfg.Issuer, "/"), http: client, now: extensions.Now,
		secrets: oauth.NewSealer(systemSecret, PurposeClientSecret), verifiers: oauth.NewSealer(systemSecret, PurposeVerifier),
		states: oauth.NewHasher(systemSecret, PurposeState), nonces: oauth.NewHasher(systemSecret, PurposeNonce),
		browsers: oauth.NewHasher(systemSecret, PurposeBrowser), handles: oauth.NewHasher(systemSecret, PurposeLinkHandle),
		discovered: map[string]discovery{},
	}
}

// RedirectURI is identityd's callback, to register at the providers.
func (s *Service) RedirectURI() string { return s.issuer + CallbackPath }

// DefaultScopes are a provider's scopes when the admin names none.
var DefaultScopes = []string{oidc.ScopeOpenID, "email", "profile"}

// reservedNames are identityd's own sign-in methods and identities: a
// provider named so would be taken for one of them.
var reservedNames = []string{"password", "otp", "magic-link", "magiclink", "passkey", "passkeys", "totp", "email", "mfa", "recovery-code", "webauthn", "sms", "fed"}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// scopeRe is one scope-token (RFC 6749 §3.3).
var scopeRe = regexp.MustCompile(`^[\x21\x23-\x5B\x5D-\x7E]{1,128}$`)

// Input is a create or PATCH body: a nil member is not given.
type Input struct {
	Name         *string
	DisplayName  *string
	Issuer       *string
	ClientID     *string
	ClientSecret *string
	Scopes       *[]string
	Applications *[]string
}

// apply validates in onto p: every problem at once. create: the required
// members must be there.
func (s *Service) apply(ctx context.Context, p *persistence.IdentityProvider, in Input, create bool) error {
	var v extensions.ValidationError
	need := func(field string, val *string) {
		if create && val == nil {
			v.Add(field, "is required")
		}
	}
	need("name", in.Name)
	need("displayName", in.DisplayName)
	need("issuer", in.Issuer)
	need("clientId", in.ClientID)
	need("clientSecret", in.ClientSecret)
	if in.Name != nil {
		switch {
		case !create && *in.Name != p.Name:
			v.Add("name", "cannot change: the identities of the provider's people carry it (delete and register the provider again)")
		case !nameRe.MatchString(*in.Name):
			v.Add("name", "must be 1 to 64 letters, digits or '-'")
		case slices.Contains(reservedNames, strings.ToLower(*in.Name)):
			v.Add("name", "is one of identityd's own sign-in methods")
		default:
			p.Name = *in.Name
		}
	}
	if in.DisplayName != nil {
		if v.CheckText("displayName", *in.DisplayName, true, 100); v.Fields["displayName"] == "" {
			p.DisplayName = strings.TrimSpace(*in.DisplayName)
		}
	}
	if in.Issuer != nil {
		if err := checkIssuer(*in.Issuer); err != nil {
			v.Add("issuer", "%s", err.Error())
		} else {
			p.Issuer = *in.Issuer
		}
	}
	if in.ClientID != nil {
		if v.CheckText("clientId", *in.ClientID, true, 255); v.Fields["clientId"] == "" {
			p.ClientID = *in.ClientID
		}
	}
	if in.ClientSecret != nil {
		if v.CheckText("clientSecret", *in.ClientSecret, true, 1000); v.Fields["clientSecret"] == "" {
			p.ClientSecretSealed = s.secrets.Seal([]byte(*in.ClientSecret), []byte(p.ID))
		}
	}
	if in.Scopes != nil {
		scopes := extensions.Distinct(*in.Scopes)
		switch {
		case len(scopes) > 20:
			v.Add("scopes", "must hold at most 20 scopes")
		case !slices.Contains(scopes, oidc.ScopeOpenID):
			v.Add("scopes", "must include openid")
		default:
			if i := slices.IndexFunc(scopes, func(sc string) bool { return !scopeRe.MatchString(sc) }); i >= 0 {
				v.Add("scopes", "%q is not a scope", scopes[i])
			} else {
				p.Scopes = scopes
			}
		}
	} else if create {
		p.Scopes = slices.Clone(DefaultScopes)
	}
	if in.Applications != nil {
		apps := extensions.Distinct(*in.Applications)
		if len(apps) > 100 {
			v.Add("applications", "must hold at most 100 client ids")
		} else {
			for _, id := range apps {
				if _, err := s.store.GetApplicationByClientID(ctx, id); errors.Is(err, persistence.ErrNotFound) {
					v.Add("applications", "%q is not the client id of an application", id)
					break
				} else if err != nil {
					return err
				}
			}
			p.Applications = apps
		}
	} else if create {
		p.Applications = []string{}
	}
	if err := v.Err(); err != nil {
		return err
	}
	return nil
}

// checkIssuer checks an issuer URL (OpenID Connect Discovery §2: https,
// no query or fragment; http on loopback for development).
func checkIssuer(raw string) error {
	if err := extensions.CheckHTTPSURL(raw); err != nil {
		return err
	}
	u, _ := url.Parse(raw)
	if u.RawQuery != "" || strings.Contains(raw, "?") {
		return errors.New("must not contain a query")
	}
	return nil
}

// ErrDiscovery refuses a provider whose discovery failed.
func errDiscovery(issuer string, err error) error {
	reason := err.Error()
	if len(reason) > 300 {
		reason = reason[:300] + "…"
	}
	return extensions.NewError(http.StatusBadRequest, "discovery_failed",
		"identityd could not read the OpenID Connect discovery document of the issuer: check issuer (it must serve "+
			strings.TrimSuffix(issuer, "/")+"/.well-known/openid-configuration naming itself as issuer).",
		map[string]any{"issuer": issuer, "reason": reason})
}

// Create validates in, discovers the issuer and stores a new provider.
func (s *Service) Create(ctx context.Context, in Input) (*persistence.IdentityProvider, error) {
	now := s.now()
	p := &persistence.IdentityProvider{ID: uuid.Must(uuid.NewV7()).String(), CreatedAt: now, UpdatedAt: now}
	if err := s.apply(ctx, p, in, true); err != nil {
		return nil, err
	}
	if err := s.nameFree(ctx, p.Name); err != nil {
		return nil, err
	}
	if _, err := s.discover(ctx, p.Issuer, true); err != nil {
		return nil, errDiscovery(p.Issuer, err)
	}
	err := s.store.CreateIdentityProvider(ctx, p)
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, extensions.Conflict("name_taken", "Another identity provider has this name.", map[string]any{"name": p.Name})
	}
	return p, err
}

// nameFree refuses a name another provider has in another case (`Google`
// beside `google`): they would read as one provider. The store's unique
// index catches the same name exactly, also in a race.
func (s *Service) nameFree(ctx context.Context, name string) error {
	for page := (persistence.Page{Limit: 200}); ; page.Offset += page.Limit {
		list, total, err := s.store.ListIdentityProviders(ctx, page)
		if err != nil {
			return err
		}
		for _, other := range list {
			if strings.EqualFold(other.Name, name) {
				return extensions.Conflict("name_taken", "Another identity provider has this name.", map[string]any{"name": other.Name})
			}
		}
		if page.Offset+len(list) >= total || len(list) == 0 {
			return nil
		}
	}
}

// Get reads one provider.
func (s *Service) Get(ctx context.Context, id string) (*persistence.IdentityProvider, error) {
	if uuid.Validate(id) != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetIdentityProvider(ctx, id)
}

// List returns one page of providers, oldest first, and the total.
func (s *Service) List(ctx context.Context, p persistence.Page) ([]persistence.IdentityProvider, int, error) {
	return s.store.ListIdentityProviders(ctx, p)
}

// Update applies a patch and discovers the issuer again (a provider that
// no longer answers discovery is refused as at create).
func (s *Service) Update(ctx context.Context, id string, in Input) (*persistence.IdentityProvider, error) {
	if uuid.Validate(id) != nil {
		return nil, persistence.ErrNotFound
	}
	current, err := s.store.GetIdentityProvider(ctx, id)
	if err != nil {
		return nil, err
	}
	// Validate and discover before the row is held: discovery is a
	// request to another server.
	probe := *current
	if err := s.apply(ctx, &probe, in, false); err != nil {
		return nil, err
	}
	if _, err := s.discover(ctx, probe.Issuer, true); err != nil {
		return nil, errDiscovery(probe.Issuer, err)
	}
	return s.store.UpdateIdentityProvider(ctx, id, func(p *persistence.IdentityProvider) error {
		if err := s.apply(ctx, p, in, false); err != nil {
			return err
		}
		p.UpdatedAt = s.now()
		return nil
	})
}

// Delete removes a provider; the identities it made stay (see
// persistence.DeleteIdentityProvider).
func (s *Service) Delete(ctx context.Context, id string) error {
	if uuid.Validate(id) != nil {
		return persistence.ErrNotFound
	}
	return s.store.DeleteIdentityProvider(ctx, id)
}

// Offered lists the providers an application offers whose discovery
// answers now (a button that cannot work is not shown), with the origin
// of each one's authorization endpoint (the hosted page's form leads
// there).
func (s *Service) Offered(ctx context.Context, clientID string) ([]persistence.IdentityProvider, []string, error) {
	list, err := s.store.IdentityProvidersOf(ctx, clientID)
	if err != nil {
		return nil, nil, err
	}
	var out []persistence.IdentityProvider
	var origins []string
	for _, p := range list {
		op, err := s.discover(ctx, p.Issuer, false)
		if err != nil {
			continue
		}
		out = append(out, p)
		if u, err := url.Parse(op.Endpoint().AuthURL); err == nil {
			origins = append(origins, u.Scheme+"://"+u.Host)
		}
	}
	return out, origins, nil
}

// discover reads an issuer's discovery document (go-oidc checks that it
// names the issuer), from the cache unless fresh is asked or it is older
// than discoveryTTL.
func (s *Service) discover(ctx context.Context, issuer string, fresh bool) (*oidc.Provider, error) {
	s.mu.Lock()
	d, ok := s.discovered[issuer]
	s.mu.Unlock()
	if ok && !fresh && s.now().Sub(d.at) < discoveryTTL {
		return d.provider, nil
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, s.http), 10*time.Second)
	defer cancel()
	op, err := oidc.NewProvider(ctx, issuer)
	if err != nil {
		return nil, err
	}
	if e := op.Endpoint(); e.AuthURL == "" || e.TokenURL == "" {
		return nil, errors.New("the discovery document names no authorization or token endpoint")
	}
	if err := extensions.CheckHTTPSURL(op.Endpoint().AuthURL); err != nil { // a query is allowed (Azure AD B2C names its policy so)
		return nil, errors.New("authorization_endpoint " + err.Error())
	}
	s.mu.Lock()
	s.discovered[issuer] = discovery{provider: op, at: s.now()}
	s.mu.Unlock()
	return op, nil
}
