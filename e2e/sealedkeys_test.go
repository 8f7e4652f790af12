package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"slices"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// storedKeys reads the signing_keys table as it is: kid → private_der.
func storedKeys(t *testing.T, dbURL string) map[string][]byte {
	t.Helper()
	db, _, err := persistence.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows []struct {
		KID  string `db:"kid"`
		Priv []byte `db:"private_der"`
	}
	if err := db.Select(&rows, `SELECT kid, private_der FROM signing_keys`); err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, r := range rows {
		out[r.KID] = r.Priv
	}
	return out
}

// expectNoPrivateMaterial: no stored key is PKCS #8 DER, PEM or a JWK's
// private members.
func expectNoPrivateMaterial(t *testing.T, keys map[string][]byte) {
	t.Helper()
	for kid, priv := range keys {
		if _, err := x509.ParsePKCS8PrivateKey(priv); err == nil {
			t.Fatalf("key %s is stored in clear", kid)
		}
		for _, marker := range []string{"PRIVATE KEY", `"d":`, `"p":`} {
			if bytes.Contains(priv, []byte(marker)) {
				t.Fatalf("key %s is stored with %q", kid, marker)
			}
		}
	}
}

// Private signing keys are sealed in the database, as the server makes
// them and as `identityd keys rotate` does; keys an earlier version
// stored in clear keep signing and are sealed when a server starts.
func TestSigningKeysSealedAtRest(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		system := "IDENTITYD_SYSTEM_SECRET=" + randomString() // the replica's too
		s := startLogged(t, dbURL, system)
		if code, _, stderr := s.command(t, "keys", "rotate"); code != 0 {
			t.Fatalf("keys rotate: %d %s", code, stderr)
		}
		stored := storedKeys(t, s.DB)
		if len(stored) != 4 {
			t.Fatalf("%d stored keys, want 4", len(stored))
		}
		expectNoPrivateMaterial(t, stored)

		// A key in clear, as an earlier version stored it, made the
		// active ES256 key beside the server's.
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, _ := x509.MarshalPKCS8PrivateKey(priv)
		tp, _ := (&jose.JSONWebKey{Key: priv.Public()}).Thumbprint(crypto.SHA256)
		kid := base64.RawURLEncoding.EncodeToString(tp)
		db, _, err := persistence.Open(context.Background(), s.DB)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		if _, err := db.Exec(db.Rebind(`UPDATE signing_keys SET retired_at = ? WHERE alg = 'ES256' AND retired_at IS NULL`), now); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(db.Rebind(`INSERT INTO signing_keys (kid, alg, private_der, created_at) VALUES (?, 'ES256', ?, ?)`), kid, der, now); err != nil {
			t.Fatal(err)
		}
		db.Close()

		// Another server starts on it, signs with it and seals it.
		other := s.sibling(t, system, "IDENTITYD_ADMIN_CLIENT_SECRET="+s.AdminSecret)
		if k := other.keyList(t)[kid]; k == nil || k["state"] != "active" || !slices.Contains(other.jwks(t), kid) {
			t.Fatalf("the clear key is not the active ES256 key: %v", other.keyList(t))
		}
		after := storedKeys(t, s.DB)
		if len(after) != 5 {
			t.Fatalf("%d stored keys, want 5", len(after))
		}
		expectNoPrivateMaterial(t, after)
	})
}
