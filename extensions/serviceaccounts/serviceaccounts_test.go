package serviceaccounts_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newService(t *testing.T) (*serviceaccounts.Service, *oauth.SecretHasher) {
	t.Helper()
	store := dbtest.Store(t, dbtest.URLs(t)["sqlite"])
	h := oauth.NewSecretHasher([]byte("test system secret of some length"))
	return serviceaccounts.New(store, h), h
}

func TestCreateValidation(t *testing.T) {
	svc, _ := newService(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		in     serviceaccounts.Input
		fields []string // fields reported; none means valid
	}{
		{"minimal", serviceaccounts.Input{Name: "x"}, nil},
		{"full", serviceaccounts.Input{Name: "x", Description: "d", Scopes: []string{"users:read", "admin"}, RedirectURIs: []string{"https://a.example/cb"}}, nil},
		{"blank name", serviceaccounts.Input{Name: "   "}, []string{"name"}},
		{"unknown scope", serviceaccounts.Input{Name: "x", Scopes: []string{"users:read", "users:rea"}}, []string{"scopes[1]"}},
		{"bad redirect", serviceaccounts.Input{Name: "x", RedirectURIs: []string{"https://ok.example", "http://evil.example"}}, []string{"redirectUris[1]"}},
		{"all at once", serviceaccounts.Input{Name: "", Scopes: []string{"nope"}, RedirectURIs: []string{"rel"}}, []string{"name", "scopes[0]", "redirectUris[0]"}},
	}
	for _, c := range cases {
		sa, secret, err := svc.Create(ctx, c.in)
		var ve *extensions.ValidationError
		if c.fields == nil {
			if err != nil || len(secret) != 43 || sa.ClientID[:3] != "sa_" || string(sa.SecretHash) == secret {
				t.Errorf("%s: %+v %q %v", c.name, sa, secret, err)
			}
			continue
		}
		if !errors.As(err, &ve) {
			t.Errorf("%s: err %v, want a validation error", c.name, err)
			continue
		}
		for _, f := range c.fields {
			if ve.Fields[f] == "" {
				t.Errorf("%s: %s not reported in %v", c.name, f, ve.Fields)
			}
		}
		if len(ve.Fields) != len(c.fields) {
			t.Errorf("%s: reported %v, want %v", c.name, ve.Fields, c.fields)
		}
	}
}

func TestUpdateRotateDelete(t *testing.T) {
	svc, h := newService(t)
	ctx := context.Background()
	sa, secret, err := svc.Create(ctx, serviceaccounts.Input{Name: "svc", Scopes: []string{"users:read", "users:read"}})
	if err != nil || !slices.Equal(sa.Scopes, []string{"users:read"}) {
		t.Fatalf("create %+v %v (duplicates must collapse)", sa, err)
	}
	desc := "now described"
	up, err := svc.Update(ctx, sa.ID, serviceaccounts.Patch{Description: &desc})
	if err != nil || up.Description != desc || up.Name != "svc" || !slices.Equal(up.Scopes, []string{"users:read"}) {
		t.Fatalf("patch %+v %v", up, err)
	}
	bad := []string{"nope"}
	if _, err := svc.Update(ctx, sa.ID, serviceaccounts.Patch{Scopes: &bad}); err == nil {
		t.Fatal("invalid patch accepted")
	}
	if got, _ := svc.Get(ctx, sa.ID); !slices.Equal(got.Scopes, []string{"users:read"}) {
		t.Fatalf("refused patch was written: %v", got.Scopes)
	}

	rotated, newSecret, err := svc.Rotate(ctx, sa.ID)
	if err != nil || newSecret == secret || rotated.RotatedAt == nil {
		t.Fatalf("rotate %+v %v", rotated, err)
	}
	if h.Compare(ctx, rotated.SecretHash, []byte(secret)) == nil || h.Compare(ctx, rotated.SecretHash, []byte(newSecret)) != nil {
		t.Fatal("rotation did not replace the secret")
	}

	for _, id := range []string{"not-a-uuid", "00000000-0000-0000-0000-000000000000"} {
		if _, err := svc.Get(ctx, id); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("get %s: %v", id, err)
		}
		if err := svc.Delete(ctx, id); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if err := svc.Delete(ctx, sa.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Get(ctx, sa.ID); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("deleted account still there: %v", err)
	}
}

func TestBootstrapAdmin(t *testing.T) {
	svc, h := newService(t)
	ctx := context.Background()

	id, secret, created, err := svc.GenerateAdminIfNone(ctx)
	if err != nil || !created || id == "" || len(secret) != 43 {
		t.Fatalf("first start: %q %q %v %v", id, secret, created, err)
	}
	if _, _, created, err := svc.GenerateAdminIfNone(ctx); err != nil || created {
		t.Fatalf("second start created another admin: %v %v", created, err)
	}

	first, err := svc.EnsureAdmin(ctx, "ops-admin", "first-secret-with-enough-characters")
	if err != nil || !slices.Contains(first.Scopes, oauth.ScopeAdmin) || !slices.Equal(first.Scopes, oauth.Scopes) {
		t.Fatalf("ensure admin: %+v %v", first, err)
	}
	again, err := svc.EnsureAdmin(ctx, "ops-admin", "second-secret-with-enough-characters")
	if err != nil || again.ID != first.ID {
		t.Fatalf("second ensure made another account: %+v %v", again, err)
	}
	if h.Compare(ctx, again.SecretHash, []byte("first-secret-with-enough-characters")) == nil ||
		h.Compare(ctx, again.SecretHash, []byte("second-secret-with-enough-characters")) != nil {
		t.Fatal("ensure admin did not take the new secret")
	}
}

// A lost admin secret is replaced: the configured admin's, the oldest
// admin's, or a new admin's when none exists; the old secret fails at once.
func TestResetAdmin(t *testing.T) {
	svc, h := newService(t)
	ctx := context.Background()

	fresh, secret, err := svc.ResetAdmin(ctx, "")
	if err != nil || !slices.Contains(fresh.Scopes, oauth.ScopeAdmin) || h.Compare(ctx, fresh.SecretHash, []byte(secret)) != nil {
		t.Fatalf("no admin yet: %+v %v", fresh, err)
	}
	// Others hold admin later; the oldest is the one reset.
	if _, _, err := svc.Create(ctx, serviceaccounts.Input{Name: "second admin", Scopes: []string{oauth.ScopeAdmin}}); err != nil {
		t.Fatal(err)
	}
	again, newSecret, err := svc.ResetAdmin(ctx, "")
	if err != nil || again.ID != fresh.ID || again.RotatedAt == nil || newSecret == secret {
		t.Fatalf("reset: %+v %v", again, err)
	}
	if h.Compare(ctx, again.SecretHash, []byte(secret)) == nil || h.Compare(ctx, again.SecretHash, []byte(newSecret)) != nil {
		t.Fatal("the reset did not replace the secret")
	}

	// A configured admin: reset by its client id, its scopes restored.
	if _, err := svc.EnsureAdmin(ctx, "ops-admin", "a configured secret, long enough!!"); err != nil {
		t.Fatal(err)
	}
	configured, s2, err := svc.ResetAdmin(ctx, "ops-admin")
	if err != nil || configured.ClientID != "ops-admin" || !slices.Equal(configured.Scopes, oauth.Scopes) ||
		h.Compare(ctx, configured.SecretHash, []byte(s2)) != nil || h.Compare(ctx, configured.SecretHash, []byte("a configured secret, long enough!!")) == nil {
		t.Fatalf("configured reset: %+v %v", configured, err)
	}
}
