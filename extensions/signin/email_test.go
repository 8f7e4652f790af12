package signin

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

var (
	codeRe = regexp.MustCompile(`\b(\d{6})\b`)
	linkRe = regexp.MustCompile(`https://id\.example/signin/magic-link\?token=([A-Za-z0-9_-]+)`)
)

// next is the next message the outbox sent.
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

// none checks that nothing more is sent.
func (f *fixture) none(t *testing.T) {
	t.Helper()
	select {
	case m := <-f.mails:
		t.Fatalf("unexpected message %q to %s", m.Subject, m.To)
	case <-time.After(300 * time.Millisecond):
	}
}

// otpFlow begins a flow whose first step is the e-mailed code, for email.
func (f *fixture) otpFlow(t *testing.T, browser, email string) *persistence.SignInFlow {
	t.Helper()
	ctx := context.Background()
	fl, err := f.svc.BeginFlow(ctx, browser, f.app.ID, url.Values{"client_id": {f.app.ID}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if fl, err = f.svc.SubmitEmail(ctx, fl, f.app, email, Client{IP: "192.0.2.1"}); err != nil {
		t.Fatal(err)
	}
	if fl.Step != StepOTP {
		t.Fatalf("step %s", fl.Step)
	}
	return fl
}

func sentCode(t *testing.T, m mail.Message) string {
	t.Helper()
	c := codeRe.FindStringSubmatch(m.Text)
	if c == nil || !slices.Contains(codeRe.FindAllString(m.HTML, -1), c[1]) {
		t.Fatalf("no code in %q", m.Text)
	}
	return c[1]
}

func TestOTPSignIn(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, MethodOTP, MethodPassword)
		ada := f.user(t, "ada@example.com", directory.StatusActive, false)

		fl := f.otpFlow(t, "browser", "ada@example.com")
		m := f.next(t)
		if m.To != "ada@example.com" || m.Subject != "Your code for Web" {
			t.Fatalf("message %+v", m)
		}
		code := sentCode(t, m)
		wrong := "000000"
		if code == wrong {
			wrong = "000001"
		}
		if _, err := f.svc.SubmitOTP(ctx, fl, f.app, wrong, Client{}); !errors.Is(err, ErrInvalidCode) {
			t.Fatalf("wrong code: %v", err)
		}
		res, err := f.svc.SubmitOTP(ctx, fl, f.app, " "+code+" ", Client{})
		if err != nil {
			t.Fatal(err)
		}
		if res.User.ID != ada.ID || !slices.Equal(res.Session.AMR, []string{"otp", "email"}) {
			t.Fatalf("result %+v %+v", res.User, res.Session)
		}
		ids, _ := f.svc.identityNames(ctx, ada.ID)
		if !slices.Equal(ids, []string{persistence.IdentityOTP}) {
			t.Fatalf("identities %v", ids)
		}
		u, _ := f.store.GetUser(ctx, ada.ID)
		if !u.EmailVerified || u.LastSignInAt == nil {
			t.Fatalf("user %+v", u)
		}

		// Replayed, in a new flow: the code was spent.
		fl2 := f.otpFlow(t, "browser", "ada@example.com")
		f.next(t)
		if _, err := f.svc.SubmitOTP(ctx, fl2, f.app, code, Client{}); err == nil {
			t.Fatal("a spent code signed in again")
		}
	})
}

func TestOTPRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, MethodOTP)
		f.user(t, "ada@example.com", directory.StatusActive, false)

		t.Run("expired", func(t *testing.T) {
			fl := f.otpFlow(t, "b1", "ada@example.com")
			code := sentCode(t, f.next(t))
			f.advance(OTPTTL)
			_, err := f.svc.SubmitOTP(ctx, fl, f.app, code, Client{})
			f.advance(-OTPTTL)
			if !errors.Is(err, ErrCodeExpired) {
				t.Fatalf("expired code: %v", err)
			}
		})
		t.Run("too many wrong codes", func(t *testing.T) {
			fl := f.otpFlow(t, "b2", "ada@example.com")
			code := sentCode(t, f.next(t))
			wrong := "123456"
			if code == wrong {
				wrong = "654321"
			}
			for i := range MaxOTPAttempts {
				_, err := f.svc.SubmitOTP(ctx, fl, f.app, wrong, Client{})
				want := ErrInvalidCode
				if i == MaxOTPAttempts-1 {
					want = ErrTooManyWrongCode
				}
				if !errors.Is(err, want) {
					t.Fatalf("try %d: %v", i, err)
				}
			}
			if _, err := f.svc.SubmitOTP(ctx, fl, f.app, code, Client{}); !errors.Is(err, ErrTooManyWrongCode) {
				t.Fatalf("the right code after too many wrong ones: %v", err)
			}
		})
		t.Run("a new code replaces the last", func(t *testing.T) {
			fl := f.otpFlow(t, "b3", "ada@example.com")
			first := sentCode(t, f.next(t))
			fl, err := f.svc.ChooseMethod(ctx, fl, f.app, MethodOTP, Client{})
			if err != nil {
				t.Fatal(err)
			}
			second := sentCode(t, f.next(t))
			if first != second {
				if _, err := f.svc.SubmitOTP(ctx, fl, f.app, first, Client{}); !errors.Is(err, ErrInvalidCode) {
					t.Fatalf("the replaced code: %v", err)
				}
			}
			if _, err := f.svc.SubmitOTP(ctx, fl, f.app, second, Client{}); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("not a code", func(t *testing.T) {
			fl := f.otpFlow(t, "b4", "ada@example.com")
			f.next(t)
			for _, c := range []string{"", "12345", "1234567", "12345\x00", "١٢٣٤٥٦", string(make([]byte, 10000))} {
				if _, err := f.svc.SubmitOTP(ctx, fl, f.app, c, Client{}); !errors.Is(err, ErrInvalidCode) && !errors.Is(err, ErrTooManyWrongCode) {
					t.Fatalf("%q: %v", c, err)
				}
			}
		})
		t.Run("two at once", func(t *testing.T) {
			fl := f.otpFlow(t, "b5", "ada@example.com")
			code := sentCode(t, f.next(t))
			var wg sync.WaitGroup
			var mu sync.Mutex
			wins := 0
			for range 4 {
				wg.Go(func() {
					if _, err := f.svc.SubmitOTP(ctx, fl, f.app, code, Client{}); err == nil {
						mu.Lock()
						wins++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if wins != 1 {
				t.Fatalf("%d sign-ins with one code", wins)
			}
		})
	})
}

// An e-mail that signs in with a password only is not sent a code: the
// hosted page says nothing and the person gets a notice; the embedded API
// is told account_exists with the identities.
func TestAccountExists(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, MethodOTP, MethodMagicLink, MethodPassword)
		f.user(t, "pat@example.com", directory.StatusActive, true)

		f.otpFlow(t, "b", "pat@example.com")
		m := f.next(t)
		if codeRe.MatchString(m.Text) || !regexp.MustCompile(`another way \(password\)`).MatchString(m.Text) {
			t.Fatalf("notice %q", m.Text)
		}
		for _, send := range []func(context.Context, *persistence.Client, string, Target, Client) error{f.svc.SendOTP, f.svc.SendMagicLink} {
			err := send(ctx, f.app, "pat@example.com", Target{RedirectURI: "https://app.example.com/cb"}, Client{})
			var exists *AccountExistsError
			if !errors.As(err, &exists) || !slices.Equal(exists.Identities, []string{"password"}) {
				t.Fatalf("embedded send: %v", err)
			}
		}
		f.none(t)
	})
}

func TestSignUp(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		closed := newFixture(t, dbURL, MethodOTP)
		// Not allowed: the hosted page sends nothing, the API says so.
		closed.otpFlow(t, "b", "new@example.com")
		closed.none(t)
		if err := closed.svc.SendOTP(ctx, closed.app, "new@example.com", Target{}, Client{}); !errors.Is(err, ErrUserNotFound) {
			t.Fatalf("embedded: %v", err)
		}

		open := newFixture(t, dbURL, MethodOTP)
		if _, err := open.store.UpdateApplication(ctx, open.app.RecordID, func(a *persistence.Application) error {
			a.AllowSignUp = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		c, _ := open.store.GetClient(ctx, open.app.ID)
		open.app = c.(*persistence.Client)
		fl := open.otpFlow(t, "b", "New@Example.com")
		res, err := open.svc.SubmitOTP(ctx, fl, open.app, sentCode(t, open.next(t)), Client{})
		if err != nil {
			t.Fatal(err)
		}
		u := res.User
		if u.Email != "New@Example.com" || u.Status != directory.StatusActive || !u.EmailVerified {
			t.Fatalf("new person %+v", u)
		}
		if ids, _ := open.svc.identityNames(ctx, u.ID); !slices.Equal(ids, []string{persistence.IdentityOTP}) {
			t.Fatalf("identities %v", ids)
		}
	})
}

// A person made by an invite (no password, status invited) signs in with
// a code, which activates them; a disabled person gets nothing.
func TestInvitedAndDisabled(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, MethodOTP)
		inv := f.user(t, "inv@example.com", directory.StatusInvited, false)
		fl := f.otpFlow(t, "b", "inv@example.com")
		res, err := f.svc.SubmitOTP(ctx, fl, f.app, sentCode(t, f.next(t)), Client{})
		if err != nil {
			t.Fatal(err)
		}
		if res.User.ID != inv.ID || res.User.Status != directory.StatusActive || !res.User.EmailVerified {
			t.Fatalf("invited person after the code %+v", res.User)
		}

		f.user(t, "off@example.com", directory.StatusDisabled, false)
		f.otpFlow(t, "b", "off@example.com")
		f.none(t)
	})
}

func TestMagicLink(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, MethodMagicLink)
		ada := f.user(t, "ada@example.com", directory.StatusActive, false)
		fl, err := f.svc.BeginFlow(ctx, "browser", f.app.ID, url.Values{"client_id": {f.app.ID}}, "")
		if err != nil {
			t.Fatal(err)
		}
		if fl, err = f.svc.SubmitEmail(ctx, fl, f.app, "ada@example.com", Client{}); err != nil || fl.Step != StepLinkSent {
			t.Fatalf("%v %+v", err, fl)
		}
		m := f.next(t)
		link := linkRe.FindStringSubmatch(m.Text)
		if link == nil || !regexp.MustCompile(regexp.QuoteMeta(link[0])).MatchString(m.HTML) {
			t.Fatalf("no link in %q", m.Text)
		}
		token := link[1]
		// Reading is free: twice.
		for range 2 {
			if _, err := f.svc.MagicLink(ctx, token); err != nil {
				t.Fatal(err)
			}
		}
		ch, _ := f.svc.MagicLink(ctx, token)
		// Opened in another browser: a flow of its own, same request.
		other, err := f.svc.LinkFlow(ctx, ch, "phone")
		if err != nil || other.ID == fl.ID || other.Request != fl.Request || other.Step != StepLinkSent {
			t.Fatalf("%v %+v", err, other)
		}
		own, err := f.svc.LinkFlow(ctx, ch, "browser")
		if err != nil || own.ID != fl.ID {
			t.Fatalf("%v %+v", err, own)
		}
		res, err := f.svc.SignInWithLink(ctx, ch, own, f.app, Client{})
		if err != nil {
			t.Fatal(err)
		}
		if res.User.ID != ada.ID || !slices.Equal(res.Session.AMR, []string{"email"}) {
			t.Fatalf("%+v", res.Session)
		}
		if _, err := f.svc.MagicLink(ctx, token); !errors.Is(err, ErrCodeExpired) {
			t.Fatalf("a used link: %v", err)
		}
		if _, err := f.svc.SignInWithLink(ctx, ch, other, f.app, Client{}); !errors.Is(err, ErrCodeExpired) {
			t.Fatalf("a used link, again: %v", err)
		}
		for _, bad := range []string{"", "x", token + "x", string(make([]byte, 5000))} {
			if _, err := f.svc.MagicLink(ctx, bad); !errors.Is(err, ErrCodeExpired) {
				t.Fatalf("%q: %v", bad, err)
			}
		}

		// Expired.
		if _, err := f.svc.ChooseMethod(ctx, fl, f.app, MethodMagicLink, Client{}); err == nil {
			t.Fatal("a finished flow sent a link")
		}
		fl2, _ := f.svc.BeginFlow(ctx, "browser", f.app.ID, url.Values{}, "")
		if _, err := f.svc.SubmitEmail(ctx, fl2, f.app, "ada@example.com", Client{}); err != nil {
			t.Fatal(err)
		}
		token2 := linkRe.FindStringSubmatch(f.next(t).Text)[1]
		f.advance(MagicLinkTTL)
		if _, err := f.svc.MagicLink(ctx, token2); !errors.Is(err, ErrCodeExpired) {
			t.Fatalf("expired link: %v", err)
		}
	})
}
