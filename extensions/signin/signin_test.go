package signin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

const password = "correct horse battery"

var (
	hashOnce sync.Once
	hashed   string
)

// passwordHash is one argon2id hash of password, made once for all tests.
func passwordHash(t *testing.T) *string {
	hashOnce.Do(func() {
		var err error
		if hashed, err = directory.HashPassword(password); err != nil {
			t.Fatal(err)
		}
	})
	h := hashed
	return &h
}

type fixture struct {
	svc   *Service
	store *persistence.Store
	app   *persistence.Client
	clock time.Time
	mails capture // what the outbox sent
}

// capture is a mail sender that keeps what it is given.
type capture chan mail.Message

func (c capture) Send(_ context.Context, m mail.Message) error { c <- m; return nil }

func (f *fixture) advance(d time.Duration) { f.clock = f.clock.Add(d) }

func newFixture(t *testing.T, dbURL string, methods ...string) *fixture {
	t.Helper()
	ctx := context.Background()
	store := dbtest.Store(t, dbURL)
	mails := make(capture, 100)
	outbox, err := mail.NewOutbox(store, mails, oauth.DeriveKey([]byte("a mail key"), "mail outbox"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go outbox.Run(runCtx)
	svc, err := New(store, []byte("a system secret of thirty-two bytes!"), Config{Idle: time.Hour, Max: 24 * time.Hour, Outbox: outbox, Issuer: "https://id.example"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, store: store, clock: extensions.Now(), mails: mails}
	svc.now = func() time.Time { return f.clock }
	if methods == nil {
		methods = []string{MethodPassword, "otp"}
	}
	n := extensions.Now()
	app := &persistence.Application{
		ID: uuid.NewString(), ClientID: "app_" + uuid.NewString()[:8], Name: "Web", Type: persistence.AppConfidential,
		RedirectURIs: persistence.StringList{"https://app.example.com/cb"}, SignInMethods: methods, MFA: persistence.JSONObject{},
		AccessTokenFormat: "opaque", IDTokenSigningAlg: "RS256", CreatedAt: n, UpdatedAt: n,
	}
	if err := store.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	c, err := store.GetClient(ctx, app.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	f.app = c.(*persistence.Client)
	return f
}

func (f *fixture) user(t *testing.T, email, status string, withPassword bool) *persistence.User {
	t.Helper()
	n := extensions.Now()
	u := &persistence.User{ID: uuid.NewString(), Email: email, Name: "Person", Status: status, Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
	if withPassword {
		u.PasswordHash = passwordHash(t)
	}
	if err := f.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

// flowAt begins a flow and moves it to the password step for email.
func (f *fixture) flowAt(t *testing.T, browser, email string) *persistence.SignInFlow {
	t.Helper()
	ctx := context.Background()
	fl, err := f.svc.BeginFlow(ctx, browser, f.app.ID, url.Values{"client_id": {f.app.ID}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if fl, err = f.svc.SubmitEmail(ctx, fl, f.app, email, Client{}); err != nil {
		t.Fatal(err)
	}
	return fl
}

func code(err error) string {
	var e *extensions.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

func TestSubmitPassword(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		f.user(t, "ada@example.com", directory.StatusActive, true)
		f.user(t, "nopass@example.com", directory.StatusActive, false)
		f.user(t, "off@example.com", directory.StatusDisabled, true)
		f.user(t, "invited@example.com", directory.StatusInvited, true)
		client := Client{IP: "192.0.2.7", UserAgent: "table"}
		cases := []struct {
			name, email, password string
			code                  string // "" for success
			reason                string // of the sign_in_failed event
		}{
			{"right password", "ada@example.com", password, "", ""},
			{"e-mail in another case", "ADA@Example.com", password, "", ""},
			{"wrong password", "ada@example.com", "wrong", "invalid_credentials", ReasonWrongPassword},
			{"empty password", "ada@example.com", "", "invalid_credentials", ReasonWrongPassword},
			{"unknown e-mail", "nobody@example.com", password, "invalid_credentials", ReasonUnknownEmail},
			{"no password set", "nopass@example.com", password, "invalid_credentials", ReasonNoPassword},
			{"disabled, right password", "off@example.com", password, "user_disabled", ReasonDisabled},
			{"disabled, wrong password", "off@example.com", "wrong", "invalid_credentials", ReasonWrongPassword},
			{"invited, not yet active", "invited@example.com", password, "user_disabled", ReasonDisabled},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				fl := f.flowAt(t, "browser-"+tc.name, tc.email)
				if fl.Step != StepPassword {
					t.Fatalf("step after e-mail %q", fl.Step)
				}
				before, _ := f.store.ListAuthEvents(ctx, "", persistence.Page{Limit: 200})
				res, err := f.svc.SubmitPassword(ctx, fl, f.app, tc.password, client)
				if got := code(err); got != tc.code {
					t.Fatalf("code %q, want %q", got, tc.code)
				}
				after, _ := f.store.ListAuthEvents(ctx, "", persistence.Page{Limit: 200})
				seen := map[string]bool{}
				for _, e := range before {
					seen[e.ID] = true
				}
				var types []string
				for _, e := range after {
					if seen[e.ID] {
						continue
					}
					types = append(types, e.Type)
					if e.IP != client.IP || e.UserAgent != client.UserAgent || e.ClientID != f.app.ID || *e.ApplicationID != f.app.RecordID {
						t.Fatalf("event without its context: %+v", e)
					}
					if e.Type == persistence.EventSignInFailed && e.Reason != tc.reason {
						t.Fatalf("reason %q, want %q", e.Reason, tc.reason)
					}
					for _, v := range e.Data {
						if v == tc.password && tc.password != "" {
							t.Fatal("an event holds the password")
						}
					}
				}
				if tc.code != "" {
					if res != nil || !slices.Equal(types, []string{persistence.EventSignInFailed}) {
						t.Fatalf("a refusal answered %+v, events %v", res, types)
					}
					return
				}
				if !slices.Equal(types, []string{persistence.EventSignIn}) {
					t.Fatalf("events %v", types)
				}
				if res.Secret == "" || res.Session.UserID != res.User.ID || res.User.LastSignInAt == nil || !slices.Equal(res.Session.AMR, []string{"pwd"}) {
					t.Fatalf("result %+v", res)
				}
				stored, err := f.store.GetSignInFlow(ctx, fl.ID)
				if err != nil || stored.Step != StepDone || *stored.SessionID != res.Session.ID {
					t.Fatalf("flow after sign-in %+v %v", stored, err)
				}
				// A finished flow takes no more passwords.
				if _, err := f.svc.SubmitPassword(ctx, stored, f.app, password, client); code(err) != "invalid_request" {
					t.Fatalf("a finished flow took a password: %v", err)
				}
			})
		}
	})
}

func TestSubmitEmail(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		otpOnly := newFixture(t, dbURL, "otp", "magic-link")
		passkeyOnly := newFixture(t, dbURL, "passkey")
		cases := []struct {
			name  string
			fx    *fixture
			email string
			code  string
			step  string
		}{
			{"an address", f, "ada@example.com", "", StepPassword},
			{"padded", f, "  ada@example.com ", "", StepPassword},
			{"unknown address, same next step", f, "nobody@example.com", "", StepPassword},
			{"empty", f, "", "invalid_request", ""},
			{"not an address", f, "ada", "invalid_request", ""},
			{"with a name", f, "Ada <ada@example.com>", "invalid_request", ""},
			{"two addresses", f, "a@example.com, b@example.com", "invalid_request", ""},
			{"an e-mailed code first", otpOnly, "ada@example.com", "", StepOTP},
			{"no method this server offers", passkeyOnly, "ada@example.com", "no_method", ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				fl, err := tc.fx.svc.BeginFlow(ctx, "b", tc.fx.app.ID, url.Values{}, "")
				if err != nil {
					t.Fatal(err)
				}
				got, err := tc.fx.svc.SubmitEmail(ctx, fl, tc.fx.app, tc.email, Client{})
				if code(err) != tc.code {
					t.Fatalf("code %q, want %q", code(err), tc.code)
				}
				if tc.code == "" && (got.Step != tc.step || got.Email == "" || got.Email[0] == ' ') {
					t.Fatalf("flow %+v", got)
				}
			})
		}
	})
}

// A flow belongs to the browser that began it, lives FlowTTL, resumes
// once, and only with the session it ended in.
func TestFlowBinding(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		f.user(t, "ada@example.com", directory.StatusActive, true)
		fl := f.flowAt(t, "mine", "ada@example.com")
		cases := []struct {
			name, id, browser string
			ok                bool
		}{
			{"its browser", fl.ID, "mine", true},
			{"another browser", fl.ID, "theirs", false},
			{"no browser secret", fl.ID, "", false},
			{"unknown flow", uuid.NewString(), "mine", false},
			{"not a flow id", "../x", "mine", false},
		}
		for _, tc := range cases {
			_, err := f.svc.Flow(ctx, tc.id, tc.browser)
			if (err == nil) != tc.ok {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		res, err := f.svc.SubmitPassword(ctx, fl, f.app, password, Client{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.svc.Resume(ctx, fl.ID, "mine", uuid.NewString()); code(err) != "expired_token" {
			t.Fatalf("resumed with another session: %v", err)
		}
		if _, err := f.svc.Resume(ctx, fl.ID, "theirs", res.Session.ID); code(err) != "expired_token" {
			t.Fatalf("resumed in another browser: %v", err)
		}
		got, err := f.svc.Resume(ctx, fl.ID, "mine", res.Session.ID)
		if err != nil || got.ClientID != f.app.ID || got.Request != "client_id="+f.app.ID {
			t.Fatalf("resume: %+v %v", got, err)
		}
		if _, err := f.svc.Resume(ctx, fl.ID, "mine", res.Session.ID); code(err) != "expired_token" {
			t.Fatalf("resumed twice: %v", err)
		}
		// An unfinished flow does not resume; an old one is gone.
		other := f.flowAt(t, "mine", "ada@example.com")
		if _, err := f.svc.Resume(ctx, other.ID, "mine", res.Session.ID); code(err) != "expired_token" {
			t.Fatalf("an unfinished flow resumed: %v", err)
		}
		f.advance(FlowTTL)
		if _, err := f.svc.Flow(ctx, other.ID, "mine"); code(err) != "expired_token" {
			t.Fatalf("an expired flow: %v", err)
		}
	})
}

func TestSessionLiveness(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		cases := []struct {
			name  string
			after func(f *fixture, u *persistence.User)
			live  bool
		}{
			{"fresh", func(*fixture, *persistence.User) {}, true},
			{"used within the idle lifetime", func(f *fixture, _ *persistence.User) { f.advance(59 * time.Minute) }, true},
			{"idle too long", func(f *fixture, _ *persistence.User) { f.advance(time.Hour) }, false},
			{"kept in use, past its end", nil, false},
			{"person disabled", func(f *fixture, u *persistence.User) {
				if _, err := f.store.UpdateUser(ctx, u.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
					u.Status = directory.StatusDisabled
					return nil, nil
				}); err != nil {
					panic(err)
				}
			}, false},
			{"person deleted", func(f *fixture, u *persistence.User) {
				if err := f.store.DeleteUser(ctx, u.ID); err != nil {
					panic(err)
				}
			}, false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f := newFixture(t, dbURL)
				u := f.user(t, uuid.NewString()+"@example.com", directory.StatusActive, true)
				res, err := f.svc.SubmitPassword(ctx, f.flowAt(t, "b", u.Email), f.app, password, Client{})
				if err != nil {
					t.Fatal(err)
				}
				if tc.after == nil { // used every 59 minutes: never idle, but 24 h pass
					for range 25 {
						f.advance(59 * time.Minute)
						if ss, _, err := f.svc.Live(ctx, res.Secret); err != nil || (ss == nil) != f.clock.After(res.Session.ExpiresAt.Add(-time.Nanosecond)) {
							t.Fatalf("at %v: %v %v", f.clock.Sub(res.Session.AuthTime), ss, err)
						}
					}
				} else {
					tc.after(f, u)
				}
				ss, who, err := f.svc.Live(ctx, res.Secret)
				if err != nil || (ss != nil) != tc.live || (who != nil) != tc.live {
					t.Fatalf("live %v, want %v (%v)", ss != nil, tc.live, err)
				}
				if _, _, err := f.svc.Live(ctx, res.Secret+"x"); err != nil {
					t.Fatal(err)
				}
				if ss, _, _ := f.svc.Live(ctx, res.Secret+"x"); ss != nil {
					t.Fatal("another secret found the session")
				}
			})
		}
	})
}

// TestSessionKeys: a session cookie's secret begins with the time it was
// made, and so does the key it is stored as, so that later sessions sort
// after earlier ones; a secret from before the prefix is still found.
func TestSessionKeys(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		u := f.user(t, "keys@example.com", directory.StatusActive, true)
		var keys [][]byte
		for range 2 {
			res, err := f.svc.SubmitPassword(ctx, f.flowAt(t, "b", u.Email), f.app, password, Client{})
			if err != nil {
				t.Fatal(err)
			}
			prefix := persistence.TokenKeyPrefix(f.clock)
			if len(res.Secret) != persistence.TokenKeyPrefixLen+unprefixedSecretLen || res.Secret[:persistence.TokenKeyPrefixLen] != prefix ||
				string(res.Session.TokenHash[:persistence.TokenKeyPrefixLen]) != prefix {
				t.Fatalf("secret %q, key %q: want both to begin with %s", res.Secret, res.Session.TokenHash, prefix)
			}
			if ss, _, err := f.svc.Live(ctx, res.Secret); err != nil || ss == nil || ss.ID != res.Session.ID {
				t.Fatalf("session not found by its secret: %v %v", ss, err)
			}
			other := persistence.TokenKeyPrefix(f.clock.Add(time.Millisecond)) + res.Secret[persistence.TokenKeyPrefixLen:]
			if ss, _, err := f.svc.Live(ctx, other); err != nil || ss != nil {
				t.Fatalf("a secret with another time found %v (%v)", ss, err)
			}
			keys = append(keys, res.Session.TokenHash)
			f.advance(time.Minute)
		}
		if string(keys[0]) >= string(keys[1]) {
			t.Fatalf("keys out of order: %q then %q", keys[0], keys[1])
		}

		// A cookie set before secrets carried the time.
		legacy := oauth.NewSecret()
		hash, _ := f.svc.cookies.Hash(ctx, []byte(legacy))
		at := f.clock
		ss := &persistence.SSOSession{ID: uuid.NewString(), TokenHash: hash, UserID: u.ID, ApplicationID: &f.app.RecordID,
			AMR: persistence.StringList{"pwd"}, AuthTime: at, CreatedAt: at, LastSeenAt: at, ExpiresAt: at.Add(time.Hour)}
		if err := f.store.OpenSession(ctx, persistence.Opening{Session: ss}); err != nil {
			t.Fatal(err)
		}
		if got, _, err := f.svc.Live(ctx, legacy); err != nil || got == nil || got.ID != ss.ID {
			t.Fatalf("a secret without the time: %v %v", got, err)
		}
	})
}

func TestFreshEnough(t *testing.T) {
	s := &Service{now: func() time.Time { return time.Unix(1000, 0) }}
	ss := &persistence.SSOSession{AuthTime: time.Unix(900, 0)}
	for _, tc := range []struct {
		maxAge time.Duration
		fresh  bool
	}{{-1, true}, {0, false}, {99 * time.Second, false}, {100 * time.Second, true}, {time.Hour, true}} {
		if got := s.FreshEnough(ss, tc.maxAge); got != tc.fresh {
			t.Errorf("max_age %v: %v, want %v", tc.maxAge, got, tc.fresh)
		}
	}
}

func TestMethods(t *testing.T) {
	for _, tc := range []struct {
		allowed, want []string
	}{
		{[]string{"password", "otp", "magic-link"}, []string{"password", "otp", "magic-link"}},
		{[]string{"magic-link", "passkey", "otp"}, []string{"magic-link", "otp"}}, // in the application's order
		{[]string{"otp"}, []string{"otp"}},
		{[]string{"passkey"}, nil},
		{nil, nil},
	} {
		if got := Methods(&persistence.AppFacts{SignInMethods: tc.allowed}); !slices.Equal(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.allowed, got, tc.want)
		}
	}
	if Methods(nil) != nil {
		t.Error("no application, methods")
	}
}

// Ending sessions: one (logout records logout too), or all of a person's.
func TestEndSessions(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		u := f.user(t, "ada@example.com", directory.StatusActive, true)
		var secrets []string
		for i := range 3 {
			res, err := f.svc.SubmitPassword(ctx, f.flowAt(t, "b"+string(rune('0'+i)), u.Email), f.app, password, Client{})
			if err != nil {
				t.Fatal(err)
			}
			secrets = append(secrets, res.Secret)
		}
		ss, _, _ := f.svc.Live(ctx, secrets[0])
		if err := f.svc.End(ctx, ss, persistence.SessionEndLogout, f.app.RecordID, f.app.ID, Client{}); err != nil {
			t.Fatal(err)
		}
		if err := f.svc.End(ctx, ss, persistence.SessionEndLogout, "", "", Client{}); err != nil {
			t.Fatalf("ending an ended session: %v", err)
		}
		if ss, _, _ := f.svc.Live(ctx, secrets[0]); ss != nil {
			t.Fatal("an ended session lives")
		}
		list, err := f.svc.Sessions(ctx, u.ID)
		if err != nil || len(list) != 2 {
			t.Fatalf("sessions %d %v", len(list), err)
		}
		if n, err := f.svc.EndAll(ctx, u.ID, Client{}); err != nil || n != 2 {
			t.Fatalf("end all %d %v", n, err)
		}
		if _, err := f.svc.EndAll(ctx, uuid.NewString(), Client{}); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("an unknown person: %v", err)
		}
		events, _ := f.store.ListAuthEvents(ctx, u.ID, persistence.Page{Limit: 200})
		count := map[string]int{}
		for _, e := range events {
			count[e.Type+"/"+e.Reason]++
		}
		if count["logout/"] != 1 || count["session_ended/logout"] != 1 || count["session_ended/admin"] != 2 || count["sign_in/"] != 3 {
			t.Fatalf("events %v", count)
		}
	})
}

// One person signing in from several browsers at once: every sign-in
// starts its session. (On PostgreSQL, locking the person's row after the
// new session's foreign key had share-locked it deadlocked two of them.)
func TestConcurrentSignInsOfOnePerson(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		f := newFixture(t, dbURL)
		ada := f.user(t, "ada@example.com", directory.StatusActive, true)
		const n = 8
		flows := make([]*persistence.SignInFlow, n)
		for i := range flows {
			flows[i] = f.flowAt(t, fmt.Sprintf("browser-%d", i), ada.Email)
		}
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for _, fl := range flows {
			wg.Go(func() {
				_, err := f.svc.SubmitPassword(context.Background(), fl, f.app, password, Client{IP: "192.0.2.1"})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("a concurrent sign-in: %v", err)
			}
		}
		sessions, err := f.store.ListUserSSOSessions(context.Background(), ada.ID)
		if err != nil || len(sessions) != n {
			t.Fatalf("%d sessions, want %d (%v)", len(sessions), n, err)
		}
		if u, err := f.store.GetUser(context.Background(), ada.ID); err != nil || u.LastSignInAt == nil {
			t.Fatalf("lastSignInAt not set: %+v %v", u, err)
		}
	})
}
