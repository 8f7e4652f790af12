package handlers

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions/agents"
)

// Rate is one limit: so many requests per period.
type Rate = limiter.Rate

// RateLimits are the limits identityd enforces, each counted per client (or
// per IP address where no client is known). See docs/decisions.md.
type RateLimits struct {
	Token      Rate // POST /oauth/token, per client_id claimed
	Introspect Rate // introspection and revocation, per client
	M2MRead    Rate // GET /m2m/*
	M2MWrite   Rate // POST and PATCH /m2m/*
	M2MDelete  Rate // DELETE /m2m/*
	Admin      Rate // every other authenticated /api/v1 route
	Public     Rate // unauthenticated invite status and links, per address
}

// DefaultRateLimits are the spec's limits, and ours where it names none.
func DefaultRateLimits() RateLimits {
	perMin := func(n int64) Rate { return Rate{Period: time.Minute, Limit: n} }
	return RateLimits{
		Token: perMin(30), Introspect: perMin(6000),
		M2MRead: perMin(100), M2MWrite: perMin(30), M2MDelete: perMin(10),
		Admin: perMin(600), Public: perMin(60),
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
			// A limiter that cannot count (Redis down) must not take the
			// server down with it: serve, and say so in the log.
			logger(r).WarnContext(r.Context(), "rate limiter unavailable", "error", err.Error())
			next(w, r)
			return
		}
		h := w.Header()
		h.Set("X-RateLimit-Limit", strconv.FormatInt(c.Limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(c.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(c.Reset, 10))
		if c.Reached {
			retry := max(c.Reset-time.Now().Unix(), 1)
			h.Set("Retry-After", strconv.FormatInt(retry, 10))
			writeError(w, r, newError(http.StatusTooManyRequests, "rate_limited", "Too many requests; retry later.",
				map[string]any{"limit": c.Limit, "retryAfter": retry}))
			return
		}
		next(w, r)
	}
}

// byPrincipal keys a limit on the authenticated client.
func byPrincipal(r *http.Request) string {
	if p := principalFrom(r.Context()); p != nil {
		return "client:" + p.ClientID()
	}
	return byIP(r)
}

// byIP keys a limit on the peer address.
func byIP(r *http.Request) string { return "ip:" + clientIP(r) }

// clientIP is the peer address of the request; no forwarding header is
// trusted.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// claimedClientID is the client a token-endpoint request names (HTTP Basic
// user, RFC 6749 §2.3.1 form-decoded, or client_id), before it is
// authenticated; the form is parsed by then.
func claimedClientID(r *http.Request) string {
	if id, _, ok := r.BasicAuth(); ok && id != "" {
		if unescaped, err := url.QueryUnescape(id); err == nil {
			return unescaped
		}
		return id
	}
	return r.PostForm.Get("client_id")
}

// byClaimedClient keys a limit on the client a request names, else its IP.
func byClaimedClient(r *http.Request) string {
	if id := claimedClientID(r); id != "" {
		return "client:" + id
	}
	return byIP(r)
}
