package persistence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/oauth2"
)

// Kinds of client, as registered.
const (
	KindServiceAccount = "service_account"
	KindAgent          = "agent"
)

// Client is the fosite view of a principal that authenticates at the token
// endpoint, as it is now. Its registration (RFC 7591's grant types,
// response types, redirect URIs, public or confidential) is data, not code.
// It is deliberately not an OpenIDConnectClient: fosite then accepts both
// client_secret_basic and client_secret_post for it.
type Client struct {
	ID          string
	SecretHash  []byte
	Scopes      []string
	Kind        string      // KindServiceAccount, KindAgent or KindApplication
	RecordID    string      // the id of the service account, agent or application behind the client
	PrincipalID string      // RecordID, and for agents the epoch: what tokens are bound to
	Agent       *AgentFacts // the agent behind the client; nil for any other client
	App         *AppFacts   // the application behind the client; nil for any other client
	Tier        string      // a service account's usage tier; "" for any other client

	GrantTypes    []string
	ResponseTypes []string
	RedirectURIs  []string
	Public        bool
}

// AgentFacts are what the token path needs to know of an agent.
type AgentFacts struct {
	TrustLevel   string
	Capabilities []string
	RecoveredAt  time.Time   // the last recovery; zero if never killed
	Grants       []LiveGrant // active just-in-time grants when read; each holds until its ExpiresAt
}

// LiveGrants are the agent's grants still active at now.
func (a *AgentFacts) LiveGrants(now time.Time) []LiveGrant {
	var out []LiveGrant
	for _, g := range a.Grants {
		if now.Before(g.ExpiresAt) {
			out = append(out, g)
		}
	}
	return out
}

var _ fosite.Client = (*Client)(nil)

func (c *Client) GetID() string                      { return c.ID }
func (c *Client) GetHashedSecret() []byte            { return c.SecretHash }
func (c *Client) GetRedirectURIs() []string          { return c.RedirectURIs }
func (c *Client) GetGrantTypes() fosite.Arguments    { return c.GrantTypes }
func (c *Client) GetResponseTypes() fosite.Arguments { return c.ResponseTypes }
func (c *Client) IsPublic() bool                     { return c.Public }
func (c *Client) GetAudience() fosite.Arguments      { return nil }

// GetScopes is what the client may hold now: its own scopes and, for an
// agent, those of its just-in-time grants still active.
func (c *Client) GetScopes() fosite.Arguments {
	if c.Agent == nil || len(c.Agent.Grants) == 0 {
		return c.Scopes
	}
	out := slices.Clone(c.Scopes)
	for _, g := range c.Agent.LiveGrants(time.Now()) {
		for _, sc := range g.Scopes {
			if !slices.Contains(out, sc) {
				out = append(out, sc)
			}
		}
	}
	return out
}

// Grant types clients are registered with.
const (
	GrantClientCredentials = "client_credentials"
	GrantTokenExchange     = "urn:ietf:params:oauth:grant-type:token-exchange"
	GrantAuthorizationCode = "authorization_code"
	GrantRefreshToken      = "refresh_token"
	GrantCIBA              = "urn:openid:params:grant-type:ciba"
)

var (
	_ fosite.ClientManager      = (*Store)(nil)
	_ oauth2.AccessTokenStorage = (*Store)(nil)
	_ fosite.Storage            = (*Store)(nil)
)

// GetClient implements fosite.ClientManager, from the cache when it can.
// Agent client ids have their own prefix; a killed agent is no client at all,
// so its secret fails and its tokens find no client (GetAccessTokenSession).
func (s *Store) GetClient(ctx context.Context, id string) (fosite.Client, error) {
	cache := s.cacheFor(ctx)
	if c := cache.client(id); c != nil {
		return c, nil
	}
	rs := cache.begin()
	var c *Client
	var err error
	switch {
	case strings.HasPrefix(id, AgentClientPrefix):
		c, err = s.agentClient(ctx, id)
	case strings.HasPrefix(id, ApplicationClientPrefix):
		c, err = s.applicationClient(ctx, id)
	default:
		c, err = s.serviceAccountClient(ctx, id)
	}
	if errors.Is(err, ErrNotFound) {
		return nil, fosite.ErrNotFound
	} else if err != nil {
		return nil, err
	}
	cache.putClient(rs, c)
	return c, nil
}

func (s *Store) serviceAccountClient(ctx context.Context, id string) (*Client, error) {
	var sa ServiceAccount
	if err := s.stmt(ctx, s.clientStmt).GetContext(ctx, &sa, id); err != nil {
		return nil, mapError(err)
	}
	return &Client{
		ID: sa.ClientID, SecretHash: sa.SecretHash, Scopes: sa.Scopes, Kind: KindServiceAccount, RecordID: sa.ID, PrincipalID: sa.ID, Tier: sa.Tier,
		GrantTypes: []string{GrantClientCredentials}, RedirectURIs: sa.RedirectURIs,
	}, nil
}

func (s *Store) agentClient(ctx context.Context, id string) (*Client, error) {
	var a Agent
	if err := s.stmt(ctx, s.agentStmt).GetContext(ctx, &a, id); err != nil {
		return nil, mapError(err)
	}
	if a.Status != AgentActive {
		return nil, ErrNotFound
	}
	facts := &AgentFacts{TrustLevel: a.TrustLevel, Capabilities: a.Capabilities}
	var err error
	if facts.Grants, err = s.liveGrants(ctx, a.ID, time.Now()); err != nil {
		return nil, err
	}
	if a.RecoveredAt != nil {
		facts.RecoveredAt = *a.RecoveredAt
	}
	grants := []string{GrantClientCredentials, GrantTokenExchange}
	if a.Type == AgentUserDelegated { // only they act for people (CIBA), renewing their delegated tokens until the delegation ends
		grants = append(grants, GrantCIBA, GrantRefreshToken)
	}
	return &Client{
		ID: a.ClientID, SecretHash: a.SecretHash, Scopes: a.Scopes, Kind: KindAgent, RecordID: a.ID,
		PrincipalID: fmt.Sprintf("%s#%d", a.ID, a.Epoch),
		Agent:       facts,
		GrantTypes:  grants,
	}, nil
}

// stmt is a prepared statement for use with ctx: bound to its unit of work
// when there is one.
func (s *Store) stmt(ctx context.Context, st *sqlx.Stmt) *sqlx.Stmt {
	if u := unitFrom(ctx); u != nil {
		if tx, err := u.txn(); err == nil {
			return tx.StmtxContext(ctx, st)
		}
	}
	return st
}

// ClientAssertionJWTValid implements fosite.ClientManager. identityd offers no
// private_key_jwt client authentication, so every assertion id counts as used.
func (s *Store) ClientAssertionJWTValid(context.Context, string) error { return fosite.ErrJTIKnown }

// SetClientAssertionJWT implements fosite.ClientManager; see ClientAssertionJWTValid.
func (s *Store) SetClientAssertionJWT(context.Context, string, time.Time) error {
	return fosite.ErrJTIKnown
}

// CreateAccessTokenSession implements oauth2.AccessTokenStorage. The row is
// committed, grouped with concurrent ones, before this returns.
func (s *Store) CreateAccessTokenSession(ctx context.Context, signature string, req fosite.Requester) error {
	row, err := newTokenRow(signature, req)
	if err != nil {
		return err
	}
	// Not cached here: most tokens are never introspected, and a cache full
	// of them costs memory and garbage-collection time (measured).
	audit, _ := ctx.Value(tokenAuditKey{}).([]AuditEntry)
	if err := s.write(ctx, tokenWrite{token: row, audit: audit}); err != nil {
		return err
	}
	if row.clientKind == KindApplication && unitFrom(ctx) != nil {
		// An authorization code's exchange: the code's replay must find it.
		return s.linkCodeAccessToken(ctx, row.RequestID, signature)
	}
	return nil
}

// newTokenRow is the row of an access token about to be stored.
func newTokenRow(signature string, req fosite.Requester) (*tokenRow, error) {
	session, err := json.Marshal(req.GetSession())
	if err != nil {
		return nil, err
	}
	exp := req.GetSession().GetExpiresAt(fosite.AccessToken)
	if exp.IsZero() {
		return nil, errors.New("access token session has no expiry")
	}
	client, ok := req.GetClient().(*Client)
	if !ok {
		return nil, errors.New("access token request without a stored client")
	}
	return &tokenRow{
		Signature:   signature,
		RequestID:   req.GetID(),
		ClientID:    client.ID,
		PrincipalID: client.PrincipalID,
		Scopes:      StringList(req.GetGrantedScopes()),
		Audience:    StringList(req.GetGrantedAudience()),
		Session:     string(session),
		RequestedAt: req.GetRequestedAt().UTC(),
		ExpiresAt:   exp.UTC(),
		clientKind:  client.Kind,
	}, nil
}

type tokenAuditKey struct{}

// WithTokenAudit returns a context in which the access token stored next is
// committed together with these audit entries: both or neither.
func WithTokenAudit(ctx context.Context, entries ...AuditEntry) context.Context {
	return context.WithValue(ctx, tokenAuditKey{}, entries)
}

// GetAccessTokenSession implements oauth2.AccessTokenStorage. A token
// exists only while its client does, as the same principal (a client deleted
// and made again under the same id does not revive old tokens). The session
// is decoded into the one given; the cache keeps a copy of it (its Clone),
// and later reads copy that into theirs. Without a session to decode into
// (revocation), the request carries none and nothing is cached.
func (s *Store) GetAccessTokenSession(ctx context.Context, signature string, session fosite.Session) (fosite.Requester, error) {
	cache := s.cacheFor(ctx)
	row := cache.token(signature)
	if row == nil {
		rs := cache.begin()
		row = &tokenRow{}
		err := mapError(s.stmt(ctx, s.tokenStmt).GetContext(ctx, row, signature))
		if errors.Is(err, ErrNotFound) {
			return nil, fosite.ErrNotFound
		} else if err != nil {
			return nil, err
		}
		if session != nil {
			if err := decodeJSON(row.Session, session); err != nil {
				return nil, err
			}
			row.Session, row.decoded = "", session.Clone() // decoded holds it now
			cache.putToken(rs, row)
		}
	} else if session != nil {
		if err := copySession(session, row.decoded); err != nil {
			return nil, err
		}
	}
	client, err := s.GetClient(ctx, row.ClientID)
	if err != nil {
		return nil, err
	}
	if client.(*Client).PrincipalID != row.PrincipalID {
		return nil, fosite.ErrNotFound
	}
	// A person's token lives no longer than their SSO session.
	if b, ok := session.(SSOBound); ok && b.SSOSessionID() != "" {
		if live, err := s.ssoSessionLive(ctx, b.SSOSessionID()); err != nil {
			return nil, err
		} else if !live {
			return nil, fosite.ErrNotFound
		}
	}
	// A delegated token lives no longer than its delegation (and its
	// person's standing).
	if b, ok := session.(DelegationBound); ok && b.DelegationRef() != "" {
		if live, err := s.delegationLive(ctx, b.DelegationRef()); err != nil {
			return nil, err
		} else if !live {
			return nil, fosite.ErrNotFound
		}
	}
	return row.request(session, client.(*Client)), nil
}

// copySession makes dst a copy of src (a cached session, never changed):
// src's Clone when both are of one type, else src as JSON decoded into dst.
func copySession(dst, src fosite.Session) error {
	c := src.Clone()
	dv, cv := reflect.ValueOf(dst), reflect.ValueOf(c)
	if dv.Type() == cv.Type() && dv.Kind() == reflect.Pointer {
		dv.Elem().Set(cv.Elem())
		return nil
	}
	b, err := json.Marshal(src)
	if err != nil {
		return err
	}
	return decodeJSON(string(b), dst)
}

// DeleteAccessTokenSession implements oauth2.AccessTokenStorage; it is how
// a token is revoked.
func (s *Store) DeleteAccessTokenSession(ctx context.Context, signature string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM access_tokens WHERE signature = ?`), signature)
		return []string{evictToken + signature}, err
	})
}

// TokenKeyPrefix is how every stored token key begins (the signatures of
// access tokens, codes and refresh tokens, session cookies' keys): the time
// of issue as 12 lower-case hex digits of Unix milliseconds, so that keys
// sort by issue time (see schema and oauth's token format). Refresh tokens
// and cookies issued before it keep their keys.
func TokenKeyPrefix(t time.Time) string { return fmt.Sprintf("%012x", t.UnixMilli()) }

// TokenKeyPrefixLen is the length of TokenKeyPrefix's answer (until the
// year 10889).
const TokenKeyPrefixLen = 12

// DeleteExpiredTokens removes tokens that expired before now and reports how
// many. Only tokens issued more than maxLifetime ago can have expired, and
// those are a range of the primary key: no scan, no index on expires_at.
func (s *Store) DeleteExpiredTokens(ctx context.Context, now time.Time, maxLifetime time.Duration) (int64, error) {
	s.cache.dropExpired(now)
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM access_tokens WHERE signature < ? AND expires_at < ?`),
		TokenKeyPrefix(now.Add(-maxLifetime)), now.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	return res.RowsAffected()
}

const tokenColumns = `signature, request_id, client_id, principal_id, scopes, audience, session, requested_at, expires_at`

type tokenRow struct {
	Signature   string     `db:"signature"`
	RequestID   string     `db:"request_id"`
	ClientID    string     `db:"client_id"`
	PrincipalID string     `db:"principal_id"`
	Scopes      StringList `db:"scopes"`
	Audience    StringList `db:"audience"`
	Session     string     `db:"session"`
	RequestedAt time.Time  `db:"requested_at"`
	ExpiresAt   time.Time  `db:"expires_at"`

	decoded    fosite.Session // Session, decoded once; never changed
	clientKind string         // of a row about to be stored
}

// request rebuilds the fosite request a token was issued for, with its
// client as it is now (shared and read-only: it may come from the cache).
func (r *tokenRow) request(session fosite.Session, client *Client) fosite.Requester {
	req := fosite.NewRequest()
	req.ID = r.RequestID
	req.RequestedAt = r.RequestedAt.UTC()
	req.Client = client
	req.RequestedScope = fosite.Arguments(r.Scopes)
	req.GrantedScope = fosite.Arguments(r.Scopes)
	req.RequestedAudience = fosite.Arguments(r.Audience)
	req.GrantedAudience = fosite.Arguments(r.Audience)
	req.Session = session
	return req
}
