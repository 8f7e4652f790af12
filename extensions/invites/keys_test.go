package invites_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// capture is a mail sender that hands each message to the test.
type capture chan mail.Message

func (c capture) Send(_ context.Context, m mail.Message) error { c <- m; return nil }

var link = regexp.MustCompile(`/invites/([A-Za-z0-9_-]+)`)

// Invite tokens are hashed with a key derived for invites alone, not the
// client-secret key; invites made before that (migration 0007) were hashed
// with the client-secret key and keep working until they expire, and only
// they are looked up with it.
func TestInviteTokenKeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		secret := []byte("a system secret for this test only")
		sent := make(capture, 1)
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		outbox, err := mail.NewOutbox(store, sent, oauth.DeriveKey(secret, "mail outbox"), log)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		go outbox.Run(runCtx)
		svc := invites.New(store, secret, outbox, "https://id.example", time.Hour)

		now := time.Now().UTC().Truncate(time.Microsecond)
		sa := &persistence.ServiceAccount{ID: uuid.NewString(), ClientID: "sa_inviter", SecretHash: []byte("h"), Name: "inviter",
			Scopes: []string{"users:invite"}, RedirectURIs: []string{"https://app.example/cb"}, CreatedAt: now, UpdatedAt: now}
		if err := store.CreateServiceAccount(ctx, sa); err != nil {
			t.Fatal(err)
		}
		caller := invites.Caller{ClientID: sa.ClientID, ServiceAccountID: sa.ID, Actor: persistence.Actor{ClientID: sa.ClientID}}
		inv, err := svc.Create(ctx, caller, invites.Input{Email: "new@example.com", RedirectURI: "https://app.example/cb"})
		if err != nil {
			t.Fatal(err)
		}
		var token string
		select {
		case m := <-sent:
			token = link.FindStringSubmatch(m.Text)[1]
		case <-time.After(10 * time.Second):
			t.Fatal("no invite message")
		}
		hash := func(h *oauth.SecretHasher, token string) []byte {
			b, _ := h.Hash(ctx, []byte(token))
			return b
		}
		inviteKey, clientKey := oauth.NewHasher(secret, oauth.PurposeInviteToken), oauth.NewSecretHasher(secret)
		got, err := store.InviteByToken(ctx, hash(inviteKey, token), persistence.InviteTokenKey)
		if err != nil || got.ID != inv.ID || got.TokenKey != persistence.InviteTokenKey {
			t.Fatalf("the new invite is not stored under the invite key: %+v %v", got, err)
		}
		for _, key := range []string{persistence.InviteTokenKey, persistence.LegacyInviteTokenKey} {
			if _, err := store.InviteByToken(ctx, hash(clientKey, token), key); !errors.Is(err, persistence.ErrNotFound) {
				t.Fatalf("the new invite's token hashed with the client-secret key is found (%s): %v", key, err)
			}
		}
		if _, _, err := svc.Status(ctx, token); err != nil {
			t.Fatalf("status of the new invite: %v", err)
		}

		// Invites from before: hashed with the client-secret key.
		legacy := func(tokenKey string) string {
			token := oauth.NewSecret()
			u := &persistence.User{ID: uuid.NewString(), Email: uuid.NewString() + "@example.com", Status: "invited", Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now}
			row := &persistence.Invite{ID: uuid.NewString(), TokenHash: hash(clientKey, token), TokenKey: tokenKey, Email: u.Email, UserID: u.ID,
				CreatorClientID: sa.ClientID, CreatorPrincipal: sa.ID, RedirectURI: "https://app.example/cb", AcceptURI: "https://app.example/cb",
				Metadata: persistence.JSONObject{}, Status: persistence.InviteSent, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
			if err := store.CreateInvite(ctx, row, u, nil); err != nil {
				t.Fatal(err)
			}
			return token
		}
		old := legacy(persistence.LegacyInviteTokenKey)
		if _, _, err := svc.Status(ctx, old); err != nil {
			t.Fatalf("an invite from before the invite key: %v", err)
		}
		if accepted, err := svc.Accept(ctx, caller, old); err != nil || accepted.Status != persistence.InviteAccepted {
			t.Fatalf("accepting an invite from before the invite key: %+v %v", accepted, err)
		}
		// The client-secret key finds legacy rows only.
		if _, _, err := svc.Status(ctx, legacy(persistence.InviteTokenKey)); !errors.Is(err, invites.ErrNoInvite) {
			t.Fatalf("a client-secret hash on a row of the invite key: %v", err)
		}
	})
}
