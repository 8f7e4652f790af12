package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"golang.org/x/sync/singleflight"
)

// How long an issuer's keys are trusted, and how often they are fetched.
const (
	// An issuer's Cache-Control max-age, clamped to [minKeyAge, maxKeyAge],
	// says how long its keys are trusted; without one, defaultKeyAge. Past
	// that a key removed from the issuer's key set is no longer trusted.
	minKeyAge     = 5 * time.Second
	maxKeyAge     = 24 * time.Hour
	defaultKeyAge = time.Hour
	// A token naming a key the set lacks fetches the set again (how key
	// rotation reaches us) at most once per missInterval: forged tokens
	// with invented key ids cannot make identityd hammer the issuer.
	missInterval = 5 * time.Second
	// After a failed fetch, requests are answered from that failure for
	// failureBackoff instead of fetching again.
	failureBackoff = 5 * time.Second
	maxJWKSBytes   = 1 << 20
)

// errKeysUnavailable: the issuer's keys could not be read (its key set is
// down, redirects, or answers garbage) and no trusted copy is left. The
// exchange answers temporarily_unavailable, not a verdict on the token.
var errKeysUnavailable = errors.New("the issuer's key set cannot be read")

// keySet is one issuer's JSON Web Key Set, fetched from its jwks_uri and
// trusted for as long as the issuer's cache headers say (clamped). One
// fetch at a time: concurrent verifications share it.
type keySet struct {
	issuerURL, jwksURI string
	client             *http.Client
	now                func() time.Time
	fetches            singleflight.Group

	mu        sync.Mutex
	keys      []jose.JSONWebKey
	trusted   time.Time // keys are trusted until then
	lastMiss  time.Time // the last fetch for an unknown key
	failedAt  time.Time // the last failed fetch
	failedErr error
}

// verify checks a JWS against the issuer's keys: those trusted now, or the
// set fetched again when the token names a key they lack.
func (ks *keySet) verify(ctx context.Context, jws *jose.JSONWebSignature) ([]byte, error) {
	kid := jws.Signatures[0].Header.KeyID
	keys, err := ks.current(ctx)
	if err != nil {
		return nil, err
	}
	if payload, ok := verifyWith(jws, keys, kid); ok {
		return payload, nil
	}
	ks.mu.Lock()
	refetch := ks.now().Sub(ks.lastMiss) >= missInterval
	if refetch {
		ks.lastMiss = ks.now()
	}
	ks.mu.Unlock()
	if !refetch {
		return nil, errNoKey
	}
	if keys, err = ks.fetch(ctx); err != nil {
		return nil, err
	}
	if payload, ok := verifyWith(jws, keys, kid); ok {
		return payload, nil
	}
	return nil, errNoKey
}

var errNoKey = errors.New("no key of the issuer verifies the signature")

// verifyWith tries the keys the token's key id names (all of them when it
// names none).
func verifyWith(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) ([]byte, bool) {
	for i := range keys {
		if kid == "" || keys[i].KeyID == kid {
			if payload, err := jws.Verify(&keys[i]); err == nil {
				return payload, true
			}
		}
	}
	return nil, false
}

// current returns the keys trusted now, fetching them when there are none.
func (ks *keySet) current(ctx context.Context) ([]jose.JSONWebKey, error) {
	ks.mu.Lock()
	if ks.now().Before(ks.trusted) {
		keys := ks.keys
		ks.mu.Unlock()
		return keys, nil
	}
	ks.mu.Unlock()
	return ks.fetch(ctx)
}

// fetch reads the key set, shared by every caller that asks meanwhile;
// within failureBackoff of a failure it answers that failure again.
func (ks *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	ks.mu.Lock()
	if ks.failedErr != nil && ks.now().Sub(ks.failedAt) < failureBackoff {
		err := ks.failedErr
		ks.mu.Unlock()
		return nil, err
	}
	ks.mu.Unlock()
	ch := ks.fetches.DoChan("", func() (any, error) {
		// Its own context: one caller giving up must not fail the others.
		fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, age, err := ks.get(fctx)
		ks.mu.Lock()
		defer ks.mu.Unlock()
		if err != nil { // keys still trusted stay so; expired ones are not used (current)
			ks.failedAt, ks.failedErr = ks.now(), fmt.Errorf("%w: %v", errKeysUnavailable, err)
			return nil, ks.failedErr
		}
		ks.keys, ks.trusted, ks.failedErr = keys, ks.now().Add(age), nil
		return keys, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.([]jose.JSONWebKey), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// get fetches the key set once: a 200 with a JSON Web Key Set, and how long
// to trust it.
func (ks *keySet) get(ctx context.Context) ([]jose.JSONWebKey, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ks.jwksURI, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := ks.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("%s answered %s", ks.jwksURI, resp.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJWKSBytes)).Decode(&set); err != nil {
		return nil, 0, fmt.Errorf("%s: not a JSON Web Key Set: %v", ks.jwksURI, err)
	}
	return set.Keys, keyAge(resp.Header), nil
}

// keyAge is how long a fetched key set is trusted: Cache-Control's max-age
// clamped to [minKeyAge, maxKeyAge] (no-store and no-cache: minKeyAge),
// else defaultKeyAge.
func keyAge(h http.Header) time.Duration {
	age := defaultKeyAge
	for _, directive := range strings.Split(h.Get("Cache-Control"), ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(directive), "=")
		switch strings.ToLower(name) {
		case "no-store", "no-cache":
			return minKeyAge
		case "max-age":
			if n, err := strconv.ParseInt(strings.Trim(value, `"`), 10, 64); err == nil && n >= 0 {
				age = time.Duration(min(n, int64(maxKeyAge/time.Second))) * time.Second
			}
		}
	}
	return min(max(age, minKeyAge), maxKeyAge)
}

// keySetClient fetches key sets: bounded in time, and never following a
// redirect (a redirect could lead past the https-or-loopback rule the
// jwks_uri was checked against); a redirect is a failed fetch.
func keySetClient() *http.Client {
	return &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
