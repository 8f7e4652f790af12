package persistence_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newProvider(name string, apps ...string) *persistence.IdentityProvider {
	n := now()
	return &persistence.IdentityProvider{
		ID: uuid.NewString(), Name: name, DisplayName: "Acme " + name, Issuer: "https://" + name + ".example", ClientID: "rp",
		ClientSecretSealed: []byte("sealed"), Scopes: []string{"openid", "email"}, Applications: apps, CreatedAt: n, UpdatedAt: n,
	}
}

func TestIdentityProviders(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)

		p := newProvider("acme-sso", "app_one", "app_two")
		if err := s.CreateIdentityProvider(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateIdentityProvider(ctx, newProvider("acme-sso")); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a taken name: %v", err)
		}
		other := newProvider("google", "app_two")
		if err := s.CreateIdentityProvider(ctx, other); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetIdentityProviderByName(ctx, "acme-sso")
		if err != nil || got.ID != p.ID || !slices.Equal(got.Applications, []string{"app_one", "app_two"}) || string(got.ClientSecretSealed) != "sealed" {
			t.Fatalf("by name: %+v %v", got, err)
		}
		if _, err := s.GetIdentityProvider(ctx, uuid.NewString()); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown: %v", err)
		}
		names := func(list []persistence.IdentityProvider) []string {
			var out []string
			for _, x := range list {
				out = append(out, x.Name)
			}
			return out
		}
		if list, err := s.IdentityProvidersOf(ctx, "app_two"); err != nil || !slices.Equal(names(list), []string{"acme-sso", "google"}) {
			t.Fatalf("offered by app_two: %v %v", names(list), err)
		}
		if list, err := s.IdentityProvidersOf(ctx, "app_one"); err != nil || !slices.Equal(names(list), []string{"acme-sso"}) {
			t.Fatalf("offered by app_one: %v %v", names(list), err)
		}
		if list, err := s.IdentityProvidersOf(ctx, "app_"); err != nil || len(list) != 0 {
			t.Fatalf("a prefix is no client id: %v %v", names(list), err)
		}
		list, total, err := s.ListIdentityProviders(ctx, persistence.Page{Limit: 1, Offset: 1})
		if err != nil || total != 2 || !slices.Equal(names(list), []string{"google"}) {
			t.Fatalf("page: %v %d %v", names(list), total, err)
		}
		if _, err := s.UpdateIdentityProvider(ctx, other.ID, func(x *persistence.IdentityProvider) error {
			x.Name = "acme-sso"
			return nil
		}); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("renamed onto a taken name: %v", err)
		}
		up, err := s.UpdateIdentityProvider(ctx, other.ID, func(x *persistence.IdentityProvider) error {
			x.Applications = []string{"app_one"}
			return nil
		})
		if err != nil || !slices.Equal(up.Applications, []string{"app_one"}) {
			t.Fatalf("update: %+v %v", up, err)
		}
		if list, _ := s.IdentityProvidersOf(ctx, "app_two"); !slices.Equal(names(list), []string{"acme-sso"}) {
			t.Fatalf("after the update: %v", names(list))
		}
		if err := s.DeleteIdentityProvider(ctx, other.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteIdentityProvider(ctx, other.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("deleted twice: %v", err)
		}
	})
}

func TestUpstreamIdentities(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ada, bob := newUser("ada@example.com"), newUser("bob@example.com")
		for _, u := range []*persistence.User{ada, bob} {
			if err := s.CreateUser(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		id := persistence.Identity{UserID: ada.ID, Provider: "acme-sso", Issuer: "https://idp.example", Subject: "248289761001", CreatedAt: now()}
		if err := s.AddIdentity(ctx, id); err != nil {
			t.Fatal(err)
		}
		// The same upstream person cannot be another account's.
		taken := id
		taken.UserID = bob.ID
		if err := s.AddIdentity(ctx, taken); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("one upstream subject, two people: %v", err)
		}
		// The same subject at another issuer is another person.
		elsewhere := taken
		elsewhere.Issuer = "https://other.example"
		if err := s.AddIdentity(ctx, elsewhere); err != nil {
			t.Fatal(err)
		}
		got, err := s.UpstreamIdentity(ctx, "acme-sso", "https://idp.example", "248289761001")
		if err != nil || got.UserID != ada.ID {
			t.Fatalf("bound: %+v %v", got, err)
		}
		if _, err := s.UpstreamIdentity(ctx, "acme-sso", "https://idp.example", "other"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unbound: %v", err)
		}
		ids, err := s.UserIdentities(ctx, ada.ID)
		if err != nil || len(ids) != 1 || ids[0].Issuer != "https://idp.example" || ids[0].Subject != "248289761001" {
			t.Fatalf("ada's identities: %+v %v", ids, err)
		}
	})
}

func TestUpstreamStatesAndLinks(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		p := newProvider("acme-sso", "app_one")
		if err := s.CreateIdentityProvider(ctx, p); err != nil {
			t.Fatal(err)
		}
		n := now()
		st := &persistence.UpstreamState{ID: uuid.NewString(), StateHash: []byte("state-1"), NonceHash: []byte("nonce"), VerifierSealed: []byte("v"),
			ProviderID: p.ID, BrowserHash: []byte("b"), ClientID: "app_one", RedirectURI: "https://app.example/cb", CodeChallenge: "c",
			CreatedAt: n, ExpiresAt: n.Add(10 * time.Minute)}
		if err := s.CreateUpstreamState(ctx, st); err != nil {
			t.Fatal(err)
		}
		old := *st
		old.ID, old.StateHash, old.ExpiresAt = uuid.NewString(), []byte("state-old"), n.Add(-time.Second)
		if err := s.CreateUpstreamState(ctx, &old); err != nil {
			t.Fatal(err)
		}
		if _, err := s.TakeUpstreamState(ctx, []byte("state-old"), n); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("expired state: %v", err)
		}
		// Two callbacks with one state: one gets it.
		var wg sync.WaitGroup
		results := make([]error, 4)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := s.TakeUpstreamState(ctx, []byte("state-1"), n)
				if err == nil && (got.ID != st.ID || got.UsedAt == nil || got.RedirectURI != st.RedirectURI) {
					err = errors.New("wrong state")
				}
				results[i] = err
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range results {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, persistence.ErrNotFound):
				t.Fatalf("take: %v", err)
			}
		}
		if won != 1 {
			t.Fatalf("%d callbacks took one state", won)
		}

		ada := newUser("ada@example.com")
		if err := s.CreateUser(ctx, ada); err != nil {
			t.Fatal(err)
		}
		l := &persistence.UpstreamLink{ID: uuid.NewString(), HandleHash: []byte("handle"), UserID: ada.ID, Provider: "acme-sso", ProviderID: p.ID,
			Issuer: p.Issuer, Subject: "sub-1", Email: "ada@example.com", EmailVerified: true, ClientID: "app_one",
			CreatedAt: n, ExpiresAt: n.Add(10 * time.Minute)}
		if err := s.CreateUpstreamLink(ctx, l); err != nil {
			t.Fatal(err)
		}
		got, err := s.UpstreamLinkByHash(ctx, []byte("handle"))
		if err != nil || got.UserID != ada.ID || got.Subject != "sub-1" || !got.EmailVerified || got.UsedAt != nil {
			t.Fatalf("link: %+v %v", got, err)
		}
		if ok, err := s.UseUpstreamLink(ctx, l.ID, n.Add(11*time.Minute)); ok || err != nil {
			t.Fatalf("used after expiry: %v %v", ok, err)
		}
		if ok, err := s.UseUpstreamLink(ctx, l.ID, n); !ok || err != nil {
			t.Fatalf("use: %v %v", ok, err)
		}
		if ok, _ := s.UseUpstreamLink(ctx, l.ID, n); ok {
			t.Fatal("used twice")
		}
		if removed, err := s.DeleteExpiredUpstream(ctx, n.Add(time.Hour)); err != nil || removed != 3 {
			t.Fatalf("sweep: %d %v", removed, err)
		}
	})
}
