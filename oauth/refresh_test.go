package oauth

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
)

// What refreshDelegation decides after fosite's refresh handler: a code
// flow's refresh keeps fosite's own checks (offline_access granted, every
// scope the client's), a delegation's new tokens end with it, and a
// delegation that ended, or grants nothing the agent still holds, renews
// nothing.
func TestRefreshDelegation(t *testing.T) {
	now := time.Now().UTC()
	app := &persistence.Client{ID: "app_x", Scopes: []string{"openid", "email", "offline_access"}, App: &persistence.AppFacts{}}
	agent := &persistence.Client{ID: "agt_x", Scopes: []string{"users:read"}, Agent: &persistence.AgentFacts{}}
	request := func(c *persistence.Client, granted []string, s *Session) *fosite.AccessRequest {
		req := fosite.NewAccessRequest(s)
		req.Client = c
		req.GrantTypes = fosite.Arguments{"refresh_token"}
		req.GrantedScope = granted
		return req
	}
	delegated := func(ends time.Time) *Session {
		s := &Session{DelegationID: "d", DelegationEnds: ends}
		s.SetExpiresAt(fosite.AccessToken, now.Add(time.Hour))
		s.SetExpiresAt(fosite.RefreshToken, now.Add(30*24*time.Hour))
		return s
	}
	for _, c := range []struct {
		name    string
		req     *fosite.AccessRequest
		want    *fosite.RFC6749Error
		access  time.Time // the access token's expiry after, when no error
		refresh time.Time
	}{
		{"code flow", request(app, []string{"openid", "offline_access"}, &Session{}), nil, time.Time{}, time.Time{}},
		{"code flow without offline_access", request(app, []string{"openid"}, &Session{}), fosite.ErrScopeNotGranted, time.Time{}, time.Time{}},
		{"code flow, a claim the app lacks", request(app, []string{"offline_access", "roles"}, &Session{}), fosite.ErrInvalidScope, time.Time{}, time.Time{}},
		{"a week's delegation", request(agent, []string{"openid", "users:read"}, delegated(now.Add(7*24*time.Hour))), nil,
			now.Add(time.Hour), now.Add(7 * 24 * time.Hour)},
		{"ends within the hour", request(agent, []string{"openid"}, delegated(now.Add(time.Minute))), nil, now.Add(time.Minute), now.Add(time.Minute)},
		{"ended", request(agent, []string{"openid"}, delegated(now.Add(-time.Second))), fosite.ErrInvalidGrant, time.Time{}, time.Time{}},
		{"no end recorded", request(agent, []string{"openid"}, delegated(time.Time{})), fosite.ErrInvalidGrant, time.Time{}, time.Time{}},
		{"nothing left", request(agent, nil, delegated(now.Add(time.Hour))), fosite.ErrInvalidGrant, time.Time{}, time.Time{}},
	} {
		err := refreshDelegation{}.HandleTokenEndpointRequest(context.Background(), c.req)
		if c.want != nil {
			if !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		s := c.req.GetSession().(*Session)
		if !c.access.IsZero() && (!s.GetExpiresAt(fosite.AccessToken).Equal(c.access) || !s.GetExpiresAt(fosite.RefreshToken).Equal(c.refresh)) {
			t.Errorf("%s: access %v, refresh %v", c.name, s.GetExpiresAt(fosite.AccessToken), s.GetExpiresAt(fosite.RefreshToken))
		}
	}
}

// A delegation's refreshed ID token ends with its access token (fosite's
// OpenID Connect refresh handler, before, cleared its expiry); a code
// flow's is left to fosite's lifetime.
func TestDelegationIDToken(t *testing.T) {
	end := time.Now().UTC().Add(time.Minute).Round(time.Second)
	for _, c := range []struct {
		name string
		s    *Session
		want time.Time
	}{
		{"delegation", &Session{DelegationID: "d"}, end},
		{"code flow", &Session{}, time.Time{}},
	} {
		c.s.SetExpiresAt(fosite.AccessToken, end)
		req := fosite.NewAccessRequest(c.s)
		req.GrantTypes = fosite.Arguments{"refresh_token"}
		if err := (delegationIDToken{}).HandleTokenEndpointRequest(context.Background(), req); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := c.s.IDTokenClaims().ExpiresAt; !got.Equal(c.want) {
			t.Errorf("%s: the ID token expires at %v, want %v", c.name, got, c.want)
		}
	}
}

// The refresh handler's scope strategy lets the person's claims through
// (refreshDelegation keeps them to delegations), never offline_access.
func TestRefreshScopeStrategy(t *testing.T) {
	strategy := refreshConfig{&fosite.Config{}}.GetScopeStrategy(context.Background())
	for scope, want := range map[string]bool{"openid": true, "email": true, "profile": true, "roles": true, "offline_access": false,
		"users:read": true, "users:write": false} {
		if got := strategy([]string{"users:read"}, scope); got != want {
			t.Errorf("%s: %v", scope, got)
		}
	}
	if (refreshConfig{&fosite.Config{}}).GetRefreshTokenScopes(context.Background()) != nil {
		t.Error("a refresh-token scope required of every refresh")
	}
}

// A delegated token comes with a refresh token only when its delegation
// outlives it.
func TestRefreshable(t *testing.T) {
	now := time.Now()
	s := &Session{DelegationID: "d", DelegationEnds: now.Add(2 * time.Hour)}
	s.SetExpiresAt(fosite.AccessToken, now.Add(time.Hour))
	if !refreshable(s) {
		t.Error("a delegation outliving its token")
	}
	s.SetExpiresAt(fosite.AccessToken, s.DelegationEnds)
	if refreshable(s) {
		t.Error("a token as long as its delegation")
	}
	if refreshable(&Session{DelegationEnds: now.Add(time.Hour)}) {
		t.Error("no delegation")
	}
	// The session keeps the delegation's end through a clone and storage.
	c := s.Clone().(*Session)
	if c.DelegationID != "d" || !c.DelegationEnds.Equal(s.DelegationEnds) {
		t.Errorf("clone: %+v", c)
	}
}
