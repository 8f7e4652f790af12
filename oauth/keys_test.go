package oauth

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

func published(ks *KeySet) []string {
	var kids []string
	for _, k := range ks.PublicJWKS().Keys {
		if !k.IsPublic() {
			panic("JWKS holds a private key")
		}
		kids = append(kids, k.KeyID)
	}
	return kids
}

func signer(t *testing.T, ks *KeySet, alg string) string {
	t.Helper()
	k, ok := ks.Signer(alg)
	if !ok {
		t.Fatalf("no %s signer", alg)
	}
	if k.IsPublic() {
		t.Fatalf("the %s signer holds no private key", alg)
	}
	return k.KeyID
}

// A rotation makes a new key per algorithm the signer at once, on this key
// set and (when it hears, or at its next reload) on another replica's; the
// old keys stay published for their window, then leave JWKS and the store.
func TestKeySetRotation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		one, err := LoadKeys(ctx, dbtest.Store(t, dbURL))
		if err != nil {
			t.Fatal(err)
		}
		other := dbtest.Store(t, dbURL) // another replica, its own store
		two, err := LoadKeys(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		oldRS, oldES := signer(t, one, AlgRS256), signer(t, one, AlgES256)
		if signer(t, two, AlgRS256) != oldRS || signer(t, two, AlgES256) != oldES || len(published(one)) != 2 {
			t.Fatalf("replicas disagree on a first start: %v %v", published(one), published(two))
		}
		watchCtx, stop := context.WithCancel(ctx)
		defer stop()
		go two.Watch(watchCtx)

		added, retired, err := one.Rotate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{oldES, oldRS}
		slices.Sort(retired)
		slices.Sort(want)
		if len(added) != 2 || !slices.Equal(retired, want) {
			t.Fatalf("added %d keys, retired %v, want %v", len(added), retired, want)
		}
		newKids := map[string]string{added[0].Alg: added[0].KID, added[1].Alg: added[1].KID}
		for alg, kid := range newKids {
			if got := signer(t, one, alg); got != kid {
				t.Fatalf("%s signer %s after the rotation, want the new %s", alg, got, kid)
			}
		}
		if got := published(one); len(got) != 4 || !slices.Contains(got, oldRS) || !slices.Contains(got, newKids[AlgES256]) {
			t.Fatalf("JWKS after the rotation: %v", got)
		}
		// The other replica follows within a reload.
		deadline := time.Now().Add(3 * KeyReload)
		for signer(t, two, AlgRS256) != newKids[AlgRS256] || signer(t, two, AlgES256) != newKids[AlgES256] || len(published(two)) != 4 {
			if time.Now().After(deadline) {
				t.Fatalf("the other replica still signs with %s and publishes %v", signer(t, two, AlgRS256), published(two))
			}
			time.Sleep(20 * time.Millisecond)
		}

		list, err := one.List(ctx)
		if err != nil || len(list) != 4 {
			t.Fatalf("list %+v %v", list, err)
		}
		for _, k := range list {
			switch {
			case k.KID == newKids[k.Alg]:
				if k.State != KeyActive || k.RetiredAt != nil || k.PublishedUntil != nil {
					t.Errorf("new key %+v", k)
				}
			case k.State != KeyRetired || k.RetiredAt == nil || k.PublishedUntil == nil || !k.PublishedUntil.Equal(k.RetiredAt.Add(maxSignedLifetime+KeyReload)):
				t.Errorf("retired key %+v", k)
			}
		}

		// Past their window, the retired keys leave JWKS and the listing,
		// and the sweep deletes them. (A window ending before the
		// retirement stands for time having passed.)
		one.setSignedLifetime(-KeyReload - time.Second)
		if got := published(one); len(got) != 2 || slices.Contains(got, oldRS) {
			t.Fatalf("JWKS past the window: %v", got)
		}
		if list, _ := one.List(ctx); len(list) != 2 {
			t.Fatalf("listing past the window: %+v", list)
		}
		if n, err := one.Sweep(ctx, time.Now()); err != nil || n != 2 {
			t.Fatalf("swept %d: %v", n, err)
		}
		if n, _ := one.Sweep(ctx, time.Now()); n != 0 {
			t.Fatalf("swept again: %d", n)
		}
		if err := two.reload(ctx); err != nil || len(published(two)) != 2 {
			t.Fatalf("the other replica after the sweep: %v %v", published(two), err)
		}
	})
}
