package oauth_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// The token endpoint's handlers, in process, on a real store of each
// dialect: the provider as identityd composes it, with the agents' and RAR
// rules, and a federation that accepts platform tokens of the form
// "platform:<agent client id>".

type federation struct{}

func (federation) Verify(_ context.Context, token string) (*oauth.Federated, error) {
	id, ok := strings.CutPrefix(token, "platform:")
	if !ok {
		return nil, fosite.ErrInvalidRequest.WithHint("The subject_token is not acceptable.")
	}
	return &oauth.Federated{AgentClientID: id, Scopes: []string{"users:read", "users:write"}, Issuer: "https://k8s.example", Subject: "system:serviceaccount:x"}, nil
}

type rig struct {
	t        *testing.T
	store    *persistence.Store
	provider *oauth.Provider
	agents   *agents.Service
	admin    persistence.Actor
}

func newRig(t *testing.T, dbURL string, maxDepth int) *rig {
	store := dbtest.Store(t, dbURL)
	keys, err := oauth.LoadKeys(context.Background(), store, []byte(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	p := oauth.NewProvider(oauth.Config{
		Issuer: "https://id.example", AccessTokenTTL: time.Hour, SystemSecret: []byte(strings.Repeat("s", 32)),
		Details: rar.New(store), Federation: federation{}, Delegation: agents.Delegation{}, MaxDelegation: maxDepth,
	}, store, keys)
	return &rig{t: t, store: store, provider: p, agents: agents.New(store, p.Hasher), admin: persistence.Actor{ClientID: "test"}}
}

type client struct{ id, secret string }

func (r *rig) account(scopes ...string) client {
	r.t.Helper()
	sa, secret, err := serviceaccounts.New(r.store, r.provider.Hasher).Create(context.Background(), serviceaccounts.Input{Name: "sa", Scopes: scopes})
	if err != nil {
		r.t.Fatal(err)
	}
	return client{sa.ClientID, secret}
}

// agent makes an agent at a trust level, with capabilities.
func (r *rig) agent(trust string, caps ...string) (client, *persistence.Agent) {
	r.t.Helper()
	ctx := context.Background()
	a, secret, err := r.agents.Create(ctx, r.admin, agents.AnyScope, agents.Input{Name: "agent", Type: "autonomous", Capabilities: caps})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, level := range agents.TrustLevels[1 : slices.Index(agents.TrustLevels, trust)+1] {
		if a, err = r.agents.ChangeTrust(ctx, r.admin, a.ID, level, "test"); err != nil {
			r.t.Fatal(err)
		}
	}
	return client{a.ClientID, secret}, a
}

// grant runs one token request through the provider as the HTTP layer
// does; it returns the response's fields, or the RFC 6749 error.
func (r *rig) grant(c client, form url.Values) (map[string]any, *fosite.RFC6749Error) {
	r.t.Helper()
	req := httptest.NewRequest(http.MethodPost, oauth.TokenPath, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if c.id != "" {
		req.SetBasicAuth(url.QueryEscape(c.id), url.QueryEscape(c.secret))
	}
	ctx := req.Context()
	ar, err := r.provider.NewAccessRequest(ctx, req, oauth.NewSession())
	if err != nil {
		return nil, fosite.ErrorToRFC6749Error(err)
	}
	resp, err := r.provider.NewAccessResponse(ctx, ar)
	if err != nil {
		return nil, fosite.ErrorToRFC6749Error(err)
	}
	out := resp.ToMap()
	out["access_token"] = resp.GetAccessToken()
	return out, nil
}

func (r *rig) mustGrant(c client, form url.Values) map[string]any {
	r.t.Helper()
	m, err := r.grant(c, form)
	if err != nil {
		r.t.Fatalf("grant %v: %s: %s", form, err.ErrorField, err.GetDescription())
	}
	return m
}

// introspect reads a token as a resource server would: active, with the
// claims it means now.
func (r *rig) introspect(token string) (fosite.AccessRequester, map[string]any, error) {
	_, ar, err := r.provider.IntrospectToken(context.Background(), token, fosite.AccessToken, oauth.NewSession())
	if err != nil {
		return nil, nil, err
	}
	return ar, ar.GetSession().(*oauth.Session).GetExtraClaims(), nil
}

func exchangeForm(subject, subjectType string, kv ...string) url.Values {
	f := url.Values{"grant_type": {oauth.GrantTokenExchange}, "subject_token": {subject}, "subject_token_type": {subjectType}}
	for i := 0; i+1 < len(kv); i += 2 {
		f.Add(kv[i], kv[i+1])
	}
	return f
}

func wantError(t *testing.T, err *fosite.RFC6749Error, code, says string) {
	t.Helper()
	if err == nil {
		t.Fatalf("granted, want %s", code)
	}
	if err.ErrorField != code || !strings.Contains(err.GetDescription(), says) {
		t.Fatalf("%s: %s, want %s saying %q", err.ErrorField, err.GetDescription(), code, says)
	}
}

func TestFederationExchangeHandler(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		r := newRig(t, dbURL, 3)
		ag, rec := r.agent(agents.Registered, agents.ReadUsers, agents.WriteUsers)
		none := client{}

		m := r.mustGrant(none, exchangeForm("platform:"+ag.id, oauth.TokenTypeJWT))
		if m["issued_token_type"] != oauth.TokenTypeAccessToken || m["scope"] != "users:read users:write" || m["agent_id"] != rec.ID {
			t.Fatalf("federation answer %v", m)
		}
		ar, claims, err := r.introspect(m["access_token"].(string))
		if err != nil {
			t.Fatal(err)
		}
		s := ar.GetSession().(*oauth.Session)
		if s.GetSubject() != ag.id || s.Exchange == nil || s.Exchange.Issuer != "https://k8s.example" || claims["agent_id"] != rec.ID {
			t.Fatalf("federated token: subject %q exchange %+v claims %v", s.GetSubject(), s.Exchange, claims)
		}
		// A narrower scope; one the mapping lacks.
		if m := r.mustGrant(none, exchangeForm("platform:"+ag.id, oauth.TokenTypeJWT, "scope", "users:read")); m["scope"] != "users:read" {
			t.Fatalf("narrowed: %v", m)
		}
		_, e := r.grant(none, exchangeForm("platform:"+ag.id, oauth.TokenTypeJWT, "scope", "orgs:read"))
		wantError(t, e, "invalid_scope", "orgs:read")

		// Refusals: a secret alongside, another client_id, a token that
		// maps to no agent or to a killed one, a token the platform refuses.
		_, e = r.grant(ag, exchangeForm("platform:"+ag.id, oauth.TokenTypeJWT))
		wantError(t, e, "invalid_request", "no client secret")
		_, e = r.grant(none, exchangeForm("platform:"+ag.id, oauth.TokenTypeJWT, "client_id", "agt_other"))
		wantError(t, e, "invalid_client", "does not match")
		_, e = r.grant(none, exchangeForm("platform:agt_nobody", oauth.TokenTypeJWT))
		wantError(t, e, "invalid_request", "not active")
		_, e = r.grant(none, exchangeForm("forged", oauth.TokenTypeJWT))
		wantError(t, e, "invalid_request", "not acceptable")
		if _, err := r.agents.Kill(context.Background(), r.admin, rec.ID, "test"); err != nil {
			t.Fatal(err)
		}
		_, e = r.grant(none, exchangeForm("platform:"+ag.id, oauth.TokenTypeJWT))
		wantError(t, e, "invalid_request", "not active")
		// Parameters every exchange needs.
		_, e = r.grant(none, url.Values{"grant_type": {oauth.GrantTokenExchange}, "subject_token_type": {oauth.TokenTypeJWT}})
		wantError(t, e, "invalid_request", "subject_token")
		_, e = r.grant(none, exchangeForm("platform:x", oauth.TokenTypeJWT, "requested_token_type", "urn:ietf:params:oauth:token-type:id_token"))
		wantError(t, e, "invalid_request", "requested_token_type")
		_, e = r.grant(none, exchangeForm("platform:x", "urn:ietf:params:oauth:token-type:saml2"))
		wantError(t, e, "invalid_client", "")
	})
}

func TestDelegationExchangeHandler(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		r := newRig(t, dbURL, 2)
		ctx := context.Background()
		sa := r.account("users:read", "users:write", "orgs:read")
		b, bRec := r.agent(agents.Verified, agents.A2AExchange, agents.ReadUsers, agents.WriteUsers)
		c, _ := r.agent(agents.Verified, agents.A2AExchange, agents.ReadUsers)
		low, _ := r.agent(agents.Registered, agents.A2AExchange, agents.ReadUsers)
		noCap, _ := r.agent(agents.Verified, agents.ReadUsers)
		subject := r.mustGrant(sa, url.Values{"grant_type": {"client_credentials"}})["access_token"].(string)

		// One hop: B acts for the service account, within both their scopes.
		m := r.mustGrant(b, exchangeForm(subject, oauth.TokenTypeAccessToken, "audience", "https://api.example/one two"))
		if m["scope"] != "users:read users:write" || m["agent_id"] != bRec.ID {
			t.Fatalf("delegation answer %v", m)
		}
		t1 := m["access_token"].(string)
		ar, claims, err := r.introspect(t1)
		if err != nil {
			t.Fatal(err)
		}
		if ar.GetSession().(*oauth.Session).GetSubject() != sa.id || !sameJSON(t, claims["act"], map[string]any{"sub": b.id}) {
			t.Fatalf("delegated token: sub %q claims %v", ar.GetSession().GetSubject(), claims)
		}
		// One audience value with a space is one audience (RFC 8693 §2.1).
		if aud := ar.GetGrantedAudience(); !slices.Equal(aud, []string{"https://api.example/one two"}) {
			t.Fatalf("audience %q", aud)
		}
		// Hop two keeps the audience; hop three is one too many.
		t2 := r.mustGrant(c, exchangeForm(t1, oauth.TokenTypeAccessToken))["access_token"].(string)
		ar, claims, _ = r.introspect(t2)
		if ar.GetGrantedScopes()[0] != "users:read" || len(ar.GetGrantedScopes()) != 1 || !slices.Equal(ar.GetGrantedAudience(), []string{"https://api.example/one two"}) ||
			!sameJSON(t, claims["act"], map[string]any{"sub": c.id, "act": map[string]any{"sub": b.id}}) {
			t.Fatalf("two hops: scopes %v aud %v claims %v", ar.GetGrantedScopes(), ar.GetGrantedAudience(), claims)
		}
		_, e := r.grant(b, exchangeForm(t2, oauth.TokenTypeAccessToken))
		wantError(t, e, "invalid_request", "3 hops")
		_, e = r.grant(c, exchangeForm(t1, oauth.TokenTypeAccessToken, "audience", "https://other.example"))
		wantError(t, e, "invalid_target", "other.example")

		// Who may not act for others, and what may not be asked.
		for _, who := range []client{sa, low, noCap} {
			_, e = r.grant(who, exchangeForm(subject, oauth.TokenTypeAccessToken))
			wantError(t, e, "unauthorized_client", "")
		}
		_, e = r.grant(c, exchangeForm(subject, oauth.TokenTypeAccessToken, "scope", "users:write"))
		wantError(t, e, "invalid_scope", "users:write")
		_, e = r.grant(b, exchangeForm("garbage", oauth.TokenTypeAccessToken))
		wantError(t, e, "invalid_request", "not an active access token")
		cTok := r.mustGrant(c, url.Values{"grant_type": {"client_credentials"}})["access_token"].(string)
		_, e = r.grant(b, exchangeForm(subject, oauth.TokenTypeAccessToken, "actor_token", cTok, "actor_token_type", oauth.TokenTypeAccessToken))
		wantError(t, e, "invalid_request", "actor_token")
		_, e = r.grant(b, exchangeForm(subject, oauth.TokenTypeAccessToken, "resource", "relative/path"))
		wantError(t, e, "invalid_target", "relative/path")
		bTok := r.mustGrant(b, url.Values{"grant_type": {"client_credentials"}})["access_token"].(string)
		r.mustGrant(b, exchangeForm(subject, oauth.TokenTypeAccessToken, "actor_token", bTok, "actor_token_type", oauth.TokenTypeAccessToken))

		// The chain bites: B's kill ends t1 and t2, not C's own token.
		if _, err := r.agents.Kill(ctx, r.admin, bRec.ID, "test"); err != nil {
			t.Fatal(err)
		}
		for _, tok := range []string{t1, t2} {
			if _, _, err := r.introspect(tok); err == nil {
				t.Fatal("a token whose chain holds a killed agent is active")
			}
		}
		if _, _, err := r.introspect(cTok); err != nil {
			t.Fatalf("C's own token: %v", err)
		}
	})
}

// sameJSON tells whether a and b are the same JSON value, members in any order.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	norm := func(v any) string {
		b, err := json.Marshal(v)
		var x any
		if err == nil {
			err = json.Unmarshal(b, &x)
		}
		if err == nil {
			b, err = json.Marshal(x)
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return norm(a) == norm(b)
}
