package persistence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newUser(email string) *persistence.User {
	n := now()
	return &persistence.User{ID: uuid.NewString(), Email: email, Name: "User " + email, Status: "active",
		Metadata: persistence.JSONObject{"plan": "pro"}, CreatedAt: n, UpdatedAt: n}
}

func event(typ, userID string) persistence.DirectoryEvent {
	return persistence.DirectoryEvent{ID: uuid.NewString(), Type: typ, Actor: persistence.Actor{ClientID: "sa_test"}, UserID: &userID, Data: persistence.JSONObject{}, CreatedAt: now()}
}

func TestDirectory(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)

		ada := newUser("Ada@Example.com")
		if err := s.CreateUser(ctx, ada, event("user.created", ada.ID)); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateUser(ctx, newUser("ADA@example.COM")); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("same e-mail in another case: %v", err)
		}
		got, err := s.GetUserByEmail(ctx, "ada@EXAMPLE.com")
		if err != nil || got.ID != ada.ID || got.Email != "Ada@Example.com" || got.Metadata["plan"] != "pro" || got.EmailVerified {
			t.Fatalf("by e-mail: %+v %v", got, err)
		}
		bob := newUser("bob_smith@example.com")
		if err := s.CreateUser(ctx, bob); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			f    persistence.UserFilter
			want int
		}{
			{persistence.UserFilter{}, 2},
			{persistence.UserFilter{Q: "ADA"}, 1},
			{persistence.UserFilter{Q: "b_s"}, 1}, // '_' is a literal, not a wildcard
			{persistence.UserFilter{Q: "a%a"}, 0}, // '%' likewise
			{persistence.UserFilter{Email: "BOB_SMITH@example.com"}, 1},
			{persistence.UserFilter{Status: "disabled"}, 0},
		} {
			if _, total, err := s.ListUsers(ctx, c.f, persistence.Page{Limit: 10}); err != nil || total != c.want {
				t.Errorf("filter %+v: total %d err %v, want %d", c.f, total, err, c.want)
			}
		}
		if _, err := s.UpdateUser(ctx, bob.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.Email = "ada@example.com"
			return nil, nil
		}); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("update to a taken e-mail: %v", err)
		}

		// Roles: assignment is idempotent; deletion of the user cascades.
		if err := s.CreateRole(ctx, &persistence.Role{Name: "editor", CreatedAt: now()}); err != nil {
			t.Fatal(err)
		}
		if added, err := s.AssignRole(ctx, ada.ID, "editor", now(), event("role.assigned", ada.ID)); err != nil || !added {
			t.Fatalf("assign: %v %v", added, err)
		}
		if added, err := s.AssignRole(ctx, ada.ID, "editor", now(), event("role.assigned", ada.ID)); err != nil || added {
			t.Fatalf("assign again: %v %v", added, err)
		}
		if _, err := s.AssignRole(ctx, ada.ID, "none", now()); !errors.Is(err, persistence.ErrMissingReference) {
			t.Fatalf("assign an unknown role: %v", err)
		}
		if roles, _ := s.UserRoles(ctx, ada.ID); len(roles) != 1 || roles[0].Name != "editor" {
			t.Fatalf("roles: %v", roles)
		}

		// Organizations and members.
		org := &persistence.Org{ID: uuid.NewString(), Name: "Acme", Slug: "acme", Metadata: persistence.JSONObject{}, CreatedAt: now(), UpdatedAt: now()}
		if err := s.CreateOrg(ctx, org); err != nil {
			t.Fatal(err)
		}
		dup := *org
		dup.ID = uuid.NewString()
		if err := s.CreateOrg(ctx, &dup); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("taken slug: %v", err)
		}
		if err := s.AddMember(ctx, &persistence.Member{OrgID: org.ID, UserID: ada.ID, Role: "owner", JoinedAt: now()}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddMember(ctx, &persistence.Member{OrgID: org.ID, UserID: ada.ID, Role: "member", JoinedAt: now()}); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("member twice: %v", err)
		}
		if m, total, err := s.ListMembers(ctx, org.ID, persistence.Page{Limit: 10}); err != nil || total != 1 || m[0].Email != ada.Email || m[0].Role != "owner" {
			t.Fatalf("members: %v %d %v", m, total, err)
		}

		// Deleting the user takes memberships and roles along; events stay.
		if err := s.DeleteUser(ctx, ada.ID, event("user.deleted", ada.ID)); err != nil {
			t.Fatal(err)
		}
		if _, total, _ := s.ListMembers(ctx, org.ID, persistence.Page{Limit: 10}); total != 0 {
			t.Fatal("membership outlived its user")
		}
		if roles, _ := s.UserRoles(ctx, ada.ID); len(roles) != 0 {
			t.Fatal("role assignment outlived its user")
		}
		if err := s.DeleteUser(ctx, ada.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		events, err := s.ListDirectoryEvents(ctx, persistence.Page{Limit: 10})
		if err != nil || len(events) != 3 || events[0].Type != "user.created" || events[1].Type != "role.assigned" || events[2].Type != "user.deleted" {
			t.Fatalf("events (the second assignment records none): %+v %v", events, err)
		}
	})
}

// An invite is accepted once, whoever races for it; its user's e-mail is
// verified with it. The invite, its new user, its e-mail and its events are
// written together or not at all.
func TestInvitesAndOutbox(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		u := newUser("carol@example.com")
		u.Status = "invited"
		inv := &persistence.Invite{ID: uuid.NewString(), TokenHash: []byte("hash-1"), TokenKey: persistence.InviteTokenKey, Email: u.Email, UserID: u.ID,
			CreatorClientID: "sa_app", CreatorPrincipal: uuid.NewString(), RedirectURI: "https://app.example/cb", AcceptURI: "https://app.example/cb",
			Metadata: persistence.JSONObject{"team": "blue"}, Status: persistence.InviteSent, CreatedAt: now(), ExpiresAt: now().Add(time.Hour)}
		mail := &persistence.Mail{ID: uuid.NewString(), Recipient: u.Email, Subject: "Invitation", Sealed: []byte("sealed"), NextAttemptAt: now(), CreatedAt: now()}

		// A failure midway (the same token hash twice) leaves nothing behind.
		bad := *inv
		bad.ID = uuid.NewString()
		if err := s.CreateInvite(ctx, inv, u, mail, event("invite.sent", u.ID)); err != nil {
			t.Fatal(err)
		}
		other := newUser("dave@example.com")
		if err := s.CreateInvite(ctx, &bad, other, nil, event("invite.sent", other.ID)); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("duplicate token hash: %v", err)
		}
		if _, err := s.GetUserByEmail(ctx, "dave@example.com"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatal("a failed invite left its user behind")
		}

		got, err := s.InviteByToken(ctx, []byte("hash-1"), persistence.InviteTokenKey)
		if err != nil || got.ID != inv.ID || got.TokenKey != persistence.InviteTokenKey || got.Metadata["team"] != "blue" || got.UserExisted {
			t.Fatalf("by token: %+v %v", got, err)
		}
		// A hash is looked up under the key that made it only.
		if _, err := s.InviteByToken(ctx, []byte("hash-1"), persistence.LegacyInviteTokenKey); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("by token under the other key: %v", err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range 8 {
			wg.Go(func() {
				ok, err := s.AcceptInvite(ctx, inv.ID, now(), event("invite.accepted", u.ID))
				if err != nil {
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
			t.Fatalf("%d accepts won, want 1", wins)
		}
		if u2, _ := s.GetUser(ctx, u.ID); !u2.EmailVerified || u2.Status != "active" {
			t.Fatalf("accepting did not verify the e-mail and activate the user: %+v", u2)
		}

		// The outbox: due, claimed once, sent (and the sealed text dropped).
		due, err := s.DueMail(ctx, now().Add(time.Second), 10)
		if err != nil || len(due) != 1 {
			t.Fatalf("due: %v %v", due, err)
		}
		if ok, err := s.ClaimMail(ctx, &due[0], now().Add(time.Minute)); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		if ok, _ := s.ClaimMail(ctx, &due[0], now().Add(time.Minute)); ok {
			t.Fatal("a message was claimed twice")
		}
		if err := s.MailFailed(ctx, mail.ID, now().Add(-time.Second), "451 try later"); err != nil {
			t.Fatal(err)
		}
		if err := s.MailSent(ctx, mail.ID, now()); err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMail(ctx, mail.ID)
		if err != nil || m.SentAt == nil || m.Sealed != nil || m.Attempts != 2 {
			t.Fatalf("sent mail: %+v %v", m, err)
		}
		if due, _ := s.DueMail(ctx, now().Add(time.Hour), 10); len(due) != 0 {
			t.Fatal("a sent message is still due")
		}
		// Records of sent mail are swept after a while; unsent ones never.
		pending := &persistence.Mail{ID: uuid.NewString(), Recipient: "x@example.com", Subject: "later", Sealed: []byte("s"), NextAttemptAt: now().Add(time.Hour), CreatedAt: now()}
		if err := s.QueueMail(ctx, pending); err != nil {
			t.Fatal(err)
		}
		if n, err := s.DeleteSentMail(ctx, now().Add(-time.Minute)); err != nil || n != 0 {
			t.Fatalf("swept %d recent records (%v)", n, err)
		}
		if n, err := s.DeleteSentMail(ctx, now().Add(time.Minute)); err != nil || n != 1 {
			t.Fatalf("swept %d records, want the sent one (%v)", n, err)
		}
		if _, err := s.GetMail(ctx, pending.ID); err != nil {
			t.Fatalf("an unsent message was swept: %v", err)
		}
	})
}
