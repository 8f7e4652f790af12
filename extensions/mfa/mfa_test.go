package mfa

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image/png"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pquerna/otp/totp"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

var systemSecret = []byte("a system secret for this test only")

type fixture struct {
	svc   *Service
	store *persistence.Store
	clock time.Time
}

// newFixture is the service on a fresh database of dbURL's dialect, its
// clock fixed in the middle of a time step (set f.clock to move it).
func newFixture(t *testing.T, dbURL string, cfg Config) *fixture {
	t.Helper()
	store := dbtest.Store(t, dbURL)
	f := &fixture{svc: New(store, systemSecret, cfg), store: store, clock: time.Unix(1_900_000_015, 0).UTC()}
	f.svc.now = func() time.Time { return f.clock }
	return f
}

func (f *fixture) user(t *testing.T) *persistence.User {
	t.Helper()
	n := extensions.Now()
	u := &persistence.User{ID: uuid.NewString(), Email: "ada-" + uuid.NewString()[:8] + "@example.com", Name: "Ada", Status: "active",
		Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
	if err := f.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

// code is the TOTP code of secret, steps steps from the fixture's clock.
func (f *fixture) code(t *testing.T, secret string, steps int) string {
	t.Helper()
	c, err := totp.GenerateCode(secret, f.clock.Add(time.Duration(steps)*Period))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// enabled enrols and confirms a person's TOTP, answering its secret and
// recovery codes; the confirming code is the current step's.
func (f *fixture) enabled(t *testing.T, userID string) (string, []string) {
	t.Helper()
	ctx := context.Background()
	e, err := f.svc.Enroll(ctx, userID)
	if err != nil {
		t.Fatal(err)
	}
	codes, err := f.svc.Confirm(ctx, userID, f.code(t, e.Secret, 0), Origin{})
	if err != nil {
		t.Fatal(err)
	}
	return e.Secret, codes
}

func TestParseCode(t *testing.T) {
	for _, c := range []struct{ in, kind, normal string }{
		{"123456", MethodTOTP, "123456"},
		{"123 456", MethodTOTP, "123456"},
		{" 123456 ", MethodTOTP, "123456"},
		{"12345", "", "12345"},
		{"1234567", "", "1234567"},
		{"12345a", "", "12345a"},
		{"١٢٣٤٥٦", "", "١٢٣٤٥٦"}, // digits, but not ASCII ones
		{"abcde-fgh23", MethodRecoveryCode, "abcdefgh23"},
		{"ABCDE-FGH23", MethodRecoveryCode, "abcdefgh23"},
		{"abcde fgh23", MethodRecoveryCode, "abcdefgh23"},
		{"abcdefgh23", MethodRecoveryCode, "abcdefgh23"},
		{"abcde-fgh21", "", "abcdefgh21"}, // 1 is not base32
		{"abcde-fgh2", "", "abcdefgh2"},
		{"abcdé-fgh23", "", "abcdéfgh23"},
		{"", "", ""},
		{"------", "", ""},
		{strings.Repeat("1", 65), "", ""},
	} {
		kind, normal := parseCode(c.in)
		if kind != c.kind || normal != c.normal {
			t.Errorf("parseCode(%q) = %q %q, want %q %q", c.in, kind, normal, c.kind, c.normal)
		}
	}
}

func TestMatch(t *testing.T) {
	const secret = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
	now := time.Unix(1_900_000_015, 0)
	step := now.Unix() / 30
	for _, c := range []struct {
		offset int
		ok     bool
	}{{-3, false}, {-2, false}, {-1, true}, {0, true}, {1, true}, {2, false}} {
		code, err := totp.GenerateCode(secret, now.Add(time.Duration(c.offset)*Period))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := match(secret, code, now)
		if ok != c.ok || ok && got != step+int64(c.offset) {
			t.Errorf("offset %d: step %d %v, want %d %v", c.offset, got, ok, step+int64(c.offset), c.ok)
		}
	}
	if _, ok := match(secret, "12345", now); ok {
		t.Error("five digits matched")
	}
}

var recoveryForm = regexp.MustCompile(`^[a-z2-7]{5}-[a-z2-7]{5}$`)

func TestTOTP(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, Config{Issuer: "https://id.example.com:8443/base"})
		ada := f.user(t)
		o := Origin{ClientID: "app_web", ApplicationID: uuid.NewString(), SessionID: uuid.NewString(), IP: "192.0.2.7", UserAgent: "test"}

		if _, err := f.svc.Enroll(ctx, uuid.NewString()); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("an unknown person: %v", err)
		}
		if _, err := f.svc.Enroll(ctx, "not-a-uuid"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("no uuid: %v", err)
		}
		if _, err := f.svc.Confirm(ctx, ada.ID, "123456", o); !errors.Is(err, ErrNotEnrolled) {
			t.Fatalf("confirming before enrolling: %v", err)
		}
		if _, err := f.svc.Verify(ctx, ada.ID, "123456", Origin{}); !errors.Is(err, ErrNotEnabled) {
			t.Fatalf("verifying before enrolling: %v", err)
		}
		if _, err := f.svc.Disable(ctx, ada.ID, "123456", o); !errors.Is(err, ErrNotEnabled) {
			t.Fatalf("disabling before enrolling: %v", err)
		}

		// Enrolment: a secret, its URI and QR code; kept sealed.
		old, err := f.svc.Enroll(ctx, ada.ID)
		if err != nil {
			t.Fatal(err)
		}
		e, err := f.svc.Enroll(ctx, strings.ToUpper(ada.ID)) // again, before confirming: replaces it
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Secret) != 32 || e.Secret == old.Secret {
			t.Fatalf("secret %q (before %q)", e.Secret, old.Secret)
		}
		u, err := url.Parse(e.URI)
		q := u.Query()
		if err != nil || u.Scheme != "otpauth" || u.Host != "totp" || u.Path != "/id.example.com:"+ada.Email || q.Get("secret") != e.Secret ||
			q.Get("issuer") != "id.example.com" || q.Get("algorithm") != "SHA1" || q.Get("digits") != "6" || q.Get("period") != "30" {
			t.Fatalf("URI %q", e.URI)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(e.QRCode, "data:image/png;base64,"))
		if !strings.HasPrefix(e.QRCode, "data:image/png;base64,") || err != nil {
			t.Fatalf("QR code %.40q: %v", e.QRCode, err)
		}
		if img, err := png.Decode(bytes.NewReader(raw)); err != nil || img.Bounds().Dx() != qrSize {
			t.Fatalf("QR code image: %v", err)
		}
		row, err := f.store.GetTOTP(ctx, ada.ID)
		if err != nil || row.EnabledAt != nil || bytes.Contains(row.SecretSealed, []byte(e.Secret)) || bytes.Contains(bytes.ToUpper(row.SecretSealed), []byte(e.Secret)) {
			t.Fatalf("stored: %+v %v", row, err)
		}
		if on, err := f.svc.Enabled(ctx, ada.ID); on || err != nil {
			t.Fatalf("enabled before confirming: %v %v", on, err)
		}
		if _, err := f.svc.Verify(ctx, ada.ID, f.code(t, e.Secret, 0), Origin{}); !errors.Is(err, ErrNotEnabled) {
			t.Fatalf("verifying a pending factor: %v", err)
		}

		// Confirmation: the replaced secret's code is wrong; one step back is in time.
		if _, err := f.svc.Confirm(ctx, ada.ID, f.code(t, old.Secret, 0), o); !errors.Is(err, ErrInvalidCode) {
			t.Fatalf("the replaced secret: %v", err)
		}
		codes, err := f.svc.Confirm(ctx, ada.ID, f.code(t, e.Secret, -1), o)
		if err != nil {
			t.Fatal(err)
		}
		if len(codes) != RecoveryCodes || len(slices.Compact(slices.Sorted(slices.Values(codes)))) != RecoveryCodes {
			t.Fatalf("recovery codes %q", codes)
		}
		for _, c := range codes {
			if !recoveryForm.MatchString(c) {
				t.Fatalf("recovery code %q", c)
			}
		}
		if on, err := f.svc.Enabled(ctx, ada.ID); !on || err != nil {
			t.Fatalf("enabled: %v %v", on, err)
		}
		if _, err := f.svc.Enroll(ctx, ada.ID); !errors.Is(err, ErrAlreadyEnabled) {
			t.Fatalf("enrolling again: %v", err)
		}
		if _, err := f.svc.Confirm(ctx, ada.ID, f.code(t, e.Secret, 0), o); !errors.Is(err, ErrAlreadyEnabled) {
			t.Fatalf("confirming again: %v", err)
		}

		// Verification: each step once, newer steps only, ±1 step.
		verify := func(code string) (string, error) { return f.svc.Verify(ctx, ada.ID, code, o) }
		for i, c := range []struct {
			code, method string
			err          error
		}{
			{f.code(t, e.Secret, -1), "", ErrInvalidCode}, // the confirming code, replayed
			{f.code(t, e.Secret, 0), MethodTOTP, nil},
			{f.code(t, e.Secret, 0), "", ErrInvalidCode}, // replayed in its step
			{f.code(t, e.Secret, 1), MethodTOTP, nil},    // one step ahead
			{f.code(t, e.Secret, 0), "", ErrInvalidCode}, // older than the last used
			{f.code(t, e.Secret, 2), "", ErrInvalidCode}, // two steps ahead
			{"000000", "", ErrInvalidCode},
			{strings.ToUpper(strings.ReplaceAll(codes[0], "-", "")), MethodRecoveryCode, nil},
			{codes[0], "", ErrInvalidCode}, // spent
			{"aaaaa-aaaaa", "", ErrInvalidCode},
			{codes[1], MethodRecoveryCode, nil},
		} {
			method, err := verify(c.code)
			if method != c.method || !errors.Is(err, c.err) || c.err == nil && err != nil {
				t.Fatalf("%d: %q %v, want %q %v", i, method, err, c.method, c.err)
			}
		}
		f.clock = f.clock.Add(2 * Period)
		if method, err := f.svc.Verify(ctx, ada.ID, f.code(t, e.Secret, 0), Origin{}); err != nil || method != MethodTOTP {
			t.Fatalf("a later step: %q %v", method, err)
		}

		// Turning it off: proved by a recovery code here (TOTP in TestDisable).
		if _, err := f.svc.Disable(ctx, ada.ID, codes[1], o); !errors.Is(err, ErrInvalidCode) {
			t.Fatalf("disabling with a spent code: %v", err)
		}
		if method, err := f.svc.Disable(ctx, ada.ID, codes[2], o); err != nil || method != MethodRecoveryCode {
			t.Fatalf("disabling: %q %v", method, err)
		}
		if on, _ := f.svc.Enabled(ctx, ada.ID); on {
			t.Fatal("still on")
		}
		if _, err := f.svc.Disable(ctx, ada.ID, codes[3], o); !errors.Is(err, ErrNotEnabled) {
			t.Fatalf("disabling twice: %v", err)
		}

		// The log: what happened, where from, and never a code or the secret.
		events, err := f.store.ListAuthEvents(ctx, ada.ID, persistence.Page{Limit: 200})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ev := range events {
			got = append(got, ev.Type+"/"+ev.Reason)
			if ev.ClientID != o.ClientID || ev.IP != o.IP || *ev.SessionID != o.SessionID || *ev.ApplicationID != o.ApplicationID {
				t.Fatalf("event without its origin: %+v", ev)
			}
			text := strings.Join([]string{ev.Type, ev.Reason, ev.ClientID, ev.IP, ev.UserAgent, fmt.Sprint(ev.Data)}, " ")
			for _, secret := range append([]string{e.Secret, old.Secret, "000000"}, codes...) {
				if strings.Contains(strings.ToLower(text), strings.ToLower(strings.ReplaceAll(secret, "-", ""))) || strings.Contains(text, secret) {
					t.Fatalf("event %+v holds a secret", ev)
				}
			}
		}
		want := []string{
			"mfa_verify_failed/wrong_code", "USER_MFA_ENABLED/", "mfa_verify_failed/replayed_code",
			"mfa_verify_failed/replayed_code", "mfa_verify_failed/replayed_code", "mfa_verify_failed/wrong_code", "mfa_verify_failed/wrong_code",
			"mfa_recovery_code_used/", "mfa_verify_failed/wrong_recovery_code", "mfa_verify_failed/wrong_recovery_code", "mfa_recovery_code_used/",
			"mfa_verify_failed/wrong_recovery_code", "mfa_recovery_code_used/", "USER_MFA_DISABLED/",
		}
		slices.Sort(got) // events of one clock tick are listed in id order
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("events\n %v\nwant\n %v", got, want)
		}
	})
}

func TestDisable(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, Config{})
		ada := f.user(t)
		secret, codes := f.enabled(t, ada.ID)
		if _, err := f.svc.Disable(ctx, ada.ID, f.code(t, secret, 0), Origin{}); !errors.Is(err, ErrInvalidCode) {
			t.Fatalf("the confirming code, replayed: %v", err)
		}
		if method, err := f.svc.Disable(ctx, ada.ID, f.code(t, secret, 1), Origin{}); err != nil || method != MethodTOTP {
			t.Fatalf("disabling: %q %v", method, err)
		}
		if _, err := f.svc.Verify(ctx, ada.ID, codes[0], Origin{}); !errors.Is(err, ErrNotEnabled) {
			t.Fatalf("a recovery code after disabling: %v", err)
		}
		// On again: a new secret, new recovery codes; the old ones are gone.
		secret2, codes2 := f.enabled(t, ada.ID)
		if secret2 == secret || slices.ContainsFunc(codes, func(c string) bool { return slices.Contains(codes2, c) }) {
			t.Fatal("a secret or code came back")
		}
		if _, err := f.svc.Verify(ctx, ada.ID, codes[1], Origin{}); !errors.Is(err, ErrInvalidCode) {
			t.Fatalf("an old recovery code: %v", err)
		}
	})
}

// Wrong codes are bounded per person; a passing code clears the count, and
// the lock ends with its window however often it is knocked on.
func TestTryLimit(t *testing.T) {
	ctx := context.Background()
	const window = 600 * time.Millisecond
	f := newFixture(t, dbtest.URLs(t)["sqlite"], Config{MaxTries: 3, TryWindow: window})
	ada, bob := f.user(t), f.user(t)
	secret, _ := f.enabled(t, ada.ID)
	bobSecret, _ := f.enabled(t, bob.ID)
	tick := func() { f.clock = f.clock.Add(Period) } // a fresh step: a right code is not a replay
	next := func() string { return f.code(t, secret, 0) }

	for range 2 {
		if _, err := f.svc.Verify(ctx, ada.ID, "000000", Origin{}); !errors.Is(err, ErrInvalidCode) {
			t.Fatal(err)
		}
	}
	tick()
	if _, err := f.svc.Verify(ctx, ada.ID, next(), Origin{}); err != nil {
		t.Fatalf("the third try, right: %v", err)
	}
	began := time.Now()
	for range 3 { // the count began again
		if _, err := f.svc.Verify(ctx, ada.ID, "000000", Origin{}); !errors.Is(err, ErrInvalidCode) {
			t.Fatal(err)
		}
	}
	tick()
	_, err := f.svc.Verify(ctx, ada.ID, next(), Origin{})
	var e *extensions.Error
	if !errors.Is(err, ErrTooManyTries) || !errors.As(err, &e) || e.Details["retryAfter"] == nil || e.Details["limit"] != int64(3) {
		t.Fatalf("past the limit, the right code: %v", err)
	}
	if _, err := f.svc.Disable(ctx, ada.ID, next(), Origin{}); !errors.Is(err, ErrTooManyTries) {
		t.Fatalf("disabling past the limit: %v", err)
	}
	if _, err := f.svc.Verify(ctx, bob.ID, f.code(t, bobSecret, 0), Origin{}); err != nil {
		t.Fatalf("another person is not limited: %v", err)
	}
	// Knocking during the lock does not extend it.
	for time.Since(began) < window-100*time.Millisecond {
		_, _ = f.svc.Verify(ctx, ada.ID, "000000", Origin{})
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(began.Add(window + 100*time.Millisecond)))
	tick()
	if _, err := f.svc.Verify(ctx, ada.ID, next(), Origin{}); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

// Of many requests carrying one code at once, one passes.
func TestConcurrentCode(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFixture(t, dbURL, Config{MaxTries: 100})
		ada := f.user(t)
		secret, codes := f.enabled(t, ada.ID)
		for _, code := range []string{f.code(t, secret, 1), codes[0]} {
			var wg sync.WaitGroup
			var mu sync.Mutex
			passed := 0
			for range 8 {
				wg.Go(func() {
					_, err := f.svc.Verify(ctx, ada.ID, code, Origin{})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						passed++
					case !errors.Is(err, ErrInvalidCode) && !persistence.Unavailable(err):
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if passed != 1 {
				t.Fatalf("one code passed %d times", passed)
			}
		}
	})
}

// A sealed secret opens only in its own row: copied to another person's,
// it is an internal error, never a pass.
func TestSealBinding(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, dbtest.URLs(t)["sqlite"], Config{})
	ada, eve := f.user(t), f.user(t)
	e, err := f.svc.Enroll(ctx, ada.ID)
	if err != nil {
		t.Fatal(err)
	}
	row, _ := f.store.GetTOTP(ctx, ada.ID)
	row.UserID = eve.ID
	if err := f.store.PutPendingTOTP(ctx, row); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Confirm(ctx, eve.ID, f.code(t, e.Secret, 0), Origin{})
	if err == nil || errors.Is(err, ErrInvalidCode) || strings.Contains(err.Error(), e.Secret) {
		t.Fatalf("a copied secret: %v", err)
	}
}

// brokenStore is a rate-limit store that cannot count (Redis down).
type brokenStore struct{}

var errDown = errors.New("redis: connection refused")

func (brokenStore) Get(context.Context, string, limiter.Rate) (limiter.Context, error) {
	return limiter.Context{}, errDown
}
func (brokenStore) Peek(context.Context, string, limiter.Rate) (limiter.Context, error) {
	return limiter.Context{}, errDown
}
func (brokenStore) Reset(context.Context, string, limiter.Rate) (limiter.Context, error) {
	return limiter.Context{}, errDown
}
func (brokenStore) Increment(context.Context, string, int64, limiter.Rate) (limiter.Context, error) {
	return limiter.Context{}, errDown
}

// Without a count of tries, no code is checked: the answer is "try again
// later", never an unbounded guess.
func TestTriesUncounted(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, dbtest.URLs(t)["sqlite"], Config{})
	ada := f.user(t)
	secret, _ := f.enabled(t, ada.ID)
	f.svc.tries = limiter.New(brokenStore{}, f.svc.tries.Rate)
	if _, err := f.svc.Verify(ctx, ada.ID, f.code(t, secret, 1), Origin{}); !persistence.Unavailable(err) {
		t.Fatalf("with the counter down: %v", err)
	}
}
