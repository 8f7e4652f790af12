package oauth

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence"
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
		one, err := LoadKeys(ctx, dbtest.Store(t, dbURL), testSecret)
		if err != nil {
			t.Fatal(err)
		}
		other := dbtest.Store(t, dbURL) // another replica, its own store
		two, err := LoadKeys(ctx, other, testSecret)
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

// testSecret is the system secret of the key sets here.
var testSecret = []byte("a system secret for the key tests")

// clearKey is a key stored as an earlier version stored it: in clear.
func clearKey(t *testing.T, alg string) persistence.SigningKey {
	t.Helper()
	k, err := generateKey(alg, NewSealer(testSecret, PurposeSigningKey))
	if err != nil {
		t.Fatal(err)
	}
	der, err := NewSealer(testSecret, PurposeSigningKey).Open(k.PrivateDER, []byte(k.KID))
	if err != nil {
		t.Fatal(err)
	}
	k.PrivateDER = der
	return k
}

// expectSealed checks that no stored key holds private material in a form
// anyone could use: PKCS #8 DER, PEM or a JWK's private members.
func expectSealed(t *testing.T, store KeyStore, n int) {
	t.Helper()
	stored, err := store.SigningKeys(context.Background())
	if err != nil || len(stored) != n {
		t.Fatalf("%d stored keys (%v), want %d", len(stored), err, n)
	}
	for _, k := range stored {
		if _, err := x509.ParsePKCS8PrivateKey(k.PrivateDER); err == nil {
			t.Fatalf("key %s is stored in clear (PKCS #8)", k.KID)
		}
		for _, marker := range []string{"PRIVATE KEY", `"d":`, `"p":`} {
			if bytes.Contains(k.PrivateDER, []byte(marker)) {
				t.Fatalf("key %s is stored with %q", k.KID, marker)
			}
		}
		if _, err := NewSealer(testSecret, PurposeSigningKey).Open(k.PrivateDER, []byte(k.KID)); err != nil {
			t.Fatalf("key %s does not open: %v", k.KID, err)
		}
	}
}

// Private signing keys are sealed at rest: on first start, on rotation
// (by the server and by `identityd keys rotate`); a copy of the database
// without the system secret signs nothing.
func TestSigningKeysSealed(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		ks, err := LoadKeys(ctx, store, testSecret)
		if err != nil {
			t.Fatal(err)
		}
		expectSealed(t, store, 2)
		rs := signer(t, ks, AlgRS256)
		if _, _, err := ks.Rotate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := RotateKeys(ctx, store, NewSealer(testSecret, PurposeSigningKey)); err != nil {
			t.Fatal(err)
		}
		expectSealed(t, store, 6)
		// Another replica with the same secret reads them all.
		again, err := LoadKeys(ctx, dbtest.Store(t, dbURL), testSecret)
		if err != nil || len(published(again)) != 6 || !slices.Contains(published(again), rs) {
			t.Fatalf("reloaded: %v %v", published(again), err)
		}
		// Another system secret opens none: the server does not start.
		if _, err := LoadKeys(ctx, dbtest.Store(t, dbURL), []byte("another system secret, not the one")); !errors.Is(err, ErrSealBroken) {
			t.Fatalf("keys loaded under another system secret: %v", err)
		}
	})
}

// Keys an earlier version stored in clear keep working, and are sealed in
// place on the first start (once, however many replicas start together).
func TestClearSigningKeysSealedOnStart(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		rs, es := clearKey(t, AlgRS256), clearKey(t, AlgES256)
		if _, err := store.EnsureSigningKeys(ctx, []persistence.SigningKey{rs, es}); err != nil {
			t.Fatal(err)
		}
		sets := make([]*KeySet, 3)
		var wg sync.WaitGroup
		for i := range sets {
			wg.Go(func() {
				var err error
				if sets[i], err = LoadKeys(ctx, dbtest.Store(t, dbURL), testSecret); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		for _, ks := range sets {
			if signer(t, ks, AlgRS256) != rs.KID || signer(t, ks, AlgES256) != es.KID {
				t.Fatalf("the stored keys are not the signers: %v", published(ks))
			}
		}
		expectSealed(t, store, 2)
		// The private key read is the one stored in clear.
		k, _ := sets[0].Signer(AlgES256)
		der, err := x509.MarshalPKCS8PrivateKey(k.Key)
		if err != nil || !bytes.Equal(der, es.PrivateDER) {
			t.Fatalf("the signer is not the stored key (%v)", err)
		}
	})
}

// After the system secret changes (say it leaked), `identityd keys
// rotate` with the new one retires the keys it cannot open and makes new
// ones; the server starts, and publishes the new keys only.
func TestSigningKeysAfterSecretChange(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		old, err := LoadKeys(ctx, store, testSecret)
		if err != nil {
			t.Fatal(err)
		}
		newSecret := []byte("the system secret that replaced it")
		if _, err := LoadKeys(ctx, store, newSecret); !errors.Is(err, ErrSealBroken) {
			t.Fatalf("active keys sealed under the old secret loaded: %v", err)
		}
		added, _, err := RotateKeys(ctx, store, NewSealer(newSecret, PurposeSigningKey))
		if err != nil {
			t.Fatal(err)
		}
		ks, err := LoadKeys(ctx, store, newSecret)
		if err != nil {
			t.Fatal(err)
		}
		if got := published(ks); len(got) != 2 || !slices.Contains(got, added[0].KID) || slices.Contains(got, signer(t, old, AlgRS256)) {
			t.Fatalf("published %v, want the new keys only", got)
		}
	})
}
