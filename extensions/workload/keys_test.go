package workload

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func TestKeyAge(t *testing.T) {
	for cc, want := range map[string]time.Duration{
		"":                           defaultKeyAge,
		"public, max-age=600":        10 * time.Minute,
		"max-age=0":                  minKeyAge,
		"max-age=2":                  minKeyAge,
		"max-age=31536000":           maxKeyAge,
		"max-age=99999999999999999":  maxKeyAge,
		"no-store":                   minKeyAge,
		"max-age=600, no-cache":      minKeyAge,
		`MAX-AGE="120"`:              2 * time.Minute,
		"private, must-revalidate":   defaultKeyAge,
		"max-age=-5":                 defaultKeyAge,
		"s-maxage=10, max-age=86400": 24 * time.Hour,
	} {
		h := http.Header{}
		if cc != "" {
			h.Set("Cache-Control", cc)
		}
		if got := keyAge(h); got != want {
			t.Errorf("Cache-Control %q: %v, want %v", cc, got, want)
		}
	}
}

// fedRig is a registered issuer mapped to one agent, on a clock the test
// moves.
type fedRig struct {
	s      *Service
	is     *issuer
	clock  atomic.Int64 // Unix nanoseconds
	claims func() map[string]any
}

func newFedRig(t testing.TB, dbURL string) *fedRig {
	ctx := context.Background()
	store := dbtest.Store(t, dbURL)
	r := &fedRig{s: New(store), is: newIssuer(t)}
	r.clock.Store(time.Now().UnixNano())
	r.s.now = func() time.Time { return time.Unix(0, r.clock.Load()).UTC() }
	ptr := func(v string) *string { return &v }
	list := func(v ...string) *[]string { return &v }
	reg, err := r.s.CreateIssuer(ctx, IssuerInput{Name: ptr("cluster"), IssuerURL: ptr(r.is.srv.URL), JWKSURI: ptr(r.is.srv.URL + "/keys"),
		Platform: ptr("kubernetes"), AllowedAudiences: list("identityd"), AllowedSubjects: list("*")})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := store.CreateAgent(ctx, &persistence.Agent{ID: uuid.NewString(), ClientID: "agt_keys", SecretHash: []byte("x"), Name: "k",
		Type: "service", TrustLevel: "sandboxed", Status: persistence.AgentActive, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.s.CreateMapping(ctx, MappingInput{IssuerID: reg.ID, AgentClientID: "agt_keys", SubjectPattern: "sa"}); err != nil {
		t.Fatal(err)
	}
	r.claims = func() map[string]any {
		now := r.s.now()
		return map[string]any{"iss": r.is.srv.URL, "sub": "sa", "aud": "identityd", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	}
	return r
}

func (r *fedRig) advance(d time.Duration) { r.clock.Add(int64(d)) }

func refusedWith(err error, code string) bool {
	var rfc *fosite.RFC6749Error
	return errors.As(err, &rfc) && rfc.ErrorField == code
}

// A key the issuer removed stops being trusted once the cached set's age
// (its Cache-Control, clamped) has passed.
func TestRemovedKeyExpires(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		r := newFedRig(t, dbURL)
		ctx := context.Background()
		r.is.cacheControl.Store("max-age=60")
		old := r.is.sign(t, r.claims())
		if _, err := r.s.Verify(ctx, old); err != nil {
			t.Fatal(err)
		}
		r.is.rotate(t, r.is.alg) // the old key is gone from the issuer's set
		r.advance(59 * time.Second)
		if _, err := r.s.Verify(ctx, old); err != nil {
			t.Fatalf("within its age the cached key is trusted: %v", err)
		}
		r.advance(2 * time.Second)
		if _, err := r.s.Verify(ctx, old); !refusedWith(err, "invalid_request") {
			t.Fatalf("a removed key past its age: %v, want a refusal", err)
		}
		if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); err != nil {
			t.Fatalf("the issuer's new key: %v", err)
		}
		// Without Cache-Control: an hour.
		r.is.cacheControl.Store("")
		r.advance(2 * time.Minute) // the set cached above expires; the next fetch has no header
		if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); err != nil {
			t.Fatal(err)
		}
		before := r.is.fetches.Load()
		r.advance(59 * time.Minute)
		if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); err != nil || r.is.fetches.Load() != before {
			t.Fatalf("within the default hour: %v, %d fetches", err, r.is.fetches.Load()-before)
		}
		r.advance(2 * time.Minute)
		if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); err != nil || r.is.fetches.Load() != before+1 {
			t.Fatalf("past the default hour: %v, %d fetches, want 1", err, r.is.fetches.Load()-before)
		}
	})
}

// Tokens naming keys the set lacks (forged ones) fetch it again at most
// once per missInterval, and concurrent ones share the fetch.
func TestForgedKeysBoundFetches(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		r := newFedRig(t, dbURL)
		ctx := context.Background()
		if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); err != nil {
			t.Fatal(err)
		}
		forger := newIssuer(t)
		forger.srv.Close()
		before := r.is.fetches.Load()
		var wg sync.WaitGroup
		for range 400 {
			wg.Go(func() {
				forger.kid = r.is.kid + "-" + uuid.NewString()[:8]
				claims := r.claims()
				if _, err := r.s.Verify(ctx, forger.sign(t, claims)); !refusedWith(err, "invalid_request") {
					t.Errorf("a forged token: %v", err)
				}
			})
			wg.Wait()
		}
		if n := r.is.fetches.Load() - before; n != 1 {
			t.Fatalf("400 forged tokens fetched the key set %d times, want 1", n)
		}
		r.advance(missInterval)
		forger.kid = "another"
		if _, err := r.s.Verify(ctx, forger.sign(t, r.claims())); !refusedWith(err, "invalid_request") {
			t.Fatal(err)
		}
		if n := r.is.fetches.Load() - before; n != 2 {
			t.Fatalf("after the interval, fetches %d, want 2", n)
		}
	})
}

// A key set that redirects is not followed: the fetch fails, the exchange
// is answered temporarily_unavailable, and the issuer is not hammered.
func TestKeySetRedirectNotFollowed(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		r := newFedRig(t, dbURL)
		ctx := context.Background()
		r.is.redirect.Store(true)
		for range 20 {
			if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); !refusedWith(err, "temporarily_unavailable") {
				t.Fatalf("through a redirecting key set: %v", err)
			}
		}
		if n := r.is.fetches.Load(); n != 1 {
			t.Fatalf("%d fetches (the redirect target included), want 1", n)
		}
		r.is.redirect.Store(false)
		r.advance(failureBackoff)
		if _, err := r.s.Verify(ctx, r.is.sign(t, r.claims())); err != nil {
			t.Fatalf("once the key set answers: %v", err)
		}
	})
}
