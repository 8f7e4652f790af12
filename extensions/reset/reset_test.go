package reset

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
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

func TestCheckPassword(t *testing.T) {
	for _, tc := range []struct {
		password, email, code string
	}{
		{"", "ada@example.com", "weak_password"},
		{"short1!", "ada@example.com", "weak_password"},
		{"ééééééé", "ada@example.com", "weak_password"}, // 7 characters, 14 bytes
		{"éééééééé", "ada@example.com", ""},             // 8 characters
		{"ada@example.com", "ada@example.com", "weak_password"},
		{"ADA@Example.com", " ada@example.com", "weak_password"},
		{"adalovelace", "adalovelace@example.com", "weak_password"}, // the local part
		{"password", "ada@example.com", "weak_password"},
		{"Password", "ada@example.com", "weak_password"}, // the list is case-folded
		{"12345678", "ada@example.com", "weak_password"},
		{"iloveyou1", "ada@example.com", "weak_password"},
		{"correct horse battery staple", "ada@example.com", ""},
		{"Tr0ub4dor&3-lagoon", "ada@example.com", ""},
		{strings.Repeat("x", 1025), "ada@example.com", "invalid_request"},
	} {
		err := CheckPassword(tc.password, tc.email)
		var refusal *extensions.Error
		switch {
		case tc.code == "" && err != nil:
			t.Errorf("%q refused: %v", tc.password, err)
		case tc.code != "" && (!errors.As(err, &refusal) || refusal.Code != tc.code || refusal.Status != http.StatusBadRequest):
			t.Errorf("%q: %v, want %s", tc.password, err, tc.code)
		}
	}
	if n := strings.Count(commonPasswordsText, "\n"); n < 15000 {
		t.Fatalf("the list holds %d passwords", n)
	}
}

func TestMaskEmail(t *testing.T) {
	for in, want := range map[string]string{
		"ada@example.com": "a***@example.com", "a@example.com": "a***@example.com", "émile@exemple.fr": "é***@exemple.fr",
		"nobody": "***", "@example.com": "***",
	} {
		if got := MaskEmail(in); got != want {
			t.Errorf("MaskEmail(%q) = %q, want %q", in, got, want)
		}
	}
}

// siteverify is a siteverify-compatible server on 127.0.0.1 that accepts
// the token "good" for the secret "s3cret", and records what it was sent.
func siteverify(t *testing.T) (*httptest.Server, *[]map[string]string) {
	var mu sync.Mutex
	var seen []map[string]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.ParseForm() != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen = append(seen, map[string]string{"secret": r.PostForm.Get("secret"), "response": r.PostForm.Get("response"), "remoteip": r.PostForm.Get("remoteip")})
		mu.Unlock()
		if r.PostForm.Get("response") == "broken" {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		ok := r.PostForm.Get("secret") == "s3cret" && r.PostForm.Get("response") == "good"
		_ = json.NewEncoder(w).Encode(map[string]any{"success": ok, "error-codes": []string{}})
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

func TestCaptcha(t *testing.T) {
	srv, seen := siteverify(t)
	c := &Captcha{VerifyURL: srv.URL, Secret: "s3cret"}
	ctx := context.Background()
	if err := c.Verify(ctx, "good", "192.0.2.7"); err != nil {
		t.Fatal(err)
	}
	if got := (*seen)[0]; got["secret"] != "s3cret" || got["response"] != "good" || got["remoteip"] != "192.0.2.7" {
		t.Fatalf("sent %v", got)
	}
	for token, want := range map[string]error{"": ErrCaptchaRequired, "bad": ErrCaptchaFailed, "broken": ErrCaptchaUnavailable,
		strings.Repeat("x", 5000): ErrCaptchaFailed} {
		if err := c.Verify(ctx, token, ""); !errors.Is(err, want) {
			t.Errorf("%.10q: %v, want %v", token, err, want)
		}
	}
	if err := (&Captcha{VerifyURL: srv.URL, Secret: "wrong"}).Verify(ctx, "good", ""); !errors.Is(err, ErrCaptchaFailed) {
		t.Fatalf("a wrong secret: %v", err)
	}
	srv.Close()
	if err := c.Verify(ctx, "good", ""); !errors.Is(err, ErrCaptchaUnavailable) {
		t.Fatalf("the provider down: %v", err)
	}
}

type capture chan mail.Message

func (c capture) Send(_ context.Context, m mail.Message) error { c <- m; return nil }

type fixture struct {
	svc   *Service
	store *persistence.Store
	app   *persistence.Client
	mails capture
	clock time.Time
}

func newFixture(t *testing.T, dbURL string) *fixture {
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
	f := &fixture{store: store, mails: mails, clock: extensions.Now()}
	f.svc = New(store, []byte("a system secret of thirty-two bytes!"), Config{Outbox: outbox, Issuer: "https://id.example/"})
	f.svc.now = func() time.Time { return f.clock }
	f.svc.floor = time.Millisecond
	n := extensions.Now()
	app := &persistence.Application{
		ID: uuid.NewString(), ClientID: "app_" + uuid.NewString()[:8], Name: "Web", Type: persistence.AppConfidential,
		RedirectURIs: persistence.StringList{"https://app.example.com/cb"}, SignInMethods: persistence.StringList{"password"}, MFA: persistence.JSONObject{},
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

func (f *fixture) user(t *testing.T, email, status string, password string) *persistence.User {
	t.Helper()
	n := extensions.Now()
	u := &persistence.User{ID: uuid.NewString(), Email: email, Status: status, Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
	if password != "" {
		h, err := directory.HashPassword(password)
		if err != nil {
			t.Fatal(err)
		}
		u.PasswordHash = &h
	}
	if err := f.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

func (f *fixture) next(t *testing.T) mail.Message {
	t.Helper()
	select {
	case m := <-f.mails:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message sent")
		return mail.Message{}
	}
}

func (f *fixture) none(t *testing.T) {
	t.Helper()
	select {
	case m := <-f.mails:
		t.Fatalf("unexpected message %q to %s", m.Subject, m.To)
	case <-time.After(300 * time.Millisecond):
	}
}

var linkRe = regexp.MustCompile(`https://[a-z.]+/[a-z/-]+\?token=([A-Za-z0-9_-]{43})`)

// token is the token of a reset e-mail, the same in its text and HTML.
func token(t *testing.T, m mail.Message) string {
	t.Helper()
	l := linkRe.FindStringSubmatch(m.Text)
	if l == nil || !strings.Contains(m.HTML, l[0]) {
		t.Fatalf("no link in %q", m.Text)
	}
	return l[1]
}

func (f *fixture) events(t *testing.T, userID string) []string {
	t.Helper()
	list, err := f.store.ListAuthEvents(context.Background(), userID, persistence.Page{Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list {
		out = append(out, e.Type+"/"+e.Reason)
	}
	return out
}

func TestResetFlow(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		c := Client{IP: "192.0.2.1", UserAgent: "test"}
		ada := f.user(t, "ada@example.com", directory.StatusActive, "an old password, long")

		// An unknown and a disabled address get nothing; the answer is the same.
		f.user(t, "off@example.com", directory.StatusDisabled, "")
		for _, email := range []string{"nobody@example.com", "off@example.com"} {
			if err := f.svc.Request(ctx, f.app, email, "", c); err != nil {
				t.Fatalf("%s: %v", email, err)
			}
		}
		f.none(t)
		// Both recorded, as an account's request is, with why nothing was sent.
		all, err := f.store.ListAuthEvents(ctx, "", persistence.Page{Limit: 50})
		if err != nil || len(all) != 2 || all[0].Type != persistence.EventResetRequested || all[0].UserID != nil ||
			!slices.Contains([]string{all[0].Reason, all[1].Reason}, "unknown_email") || !slices.Contains([]string{all[0].Reason, all[1].Reason}, "user_disabled") {
			t.Fatalf("events %+v %v", all, err)
		}
		var v *extensions.ValidationError
		if err := f.svc.Request(ctx, f.app, "not an address", "", c); !errors.As(err, &v) {
			t.Fatalf("a malformed address: %v", err)
		}

		if err := f.svc.Request(ctx, f.app, " Ada@Example.com ", "", c); err != nil {
			t.Fatal(err)
		}
		m := f.next(t)
		if m.To != "Ada@Example.com" || m.Subject != "Reset your Web password" || !strings.Contains(m.Text, "https://id.example/signin/reset-password?token=") {
			t.Fatalf("message %+v", m)
		}
		tok := token(t, m)

		st, err := f.svc.Verify(ctx, tok)
		if err != nil || st.Email != "A***@Example.com" || st.ExpiresIn != 3600 {
			t.Fatalf("verify: %+v %v", st, err)
		}
		f.clock = f.clock.Add(10 * time.Minute)
		if st, _ := f.svc.Verify(ctx, tok); st.ExpiresIn != 3000 {
			t.Fatalf("expiresIn %d", st.ExpiresIn)
		}
		for _, bad := range []string{"", "nope", tok + "x", strings.Repeat("a", 500)} {
			if _, err := f.svc.Verify(ctx, bad); !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("%.12q: %v", bad, err)
			}
		}

		// A weak password counts an attempt; a strong one resets.
		err = f.svc.Reset(ctx, tok, "password1", c)
		var refusal *extensions.Error
		if !errors.As(err, &refusal) || refusal.Code != "weak_password" || refusal.Details["attemptsRemaining"] != 2 {
			t.Fatalf("weak: %v", err)
		}
		f.clock = f.clock.Add(time.Second) // the events' order
		if err := f.svc.Reset(ctx, tok, "a new password, long enough", c); err != nil {
			t.Fatal(err)
		}
		// The person is told, with the reset (passkeys and TOTP stay).
		if m := f.next(t); m.To != "ada@example.com" || m.Subject != "The password of your Web account was changed" ||
			!strings.Contains(m.Text, "passkeys and two-step verification stay") || !strings.Contains(m.Text, "From: 192.0.2.1") {
			t.Fatalf("the notice: %+v", m)
		}
		u, err := f.store.GetUser(ctx, ada.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ok, _ := directory.VerifyPassword(*u.PasswordHash, "a new password, long enough"); !ok || !u.EmailVerified {
			t.Fatalf("the new password does not verify: %+v", u)
		}
		if err := f.svc.Reset(ctx, tok, "yet another password, long", c); !errors.Is(err, ErrTokenUsed) {
			t.Fatalf("reuse: %v", err)
		}
		if _, err := f.svc.Verify(ctx, tok); !errors.Is(err, ErrTokenUsed) {
			t.Fatalf("verify after use: %v", err)
		}
		got := f.events(t, ada.ID)
		want := []string{"password_reset_requested/", "password_reset_failed/weak_password", "password_reset/"}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("events %v, want %v", got, want)
		}
	})
}

func TestResetRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		c := Client{IP: "192.0.2.1"}
		f.user(t, "ada@example.com", directory.StatusActive, "")
		ask := func() string {
			t.Helper()
			if err := f.svc.Request(ctx, f.app, "ada@example.com", "", c); err != nil {
				t.Fatal(err)
			}
			return token(t, f.next(t))
		}

		// Three weak passwords and the token is dead, whatever comes next.
		tok := ask()
		for i, pw := range []string{"short", "ada@example.com", "iloveyou"} {
			var refusal *extensions.Error
			if err := f.svc.Reset(ctx, tok, pw, c); !errors.As(err, &refusal) || refusal.Code != "weak_password" || refusal.Details["attemptsRemaining"] != 2-i {
				t.Fatalf("attempt %d: %v", i, err)
			}
		}
		if err := f.svc.Reset(ctx, tok, "a perfectly good password", c); !errors.Is(err, ErrTooManyAttempts) {
			t.Fatalf("after three: %v", err)
		}
		if _, err := f.svc.Verify(ctx, tok); !errors.Is(err, ErrTooManyAttempts) {
			t.Fatalf("verify after three: %v", err)
		}

		// An hour later the token has expired.
		tok = ask()
		f.clock = f.clock.Add(TTL)
		if err := f.svc.Reset(ctx, tok, "a perfectly good password", c); !errors.Is(err, ErrTokenExpired) {
			t.Fatalf("expired: %v", err)
		}

		// A person who changed address since cannot be reset through the old link.
		tok = ask()
		u, _ := f.store.GetUserByEmail(ctx, "ada@example.com")
		if _, err := f.store.UpdateUser(ctx, u.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.Email = "ada@elsewhere.example"
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := f.svc.Reset(ctx, tok, "a perfectly good password", c); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("address changed: %v", err)
		}

		// A person without a password gets one, and its identity.
		if err := f.svc.Request(ctx, f.app, "ada@elsewhere.example", "", c); err != nil {
			t.Fatal(err)
		}
		tok = token(t, f.next(t))
		if err := f.svc.Reset(ctx, tok, "a perfectly good password", c); err != nil {
			t.Fatal(err)
		}
		if m := f.next(t); m.To != "ada@elsewhere.example" || m.Subject != "The password of your Web account was changed" {
			t.Fatalf("the notice: %+v", m)
		}
		ids, err := f.store.UserIdentities(ctx, u.ID)
		if err != nil || len(ids) != 1 || ids[0].Provider != persistence.IdentityPassword {
			t.Fatalf("identities %+v %v", ids, err)
		}

		// Two resets with one token at once: one wins, the other is token_used.
		if err := f.svc.Request(ctx, f.app, "ada@elsewhere.example", "", c); err != nil {
			t.Fatal(err)
		}
		tok = token(t, f.next(t))
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- f.svc.Reset(ctx, tok, "another good password here", c) }()
		}
		wins := 0
		for range 3 {
			switch err := <-errs; {
			case err == nil:
				wins++
			case !errors.Is(err, ErrTokenUsed):
				t.Fatalf("a racing reset: %v", err)
			}
		}
		if wins != 1 {
			t.Fatalf("%d resets won", wins)
		}
	})
}

func TestResetEndsSessions(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		ada := f.user(t, "ada@example.com", directory.StatusActive, "an old password, long")
		at := extensions.Now()
		for i := range 2 {
			app := f.app.RecordID
			ss := &persistence.SSOSession{ID: uuid.NewString(), TokenHash: []byte{byte(i), 1, 2}, UserID: ada.ID, ApplicationID: &app,
				AMR: persistence.StringList{"pwd"}, AuthTime: at, CreatedAt: at, LastSeenAt: at, ExpiresAt: at.Add(time.Hour)}
			if err := f.store.OpenSession(ctx, persistence.Opening{Session: ss}); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.svc.Request(ctx, f.app, "ada@example.com", "", Client{}); err != nil {
			t.Fatal(err)
		}
		if err := f.svc.Reset(ctx, token(t, f.next(t)), "a new password, long enough", Client{}); err != nil {
			t.Fatal(err)
		}
		if list, err := f.store.ListUserSSOSessions(ctx, ada.ID); err != nil || len(list) != 0 {
			t.Fatalf("sessions left: %d %v", len(list), err)
		}
		ended := 0
		for _, e := range f.events(t, ada.ID) {
			if e == "session_ended/password_reset" {
				ended++
			}
		}
		if ended != 2 {
			t.Fatalf("events %v", f.events(t, ada.ID))
		}
	})
}

func TestResetCaptchaAndAppPage(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL)
		srv, seen := siteverify(t)
		f.svc.captcha = &Captcha{VerifyURL: srv.URL, Secret: "s3cret"}
		f.user(t, "ada@example.com", directory.StatusActive, "")
		c := Client{IP: "192.0.2.9"}
		if err := f.svc.Request(ctx, f.app, "ada@example.com", "", c); !errors.Is(err, ErrCaptchaRequired) {
			t.Fatalf("no token: %v", err)
		}
		if err := f.svc.Request(ctx, f.app, "ada@example.com", "bad", c); !errors.Is(err, ErrCaptchaFailed) {
			t.Fatalf("a bad token: %v", err)
		}
		f.none(t)
		// The application's own page, with a query of its own.
		f.app.App.PasswordResetURI = "https://app.example.com/reset?lang=en"
		if err := f.svc.Request(ctx, f.app, "ada@example.com", "good", c); err != nil {
			t.Fatal(err)
		}
		m := f.next(t)
		if !strings.Contains(m.Text, "https://app.example.com/reset?lang=en&token=") {
			t.Fatalf("link in %q", m.Text)
		}
		if last := (*seen)[len(*seen)-1]; last["remoteip"] != "192.0.2.9" {
			t.Fatalf("siteverify got %v", last)
		}
	})
}
