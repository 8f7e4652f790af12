package persistence_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// newApplication is a confidential application with one redirect URI.
func newApplication(clientID string) *persistence.Application {
	n := now()
	return &persistence.Application{
		ID: uuid.NewString(), ClientID: clientID, SecretHash: []byte("hash"), Name: "Web", Type: persistence.AppConfidential,
		RedirectURIs: persistence.StringList{"https://app.example.com/callback"}, SignInMethods: persistence.StringList{"password"},
		MFA: persistence.JSONObject{"policy": "off"}, AccessTokenFormat: "opaque", IDTokenSigningAlg: "RS256", CreatedAt: n, UpdatedAt: n,
	}
}

func TestApplicationClient(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		app := newApplication("app_web")
		ttl := 600
		app.RefreshTokenTTL = &ttl
		if err := s.CreateApplication(ctx, app); err != nil {
			t.Fatal(err)
		}
		fc, err := s.GetClient(ctx, "app_web")
		if err != nil {
			t.Fatal(err)
		}
		c := fc.(*persistence.Client)
		if c.Kind != persistence.KindApplication || c.RecordID != app.ID || c.IsPublic() || c.App == nil ||
			c.App.RefreshTokenTTL.Seconds() != 600 || c.App.AccessTokenTTL != 0 || c.App.IDTokenSigningAlg != "RS256" ||
			!c.GetGrantTypes().Has("authorization_code") || !c.GetResponseTypes().Has("code") || c.GetRedirectURIs()[0] != "https://app.example.com/callback" {
			t.Fatalf("client: %+v %+v", c, c.App)
		}
		if err := s.CreateApplication(ctx, newApplication("app_web")); err == nil {
			t.Fatal("a taken client id was stored twice")
		}
	})
}

func TestAuthEvents(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		user := uuid.NewString()
		other := uuid.NewString()
		for i, u := range []string{user, other, user} {
			e := persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventSignInFailed, UserID: &u, Reason: "invalid_credentials",
				IP: "127.0.0.1", CreatedAt: now().Add(time.Duration(i) * time.Second)}
			if err := s.AppendAuthEvents(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		all, err := s.ListAuthEvents(ctx, "", persistence.Page{Limit: 10})
		if err != nil || len(all) != 3 {
			t.Fatalf("all: %d %v", len(all), err)
		}
		mine, err := s.ListAuthEvents(ctx, user, persistence.Page{Limit: 10})
		if err != nil || len(mine) != 2 || *mine[0].UserID != user || mine[0].Reason != "invalid_credentials" || mine[0].Data == nil {
			t.Fatalf("one user's: %+v %v", mine, err)
		}
	})
}
