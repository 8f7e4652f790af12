package persistence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Disabling a person signs them out everywhere, and enabling them again
// brings none of it back; their API keys answer owner_disabled meanwhile.
func TestDisableSignsOut(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		prefix := persistence.TokenKeyPrefix(time.Now())
		issue(t, s, f.request(nil), prefix+"disable-at", "disable-rt")
		key := &persistence.APIKey{ID: uuid.Must(uuid.NewV7()).String(), ApplicationID: f.client.RecordID, UserID: &f.user.ID, Name: "ci",
			KeyHash: []byte("hash-disable"), Hint: "idk_x_…abcd", Scopes: persistence.StringList{}, Metadata: persistence.JSONObject{}, IssuedBy: "sa_x", CreatedAt: now()}
		if err := s.CreateAPIKey(ctx, key); err != nil {
			t.Fatal(err)
		}
		setStatus := func(status string) {
			t.Helper()
			if _, err := s.UpdateUser(ctx, f.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
				u.Status = status
				return nil, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		ownerDisabled := func() bool {
			t.Helper()
			k, err := s.APIKeyByHash(ctx, key.KeyHash)
			if err != nil {
				t.Fatal(err)
			}
			return k.OwnerDisabled
		}
		if ownerDisabled() { // read once, so that a stale cached copy would show below
			t.Fatal("an active person's key reads owner_disabled")
		}

		setStatus(persistence.UserDisabled)
		if _, err := s.GetSSOSession(ctx, f.sso.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("the session outlived the disabling: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "disable-rt", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("refresh token: %v", err)
		}
		if _, err := s.GetAccessTokenSession(ctx, prefix+"disable-at", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("access token: %v", err)
		}
		events, err := s.ListAuthEvents(ctx, f.user.ID, persistence.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		ended := 0
		for _, e := range events {
			if e.Type == persistence.EventSessionEnded && e.Reason == persistence.SessionEndUserDisabled && e.SessionID != nil && *e.SessionID == f.sso.ID {
				ended++
			}
		}
		if ended != 1 {
			t.Fatalf("%d session_ended events with reason user_disabled, want 1: %+v", ended, events)
		}
		if !ownerDisabled() {
			t.Fatal("a disabled person's key does not read owner_disabled")
		}

		setStatus("active")
		if _, err := s.GetSSOSession(ctx, f.sso.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("enabling brought the session back: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "disable-rt", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("enabling brought the refresh token back: %v", err)
		}
		if ownerDisabled() {
			t.Fatal("an enabled person's key still reads owner_disabled")
		}
	})
}
