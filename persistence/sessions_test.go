package persistence_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newSSOSession(userID string, hash string, at time.Time) *persistence.SSOSession {
	app := uuid.NewString()
	return &persistence.SSOSession{
		ID: uuid.NewString(), TokenHash: []byte(hash), UserID: userID, ApplicationID: &app, AMR: persistence.StringList{"pwd"},
		AuthTime: at, IP: "192.0.2.1", UserAgent: "test", CreatedAt: at, LastSeenAt: at, ExpiresAt: at.Add(14 * 24 * time.Hour),
	}
}

// authEventTypes lists the log's events of one person: type/reason.
func authEventTypes(t *testing.T, s *persistence.Store, userID string) []string {
	t.Helper()
	list, err := s.ListAuthEvents(context.Background(), userID, persistence.Page{Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list {
		out = append(out, e.Type+"/"+e.Reason)
	}
	return out
}

func TestSSOSessions(t *testing.T) {
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
		one := newSSOSession(ada.ID, "hash-one", at)
		started := persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventSessionStarted, UserID: &ada.ID, SessionID: &one.ID, CreatedAt: at}
		if err := s.OpenSession(ctx, persistence.Opening{Session: one, Events: []persistence.AuthEvent{started}}); err != nil {
			t.Fatal(err)
		}
		if err := s.OpenSession(ctx, persistence.Opening{Session: newSSOSession(bob.ID, "hash-one", at)}); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a taken cookie hash: %v", err)
		}
		two := newSSOSession(ada.ID, "hash-two", at.Add(time.Second))
		three := newSSOSession(bob.ID, "hash-three", at)
		for _, ss := range []*persistence.SSOSession{two, three} {
			if err := s.OpenSession(ctx, persistence.Opening{Session: ss}); err != nil {
				t.Fatal(err)
			}
		}

		got, err := s.SSOSessionByTokenHash(ctx, []byte("hash-one"))
		if err != nil || got.ID != one.ID || got.UserID != ada.ID || !slices.Equal(got.AMR, []string{"pwd"}) || !got.AuthTime.Equal(at) ||
			*got.ApplicationID != *one.ApplicationID || got.IP != "192.0.2.1" || !got.ExpiresAt.Equal(one.ExpiresAt) {
			t.Fatalf("by hash: %+v %v", got, err)
		}
		if _, err := s.SSOSessionByTokenHash(ctx, []byte("nope")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unknown hash: %v", err)
		}
		if got, err := s.GetSSOSession(ctx, two.ID); err != nil || got.UserID != ada.ID {
			t.Fatalf("by id: %+v %v", got, err)
		}

		// Touch writes at most once per TouchInterval.
		if wrote, err := s.TouchSSOSession(ctx, one.ID, at.Add(time.Second)); err != nil || wrote {
			t.Fatalf("touch within the interval wrote: %v %v", wrote, err)
		}
		later := at.Add(persistence.TouchInterval + time.Second)
		if wrote, err := s.TouchSSOSession(ctx, one.ID, later); err != nil || !wrote {
			t.Fatalf("touch after the interval: %v %v", wrote, err)
		}
		if got, _ := s.GetSSOSession(ctx, one.ID); !got.LastSeenAt.Equal(later) {
			t.Fatalf("lastSeenAt %v, want %v", got.LastSeenAt, later)
		}
		// Sessions read by cookie are cached: the cached copy moves with the
		// touch, and every way a session ends reaches it (below).
		if got, err := s.SSOSessionByTokenHash(ctx, []byte("hash-one")); err != nil || !got.LastSeenAt.Equal(later) {
			t.Fatalf("by hash after the touch: lastSeenAt %v, want %v (%v)", got.LastSeenAt, later, err)
		}
		for _, h := range []string{"hash-two", "hash-three"} {
			if _, err := s.SSOSessionByTokenHash(ctx, []byte(h)); err != nil {
				t.Fatal(err)
			}
		}

		list, err := s.ListUserSSOSessions(ctx, ada.ID)
		if err != nil || len(list) != 2 || list[0].ID != one.ID || list[1].ID != two.ID {
			t.Fatalf("ada's sessions: %+v %v", list, err)
		}

		// End one: gone, with its event; again is ErrNotFound.
		logout := persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventLogout, UserID: &ada.ID, SessionID: &one.ID, CreatedAt: at}
		if err := s.EndSSOSession(ctx, one.ID, persistence.AuthEvent{Reason: persistence.SessionEndLogout}, logout); err != nil {
			t.Fatal(err)
		}
		if err := s.EndSSOSession(ctx, one.ID, persistence.AuthEvent{}); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("ending twice: %v", err)
		}
		if _, err := s.SSOSessionByTokenHash(ctx, []byte("hash-one")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("an ended session is found: %v", err)
		}

		// End all of a person's: the other person's stay.
		if n, err := s.EndUserSSOSessions(ctx, ada.ID, persistence.AuthEvent{Reason: persistence.SessionEndAdmin}); err != nil || n != 1 {
			t.Fatalf("end all: %d %v", n, err)
		}
		if list, _ := s.ListUserSSOSessions(ctx, ada.ID); len(list) != 0 {
			t.Fatalf("left: %+v", list)
		}
		if _, err := s.SSOSessionByTokenHash(ctx, []byte("hash-two")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a session ended with all of its person's is found: %v", err)
		}
		if list, _ := s.ListUserSSOSessions(ctx, bob.ID); len(list) != 1 {
			t.Fatalf("bob's session went too: %+v", list)
		}
		want := []string{"logout/", "session_ended/admin", "session_ended/logout", "session_started/"}
		if got := authEventTypes(t, s, ada.ID); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
			t.Fatalf("ada's events %v, want %v", got, want)
		}

		// Deleting a person ends their sessions, recorded.
		if err := s.DeleteUser(ctx, bob.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSSOSession(ctx, three.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's session stays: %v", err)
		}
		if _, err := s.SSOSessionByTokenHash(ctx, []byte("hash-three")); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a deleted person's session is found by its cookie: %v", err)
		}
		if got := authEventTypes(t, s, bob.ID); !slices.Equal(got, []string{"session_ended/user_deleted"}) {
			t.Fatalf("bob's events %v", got)
		}
	})
}

func TestSSOSessionsExpire(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		ada := newUser("ada@example.com")
		if err := s.CreateUser(ctx, ada); err != nil {
			t.Fatal(err)
		}
		at := now()
		idle := newSSOSession(ada.ID, "idle", at.Add(-2*time.Hour)) // idle past an hour
		old := newSSOSession(ada.ID, "old", at)                     // past its absolute end
		old.ExpiresAt = at.Add(-time.Second)
		live := newSSOSession(ada.ID, "live", at)
		for _, ss := range []*persistence.SSOSession{idle, old, live} {
			if err := s.OpenSession(ctx, persistence.Opening{Session: ss}); err != nil {
				t.Fatal(err)
			}
		}
		for _, h := range []string{"idle", "old", "live"} {
			if _, err := s.SSOSessionByTokenHash(ctx, []byte(h)); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := s.DeleteExpiredSSOSessions(ctx, at, time.Hour); err != nil || n != 2 {
			t.Fatalf("swept %d %v", n, err)
		}
		if list, _ := s.ListUserSSOSessions(ctx, ada.ID); len(list) != 1 || list[0].ID != live.ID {
			t.Fatalf("left: %+v", list)
		}
		for _, h := range []string{"idle", "old"} {
			if _, err := s.SSOSessionByTokenHash(ctx, []byte(h)); !errors.Is(err, persistence.ErrNotFound) {
				t.Fatalf("swept session %q found by its cookie: %v", h, err)
			}
		}
		if got := authEventTypes(t, s, ada.ID); !slices.Equal(got, []string{"session_ended/expired", "session_ended/expired"}) {
			t.Fatalf("events %v", got)
		}
	})
}

func TestSignInFlows(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		at := now()
		f := &persistence.SignInFlow{ID: uuid.NewString(), BrowserHash: []byte("browser"), ClientID: "app_web",
			Request: "client_id=app_web&state=xyz", Step: "email", CreatedAt: at, ExpiresAt: at.Add(15 * time.Minute)}
		if err := s.CreateSignInFlow(ctx, f); err != nil {
			t.Fatal(err)
		}
		sid := uuid.NewString()
		got, err := s.UpdateSignInFlow(ctx, f.ID, func(f *persistence.SignInFlow) error {
			f.Step, f.Email, f.SessionID = "done", "ada@example.com", &sid
			return nil
		})
		if err != nil || got.Step != "done" {
			t.Fatalf("update: %+v %v", got, err)
		}
		refused := errors.New("refused")
		if _, err := s.UpdateSignInFlow(ctx, f.ID, func(f *persistence.SignInFlow) error { f.Step = "x"; return refused }); !errors.Is(err, refused) {
			t.Fatalf("a refused update: %v", err)
		}
		got, err = s.GetSignInFlow(ctx, f.ID)
		if err != nil || got.Step != "done" || got.Email != "ada@example.com" || *got.SessionID != sid || string(got.BrowserHash) != "browser" ||
			got.Request != f.Request || !got.ExpiresAt.Equal(f.ExpiresAt) {
			t.Fatalf("get: %+v %v", got, err)
		}
		if ok, err := s.ConsumeSignInFlow(ctx, f.ID); err != nil || !ok {
			t.Fatalf("consume: %v %v", ok, err)
		}
		if ok, err := s.ConsumeSignInFlow(ctx, f.ID); err != nil || ok {
			t.Fatalf("consumed twice: %v %v", ok, err)
		}
		if _, err := s.GetSignInFlow(ctx, f.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("a consumed flow: %v", err)
		}
		stale := *f
		stale.ID, stale.ExpiresAt = uuid.NewString(), at.Add(-time.Second)
		if err := s.CreateSignInFlow(ctx, &stale); err != nil {
			t.Fatal(err)
		}
		if n, err := s.DeleteExpiredSignInFlows(ctx, at); err != nil || n != 1 {
			t.Fatalf("swept %d %v", n, err)
		}
	})
}
