package persistence_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func TestRiskHistory(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ada, bob := newUser("ada@example.com"), newUser("bob@example.com")
		for _, u := range []*persistence.User{ada, bob} {
			if err := s.CreateUser(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		history := func(userID string) *persistence.RiskHistory {
			t.Helper()
			h, err := s.RiskHistory(ctx, userID)
			if err != nil {
				t.Fatal(err)
			}
			return h
		}
		if h := history(ada.ID); len(h.DeviceHashes) != 0 || len(h.SignIns) != 0 {
			t.Fatalf("a person without sign-ins: %+v", h)
		}

		const keep = 3
		at := now()
		london := persistence.SignInLocation{At: at, Country: "GB", Lat: 51.5072, Lon: -0.1276}
		if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: ada.ID, DeviceHash: []byte("device-1"), Location: london, Keep: keep}); err != nil {
			t.Fatal(err)
		}
		h := history(ada.ID)
		if len(h.DeviceHashes) != 1 || !bytes.Equal(h.DeviceHashes[0], []byte("device-1")) || len(h.SignIns) != 1 || !sameSignIn(h.SignIns[0], london) {
			t.Fatalf("after one sign-in: %+v", h)
		}
		if h := history(bob.ID); len(h.DeviceHashes) != 0 || len(h.SignIns) != 0 {
			t.Fatalf("another person's history: %+v", h)
		}

		// Sign-ins without a device cookie, from addresses not located: the
		// first one's row tells the person has signed in, and the later
		// ones share it.
		unlocated := persistence.SignInLocation{At: at.Add(time.Minute)}
		for i := range 2 {
			later := persistence.SignInLocation{At: unlocated.At.Add(time.Duration(i) * time.Second)}
			if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: ada.ID, Location: later, Keep: keep}); err != nil {
				t.Fatal(err)
			}
		}
		if h := history(ada.ID); len(h.DeviceHashes) != 1 || len(h.SignIns) != 2 || !sameSignIn(h.SignIns[0], unlocated) || !sameSignIn(h.SignIns[1], london) {
			t.Fatalf("after sign-ins without a device: %+v", h)
		}
		// The same for a person with no sign-in remembered.
		carol := newUser("carol@example.com")
		if err := s.CreateUser(ctx, carol); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: carol.ID, Location: persistence.SignInLocation{At: at.Add(time.Duration(i) * time.Minute)}, Keep: keep}); err != nil {
				t.Fatal(err)
			}
		}
		if h := history(carol.ID); len(h.DeviceHashes) != 0 || len(h.SignIns) != 1 || !sameSignIn(h.SignIns[0], persistence.SignInLocation{At: at}) {
			t.Fatalf("unlocated sign-ins of a new person: %+v", h)
		}

		// More devices than keep: the least recently seen goes. device-1
		// seen again (moving it to the front) and one recorded late, with a
		// time before its last sighting, keeps the later time.
		for i, dev := range []string{"device-2", "device-3", "device-1", "device-4"} {
			loc := persistence.SignInLocation{At: at.Add(time.Duration(i+2) * time.Minute), Country: "FR", Lat: 48.8566, Lon: 2.3522}
			if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: ada.ID, DeviceHash: []byte(dev), Location: loc, Keep: keep}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: ada.ID, DeviceHash: []byte("device-1"), Location: persistence.SignInLocation{At: at}, Keep: keep}); err != nil {
			t.Fatal(err)
		}
		h = history(ada.ID)
		var devices []string
		for _, d := range h.DeviceHashes {
			devices = append(devices, string(d))
		}
		if got, want := devices, []string{"device-4", "device-1", "device-3"}; !slices.Equal(got, want) {
			t.Fatalf("devices %v, want %v", got, want)
		}
		// The located sign-ins are trimmed to keep (the unlocated row went
		// with them); the late one, at at, is unlocated: the person's
		// unlocated row is back, the oldest, and trimmed by the next
		// located sign-in.
		if len(h.SignIns) != keep+1 || !sameSignIn(h.SignIns[keep], persistence.SignInLocation{At: at}) {
			t.Fatalf("%d sign-ins kept, want %d and the unlocated row: %+v", len(h.SignIns), keep, h.SignIns)
		}
		for i, want := range []time.Duration{5, 4, 3} {
			if got := h.SignIns[i].At; !got.Equal(at.Add(want*time.Minute)) || h.SignIns[i].Country != "FR" {
				t.Fatalf("sign-in %d: %+v", i, h.SignIns[i])
			}
		}

		// Two sign-ins at one instant are both kept, in the order recorded.
		same := at.Add(time.Hour)
		for _, c := range []string{"DE", "NL"} {
			if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: bob.ID, Location: persistence.SignInLocation{At: same, Country: c}, Keep: keep}); err != nil {
				t.Fatal(err)
			}
		}
		if h := history(bob.ID); len(h.SignIns) != 2 || h.SignIns[0].Country != "NL" || h.SignIns[1].Country != "DE" {
			t.Fatalf("two sign-ins at one instant: %+v", h.SignIns)
		}

		// In a unit of work that rolls back, nothing is recorded.
		fail := errors.New("the sign-in failed after all")
		err := s.InTx(ctx, func(ctx context.Context) error {
			if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: bob.ID, DeviceHash: []byte("device-x"), Location: persistence.SignInLocation{At: same}, Keep: keep}); err != nil {
				return err
			}
			return fail
		})
		if !errors.Is(err, fail) {
			t.Fatal(err)
		}
		if h := history(bob.ID); len(h.DeviceHashes) != 0 || len(h.SignIns) != 2 {
			t.Fatalf("a rolled-back sign-in was recorded: %+v", h)
		}

		// No such person: refused; a person deleted takes their history.
		if err := s.RecordRiskSignIn(ctx, persistence.RiskSignIn{UserID: uuid.NewString(), DeviceHash: []byte("d"), Location: london, Keep: keep}); !errors.Is(err, persistence.ErrMissingReference) {
			t.Fatalf("an unknown person: %v", err)
		}
		if err := s.DeleteUser(ctx, ada.ID); err != nil {
			t.Fatal(err)
		}
		if h := history(ada.ID); len(h.DeviceHashes) != 0 || len(h.SignIns) != 0 {
			t.Fatalf("a deleted person's history: %+v", h)
		}
	})
}

// sameSignIn compares sign-ins read back (their times' zones may differ).
func sameSignIn(a, b persistence.SignInLocation) bool {
	return a.At.Equal(b.At) && a.Country == b.Country && a.Lat == b.Lat && a.Lon == b.Lon
}
