package persistence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newReset(userID, email string, at time.Time) *persistence.PasswordReset {
	return &persistence.PasswordReset{
		ID: uuid.NewString(), TokenHash: []byte("hash " + uuid.NewString()), UserID: userID, Email: email, ClientID: "app_reset",
		CreatedAt: at, ExpiresAt: at.Add(time.Hour),
	}
}

func TestPasswordResetStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ada := newUser("ada@example.com")
		if err := s.CreateUser(ctx, ada); err != nil {
			t.Fatal(err)
		}
		at := now()
		r := newReset(ada.ID, ada.Email, at)
		event := persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventResetRequested, UserID: &ada.ID, CreatedAt: at}
		mail := &persistence.Mail{ID: uuid.NewString(), Recipient: ada.Email, Subject: "Reset", Sealed: []byte("sealed"), CreatedAt: at, NextAttemptAt: at}
		if err := s.CreatePasswordReset(ctx, r, mail, event); err != nil {
			t.Fatal(err)
		}
		got, err := s.PasswordResetByHash(ctx, r.TokenHash)
		if err != nil || got.ID != r.ID || got.UserID != ada.ID || got.Attempts != 0 || got.UsedAt != nil || !got.ExpiresAt.Equal(r.ExpiresAt) {
			t.Fatalf("read back %+v %v", got, err)
		}
		if _, err := s.PasswordResetByHash(ctx, []byte("unknown")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown hash: %v", err)
		}
		events, err := s.ListAuthEvents(ctx, ada.ID, persistence.Page{Limit: 50})
		if err != nil || len(events) != 1 || events[0].Type != persistence.EventResetRequested {
			t.Fatalf("events: %+v %v", events, err)
		}
		// The same hash twice is refused, and nothing of the second is kept.
		dup := newReset(ada.ID, ada.Email, at)
		dup.TokenHash = r.TokenHash
		if err := s.CreatePasswordReset(ctx, dup, nil); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a taken hash: %v", err)
		}
		// A request that sends nothing is recorded alone.
		if err := s.RecordResetRequest(ctx, persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventResetRequested, Reason: "unknown_email", CreatedAt: at}); err != nil {
			t.Fatal(err)
		}

		// Failed attempts count up; a used token counts no more.
		for want := 1; want <= 2; want++ {
			n, err := s.FailPasswordReset(ctx, r.ID, persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventResetFailed, UserID: &ada.ID, CreatedAt: at})
			if err != nil || n != want {
				t.Fatalf("attempt %d: %d %v", want, n, err)
			}
		}
		// Spending: below the attempts allowed, unused, alive; every other
		// unused token of the person ends with it.
		other := newReset(ada.ID, ada.Email, at)
		if err := s.CreatePasswordReset(ctx, other, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.SpendPasswordReset(ctx, r.ID, 2, at); !errors.Is(err, persistence.ErrResetSpent) {
			t.Fatalf("out of attempts: %v", err)
		}
		if err := s.SpendPasswordReset(ctx, r.ID, 3, at.Add(2*time.Hour)); !errors.Is(err, persistence.ErrResetSpent) {
			t.Fatalf("expired: %v", err)
		}
		if err := s.SpendPasswordReset(ctx, r.ID, 3, at); err != nil {
			t.Fatal(err)
		}
		if err := s.SpendPasswordReset(ctx, r.ID, 3, at); !errors.Is(err, persistence.ErrResetSpent) {
			t.Fatalf("spent twice: %v", err)
		}
		if got, err := s.PasswordResetByHash(ctx, other.TokenHash); err != nil || got.UsedAt == nil {
			t.Fatalf("the other token lives on: %+v %v", got, err)
		}
		if n, err := s.FailPasswordReset(ctx, r.ID); err != nil || n != 0 {
			t.Fatalf("a failure on a used token: %d %v", n, err)
		}

		// Of many resets with one token at once, one wins.
		race := newReset(ada.ID, ada.Email, at)
		if err := s.CreatePasswordReset(ctx, race, nil); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.InTx(ctx, func(ctx context.Context) error { return s.SpendPasswordReset(ctx, race.ID, 3, at) })
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case !errors.Is(err, persistence.ErrResetSpent):
					t.Errorf("a racing reset: %v", err)
				}
			}()
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("%d resets won", wins)
		}

		// The sweep removes expired tokens only; deleting the person removes theirs.
		if n, err := s.DeleteExpiredPasswordResets(ctx, at.Add(30*time.Minute)); err != nil || n != 0 {
			t.Fatalf("swept live tokens: %d %v", n, err)
		}
		if n, err := s.DeleteExpiredPasswordResets(ctx, at.Add(2*time.Hour)); err != nil || n != 3 {
			t.Fatalf("swept %d %v", n, err)
		}
		last := newReset(ada.ID, ada.Email, at)
		if err := s.CreatePasswordReset(ctx, last, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteUser(ctx, ada.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PasswordResetByHash(ctx, last.TokenHash); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's token: %v", err)
		}
		if err := s.CreatePasswordReset(ctx, newReset(uuid.NewString(), "x@example.com", at), nil); !errors.Is(err, persistence.ErrMissingReference) {
			t.Fatalf("an unknown person: %v", err)
		}
	})
}

func TestRevokeUserTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		prefix := persistence.TokenKeyPrefix(time.Now())
		first, second := f.request(nil), f.request(nil)
		issue(t, s, first, prefix+"reset-at-1", "reset-rt-1")
		issue(t, s, second, prefix+"reset-at-2", "reset-rt-2")

		n, err := s.RevokeUserTokens(ctx, f.user.ID)
		if err != nil || n != 2 {
			t.Fatalf("revoked %d families: %v", n, err)
		}
		for _, sig := range []string{"reset-rt-1", "reset-rt-2"} {
			if _, err := s.GetRefreshTokenSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("refresh token %s: %v", sig, err)
			}
		}
		for _, sig := range []string{prefix + "reset-at-1", prefix + "reset-at-2"} {
			if _, err := s.GetAccessTokenSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("access token %s: %v", sig, err)
			}
		}
		if n, err := s.RevokeUserTokens(ctx, f.user.ID); err != nil || n != 0 {
			t.Fatalf("again: %d %v", n, err)
		}
	})
}
