package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func TestMFAStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ada := newUser("ada@example.com")
		if err := s.CreateUser(ctx, ada); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTOTP(ctx, ada.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("no factor: %v", err)
		}
		pending := func(userID string) *persistence.TOTP {
			return &persistence.TOTP{UserID: userID, EnrolmentID: uuid.NewString(), SecretSealed: []byte("sealed " + uuid.NewString()), CreatedAt: now()}
		}
		if err := s.PutPendingTOTP(ctx, pending(uuid.NewString())); !errors.Is(err, persistence.ErrMissingReference) {
			t.Fatalf("an unknown person: %v", err)
		}

		// Enrolling again replaces a pending enrolment.
		first, second := pending(ada.ID), pending(ada.ID)
		for _, p := range []*persistence.TOTP{first, second} {
			if err := s.PutPendingTOTP(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.GetTOTP(ctx, ada.ID)
		if err != nil || got.EnrolmentID != second.EnrolmentID || string(got.SecretSealed) != string(second.SecretSealed) || got.EnabledAt != nil || got.LastStep != 0 {
			t.Fatalf("pending: %+v %v", got, err)
		}
		if ok, err := s.UseTOTPStep(ctx, ada.ID, 5); err != nil || ok {
			t.Fatalf("a step of a pending factor was taken: %v %v", ok, err)
		}
		if err := s.DeleteTOTP(ctx, ada.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("deleting a pending factor: %v", err)
		}

		// Enabling: only the pending enrolment named, with codes and events, all or nothing.
		at := now()
		enabled := persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventMFAEnabled, UserID: &ada.ID, CreatedAt: at}
		hashes := [][]byte{[]byte("h1"), []byte("h2"), []byte("h3")}
		if err := s.EnableTOTP(ctx, ada.ID, first.EnrolmentID, 100, at, hashes, enabled); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("enabling a replaced enrolment: %v", err)
		}
		// An event that cannot be stored (a taken id) rolls the whole change back.
		if err := s.EnableTOTP(ctx, ada.ID, second.EnrolmentID, 100, at, hashes, persistence.AuthEvent{ID: uuid.NewString(), Type: "x", CreatedAt: at}, enabled, enabled); err == nil {
			t.Fatal("a duplicate event id was stored")
		}
		if got, _ := s.GetTOTP(ctx, ada.ID); got.EnabledAt != nil {
			t.Fatal("a failed enable left the factor on")
		}
		if n, _ := s.RecoveryCodesLeft(ctx, ada.ID); n != 0 {
			t.Fatalf("a failed enable left %d codes", n)
		}
		if err := s.EnableTOTP(ctx, ada.ID, second.EnrolmentID, 100, at, hashes, enabled); err != nil {
			t.Fatal(err)
		}
		got, err = s.GetTOTP(ctx, ada.ID)
		if err != nil || got.EnabledAt == nil || !got.EnabledAt.Equal(at) || got.LastStep != 100 {
			t.Fatalf("enabled: %+v %v", got, err)
		}
		if err := s.EnableTOTP(ctx, ada.ID, second.EnrolmentID, 101, at, hashes); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("enabling twice: %v", err)
		}
		if err := s.PutPendingTOTP(ctx, pending(ada.ID)); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("enrolling over an enabled factor: %v", err)
		}
		if got, _ := s.GetTOTP(ctx, ada.ID); got.EnrolmentID != second.EnrolmentID || got.EnabledAt == nil {
			t.Fatalf("the enabled factor changed: %+v", got)
		}

		// Steps: only newer ones, each once, whoever races.
		for _, c := range []struct {
			step int64
			ok   bool
		}{{100, false}, {99, false}, {101, true}, {101, false}, {103, true}, {102, false}} {
			if ok, err := s.UseTOTPStep(ctx, ada.ID, c.step); err != nil || ok != c.ok {
				t.Fatalf("step %d: %v %v, want %v", c.step, ok, err, c.ok)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range 8 {
			wg.Go(func() {
				ok, err := s.UseTOTPStep(ctx, ada.ID, 200)
				if err != nil && !persistence.Unavailable(err) {
					t.Error(err)
				}
				if ok {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("step 200 taken %d times", wins)
		}

		// Recovery codes: each once, with its event and the count left.
		used := func(hash string) (bool, error) {
			return s.UseRecoveryCode(ctx, ada.ID, []byte(hash), now(), func(remaining int) []persistence.AuthEvent {
				return []persistence.AuthEvent{{ID: uuid.NewString(), Type: persistence.EventMFARecoveryCodeUsed, UserID: &ada.ID,
					Data: persistence.JSONObject{"remaining": remaining}, CreatedAt: now()}}
			})
		}
		if ok, err := used("h2"); err != nil || !ok {
			t.Fatalf("a recovery code: %v %v", ok, err)
		}
		if ok, err := used("h2"); err != nil || ok {
			t.Fatalf("a recovery code twice: %v %v", ok, err)
		}
		if ok, err := used("nope"); err != nil || ok {
			t.Fatalf("an unknown recovery code: %v %v", ok, err)
		}
		if n, err := s.RecoveryCodesLeft(ctx, ada.ID); err != nil || n != 2 {
			t.Fatalf("codes left: %d %v", n, err)
		}
		events, _ := s.ListAuthEvents(ctx, ada.ID, persistence.Page{Limit: 50})
		i := slices.IndexFunc(events, func(e persistence.AuthEvent) bool { return e.Type == persistence.EventMFARecoveryCodeUsed })
		if i < 0 || fmt.Sprint(events[i].Data["remaining"]) != "2" || len(events) != 2 {
			t.Fatalf("events: %+v", events)
		}

		// Deleting takes the factor and the codes, with its event.
		disabled := persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventMFADisabled, UserID: &ada.ID, CreatedAt: now()}
		if err := s.DeleteTOTP(ctx, ada.ID, disabled); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTOTP(ctx, ada.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
		if n, _ := s.RecoveryCodesLeft(ctx, ada.ID); n != 0 {
			t.Fatalf("%d codes left after delete", n)
		}
		if err := s.DeleteTOTP(ctx, ada.ID, disabled); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("deleting twice: %v", err)
		}
		if types := authEventTypes(t, s, ada.ID); !slices.Contains(types, persistence.EventMFADisabled+"/") {
			t.Fatalf("events %v", types)
		}

		// A deleted person takes their factor along.
		if err := s.PutPendingTOTP(ctx, pending(ada.ID)); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteUser(ctx, ada.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTOTP(ctx, ada.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's factor: %v", err)
		}
	})
}
