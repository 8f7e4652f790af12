package persistence_test

import (
	"context"
	"errors"
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

func TestApplicationStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		web, mobile := newApplication("app_one"), newApplication("app_two")
		mobile.Type, mobile.SecretHash = persistence.AppPublic, nil
		for _, a := range []*persistence.Application{web, mobile} {
			if err := s.CreateApplication(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		list, total, err := s.ListApplications(ctx, persistence.Page{Limit: 1})
		if err != nil || total != 2 || len(list) != 1 || list[0].ID != web.ID {
			t.Fatalf("list: %d %+v %v", total, list, err)
		}
		if _, err := s.GetClient(ctx, "app_one"); err != nil { // cached now
			t.Fatal(err)
		}
		ttl := 900
		got, err := s.UpdateApplication(ctx, web.ID, func(a *persistence.Application) error {
			a.Name, a.AccessTokenTTL, a.AdminConsole, a.SecretHash = "Renamed", &ttl, true, []byte("new hash")
			return nil
		})
		if err != nil || got.Name != "Renamed" {
			t.Fatalf("update: %+v %v", got, err)
		}
		fc, err := s.GetClient(ctx, "app_one")
		if err != nil {
			t.Fatal(err)
		}
		if c := fc.(*persistence.Client); string(c.SecretHash) != "new hash" || c.App.Name != "Renamed" || c.App.AccessTokenTTL.Seconds() != 900 || !c.App.AdminConsole {
			t.Fatalf("the cached client was not evicted: %+v %+v", c, c.App)
		}
		pub, err := s.GetClient(ctx, "app_two")
		if err != nil || !pub.IsPublic() || pub.GetHashedSecret() != nil {
			t.Fatalf("public client: %+v %v", pub, err)
		}
		boom := errors.New("refused")
		if _, err := s.UpdateApplication(ctx, web.ID, func(a *persistence.Application) error { a.Name = "Lost"; return boom }); !errors.Is(err, boom) {
			t.Fatal(err)
		}
		if a, _ := s.GetApplication(ctx, web.ID); a.Name != "Renamed" {
			t.Fatalf("a refused update was written: %q", a.Name)
		}
		if err := s.DeleteApplication(ctx, web.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetClient(ctx, "app_one"); err == nil {
			t.Fatal("a deleted application is still a client")
		}
		if err := s.DeleteApplication(ctx, web.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
	})
}
