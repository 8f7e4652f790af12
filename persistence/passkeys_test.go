package persistence_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Passkeys: one credential id for one account; a person's list, rename and
// delete (never another's); an assertion counted once against the counter
// it was checked with; a clone revoked; ceremonies taken once.
func TestPasskeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ada, bob := newUser("ada@example.com"), newUser("bob@example.com")
		for _, u := range []*persistence.User{ada, bob} {
			if err := s.CreateUser(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		at := now()
		passkey := func(u *persistence.User, credentialID string) *persistence.Passkey {
			return &persistence.Passkey{ID: uuid.NewString(), CredentialID: []byte(credentialID), UserID: u.ID, Name: "Laptop",
				PublicKey: []byte("cose key"), SignCount: 7, AAGUID: make([]byte, 16), Transports: persistence.StringList{"internal", "hybrid"},
				Attachment: "platform", DeviceType: "desktop", BackupEligible: true, BackedUp: true, Status: persistence.PasskeyActive, CreatedAt: at}
		}
		laptop := passkey(ada, "cred-1")
		registered := persistence.AuthEvent{ID: uuid.NewString(), Type: "USER_MFA_ENABLED", UserID: &ada.ID, CreatedAt: at}
		if err := s.CreatePasskey(ctx, laptop, registered); err != nil {
			t.Fatal(err)
		}
		for _, again := range []*persistence.Passkey{passkey(ada, "cred-1"), passkey(bob, "cred-1")} {
			if err := s.CreatePasskey(ctx, again); !errors.Is(err, persistence.ErrDuplicate) {
				t.Fatalf("a credential registered twice: %v", err)
			}
		}
		got, owner, err := s.PasskeyAndOwner(ctx, []byte("cred-1"))
		if err != nil || owner.ID != ada.ID || owner.Email != ada.Email || got.UserID != ada.ID || got.ID != laptop.ID || got.SignCount != 7 || len(got.Transports) != 2 || !got.BackedUp || got.LastUsedAt != nil {
			t.Fatalf("read %+v %v", got, err)
		}
		if _, _, err := s.PasskeyAndOwner(ctx, []byte("nope")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("an unknown credential: %v", err)
		}

		// Uses: one assertion checked against counter 7, sent four times,
		// counts once; so do two assertions checked against one counter (a
		// clone racing its original).
		var wg sync.WaitGroup
		var mu sync.Mutex
		counted := 0
		use := func(u persistence.PasskeyUse) {
			wg.Go(func() {
				err := s.UsePasskey(ctx, u, at.Add(time.Second))
				if err != nil && !errors.Is(err, persistence.ErrPasskeyUseLost) {
					t.Error(err)
				}
				if err == nil {
					mu.Lock()
					counted++
					mu.Unlock()
				}
			})
		}
		for range 4 {
			use(persistence.PasskeyUse{PasskeyID: laptop.ID, Seen: 7, Count: 8, BackedUp: true})
		}
		wg.Wait()
		if got, _, _ := s.PasskeyAndOwner(ctx, []byte("cred-1")); counted != 1 || got.SignCount != 8 || got.LastUsedAt == nil {
			t.Fatalf("%d assertions counted; then %+v", counted, got)
		}
		counted = 0
		use(persistence.PasskeyUse{PasskeyID: laptop.ID, Seen: 8, Count: 9})
		use(persistence.PasskeyUse{PasskeyID: laptop.ID, Seen: 8, Count: 10})
		wg.Wait()
		if counted != 1 {
			t.Fatalf("two assertions against one counter: %d counted", counted)
		}

		// Rename and delete: the person's own only.
		if _, err := s.RenamePasskey(ctx, bob.ID, laptop.ID, "Mine"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("another's rename: %v", err)
		}
		if p, err := s.RenamePasskey(ctx, ada.ID, laptop.ID, "Work laptop"); err != nil || p.Name != "Work laptop" {
			t.Fatalf("rename %+v %v", p, err)
		}
		phone := passkey(ada, "cred-2")
		phone.CreatedAt = at.Add(time.Minute)
		if err := s.CreatePasskey(ctx, phone); err != nil {
			t.Fatal(err)
		}
		if list, err := s.UserPasskeys(ctx, ada.ID); err != nil || len(list) != 2 || list[0].ID != laptop.ID {
			t.Fatalf("list %+v %v", list, err)
		}
		if err := s.DeletePasskey(ctx, bob.ID, phone.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("another's delete: %v", err)
		}
		if err := s.DeletePasskey(ctx, ada.ID, phone.ID); err != nil {
			t.Fatal(err)
		}

		// A clone: revoked (once), its owner told, and no longer counted.
		notice := &persistence.Mail{ID: uuid.NewString(), Recipient: ada.Email, Subject: "clone", Sealed: []byte("x"), CreatedAt: at, NextAttemptAt: at}
		if err := s.RevokePasskey(ctx, laptop.ID, notice); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokePasskey(ctx, laptop.ID, nil); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("revoked twice: %v", err)
		}
		if err := s.UsePasskey(ctx, persistence.PasskeyUse{PasskeyID: laptop.ID, Seen: 9, Count: 10}, at); !errors.Is(err, persistence.ErrPasskeyUseLost) {
			t.Fatalf("a revoked credential counted: %v", err)
		}
		if list, _ := s.UserPasskeys(ctx, ada.ID); len(list) != 1 || list[0].Status != persistence.PasskeyRevoked {
			t.Fatalf("after the clone: %+v", list)
		}

		// The passkey identity comes with the first and goes with the
		// last, unless it is the person's only way in.
		names := func(u *persistence.User) []string {
			ids, err := s.UserIdentities(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, id := range ids {
				out = append(out, id.Provider)
			}
			return out
		}
		if got := names(ada); len(got) != 1 || got[0] != persistence.IdentityPasskey {
			t.Fatalf("identities %v", got)
		}
		if err := s.DeletePasskey(ctx, ada.ID, laptop.ID); !errors.Is(err, persistence.ErrLastIdentity) {
			t.Fatalf("the last way in deleted: %v", err)
		}
		if _, err := s.UpdateUser(ctx, ada.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			hash := "$argon2id$stand-in"
			u.PasswordHash = &hash
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeletePasskey(ctx, ada.ID, laptop.ID); err != nil {
			t.Fatal(err)
		}
		if got := names(ada); len(got) != 1 || got[0] != persistence.IdentityPassword {
			t.Fatalf("identities after the last passkey %v", got)
		}
		// Unlinking the passkey identity removes the passkeys.
		for _, p := range []*persistence.Passkey{passkey(ada, "cred-3"), passkey(ada, "cred-4")} {
			if err := s.CreatePasskey(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Unlink(ctx, ada.ID, persistence.IdentityPasskey, at); err != nil {
			t.Fatal(err)
		}
		if list, _ := s.UserPasskeys(ctx, ada.ID); len(list) != 0 {
			t.Fatalf("passkeys after unlinking: %+v", list)
		}

		// A ceremony is taken once, by one of several at once, whatever
		// the dialect keeps it in (PostgreSQL a row, SQLite memory).
		c := &persistence.PasskeyChallenge{Challenge: uuid.NewString(), Kind: persistence.PasskeyAuthenticate, ClientID: "app_x",
			Session: `{"challenge":"x"}`, CreatedAt: at, ExpiresAt: at.Add(5 * time.Minute)}
		if err := s.PutPasskeyChallenge(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := s.PutPasskeyChallenge(ctx, c); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("one challenge begun twice: %v", err)
		}
		if _, err := s.TakePasskeyChallenge(ctx, c.Challenge, persistence.PasskeyRegister); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a ceremony of another kind: %v", err)
		}
		taken := 0
		for range 4 {
			wg.Go(func() {
				got, err := s.TakePasskeyChallenge(ctx, c.Challenge, persistence.PasskeyAuthenticate)
				if err != nil && !errors.Is(err, persistence.ErrNotFound) {
					t.Error(err)
				}
				if err == nil && got.Session == c.Session && got.ClientID == "app_x" && got.ExpiresAt.Equal(c.ExpiresAt) {
					mu.Lock()
					taken++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if taken != 1 {
			t.Fatalf("a ceremony taken %d times", taken)
		}
		old := &persistence.PasskeyChallenge{Challenge: uuid.NewString(), Kind: persistence.PasskeyRegister, UserID: &ada.ID, ClientID: "app_x",
			Session: `{}`, CreatedAt: at, ExpiresAt: at.Add(-time.Second)}
		live := &persistence.PasskeyChallenge{Challenge: uuid.NewString(), Kind: persistence.PasskeyRegister, UserID: &ada.ID, ClientID: "app_x",
			Session: `{}`, CreatedAt: at, ExpiresAt: at.Add(time.Minute)}
		for _, c := range []*persistence.PasskeyChallenge{old, live} {
			if err := s.PutPasskeyChallenge(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := s.DeleteExpiredPasskeyChallenges(ctx, at); err != nil || n != 1 {
			t.Fatalf("swept %d %v", n, err)
		}
		if _, err := s.TakePasskeyChallenge(ctx, old.Challenge, persistence.PasskeyRegister); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a swept ceremony: %v", err)
		}
		if got, err := s.TakePasskeyChallenge(ctx, live.Challenge, persistence.PasskeyRegister); err != nil || *got.UserID != ada.ID {
			t.Fatalf("a live ceremony after the sweep: %+v %v", got, err)
		}
		// SQLite holds at most MaxCeremonies: past them begin is refused
		// as "try again", until one ends or expires.
		if strings.HasPrefix(dbURL, "postgres") {
			return
		}
		first := ""
		for i := range persistence.MaxCeremonies {
			c := &persistence.PasskeyChallenge{Challenge: fmt.Sprintf("c%d", i), Kind: persistence.PasskeyAuthenticate, ClientID: "app_x",
				Session: `{}`, CreatedAt: at, ExpiresAt: at.Add(time.Minute)}
			if err := s.PutPasskeyChallenge(ctx, c); err != nil {
				t.Fatalf("ceremony %d: %v", i, err)
			}
			first = cmp.Or(first, c.Challenge)
		}
		over := &persistence.PasskeyChallenge{Challenge: "over", Kind: persistence.PasskeyAuthenticate, ClientID: "app_x",
			Session: `{}`, CreatedAt: at, ExpiresAt: at.Add(time.Minute)}
		if err := s.PutPasskeyChallenge(ctx, over); !errors.Is(err, persistence.ErrUnavailable) {
			t.Fatalf("a ceremony past the bound: %v", err)
		}
		if _, err := s.TakePasskeyChallenge(ctx, first, persistence.PasskeyAuthenticate); err != nil {
			t.Fatal(err)
		}
		if err := s.PutPasskeyChallenge(ctx, over); err != nil {
			t.Fatalf("a ceremony once one ended: %v", err)
		}
	})
}
