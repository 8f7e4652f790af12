package handlers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ory/fosite"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/store/memory"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/oauth"
)

// Every limiter key has one small size, whatever a request sends.
func TestLimitKeyBounded(t *testing.T) {
	short, long := limitKey("client", "sa_x"), limitKey("client", strings.Repeat("x", 1<<20))
	if len(short) != len(long) || len(long) > 40 {
		t.Fatalf("key sizes %d and %d, want one size of at most 40", len(short), len(long))
	}
	if limitKey("client", "a") == limitKey("client", "b") || limitKey("client", "a") == limitKey("ip", "a") {
		t.Fatal("distinct ids share a key")
	}
}

// keySizes is the real memory store, recording the largest key it was asked
// to keep.
type keySizes struct {
	limiter.Store
	mu  sync.Mutex
	max int
}

func (k *keySizes) note(key string) {
	k.mu.Lock()
	k.max = max(k.max, len(key))
	k.mu.Unlock()
}

func (k *keySizes) Get(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	k.note(key)
	return k.Store.Get(ctx, key, rate)
}

func (k *keySizes) Peek(ctx context.Context, key string, rate limiter.Rate) (limiter.Context, error) {
	k.note(key)
	return k.Store.Peek(ctx, key, rate)
}

// Token, introspection and API requests with megabyte client ids and tokens
// leave only small keys in the limiter's store (they once kept the ids).
func TestLimiterKeysStaySmall(t *testing.T) {
	store, provider := testProvider(t)
	sizes := &keySizes{Store: memory.NewStore()}
	a := testAPI()
	router := New(Options{Provider: provider, Agents: agents.New(store, provider.Hasher), ServiceAccounts: serviceaccounts.New(store, provider.Hasher),
		Health: store.Health, Logger: a.log, Metrics: a.metrics, RateLimits: DefaultRateLimits(), LimitStore: sizes})
	huge := strings.Repeat("x", 1<<20-100)
	for _, req := range []*http.Request{
		form(oauth.TokenPath, url.Values{"grant_type": {"client_credentials"}, "client_id": {huge}, "client_secret": {"s"}}),
		form(oauth.IntrospectPath, url.Values{"token": {"t"}, "client_id": {huge}, "client_secret": {"s"}}),
		form(oauth.RevokePath, url.Values{"token": {"t"}, "client_id": {huge}, "client_secret": {"s"}}),
		withBasic(form(oauth.TokenPath, url.Values{"grant_type": {"client_credentials"}}), huge),
		bearerRequest("/api/v1/m2m/whoami", huge),
	} {
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("%s: %d %s", req.URL.Path, rec.Code, rec.Body)
		}
	}
	if sizes.max == 0 || sizes.max > 100 {
		t.Fatalf("largest limiter key %d bytes, want a small bounded key", sizes.max)
	}
}

func form(path string, v url.Values) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(v.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return req
}

func withBasic(req *http.Request, id string) *http.Request {
	req.SetBasicAuth(id, "s")
	return req
}

func bearerRequest(path, token string) *http.Request {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	return req
}

func TestAddressKey(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.7:1234":                 "192.0.2.7",
		"[::ffff:192.0.2.7]:1234":        "192.0.2.7",
		"[2001:db8:1:2:3:4:5:6]:443":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443":     "2001:db8:1:2::/64",
		"[fe80::1%eth0]:80":              "fe80::/64",
		"not an address":                 "not an address",
		"[2001:db8:1:3:3:4:5:6]:443":     "2001:db8:1:3::/64",
		"[2001:db8:1:2:3:4:5:6%eth1]:80": "2001:db8:1:2::/64",
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = addr
		if got := addressKey(req); got != want {
			t.Errorf("addressKey(%q) = %q, want %q", addr, got, want)
		}
	}
}

// The failure budget: an address that has spent it is refused; a claimed
// client that has spent it is refused to addresses that failed, not to
// others; an address-only limit ignores claims; a nil limit (limits off)
// admits everything.
func TestFailureLimit(t *testing.T) {
	a := testAPI()
	a.limitStore = memory.NewStore()
	f := a.newFailureLimit("test", Rate{Period: time.Minute, Limit: 3}, claimedClientID)
	from := func(ip, claimed string) *http.Request {
		req := form("/", url.Values{"client_id": {claimed}})
		req.RemoteAddr = ip + ":1000"
		if err := req.ParseForm(); err != nil {
			t.Fatal(err)
		}
		return req
	}
	refusedBy := func(f *failureLimit, ip, claimed string) bool {
		rec := httptest.NewRecorder()
		r := f.refused(rec, from(ip, claimed), writeOAuthRateLimited)
		if r && (rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "") {
			t.Fatalf("refusal %d %v", rec.Code, rec.Header())
		}
		return r
	}
	refused := func(ip, claimed string) bool { return refusedBy(f, ip, claimed) }
	for range 3 {
		if refused("192.0.2.1", "victim") {
			t.Fatal("refused within the budget")
		}
		f.failed(from("192.0.2.1", "victim"))
	}
	if !refused("192.0.2.1", "victim") || !refused("192.0.2.1", "") || !refused("192.0.2.1", "someone-else") {
		t.Fatal("a spent address is admitted")
	}
	// The victim's budget is spent too: a fresh address may try (and be
	// the real client), an address that failed may not.
	if refused("192.0.2.2", "victim") {
		t.Fatal("a fresh address is refused for a spent claimed client")
	}
	f.failed(from("192.0.2.2", "another"))
	if !refused("192.0.2.2", "victim") {
		t.Fatal("an address that failed is admitted for a spent claimed client")
	}
	if refused("192.0.2.2", "another") {
		t.Fatal("a claimed client within its budget is refused")
	}
	byAddress := a.newFailureLimit("bearer", Rate{Period: time.Minute, Limit: 2}, nil)
	byAddress.failed(from("192.0.2.3", "victim"))
	byAddress.failed(from("192.0.2.3", "victim"))
	byAddress.failed(from("192.0.2.4", "other"))
	if !refusedBy(byAddress, "192.0.2.3", "") || refusedBy(byAddress, "192.0.2.4", "victim") {
		t.Fatal("an address-only limit counted the claimed client")
	}
	var off *failureLimit
	off.failed(from("192.0.2.1", "victim"))
	if refusedBy(off, "192.0.2.1", "victim") {
		t.Fatal("limits off refused")
	}
}

// error_description: fosite's descriptions and hints, which echo input,
// come out in RFC 6749 §5.2's characters, and the error stays what it was.
func TestOAuthErrorDescription(t *testing.T) {
	allowed := regexp.MustCompile(`^[\x20-\x21\x23-\x5B\x5D-\x7E]*$`)
	for _, err := range []error{
		fosite.ErrInvalidScope.WithHintf("The OAuth 2.0 Client is not allowed to request scope '%s'.", "a\"b\\c\nd\u00a7\u00e9\x7f"),
		fosite.ErrInvalidRequest.WithHint("tab\there").WithDebug("debug \u00a7"),
		fosite.ErrInvalidClient,
		oauthProblem("Parameter '\u00e9' is repeated"),
	} {
		got := oauthError(err)
		d := got.GetDescription()
		if !allowed.MatchString(d) || d == "" {
			t.Errorf("description %q", d)
		}
		if want := fosite.ErrorToRFC6749Error(err); got.ErrorField != want.ErrorField || got.CodeField != want.CodeField {
			t.Errorf("%v became %s %d", err, got.ErrorField, got.CodeField)
		}
	}
	if !strings.Contains(oauthError(fosite.ErrInvalidScope.WithHint("scope 'x'")).GetDescription(), "scope 'x'") {
		t.Error("the hint is lost")
	}
	rec := httptest.NewRecorder()
	writeOAuthError(rec, http.StatusBadRequest, "invalid_request", "Parameter 'a\"\n\u00a7' is repeated")
	if strings.ContainsAny(rec.Body.String(), "\u00a7") || strings.Contains(rec.Body.String(), `\n`) || strings.Contains(rec.Body.String(), `a\"`) {
		t.Errorf("writeOAuthError wrote %s", rec.Body)
	}
}

func TestDropEmpty(t *testing.T) {
	v := url.Values{"a": {""}, "b": {"", "x", ""}, "c": {"y"}}
	dropEmpty(v)
	if v.Encode() != "b=x&c=y" {
		t.Fatalf("got %v", v)
	}
}
