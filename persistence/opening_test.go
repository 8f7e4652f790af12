package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// OpenSession writes a sign-in's session with what goes with it, all or
// nothing, spending the e-mailed challenge as its guard: on its own
// through the group commit, joined to a code's flow, and in a unit of work.
func TestOpenSession(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s, g := f.s, f.s.Grouped()
		user := newUser("otp-" + uuid.NewString() + "@example.com")
		if err := s.CreateUser(ctx, user); err != nil {
			t.Fatal(err)
		}
		challenge := func(t *testing.T, ttl time.Duration) string {
			t.Helper()
			at := now()
			c := &persistence.EmailChallenge{ID: uuid.NewString(), Kind: persistence.ChallengeOTP, SecretHash: []byte(uuid.NewString()),
				Email: user.Email, UserID: &user.ID, ClientID: f.client.ID, CreatedAt: at, ExpiresAt: at.Add(ttl)}
			if err := s.CreateEmailChallenge(ctx, c, nil); err != nil {
				t.Fatal(err)
			}
			return c.ID
		}
		opening := func(challengeID string) persistence.Opening {
			at := now()
			ss := newSSOSession(user.ID, "cookie-"+uuid.NewString(), at)
			return persistence.Opening{
				Session: ss,
				Events: []persistence.AuthEvent{{ID: uuid.NewString(), Type: persistence.EventSignIn, UserID: &user.ID, SessionID: &ss.ID, CreatedAt: at},
					{ID: uuid.NewString(), Type: persistence.EventSessionStarted, UserID: &user.ID, SessionID: &ss.ID, CreatedAt: at}},
				Spend: &persistence.Spend{Challenge: challengeID, MaxAttempts: 5,
					Identity: &persistence.Identity{UserID: user.ID, Provider: persistence.IdentityOTP, CreatedAt: at}},
				Risk: &persistence.RiskSignIn{UserID: user.ID, Location: persistence.SignInLocation{At: at, Country: "FR"}, Keep: 3},
			}
		}
		// Sign-ins are webhook messages, written with the opening: in the
		// group commit, in a code's flow, in a unit of work.
		s.RouteWebhooks(map[string]string{"auth:" + persistence.EventSignIn: "user.signed_in"})
		hook := webhookEndpoint("https://hooks.example/in", []string{"user.signed_in"}, now())
		if err := s.CreateWebhookEndpoint(ctx, hook); err != nil {
			t.Fatal(err)
		}
		// counts is what the person has: sessions, log entries, identities,
		// remembered sign-ins; and the webhook messages.
		messages := func(t *testing.T) int {
			t.Helper()
			_, total, err := s.ListWebhookDeliveries(ctx, persistence.WebhookFilter{EndpointID: hook.ID}, persistence.Page{Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			return total
		}
		counts := func(t *testing.T) [4]int {
			t.Helper()
			sessions, err := s.ListUserSSOSessions(ctx, user.ID)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := s.UserIdentities(ctx, user.ID)
			if err != nil {
				t.Fatal(err)
			}
			h, err := s.RiskHistory(ctx, user.ID)
			if err != nil {
				t.Fatal(err)
			}
			return [4]int{len(sessions), len(authEventTypes(t, s, user.ID)), len(ids), len(h.SignIns)}
		}

		// On its own: everything is written, and the person's last sign-in.
		o := opening(challenge(t, time.Minute))
		if err := s.OpenSession(ctx, o); err != nil {
			t.Fatal(err)
		}
		if got := counts(t); got != [4]int{1, 2, 1, 1} {
			t.Fatalf("after a sign-in: %v", got)
		}
		if u, err := s.GetUser(ctx, user.ID); err != nil || u.LastSignInAt == nil || !u.LastSignInAt.Equal(o.Session.AuthTime) {
			t.Fatalf("last sign-in: %v %v", u.LastSignInAt, err)
		}

		// The same challenge again, an expired one, an unknown one: nothing
		// is written. A second identity of one provider is not an error.
		for name, id := range map[string]string{"used": o.Spend.Challenge, "expired": challenge(t, -time.Second), "unknown": uuid.NewString()} {
			if err := s.OpenSession(ctx, opening(id)); !errors.Is(err, persistence.ErrChallengeUsed) {
				t.Fatalf("%s challenge: %v", name, err)
			}
		}
		if got := counts(t); got != [4]int{1, 2, 1, 1} {
			t.Fatalf("after refused sign-ins: %v", got)
		}

		// Many at once with one challenge: one wins.
		id := challenge(t, time.Minute)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = s.OpenSession(ctx, opening(id)) })
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, persistence.ErrChallengeUsed):
				t.Fatal(err)
			}
		}
		if got := counts(t); won != 1 || got != [4]int{2, 4, 1, 2} || messages(t) != 2 {
			t.Fatalf("%d of 8 won with one challenge; then %v and %d messages", won, got, messages(t))
		}

		// Joined to a code's flow: both are written by its owner's commit,
		// or, the challenge used meanwhile, neither.
		code := func(t *testing.T, o persistence.Opening, sig string) error {
			t.Helper()
			before := counts(t)
			fctx, err := g.BeginTX(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.OpenSession(fctx, o); err != nil {
				t.Fatal(err)
			}
			if err := g.CreateAuthorizeCodeSession(fctx, sig, f.request(url.Values{"redirect_uri": {"https://app.example.com/callback"}})); err != nil {
				t.Fatal(err)
			}
			if got := counts(t); got != before {
				t.Fatalf("a joined opening before its flow commits: %v, then %v", before, got)
			}
			return g.Commit(fctx)
		}
		if err := code(t, opening(challenge(t, time.Minute)), "sig-joined"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-joined", &personSession{}); err != nil {
			t.Fatal(err)
		}
		if got := counts(t); got != [4]int{3, 6, 1, 3} {
			t.Fatalf("after a joined opening: %v", got)
		}
		if err := code(t, opening(id), "sig-lost"); !errors.Is(err, persistence.ErrChallengeUsed) {
			t.Fatalf("a joined opening with a used challenge: %v", err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-lost", &personSession{}); err == nil {
			t.Fatal("the code of a lost opening was written")
		}

		// In a unit of work that rolls back: nothing; without a challenge,
		// the person must still be there.
		fail := errors.New("the sign-in failed after all")
		if err := s.InTx(ctx, func(ctx context.Context) error {
			if err := s.OpenSession(ctx, opening(challenge(t, time.Minute))); err != nil {
				return err
			}
			return fail
		}); !errors.Is(err, fail) {
			t.Fatal(err)
		}
		if got := counts(t); got != [4]int{3, 6, 1, 3} || messages(t) != 3 {
			t.Fatalf("after a rolled-back opening: %v and %d messages", got, messages(t))
		}
		gone := opening("")
		gone.Spend, gone.Risk = nil, nil
		gone.Session.UserID = uuid.NewString()
		if err := s.OpenSession(ctx, gone); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("an opening for no one: %v", err)
		}
	})
}

// The pool's prepared statements are bounded: past the bound, queries run
// unprepared, with the same answers.
func TestPreparedStatementsBounded(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		user := newUser("bounded@example.com")
		if err := s.CreateUser(ctx, user); err != nil {
			t.Fatal(err)
		}
		// Distinct queries (by a comment) that all read the person.
		for i := range persistence.MaxStmts + 10 {
			var emails []string
			if err := s.Select(ctx, &emails, fmt.Sprintf(`SELECT email FROM users WHERE id = ? /* %d */`, i), user.ID); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(emails, []string{user.Email}) {
				t.Fatalf("query %d: %v", i, emails)
			}
		}
		if n := s.PreparedStatements(); n != persistence.MaxStmts {
			t.Fatalf("%d statements kept, want %d", n, persistence.MaxStmts)
		}
	})
}
