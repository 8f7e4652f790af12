package oauth

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
)

// Paths of the OpenID Connect endpoints people's applications use.
const (
	AuthorizePath  = "/api/v1/oauth/authorize"
	UserinfoPath   = "/api/v1/oauth/userinfo"
	EndSessionPath = "/api/v1/oauth/logout"
)

// Scopes of people's applications, and the claims each one releases
// (OpenID Connect Core §5.4; roles is ours: the directory's role names).
const (
	ScopeOpenID  = "openid"
	ScopeProfile = "profile"
	ScopeEmail   = "email"
	ScopeRoles   = "roles"
)

// SignedIn is a person signed in through a single sign-on session: what an
// authorization answered for them carries into their code, tokens and ID
// token.
type SignedIn struct {
	UserID        string // sub: stable, never the e-mail
	Email         string
	EmailVerified bool
	Name          string
	Roles         []string // the directory's role names
	SessionID     string   // the SSO session (sid)
	AuthTime      time.Time
	AMR           []string // RFC 8176
	ACR           string
}

// Claims are the person's claims that scopes release, beyond sub: email
// and email_verified (email), name (profile, when the directory has one),
// roles (roles).
func (who *SignedIn) Claims(scopes fosite.Arguments) map[string]any {
	c := map[string]any{}
	if scopes.Has(ScopeEmail) {
		c["email"], c["email_verified"] = who.Email, who.EmailVerified
	}
	if scopes.Has(ScopeProfile) && who.Name != "" {
		c["name"] = who.Name
	}
	if scopes.Has(ScopeRoles) {
		roles := who.Roles
		if roles == nil {
			roles = []string{}
		}
		c["roles"] = roles
	}
	return c
}

// userActive is the directory's status of a person who may sign in
// (directory.StatusActive, which this package cannot import).
const userActive = "active"

// ErrPersonGone refuses a refresh or userinfo for a person deleted or
// disabled since they signed in.
var ErrPersonGone = errors.New("the person no longer exists or is disabled")

// Person reads a person's current claims from the directory: a person
// deleted or not active is ErrPersonGone.
func (p *Provider) Person(ctx context.Context, userID string) (*SignedIn, error) {
	return person(ctx, p.people, userID)
}

func person(ctx context.Context, people People, userID string) (*SignedIn, error) {
	u, err := people.GetUser(ctx, userID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrPersonGone
	} else if err != nil {
		return nil, err
	}
	if u.Status != userActive {
		return nil, ErrPersonGone
	}
	roles, err := people.UserRoles(ctx, userID)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = r.Name
	}
	return &SignedIn{UserID: u.ID, Email: u.Email, EmailVerified: u.EmailVerified, Name: u.Name, Roles: names}, nil
}

// setIDClaims writes the person's ID token claims into the session: what
// the granted scopes release, and sid.
func setIDClaims(s *Session, who *SignedIn, scopes fosite.Arguments) {
	claims := s.IDTokenClaims()
	claims.Extra = who.Claims(scopes)
	if s.SessionID != "" {
		claims.Extra["sid"] = s.SessionID
	}
}

// AuthorizeCode answers a verified authorization request for a signed-in
// person: it grants the requested scopes the application may have, binds
// the person to the code's session (with the ID token's claims: auth_time
// and the request's time, which fosite's prompt and max_age checks read),
// stores the code, its PKCE challenge and its OpenID Connect request as one
// row (through the group commit), and writes the redirect with the code, state and iss (RFC
// 9207).
func (p *Provider) AuthorizeCode(ctx context.Context, w http.ResponseWriter, ar fosite.AuthorizeRequester, who SignedIn) {
	resp, err := p.authorizeResponse(ctx, ar, who)
	if err != nil {
		p.AuthorizeError(ctx, w, ar, err)
		return
	}
	resp.AddParameter("iss", p.Issuer)
	p.WriteAuthorizeResponse(ctx, w, ar, resp)
}

// IssueCode answers a verified authorization request for the person who
// with the code alone, not a redirect: the embedded sign-in API's code,
// which the application's backend exchanges at the token endpoint like any.
func (p *Provider) IssueCode(ctx context.Context, ar fosite.AuthorizeRequester, who SignedIn) (string, error) {
	resp, err := p.authorizeResponse(ctx, ar, who)
	if err != nil {
		return "", err
	}
	return resp.GetCode(), nil
}

// authorizeResponse grants the requested scopes the client may have and
// issues the code for who's session.
func (p *Provider) authorizeResponse(ctx context.Context, ar fosite.AuthorizeRequester, who SignedIn) (fosite.AuthorizeResponder, error) {
	for _, s := range ar.GetRequestedScopes() {
		if ar.GetClient().GetScopes().Has(s) {
			ar.GrantScope(s)
		}
	}
	session := NewSession()
	session.SetSubject(who.UserID)
	session.SessionID = who.SessionID
	claims := session.IDTokenClaims()
	claims.Subject = who.UserID
	claims.AuthTime = who.AuthTime.UTC()
	claims.RequestedAt = ar.GetRequestedAt().UTC()
	claims.AuthenticationMethodsReferences = who.AMR
	claims.AuthenticationContextClassReference = who.ACR
	setIDClaims(session, &who, ar.GetGrantedScopes())

	var resp fosite.AuthorizeResponder
	err := p.InFlow(ctx, func(ctx context.Context) error {
		var err error
		resp, err = p.NewAuthorizeResponse(ctx, ar, session)
		return err
	})
	return resp, err
}

// InFlow runs fn as one flow of the group commit (persistence.Grouped;
// within a unit of work, in the unit; within a flow, in that flow): its
// writes are committed once when fn succeeds, and dropped when it fails.
// A commit that found no storage is Unavailable.
func (p *Provider) InFlow(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, err := p.grouped.BeginTX(ctx)
	if err == nil {
		if err = fn(ctx); err != nil {
			_ = p.grouped.Rollback(ctx)
		} else {
			err = p.grouped.Commit(ctx)
		}
	}
	if err != nil && persistence.Unavailable(err) {
		err = Unavailable(err)
	}
	return err
}

// ExchangeCode runs fn, a code's exchange at the token endpoint, as one
// flow of the group commit (persistence.Grouped): what fosite's handlers
// write in it is committed once fn returns, even when fosite refused the
// request (a wrong PKCE verifier spends the code's binding). A code used
// meanwhile by another exchange is invalid_grant, and what that one issued
// is revoked (RFC 6749 §4.1.2); a failed commit is temporarily_unavailable.
func (p *Provider) ExchangeCode(ctx context.Context, fn func(ctx context.Context)) error {
	ctx, err := p.grouped.BeginTX(ctx)
	if err != nil {
		return Unavailable(err)
	}
	fn(ctx)
	err = p.grouped.Commit(ctx)
	if errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
		return fosite.ErrInvalidGrant.WithHint("The authorization code has already been used.").WithWrap(err)
	} else if err != nil {
		return Unavailable(err)
	}
	return nil
}

// AuthorizeError answers a refused authorization request whose client and
// redirect URI are verified (the caller shows a page otherwise): back to
// the client with error, error_description, state and iss (RFC 6749
// §4.1.2.1, RFC 9207), in the request's response mode.
func (p *Provider) AuthorizeError(ctx context.Context, w http.ResponseWriter, ar fosite.AuthorizeRequester, err error) {
	if !ar.IsRedirectURIValid() {
		p.WriteAuthorizeError(ctx, w, ar, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	rfc := fosite.ErrorToRFC6749Error(err)
	values := url.Values{"error": {rfc.ErrorField}}
	if d := DescriptionText(rfc.GetDescription()); d != "" {
		values.Set("error_description", d)
	}
	if state := ar.GetState(); state != "" {
		values.Set("state", state)
	}
	values.Set("iss", p.Issuer)
	redirect := ar.GetRedirectURI()
	redirect.Fragment = ""
	switch ar.GetResponseMode() {
	case fosite.ResponseModeFormPost:
		w.Header().Set("Content-Type", "text/html;charset=UTF-8")
		fosite.WriteAuthorizeFormPostResponse(redirect.String(), values, fosite.DefaultFormPostTemplate, w)
		return
	case fosite.ResponseModeFragment:
		w.Header().Set("Location", redirect.String()+"#"+values.Encode())
	default:
		q := redirect.Query()
		for k, v := range values {
			q[k] = v
		}
		redirect.RawQuery = q.Encode()
		w.Header().Set("Location", redirect.String())
	}
	w.WriteHeader(http.StatusSeeOther)
}

// refreshPerson keeps a person's tokens current on refresh: it rereads the
// person (a name, e-mail or roles changed since sign-in show in the new ID
// token) and refuses the refresh of a person deleted or disabled since. It
// runs after fosite's refresh grant handler has restored the session, for
// an application's tokens and for an agent's delegated ones (whose
// subject is the person too).
type refreshPerson struct{ people People }

var _ fosite.TokenEndpointHandler = (*refreshPerson)(nil)

func (h *refreshPerson) HandleTokenEndpointRequest(ctx context.Context, req fosite.AccessRequester) error {
	s, ok := req.GetSession().(*Session)
	if !ok {
		return fosite.ErrServerError.WithDebug("unexpected session type")
	}
	if c, ok := req.GetClient().(*persistence.Client); (!ok || c.App == nil) && s.DelegationID == "" {
		return nil
	}
	who, err := person(ctx, h.people, s.GetSubject())
	if errors.Is(err, ErrPersonGone) {
		return fosite.ErrInvalidGrant.WithHint("The person this refresh token was issued for no longer exists or is disabled.")
	} else if err != nil {
		return Unavailable(err)
	}
	setIDClaims(s, who, req.GetGrantedScopes())
	return nil
}

func (*refreshPerson) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

func (*refreshPerson) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool { return false }

func (*refreshPerson) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne("refresh_token")
}
