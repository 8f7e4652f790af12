package e2e

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/client/rs"
	"github.com/zitadel/oidc/v3/pkg/client/tokenexchange"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence/dbtest"
)

// zitadel/oidc v3's clients, which nobody on this project wrote: discovery
// and client credentials with both authentication methods (rp), a resource
// server's introspection (rs), revocation (rp), and agent-to-agent token
// exchange (tokenexchange), whose ExchangeToken sends actor_token and
// actor_token_type even when they are empty (RFC 6749 §3.2: omitted).
func TestZitadelOIDCClients(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		ctx := context.Background()
		super := s.superToken()
		sa := s.createAccount(super, map[string]any{"name": "zitadel-client", "scopes": []string{"users:read", "orgs:read"}})
		rsAcct := s.createAccount(super, map[string]any{"name": "zitadel-resource-server", "scopes": []string{"tokens:introspect"}})
		actor := s.createAgent(super, map[string]any{"name": "zitadel-actor", "type": "autonomous", "capabilities": []string{"a2a_exchange", "read_users"}})
		for _, level := range []string{"registered", "verified"} {
			mustOK(t, s.changeTrust(super, actor.ID, level, "zitadel exchange"))
		}
		resourceServer, err := rs.NewResourceServerClientCredentials(ctx, s.URL, rsAcct.ClientID, rsAcct.ClientSecret)
		if err != nil {
			t.Fatal(err)
		}
		introspect := func(t *testing.T, token string) *oidc.IntrospectionResponse {
			t.Helper()
			in, err := rs.Introspect[*oidc.IntrospectionResponse](ctx, resourceServer, token)
			if err != nil {
				t.Fatalf("introspect: %v", err)
			}
			return in
		}
		exchanger, err := tokenexchange.NewTokenExchangerClientCredentials(ctx, s.URL, actor.ClientID, actor.ClientSecret)
		if err != nil {
			t.Fatal(err)
		}

		for _, style := range []oauth2.AuthStyle{oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams} {
			relying, err := rp.NewRelyingPartyOIDC(ctx, s.URL, sa.ClientID, sa.ClientSecret, "", []string{"users:read"}, rp.WithAuthStyle(style))
			if err != nil {
				t.Fatalf("style %v: discovery: %v", style, err)
			}
			tok, err := rp.ClientCredentials(ctx, relying, nil)
			if err != nil {
				t.Fatalf("style %v: client credentials: %v", style, err)
			}
			if tok.TokenType != "Bearer" || tok.Extra("scope") != "users:read" {
				t.Fatalf("style %v: token_type %q scope %v", style, tok.TokenType, tok.Extra("scope"))
			}
			in := introspect(t, tok.AccessToken)
			if !in.Active || in.ClientID != sa.ClientID || in.Subject != sa.ClientID || !slices.Equal([]string(in.Scope), []string{"users:read"}) {
				t.Fatalf("style %v: introspection %+v", style, in)
			}

			// The exchange as the library sends it: empty actor fields.
			x, err := tokenexchange.ExchangeToken(ctx, exchanger, tok.AccessToken, oidc.AccessTokenType, "", "", nil, nil, nil, oidc.AccessTokenType)
			if err != nil {
				t.Fatalf("style %v: exchange: %v", style, err)
			}
			if x.IssuedTokenType != oidc.AccessTokenType || x.TokenType != "Bearer" || x.AccessToken == "" {
				t.Fatalf("style %v: exchange answer %+v", style, x)
			}
			in = introspect(t, x.AccessToken)
			if !in.Active || in.ClientID != actor.ClientID || in.Subject != sa.ClientID || in.Actor == nil || in.Actor.Subject != actor.ClientID {
				t.Fatalf("style %v: delegated token %+v", style, in)
			}
			// With an actor token of the actor's own, an audience and a scope.
			actorTok := decodeToken(t, s.agentToken(actor.ClientID, actor.ClientSecret, "")).AccessToken
			x, err = tokenexchange.ExchangeToken(ctx, exchanger, tok.AccessToken, oidc.AccessTokenType, actorTok, oidc.AccessTokenType,
				nil, []string{"https://api.example"}, []string{"users:read"}, oidc.AccessTokenType)
			if err != nil {
				t.Fatalf("style %v: exchange with an actor token: %v", style, err)
			}
			if in := introspect(t, x.AccessToken); !slices.Equal([]string(in.Audience), []string{"https://api.example"}) {
				t.Fatalf("style %v: aud %v", style, in.Audience)
			}

			if err := rp.RevokeToken(ctx, relying, tok.AccessToken, "access_token"); err != nil {
				t.Fatalf("style %v: revoke: %v", style, err)
			}
			if introspect(t, tok.AccessToken).Active {
				t.Fatalf("style %v: revoked token still active", style)
			}
		}

		// A wrong secret, as the library reports it.
		bad, err := rp.NewRelyingPartyOIDC(ctx, s.URL, sa.ClientID, "wrong", "", nil, rp.WithAuthStyle(oauth2.AuthStyleInHeader))
		if err != nil {
			t.Fatal(err)
		}
		_, err = rp.ClientCredentials(ctx, bad, nil)
		var re *oauth2.RetrieveError
		if !errors.As(err, &re) || re.ErrorCode != "invalid_client" || re.Response.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong secret: %v", err)
		}
	})
}
