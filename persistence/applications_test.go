package persistence_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

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

// The store's application methods: read by id and client id, list in pages,
// update under the row lock (the cached client follows at once), delete.
func TestApplications(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		app := newApplication("app_crud")
		app.WebOrigins = persistence.StringList{"https://app.example.com"}
		app.RPID = "example.com"
		if err := s.CreateApplication(ctx, app); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetApplication(ctx, app.ID)
		if err != nil || got.ClientID != "app_crud" || got.RPID != "example.com" || !slices.Equal(got.WebOrigins, app.WebOrigins) ||
			got.MFA["policy"] != "off" || !got.CreatedAt.Equal(app.CreatedAt) || got.AccessTokenTTL != nil {
			t.Fatalf("get: %+v %v", got, err)
		}
		if byClient, err := s.GetApplicationByClientID(ctx, "app_crud"); err != nil || byClient.ID != app.ID {
			t.Fatalf("by client id: %+v %v", byClient, err)
		}
		if _, err := s.GetApplication(ctx, uuid.NewString()); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown id: %v", err)
		}
		if _, err := s.GetApplicationByClientID(ctx, "app_none"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown client id: %v", err)
		}

		// The client is cached; an update evicts it at once.
		if c, err := s.GetClient(ctx, "app_crud"); err != nil || string(c.GetHashedSecret()) != "hash" {
			t.Fatalf("client: %v %v", c, err)
		}
		ttl := 900
		updated, err := s.UpdateApplication(ctx, app.ID, func(a *persistence.Application) error {
			a.SecretHash, a.Name, a.RedirectURIs = []byte("rotated"), "Renamed", persistence.StringList{"https://new.example.com/cb"}
			a.AccessTokenTTL, a.AccessTokenFormat, a.AdminConsole = &ttl, "jwt", true
			a.MFA = persistence.JSONObject{"policy": "required", "factors": []any{"totp"}}
			a.UpdatedAt = now()
			return nil
		})
		if err != nil || updated.Name != "Renamed" {
			t.Fatalf("update: %+v %v", updated, err)
		}
		fc, err := s.GetClient(ctx, "app_crud")
		if err != nil {
			t.Fatal(err)
		}
		c := fc.(*persistence.Client)
		if string(c.SecretHash) != "rotated" || c.RedirectURIs[0] != "https://new.example.com/cb" || c.App.Name != "Renamed" ||
			c.App.AccessTokenTTL != 15*time.Minute || c.App.AccessTokenFormat != "jwt" || !c.App.AdminConsole || c.App.MFA["policy"] != "required" {
			t.Fatalf("the cache serves the old client after the update: %+v %+v", c, c.App)
		}
		reread, _ := s.GetApplication(ctx, app.ID)
		if reread.Name != "Renamed" || *reread.AccessTokenTTL != 900 || !reread.AdminConsole || reread.Type != persistence.AppConfidential {
			t.Fatalf("stored: %+v", reread)
		}
		// An error from the change aborts it.
		refused := errors.New("refused")
		if _, err := s.UpdateApplication(ctx, app.ID, func(a *persistence.Application) error {
			a.Name = "Never"
			return refused
		}); !errors.Is(err, refused) {
			t.Fatalf("aborted update: %v", err)
		}
		if reread, _ := s.GetApplication(ctx, app.ID); reread.Name != "Renamed" {
			t.Fatalf("an aborted update was stored: %q", reread.Name)
		}
		if _, err := s.UpdateApplication(ctx, uuid.NewString(), func(*persistence.Application) error { return nil }); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("update of an unknown id: %v", err)
		}

		// Pages, oldest first.
		for i := range 3 {
			a := newApplication("app_page" + string(rune('a'+i)))
			a.CreatedAt = app.CreatedAt.Add(time.Duration(i+1) * time.Second)
			if err := s.CreateApplication(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		list, total, err := s.ListApplications(ctx, persistence.Page{Limit: 2, Offset: 1})
		if err != nil || total != 4 || len(list) != 2 || list[0].ClientID != "app_pagea" || list[1].ClientID != "app_pageb" {
			t.Fatalf("page: %d %v %v", total, list, err)
		}
		if _, _, err := s.ListApplications(ctx, persistence.Page{Limit: 0}); err == nil {
			t.Fatal("a page of no rows was accepted")
		}

		// Deleting ends the client and every token it holds, and an
		// application made again under the same client id does not revive them.
		if err := s.CreateAccessTokenSession(ctx, "app-sig", tokenRequestFor(c, now().Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, "app-sig", &fosite.DefaultSession{}); err != nil {
			t.Fatalf("the application's token: %v", err)
		}
		if _, err := s.DeleteApplication(ctx, app.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetClient(ctx, "app_crud"); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("the cache serves a deleted application: %v", err)
		}
		if _, err := s.GetAccessTokenSession(ctx, "app-sig", &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("a token of a deleted application: %v", err)
		}
		if _, err := s.DeleteApplication(ctx, app.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if err := s.CreateApplication(ctx, newApplication("app_crud")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, "app-sig", &fosite.DefaultSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("a token revived by a new application with the same client id: %v", err)
		}
	})
}

// A public application is a public fosite client without a secret.
func TestPublicApplicationClient(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		app := newApplication("app_native")
		app.Type, app.SecretHash = persistence.AppPublic, nil
		app.RedirectURIs = persistence.StringList{"com.example.notes:/callback"}
		if err := s.CreateApplication(ctx, app); err != nil {
			t.Fatal(err)
		}
		c, err := s.GetClient(ctx, "app_native")
		if err != nil {
			t.Fatal(err)
		}
		if !c.IsPublic() || len(c.GetHashedSecret()) != 0 || c.GetRedirectURIs()[0] != "com.example.notes:/callback" {
			t.Fatalf("public client: public %v secret %q %v", c.IsPublic(), c.GetHashedSecret(), c.GetRedirectURIs())
		}
	})
}

// Replicas on PostgreSQL: an update or delete through one is what the other
// serves as soon as it returns (the commit wait and eviction messages).
func TestApplicationAcrossReplicas(t *testing.T) {
	dbURL, ok := dbtest.URLs(t)["postgres"]
	if !ok {
		t.Skip("TEST_DATABASE_URL is not set")
	}
	ctx := context.Background()
	a, b := openStore(t, dbURL), openStore(t, dbURL)
	app := newApplication("app_shared")
	if err := a.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetClient(ctx, "app_shared"); err != nil { // cached on b
		t.Fatal(err)
	}
	if _, err := a.UpdateApplication(ctx, app.ID, func(x *persistence.Application) error {
		x.SecretHash = []byte("rotated")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c, err := b.GetClient(ctx, "app_shared"); err != nil || string(c.GetHashedSecret()) != "rotated" {
		t.Fatalf("b serves the old secret after the rotation returned: %v %v", c, err)
	}
	if _, err := a.DeleteApplication(ctx, app.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetClient(ctx, "app_shared"); !errors.Is(err, fosite.ErrNotFound) {
		t.Fatalf("b serves a deleted application: %v", err)
	}
}

// Deleting an application ends its codes, access tokens and refresh tokens
// at once: each is bound to the application as a principal.
func TestDeletedApplicationEndsItsGrants(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		req := f.request(nil)
		if err := f.s.CreateAuthorizeCodeSession(ctx, "code-sig", req); err != nil {
			t.Fatal(err)
		}
		if err := f.s.CreateAccessTokenSession(ctx, "access-sig", req); err != nil {
			t.Fatal(err)
		}
		if err := f.s.CreateRefreshTokenSession(ctx, "refresh-sig", "access-sig", req); err != nil {
			t.Fatal(err)
		}
		reads := map[string]func() error{
			"code": func() error {
				_, err := f.s.GetAuthorizeCodeSession(ctx, "code-sig", &personSession{})
				return err
			},
			"access token": func() error {
				_, err := f.s.GetAccessTokenSession(ctx, "access-sig", &personSession{})
				return err
			},
			"refresh token": func() error {
				_, err := f.s.GetRefreshTokenSession(ctx, "refresh-sig", &personSession{})
				return err
			},
		}
		for what, read := range reads {
			if err := read(); err != nil {
				t.Fatalf("%s before the deletion: %v", what, err)
			}
		}
		if _, err := f.s.DeleteApplication(ctx, f.client.RecordID); err != nil {
			t.Fatal(err)
		}
		for what, read := range reads {
			if err := read(); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("%s of a deleted application: %v", what, err)
			}
		}
	})
}
