package signin

import (
	"context"
	"errors"
	"net/http"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Hint is what an id_token_hint tells: whom the application believes is
// signed in, through which session, and the application(s) it was issued to.
type Hint struct {
	Subject   string
	SessionID string
	Audience  []string
}

// ErrBadHint refuses an id_token_hint that is not an ID token this server
// signed.
var ErrBadHint = errors.New("the id_token_hint is not an ID token this server issued")

// maxHint bounds the hint parsed (ID tokens are a few kilobytes).
const maxHint = 16 << 10

// ParseIDTokenHint verifies that hint is an ID token signed with one of
// keys by issuer and answers its claims. Expiry is not checked: OpenID
// Connect Core §3.1.2.1 and RP-Initiated Logout §2 let an expired ID token
// serve as a hint.
func ParseIDTokenHint(keys jose.JSONWebKeySet, issuer, hint string) (*Hint, error) {
	if len(hint) > maxHint {
		return nil, ErrBadHint
	}
	tok, err := jwt.ParseSigned(hint, []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil || len(tok.Headers) != 1 {
		return nil, ErrBadHint
	}
	if typ, _ := tok.Headers[0].ExtraHeaders[jose.HeaderType].(string); typ != "" && typ != "JWT" {
		return nil, ErrBadHint // an access token (at+jwt) is no ID token
	}
	var claims jwt.Claims
	var extra struct {
		SID string `json:"sid"`
	}
	verified := false
	for _, k := range keys.Key(tok.Headers[0].KeyID) {
		if k.Algorithm != "" && k.Algorithm != tok.Headers[0].Algorithm {
			continue
		}
		if tok.Claims(k.Key, &claims, &extra) == nil {
			verified = true
			break
		}
	}
	if !verified || claims.Issuer != issuer || claims.Subject == "" || len(claims.Audience) == 0 {
		return nil, ErrBadHint
	}
	return &Hint{Subject: claims.Subject, SessionID: extra.SID, Audience: claims.Audience}, nil
}

// ErrNotApplication refuses a client that is not an application.
var ErrNotApplication = extensions.NewError(http.StatusBadRequest, "invalid_client", "The client is not a registered application.", nil)

// Application is the application behind a client id; any other client, or
// none, is ErrNotApplication.
func (s *Service) Application(ctx context.Context, clientID string) (*persistence.Client, error) {
	c, err := s.store.GetClient(ctx, clientID)
	if errors.Is(err, persistence.ErrNotFound) || errors.Is(err, fosite.ErrNotFound) {
		return nil, ErrNotApplication
	}
	if err != nil {
		return nil, err
	}
	app, ok := c.(*persistence.Client)
	if !ok || app.App == nil {
		return nil, ErrNotApplication
	}
	return app, nil
}

// User is a person by id; one deleted meanwhile is ErrFlowExpired.
func (s *Service) User(ctx context.Context, id string) (*persistence.User, error) {
	u, err := s.store.GetUser(ctx, id)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrFlowExpired
	}
	return u, err
}
