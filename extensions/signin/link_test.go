package signin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Linking proves the account with its password, or without one with an
// e-mailed code; a wrong proof counts against the token, which dies at
// MaxLinkAttempts; a token works once, for LinkingTTL; the account is told.
func TestLinking(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, MethodPassword, MethodOTP, MethodMagicLink)
		pat := f.user(t, "pat@example.com", directory.StatusActive, true)
		c := Client{IP: "192.0.2.7"}
		identities := func(t *testing.T, userID string) []string {
			t.Helper()
			ids, err := f.svc.Identities(ctx, userID)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(ids)
			return ids
		}

		t.Run("refused starts", func(t *testing.T) {
			for _, tc := range []struct {
				email, provider string
				want            error
			}{
				{"nobody@example.com", persistence.IdentityOTP, ErrUserNotFound},
				{"pat@example.com", persistence.IdentityPassword, errLinkPassword},
				{"pat@example.com", "acme-sso", errLinkUpstream},
				{"pat@example.com", "", errLinkUpstream},
				{"not an address", persistence.IdentityOTP, nil},
			} {
				_, err := f.svc.InitiateLink(ctx, f.app, tc.email, tc.provider, nil, c)
				if tc.want != nil && !errors.Is(err, tc.want) || tc.want == nil && err == nil {
					t.Fatalf("%s/%s: %v", tc.email, tc.provider, err)
				}
			}
			f.none(t)
		})

		t.Run("with the password", func(t *testing.T) {
			start, err := f.svc.InitiateLink(ctx, f.app, " Pat@example.com ", persistence.IdentityMagicLink, nil, c)
			if err != nil {
				t.Fatal(err)
			}
			if start.Verification != persistence.VerifyPassword || !slices.Equal(start.Existing, []string{"password"}) || len(start.Token) != 43 {
				t.Fatalf("start %+v", start)
			}
			f.none(t) // no code for a password proof
			if _, err := f.svc.VerifyLink(ctx, start.Token, "", "123456", c); !errors.Is(err, errLinkProof) {
				t.Fatalf("a code for a password token: %v", err)
			}
			if _, err := f.svc.VerifyLink(ctx, start.Token, "wrong password", "", c); !errors.Is(err, errLinkWrongPassword) {
				t.Fatalf("a wrong password: %v", err)
			}
			linked, err := f.svc.VerifyLink(ctx, start.Token, password, "", c)
			if err != nil || linked.UserID != pat.ID || linked.Provider != persistence.IdentityMagicLink {
				t.Fatalf("linked %+v, %v", linked, err)
			}
			if m := f.next(t); m.To != pat.Email || !strings.Contains(m.Text, "magic_link") {
				t.Fatalf("notice %q to %s: %s", m.Subject, m.To, m.Text)
			}
			if _, err := f.svc.VerifyLink(ctx, start.Token, password, "", c); !errors.Is(err, ErrLinkExpired) {
				t.Fatalf("a token used twice: %v", err)
			}
			if got := identities(t, pat.ID); !slices.Equal(got, []string{"magic_link", "password"}) {
				t.Fatalf("identities %v", got)
			}
			if _, err := f.svc.InitiateLink(ctx, f.app, pat.Email, persistence.IdentityMagicLink, nil, c); !errors.Is(err, ErrAlreadyLinked) {
				t.Fatalf("linked twice: %v", err)
			}
		})

		t.Run("with an e-mailed code", func(t *testing.T) {
			lin := f.user(t, "lin@example.com", directory.StatusActive, false)
			if err := f.store.AddIdentity(ctx, persistence.Identity{UserID: lin.ID, Provider: "acme-sso", Issuer: "https://sso.example", Subject: "lin", CreatedAt: f.clock}); err != nil {
				t.Fatal(err)
			}
			start, err := f.svc.InitiateLink(ctx, f.app, lin.Email, persistence.IdentityOTP, nil, c)
			if err != nil || start.Verification != persistence.VerifyEmailCode || !slices.Equal(start.Existing, []string{"acme-sso"}) {
				t.Fatalf("start %+v, %v", start, err)
			}
			code := sentCode(t, f.next(t))
			wrong := "000000"
			if code == wrong {
				wrong = "000001"
			}
			for _, bad := range []string{wrong, "12", "١٢٣٤٥٦"} {
				if _, err := f.svc.VerifyLink(ctx, start.Token, "", bad, c); !errors.Is(err, errLinkWrongCode) {
					t.Fatalf("%q: %v", bad, err)
				}
			}
			if _, err := f.svc.VerifyLink(ctx, start.Token, "", " "+code+" ", c); err != nil {
				t.Fatal(err)
			}
			f.next(t) // the notice
			if got := identities(t, lin.ID); !slices.Equal(got, []string{"acme-sso", "otp"}) {
				t.Fatalf("identities %v", got)
			}
		})

		t.Run("too many wrong tries, and expiry", func(t *testing.T) {
			kim := f.user(t, "kim@example.com", directory.StatusActive, true)
			start, err := f.svc.InitiateLink(ctx, f.app, kim.Email, persistence.IdentityOTP, nil, c)
			if err != nil {
				t.Fatal(err)
			}
			for i := range MaxLinkAttempts {
				want := errLinkWrongPassword
				if i == MaxLinkAttempts-1 {
					want = errLinkTooManyWrong
				}
				if _, err := f.svc.VerifyLink(ctx, start.Token, "wrong", "", c); !errors.Is(err, want) {
					t.Fatalf("try %d: %v", i, err)
				}
			}
			if _, err := f.svc.VerifyLink(ctx, start.Token, password, "", c); !errors.Is(err, ErrLinkExpired) {
				t.Fatalf("the right password after too many wrong ones: %v", err)
			}
			start, err = f.svc.InitiateLink(ctx, f.app, kim.Email, persistence.IdentityOTP, nil, c)
			if err != nil {
				t.Fatal(err)
			}
			f.advance(LinkingTTL)
			if _, err := f.svc.VerifyLink(ctx, start.Token, password, "", c); !errors.Is(err, ErrLinkExpired) {
				t.Fatalf("an expired token: %v", err)
			}
			for _, token := range []string{"", "unknown", strings.Repeat("x", 100)} {
				if _, err := f.svc.VerifyLink(ctx, token, password, "", c); !errors.Is(err, ErrLinkExpired) {
					t.Fatalf("token %q: %v", token, err)
				}
			}
			if got := identities(t, kim.ID); !slices.Equal(got, []string{"password"}) {
				t.Fatalf("identities %v", got)
			}
			f.none(t)
		})

		t.Run("one token verified at once by many: one links", func(t *testing.T) {
			ray := f.user(t, "ray@example.com", directory.StatusActive, true)
			start, err := f.svc.InitiateLink(ctx, f.app, ray.Email, persistence.IdentityOTP, nil, c)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			won := 0
			for range 4 {
				wg.Go(func() {
					_, err := f.svc.VerifyLink(ctx, start.Token, password, "", c)
					if err != nil && !errors.Is(err, ErrLinkExpired) {
						t.Error(err)
					}
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						won++
					}
				})
			}
			wg.Wait()
			if won != 1 {
				t.Fatalf("%d of 4 linked", won)
			}
			f.next(t)
		})

		t.Run("an upstream identity, from a sign-in's pending link", func(t *testing.T) {
			pending := func(t *testing.T, u *persistence.User, subject, clientID string, ttl time.Duration) *persistence.UpstreamLink {
				t.Helper()
				l := &persistence.UpstreamLink{ID: uuid.NewString(), HandleHash: []byte(uuid.NewString()), UserID: u.ID, Provider: "acme-sso",
					ProviderID: uuid.NewString(), Issuer: "https://sso.example", Subject: subject, Email: u.Email, EmailVerified: true,
					ClientID: clientID, CreatedAt: f.clock, ExpiresAt: f.clock.Add(ttl)}
				if err := f.store.CreateUpstreamLink(ctx, l); err != nil {
					t.Fatal(err)
				}
				return l
			}
			sam := f.user(t, "sam@example.com", directory.StatusActive, true)
			lee := f.user(t, "lee@example.com", directory.StatusActive, true)
			for name, l := range map[string]*persistence.UpstreamLink{
				"another application's": pending(t, sam, "sub-sam", "app_other", time.Minute),
				"expired":               pending(t, sam, "sub-sam", f.app.ID, -time.Second),
				"another account's":     pending(t, lee, "sub-lee", f.app.ID, time.Minute),
			} {
				if _, err := f.svc.InitiateLink(ctx, f.app, sam.Email, "acme-sso", l, c); !errors.Is(err, errLinkUpstream) {
					t.Fatalf("%s pending link: %v", name, err)
				}
			}
			if _, err := f.svc.InitiateLink(ctx, f.app, sam.Email, "acme-sso", nil, c); !errors.Is(err, errLinkUpstream) {
				t.Fatalf("no pending link: %v", err)
			}
			ok := pending(t, sam, "sub-sam", f.app.ID, time.Minute)
			if _, err := f.svc.InitiateLink(ctx, f.app, sam.Email, persistence.IdentityOTP, ok, c); !errors.Is(err, errLinkUpstream) {
				t.Fatalf("a pending link for another method: %v", err)
			}
			start, err := f.svc.InitiateLink(ctx, f.app, sam.Email, "acme-sso", ok, c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.svc.VerifyLink(ctx, start.Token, password, "", c); err != nil {
				t.Fatal(err)
			}
			f.next(t)
			if id, err := f.store.UpstreamIdentity(ctx, "acme-sso", "https://sso.example", "sub-sam"); err != nil || id.UserID != sam.ID {
				t.Fatalf("bound %+v %v", id, err)
			}
			// The pending link was spent with the link; another account's
			// link to the same upstream person is refused.
			if _, err := f.svc.InitiateLink(ctx, f.app, sam.Email, "acme-sso", ok, c); !errors.Is(err, ErrAlreadyLinked) && !errors.Is(err, errLinkUpstream) {
				t.Fatalf("a spent pending link: %v", err)
			}
			theirs := pending(t, lee, "sub-sam", f.app.ID, time.Minute)
			start, err = f.svc.InitiateLink(ctx, f.app, lee.Email, "acme-sso", theirs, c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.svc.VerifyLink(ctx, start.Token, password, "", c); !errors.Is(err, ErrIdentityTaken) {
				t.Fatalf("another account's upstream person: %v", err)
			}
			if got := identities(t, lee.ID); !slices.Equal(got, []string{"password"}) {
				t.Fatalf("lee's identities %v", got)
			}
		})

		t.Run("unlink, never the last", func(t *testing.T) {
			if _, err := f.svc.Unlink(ctx, f.app, pat.ID, persistence.IdentityOTP, c); !errors.Is(err, ErrNotLinked) {
				t.Fatalf("a method not linked: %v", err)
			}
			remaining, err := f.svc.Unlink(ctx, f.app, pat.ID, persistence.IdentityPassword, c)
			if err != nil || !slices.Equal(remaining, []string{"magic_link"}) {
				t.Fatalf("remaining %v, %v", remaining, err)
			}
			if u, err := f.store.GetUser(ctx, pat.ID); err != nil || u.PasswordHash != nil {
				t.Fatalf("the password stays after its identity went: %v", err)
			}
			if _, err := f.svc.Unlink(ctx, f.app, pat.ID, persistence.IdentityMagicLink, c); !errors.Is(err, ErrLastMethod) {
				t.Fatalf("the last method: %v", err)
			}
			// Two methods removed at once: one goes, the last stays.
			lou := f.user(t, "lou@example.com", directory.StatusActive, true)
			if err := f.store.AddIdentity(ctx, persistence.Identity{UserID: lou.ID, Provider: persistence.IdentityOTP, CreatedAt: f.clock}); err != nil {
				t.Fatal(err)
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i, p := range []string{persistence.IdentityPassword, persistence.IdentityOTP} {
				wg.Go(func() { _, errs[i] = f.svc.Unlink(ctx, f.app, lou.ID, p, c) })
			}
			wg.Wait()
			if (errs[0] == nil) == (errs[1] == nil) || !errors.Is(errors.Join(errs...), ErrLastMethod) {
				t.Fatalf("two unlinks at once: %v", errs)
			}
			if got := identities(t, lou.ID); len(got) != 1 {
				t.Fatalf("after two unlinks at once: %v", got)
			}
		})

	})
}
