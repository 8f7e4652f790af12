package oauth

import (
	"context"
	"slices"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
)

// Principal is who made a request, as the API layer sees it, whatever kind
// it is: a service account or an agent for itself (client credentials), an
// agent for another (a delegated token), and people signed in through an
// application (with a session and how they authenticated).
type Principal struct {
	Subject   string                  // sub: whom the token speaks for
	Client    *persistence.Client     // who holds the token, as it is now
	Scopes    []string                // what the token still grants
	SessionID string                  // a person's sign-in session; empty for machines
	AMR       []string                // how that person authenticated (RFC 8176)
	AuthTime  time.Time               // when that person signed in (auth_time); zero for machines
	Agent     *persistence.AgentFacts // the acting agent, as it is now; nil when no agent acts
	Act       *Actor                  // a delegated token's act claim
	Details   []any                   // the authorization_details entries bound to the token
	ExpiresAt time.Time
}

// ClientID is the id of the client holding the token.
func (p *Principal) ClientID() string { return p.Client.ID }

// HasScope tells whether the token grants scope s.
func (p *Principal) HasScope(s string) bool { return slices.Contains(p.Scopes, s) }

// HasCapability tells whether the acting agent holds capability c.
func (p *Principal) HasCapability(c string) bool {
	return p.Agent != nil && slices.Contains(p.Agent.Capabilities, c)
}

// ForItself tells whether the token speaks for its own client (client
// credentials), not for a person or, through delegation, another principal.
func (p *Principal) ForItself() bool { return p.Subject == p.Client.ID && p.Act == nil }

// Actor is how audit trails and event logs record the principal.
func (p *Principal) Actor() persistence.Actor {
	a := persistence.Actor{Subject: p.Subject, ClientID: p.Client.ID, SessionID: p.SessionID}
	if p.Agent != nil {
		a.AgentID = p.Client.RecordID
	}
	if p.Act != nil {
		a.Act = p.Act
	}
	return a
}

// Authenticate validates a bearer access token: known, unexpired, not
// revoked, and signed with our key; the principal it names is narrowed to
// what its client (and delegation chain) may hold now.
func (p *Provider) Authenticate(ctx context.Context, token string) (*Principal, error) {
	session := NewSession()
	_, ar, err := p.IntrospectToken(ctx, token, fosite.AccessToken, session)
	if err != nil {
		return nil, err
	}
	c, ok := ar.GetClient().(*persistence.Client)
	s, sok := ar.GetSession().(*Session)
	if !ok || !sok {
		return nil, fosite.ErrServerError.WithDebug("a token without a stored client or session")
	}
	pr := &Principal{
		Subject: s.GetSubject(), Client: c, Scopes: ar.GetGrantedScopes(), SessionID: s.SessionID, Agent: c.Agent, Act: s.Act,
		ExpiresAt: s.GetExpiresAt(fosite.AccessToken), Details: s.GrantedEntries(),
	}
	if s.Claims != nil {
		pr.AMR, pr.AuthTime = s.Claims.AuthenticationMethodsReferences, s.Claims.AuthTime
	}
	if pr.Subject == "" {
		pr.Subject = c.ID
	}
	return pr, nil
}

// ServiceAccountID is the id of the service account the principal is, when
// a service account acts for itself; "" otherwise.
func (p *Principal) ServiceAccountID() string {
	if p.Client.Kind == persistence.KindServiceAccount && p.ForItself() {
		return p.Client.RecordID
	}
	return ""
}
