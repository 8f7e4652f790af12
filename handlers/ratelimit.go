package handlers

import (
	"crypto/sha256"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions/agents"
)

// Rate is one limit: so many requests per period.
type Rate = limiter.Rate

// RateLimits are the limits identityd enforces, each counted per client (or
// per IP address where no client is known). See docs/decisions.md.
type RateLimits struct {
	Token        Rate // POST /oauth/token, per authenticated client
	Introspect   Rate // introspection and revocation, per authenticated client
	AuthFailures Rate // failed authentications: per address, and per claimed client at the OAuth endpoints
	M2MRead      Rate // GET /m2m/*
	M2MWrite     Rate // POST and PATCH /m2m/*
	M2MDelete    Rate // DELETE /m2m/*
	Admin        Rate // every other authenticated /api/v1 route
	Public       Rate // unauthenticated invite status and links, per address
	SignIn       Rate // the hosted sign-in forms, per address
	SignInEmail  Rate // failed sign-ins per e-mail address (see failureLimit)
	Send         Rate // e-mailed codes and links sent, per address
	SendEmail    Rate // e-mailed codes and links sent, per e-mail address (see failureLimit)
	Embedded     Rate // the embedded sign-in API, per address

	ResetRequest      Rate // forgot-password requests, per address
	ResetRequestEmail Rate // forgot-password requests, per e-mail address (see failureLimit)
	ResetToken        Rate // reset token checks (verify, reset, the reset page), per address
	Link              Rate // account linking's initiates and verifications, per address
	LinkEmail         Rate // account linking's initiates, per e-mail address (see failureLimit)
	Passkey           Rate // the passkey routes, per address
	PasskeyUser       Rate // a person's passkey routes (register, list, rename, delete), per person
	Backchannel       Rate // CIBA backchannel requests, per authenticated agent
	BackchannelPerson Rate // CIBA backchannel requests, per agent and person asked (login_hint)
}

// DefaultRateLimits are the spec's limits, and ours where it names none.
func DefaultRateLimits() RateLimits {
	perMin := func(n int64) Rate { return Rate{Period: time.Minute, Limit: n} }
	return RateLimits{
		Token: perMin(30), Introspect: perMin(6000), AuthFailures: perMin(30),
		M2MRead: perMin(100), M2MWrite: perMin(30), M2MDelete: perMin(10),
		Admin: perMin(600), Public: perMin(60),
		SignIn: perMin(20), SignInEmail: Rate{Period: 15 * time.Minute, Limit: 5},
		Send: Rate{Period: 15 * time.Minute, Limit: 10}, SendEmail: Rate{Period: time.Hour, Limit: 5}, Embedded: perMin(20),
		ResetRequest: Rate{Period: time.Hour, Limit: 10}, ResetRequestEmail: Rate{Period: time.Hour, Limit: 3},
		ResetToken: Rate{Period: 15 * time.Minute, Limit: 30},
		Link:       Rate{Period: 15 * time.Minute, Limit: 10}, LinkEmail: Rate{Period: time.Hour, Limit: 5},
		Passkey: perMin(30), PasskeyUser: perMin(20),
		Backchannel: perMin(30), BackchannelPerson: Rate{Period: time.Hour, Limit: 10},
	}
}

// limited guards a handler with one limit. The key is what key returns for
// the request; the class keeps each limit's counters apart in a shared store.
// Every limited response carries X-RateLimit-Limit, -Remaining and -Reset
// (Unix time in seconds when the window ends); a refused one also carries
// Retry-After (seconds).
func (a *api) limited(class string, rate Rate, key func(*http.Request) string, next http.HandlerFunc) http.HandlerFunc {
	if a.limitStore == nil {
		return next
	}
	l := limiter.New(a.limitStore, rate)
	// Sandboxed agents get a fifth of every limit (spec: sandboxed agents
	// are rate-limited), counted apart.
	strict := limiter.New(a.limitStore, Rate{Period: rate.Period, Limit: max(rate.Limit/5, 1)})
	return func(w http.ResponseWriter, r *http.Request) {
		lim, k := l, class+":"+key(r)
		if p := principalFrom(r.Context()); p != nil && p.Agent != nil && p.Agent.TrustLevel == agents.Sandboxed {
			lim, k = strict, k+":sandboxed"
		}
		c, err := lim.Get(r.Context(), k)
		if err != nil {
			logger(r).WarnContext(r.Context(), "rate limiter unavailable", "error", err.Error())
		}
		if a.withTier(w, r, c, err == nil) {
			next(w, r)
		}
	}
}

// count adds the request to key's counter and sets the X-RateLimit headers.
// It answers 429 through refuse, with Retry-After, and returns false when
// the limit is reached. A limiter that cannot count (Redis down) must not
// take the server down with it: the request is served, and the log says so.
func count(w http.ResponseWriter, r *http.Request, l *limiter.Limiter, key string, refuse func(http.ResponseWriter, *http.Request, limiter.Context)) bool {
	c, err := l.Get(r.Context(), key)
	if err != nil {
		logger(r).WarnContext(r.Context(), "rate limiter unavailable", "error", err.Error())
		return true
	}
	setRateHeaders(w, c)
	if c.Reached {
		refuse(w, r, c)
		return false
	}
	return true
}

func setRateHeaders(w http.ResponseWriter, c limiter.Context) {
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.FormatInt(c.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(c.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(c.Reset, 10))
}

// retryAfter sets Retry-After (seconds until the window ends, at least 1).
func retryAfter(w http.ResponseWriter, c limiter.Context) int64 {
	retry := max(c.Reset-time.Now().Unix(), 1)
	w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
	return retry
}

// writeRateLimited is the API's 429: the spec's envelope.
func writeRateLimited(w http.ResponseWriter, r *http.Request, c limiter.Context) {
	retry := retryAfter(w, c)
	writeError(w, r, newError(http.StatusTooManyRequests, "rate_limited", "Too many requests; retry later.",
		map[string]any{"limit": c.Limit, "retryAfter": retry}))
}

// writeOAuthRateLimited is the OAuth endpoints' 429: an RFC 6749 error with
// the code the spec gives rate limits.
func writeOAuthRateLimited(w http.ResponseWriter, _ *http.Request, c limiter.Context) {
	retryAfter(w, c)
	writeOAuthError(w, http.StatusTooManyRequests, "rate_limited", "Too many requests; retry later.")
}

// Failed authentications are limited so that guessing costs the guesser,
// not the client guessed at (docs/decisions.md, "Rate limits"):
//
//   - every failure counts against its address and, at the OAuth endpoints,
//     against the client it claimed to be, in a budget of their own;
//   - an address that has spent its budget is refused outright;
//   - a claimed client whose budget is spent is refused only to addresses
//     that have failed in the window, so the real client, authenticating
//     from elsewhere, goes on;
//   - the requests of an authenticated client count against the endpoint's
//     own limit (clientLimit), never a guesser's.
type failureLimit struct {
	l       *limiter.Limiter // failures per address
	claims  *limiter.Limiter // failures per claimed identity; nil: l
	class   string
	claimed func(*http.Request) string // the client a request claims to be; nil: addresses only
}

// newFailureLimit is nil when rate limits are off; a nil limit admits all.
func (a *api) newFailureLimit(class string, rate Rate, claimed func(*http.Request) string) *failureLimit {
	if a.limitStore == nil {
		return nil
	}
	return &failureLimit{l: limiter.New(a.limitStore, rate), class: class, claimed: claimed}
}

// claimedBy is the client id r claims, "" for none or when f counts
// addresses only.
func (f *failureLimit) claimedBy(r *http.Request) string {
	if f.claimed == nil {
		return ""
	}
	return f.claimed(r)
}

// refused answers 429 (through refuse) before any work when the request's
// address, or the client it claims from an address that has failed, has
// spent its failure budget.
func (f *failureLimit) refused(w http.ResponseWriter, r *http.Request, refuse func(http.ResponseWriter, *http.Request, limiter.Context)) bool {
	if f == nil {
		return false
	}
	return f.refusedAs(w, r, f.claimedBy(r), refuse)
}

// refusedAs is refused for a request claiming the identity claimed ("" for
// none), such as the e-mail address of a sign-in.
func (f *failureLimit) refusedAs(w http.ResponseWriter, r *http.Request, claimed string, refuse func(http.ResponseWriter, *http.Request, limiter.Context)) bool {
	if f == nil {
		return false
	}
	addr, err := f.l.Peek(r.Context(), f.key("ip", addressKey(r)))
	if err != nil {
		logger(r).WarnContext(r.Context(), "rate limiter unavailable", "error", err.Error())
		return false
	}
	if spent(addr) {
		setRateHeaders(w, addr)
		refuse(w, r, addr)
		return true
	}
	if claimed == "" || addr.Remaining == addr.Limit { // this address has not failed
		return false
	}
	client, err := f.claimLimiter().Peek(r.Context(), f.key("client", claimed))
	if err == nil && spent(client) {
		setRateHeaders(w, client)
		refuse(w, r, client)
		return true
	}
	return false
}

// failed counts a failed authentication against the address and the
// claimed client (if any).
func (f *failureLimit) failed(r *http.Request) {
	if f == nil {
		return
	}
	f.failedAs(r, f.claimedBy(r))
}

// failedAs is failed for a request claiming the identity claimed.
func (f *failureLimit) failedAs(r *http.Request, claimed string) {
	if f == nil {
		return
	}
	ctx := r.Context()
	_, err := f.l.Get(ctx, f.key("ip", addressKey(r)))
	if err == nil && claimed != "" {
		_, err = f.claimLimiter().Get(ctx, f.key("client", claimed))
	}
	if err != nil {
		logger(r).WarnContext(ctx, "rate limiter unavailable", "error", err.Error())
	}
}

func (f *failureLimit) claimLimiter() *limiter.Limiter {
	if f.claims != nil {
		return f.claims
	}
	return f.l
}

func (f *failureLimit) key(kind, id string) string { return f.class + ":" + limitKey(kind, id) }

// spent tells whether a peeked counter has no request left in its window.
func spent(c limiter.Context) bool { return c.Remaining == 0 }

// clientLimit counts the requests of authenticated clients at an OAuth
// endpoint; nil when rate limits are off.
type clientLimit struct {
	l     *limiter.Limiter
	class string
}

func (a *api) newClientLimit(class string, rate Rate) *clientLimit {
	if a.limitStore == nil {
		return nil
	}
	return &clientLimit{l: limiter.New(a.limitStore, rate), class: class}
}

// admit counts a request of the authenticated client clientID; when its
// limit is reached it answers 429 and returns false.
func (c *clientLimit) admit(w http.ResponseWriter, r *http.Request, clientID string) bool {
	if c == nil {
		return true
	}
	return count(w, r, c.l, c.class+":"+limitKey("client", clientID), writeOAuthRateLimited)
}

// limitKey is the counter key of an id: the id's kind and a hash of it, so
// that every key has the same small size whatever a request sends (a
// claimed client id is attacker input of up to a megabyte). 128 bits of
// SHA-256 keep distinct ids apart; replicas sharing Redis derive the same key.
func limitKey(kind, id string) string {
	sum := sha256.Sum256([]byte(id))
	return kind + ":" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// emailKey is the counter key of an e-mail address, however it was typed.
func emailKey(email string) string {
	return limitKey("email", strings.ToLower(strings.TrimSpace(email)))
}

// byPrincipal keys a limit on the authenticated client.
func byPrincipal(r *http.Request) string {
	if p := principalFrom(r.Context()); p != nil {
		return limitKey("client", p.ClientID())
	}
	return byIP(r)
}

// byIP keys a limit on the peer address.
func byIP(r *http.Request) string { return limitKey("ip", addressKey(r)) }

// addressKey is the address a request counts against: the peer's IPv4
// address, or the /64 network of an IPv6 peer (one host commonly holds a
// whole /64, so single IPv6 addresses cost an attacker nothing).
func addressKey(r *http.Request) string {
	ip, err := netip.ParseAddr(clientIP(r))
	if err != nil {
		return clientIP(r)
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// clientIP is the peer address of the request; no forwarding header is
// trusted.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// claimedClientID is the client an OAuth request names (HTTP Basic user,
// RFC 6749 §2.3.1 form-decoded, or client_id), before it is authenticated;
// the form is parsed by then.
func claimedClientID(r *http.Request) string {
	if id, _, ok := r.BasicAuth(); ok && id != "" {
		if unescaped, err := url.QueryUnescape(id); err == nil {
			return unescaped
		}
		return id
	}
	return r.PostForm.Get("client_id")
}
