package handlers

import (
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Usage tiers (issue 18; spec "Limits"): every API request of a service
// account counts against its tier's requests per minute and per UTC day,
// in the rate-limit store (Redis-shared when configured), on top of the
// route's own limit. Admin tokens are exempt; agents and people have no
// tier. See docs/decisions.md.

// tierLimit is one tier's two counters.
type tierLimit struct {
	tier   usage.Tier
	minute *limiter.Limiter
	day    *limiter.Limiter
}

// newTierLimits is nil when rate limits are off.
func (a *api) newTierLimits(tiers []usage.Tier) map[string]*tierLimit {
	if a.limitStore == nil {
		return nil
	}
	out := map[string]*tierLimit{}
	for _, t := range tiers {
		out[t.Name] = &tierLimit{tier: t,
			minute: limiter.New(a.limitStore, Rate{Period: time.Minute, Limit: t.PerMinute}),
			// A day's counter is keyed by its date: it starts at 00:00 UTC
			// whenever the first request comes, and expires within a day.
			day: limiter.New(a.limitStore, Rate{Period: 24 * time.Hour, Limit: t.PerDay})}
	}
	return out
}

// tierOf is the tier that bounds the request's principal; nil for none.
func (a *api) tierOf(p *oauth.Principal) *tierLimit {
	if a.tiers == nil || p == nil || p.Client.Kind != persistence.KindServiceAccount || p.HasScope(oauth.ScopeAdmin) {
		return nil
	}
	if t := a.tiers[p.Client.Tier]; t != nil {
		return t
	}
	return a.tiers[usage.DefaultTier]
}

// tierKeys are an account's counter keys at now: the minute's, and the
// UTC day's.
func tierKeys(clientID string, now time.Time) (minute, day string) {
	k := limitKey("client", clientID)
	return "tier-minute:" + k, "tier-day:" + k + ":" + usage.Day(now).Format(time.DateOnly)
}

// count adds the request to the tier's minute and, unless the minute is
// spent, to its day (a request refused for the minute does not use up the
// day). The day's Reset is the next 00:00 UTC.
func (t *tierLimit) count(r *http.Request, clientID string) ([]limiter.Context, error) {
	now := time.Now()
	mk, dk := tierKeys(clientID, now)
	m, err := t.minute.Get(r.Context(), mk)
	if err != nil {
		return nil, err
	}
	var d limiter.Context
	if m.Reached {
		d, err = t.day.Peek(r.Context(), dk)
	} else {
		d, err = t.day.Get(r.Context(), dk)
	}
	if err != nil {
		return nil, err
	}
	d.Reset = usage.NextDay(now).Unix()
	return []limiter.Context{m, d}, nil
}

// withTier decides a request given its route's counter (have: the counter
// could be read): a reached route limit refuses it; else the principal's
// tier is counted, and the headers are those of the tightest counter (the
// one reached, else the one with fewest requests left). Counters that
// cannot be read (Redis down) are skipped, as count does.
func (a *api) withTier(w http.ResponseWriter, r *http.Request, class limiter.Context, have bool) bool {
	var cs []limiter.Context
	if have {
		if class.Reached {
			setRateHeaders(w, class)
			writeRateLimited(w, r, class)
			return false
		}
		cs = append(cs, class)
	}
	if p := principalFrom(r.Context()); p != nil {
		if t := a.tierOf(p); t != nil {
			tcs, err := t.count(r, p.ClientID())
			if err != nil {
				logger(r).WarnContext(r.Context(), "rate limiter unavailable", "error", err.Error())
			}
			cs = append(cs, tcs...)
		}
	}
	if len(cs) == 0 {
		return true
	}
	tight := cs[0]
	for _, c := range cs[1:] {
		if c.Reached && !tight.Reached || c.Reached == tight.Reached && c.Remaining < tight.Remaining {
			tight = c
		}
	}
	setRateHeaders(w, tight)
	if tight.Reached {
		writeRateLimited(w, r, tight)
		return false
	}
	return true
}

// tierLimited guards a route by the tier alone (API-key validation).
func (a *api) tierLimited(next http.HandlerFunc) http.HandlerFunc {
	if a.tiers == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if a.withTier(w, r, limiter.Context{}, false) {
			next(w, r)
		}
	}
}

// POST /api/v1/service-accounts/{id}/limits/reset (admin): the account's
// tier counters start again, this minute's and today's: an operator's
// relief for a customer who ran out (and how a test sees a daily limit
// reset without waiting for midnight). The usage report is history and is
// not changed.
func (a *api) resetServiceAccountLimits(w http.ResponseWriter, r *http.Request) {
	sa, err := a.serviceAccounts.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	if t := a.tiers[sa.Tier]; t != nil {
		mk, dk := tierKeys(sa.ClientID, time.Now())
		if _, err := t.minute.Reset(r.Context(), mk); err == nil {
			_, err = t.day.Reset(r.Context(), dk)
		}
		if err != nil {
			writeError(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"serviceAccountId": sa.ID, "tier": a.tierOfAccount(sa)})
}

// tierOfAccount is the tier an account is on, with its numbers.
func (a *api) tierOfAccount(sa *persistence.ServiceAccount) usage.Tier {
	for _, t := range a.tierList {
		if t.Name == sa.Tier {
			return t
		}
	}
	return usage.Tier{Name: sa.Tier}
}
