package upstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// TestPendingLinks: what the linking step gets: a pending link read by its
// handle while it lives, and not once spent.
func TestPendingLinks(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		s := New(store, nil, []byte("a system secret for this test only"), Config{Issuer: "https://id.example"})
		n := extensions.Now()
		user := func(email string) *persistence.User {
			u := &persistence.User{ID: uuid.NewString(), Email: email, Status: "active", Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
			if err := store.CreateUser(ctx, u); err != nil {
				t.Fatal(err)
			}
			return u
		}
		ada := user("ada@example.com")
		link := func(u *persistence.User, handle, subject string, expires time.Time) *persistence.UpstreamLink {
			l := &persistence.UpstreamLink{ID: uuid.NewString(), HandleHash: s.LinkHandleHash(handle), UserID: u.ID, Provider: "acme-sso",
				ProviderID: uuid.NewString(), Issuer: "https://sso.example", Subject: subject, Email: u.Email, EmailVerified: true,
				ClientID: "app_x", CreatedAt: n, ExpiresAt: expires}
			if err := store.CreateUpstreamLink(ctx, l); err != nil {
				t.Fatal(err)
			}
			return l
		}
		link(ada, "handle-ada", "sub-ada", n.Add(LinkTTL))
		link(ada, "handle-old", "sub-old", n.Add(-time.Second))
		for _, h := range []string{"", "nope", "handle-old"} {
			if _, err := s.PendingLink(ctx, h); !errors.Is(err, ErrLinkExpired) {
				t.Fatalf("handle %q: %v", h, err)
			}
		}
		l, err := s.PendingLink(ctx, "handle-ada")
		if err != nil || l.UserID != ada.ID || l.Subject != "sub-ada" {
			t.Fatalf("pending link %+v %v", l, err)
		}
		if ok, err := store.UseUpstreamLink(ctx, l.ID, n); err != nil || !ok {
			t.Fatalf("spend: %v %v", ok, err)
		}
		if _, err := s.PendingLink(ctx, "handle-ada"); !errors.Is(err, ErrLinkExpired) {
			t.Fatalf("a spent link read: %v", err)
		}
	})
}
