package oauth

import (
	"context"
	"net/http"
	"time"

	"github.com/ory/fosite"
)

// Paths of the OpenID Connect endpoints people's applications use.
const (
	AuthorizePath  = "/api/v1/oauth/authorize"
	UserinfoPath   = "/api/v1/oauth/userinfo"
	EndSessionPath = "/api/v1/oauth/logout"
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

// AuthorizeCode answers a verified authorization request for a signed-in
// person: it grants the requested scopes the application may have, binds
// the person to the code's session, and writes the redirect with the code,
// state and iss (RFC 9207).
func (p *Provider) AuthorizeCode(ctx context.Context, w http.ResponseWriter, ar fosite.AuthorizeRequester, who SignedIn) {
	for _, s := range ar.GetRequestedScopes() {
		if ar.GetClient().GetScopes().Has(s) {
			ar.GrantScope(s)
		}
	}
	session := NewSession()
	session.SetSubject(who.UserID)
	session.SessionID = who.SessionID
	resp, err := p.NewAuthorizeResponse(ctx, ar, session)
	if err != nil {
		p.WriteAuthorizeError(ctx, w, ar, err)
		return
	}
	resp.AddParameter("iss", p.Issuer)
	p.WriteAuthorizeResponse(ctx, w, ar, resp)
}
