// Package usage counts the requests of service accounts (and the API-key
// validations of applications) per minute and per UTC day, and holds the
// tiers that bound them (issue 18; spec "Limits"). Counting costs the hot
// path one map increment under a mutex: counts are flushed in batches, as
// upserts that add, so replicas' counts sum in the database by
// construction. No HTTP here (handlers/usage.go enforces and reports).
package usage

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Tier names.
const (
	Free       = "free"
	Startup    = "startup"
	Enterprise = "enterprise"
)

// Tier is what a service account may do: requests per minute and per UTC
// day.
type Tier struct {
	Name      string `json:"name"`
	PerMinute int64  `json:"perMinute"`
	PerDay    int64  `json:"perDay"`
}

// Tiers are the spec's numbers (Limits), in order.
func Tiers() []Tier {
	return []Tier{
		{Free, 60, 1_000},
		{Startup, 600, 50_000},
		{Enterprise, 10_000, 5_000_000},
	}
}

// DefaultTier is a new account's tier (persistence.DefaultTier).
const DefaultTier = persistence.DefaultTier

// Known tells whether name is a tier.
func Known(name string) bool {
	for _, t := range Tiers() {
		if t.Name == name {
			return true
		}
	}
	return false
}

// ParseTiers reads IDENTITYD_TIER_LIMITS, "name=perMinute/perDay" items
// separated by commas, over the spec's numbers: an operator's plans may
// differ from the spec's (and a test reaches a daily limit without waiting
// for a minute limit to let it). "" is the spec's.
func ParseTiers(s string) ([]Tier, error) {
	tiers := Tiers()
	if strings.TrimSpace(s) == "" {
		return tiers, nil
	}
	for _, item := range strings.Split(s, ",") {
		name, nums, ok := strings.Cut(strings.TrimSpace(item), "=")
		perMin, perDay, ok2 := strings.Cut(nums, "/")
		m, err1 := strconv.ParseInt(perMin, 10, 64)
		d, err2 := strconv.ParseInt(perDay, 10, 64)
		if !ok || !ok2 || err1 != nil || err2 != nil || m < 1 || d < 1 {
			return nil, fmt.Errorf("%q: want name=perMinute/perDay with positive whole numbers", item)
		}
		i := slices.IndexFunc(tiers, func(t Tier) bool { return t.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("%q: unknown tier (free, startup, enterprise)", name)
		}
		tiers[i].PerMinute, tiers[i].PerDay = m, d
	}
	return tiers, nil
}

// Day is the UTC calendar day holding t: a day's limit resets at 00:00 UTC,
// the same day the usage report and analytics count in.
func Day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// NextDay is when the day holding t ends.
func NextDay(t time.Time) time.Time { return Day(t).AddDate(0, 0, 1) }

// Store is the storage this package needs.
type Store interface {
	AddUsage(ctx context.Context, counts []persistence.UsageCount) error
	UsageSeries(ctx context.Context, kind, id, granularity string, from, to time.Time) ([]persistence.UsageCount, error)
	DeleteUsageBefore(ctx context.Context, granularity string, t time.Time) (int64, error)
}

// Retention of the counts: minute rows for three days, day rows for two
// years.
const (
	MinuteRetention = 72 * time.Hour
	DayRetention    = 2 * 366 * 24 * time.Hour
)

// FlushInterval is how often counts reach the database, and so how far a
// usage report may lag this replica's requests.
const FlushInterval = 2 * time.Second

type counterKey struct {
	kind, id string
	minute   int64 // Unix minute
}

// Counter counts requests in memory until Flush.
type Counter struct {
	store Store
	now   func() time.Time

	mu     sync.Mutex
	counts map[counterKey]int64
}

// NewCounter returns a counter writing to store.
func NewCounter(store Store) *Counter {
	return &Counter{store: store, now: time.Now, counts: map[counterKey]int64{}}
}

// Add counts one request of a subject (persistence.UsageServiceAccount or
// UsageApplication) now.
func (c *Counter) Add(kind, id string) {
	if c == nil {
		return
	}
	k := counterKey{kind, id, c.now().Unix() / 60}
	c.mu.Lock()
	c.counts[k]++
	c.mu.Unlock()
}

// Flush writes what was counted since the last flush, minute and day rows
// in one transaction. If the write fails, the counts are kept for the next
// flush: nothing counted is lost while the database is away (within memory).
func (c *Counter) Flush(ctx context.Context) error {
	c.mu.Lock()
	taken := c.counts
	c.counts = map[counterKey]int64{}
	c.mu.Unlock()
	if len(taken) == 0 {
		return nil
	}
	if err := c.store.AddUsage(ctx, rows(taken)); err != nil {
		c.mu.Lock()
		for k, n := range taken {
			c.counts[k] += n
		}
		c.mu.Unlock()
		return err
	}
	return nil
}

// rows turns minute counts into minute and day rows, in a stable order
// (concurrent flushes of replicas then take row locks in the same order).
func rows(counts map[counterKey]int64) []persistence.UsageCount {
	type dayKey struct {
		kind, id string
		day      int64
	}
	days := map[dayKey]int64{}
	out := make([]persistence.UsageCount, 0, len(counts)+len(counts)/4)
	for k, n := range counts {
		at := time.Unix(k.minute*60, 0).UTC()
		out = append(out, persistence.UsageCount{SubjectKind: k.kind, SubjectID: k.id, Granularity: persistence.UsageMinute, Bucket: at, Count: n})
		days[dayKey{k.kind, k.id, Day(at).Unix()}] += n
	}
	for k, n := range days {
		out = append(out, persistence.UsageCount{SubjectKind: k.kind, SubjectID: k.id, Granularity: persistence.UsageDay, Bucket: time.Unix(k.day, 0).UTC(), Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.SubjectKind != b.SubjectKind {
			return a.SubjectKind < b.SubjectKind
		}
		if a.SubjectID != b.SubjectID {
			return a.SubjectID < b.SubjectID
		}
		if a.Granularity != b.Granularity {
			return a.Granularity < b.Granularity
		}
		return a.Bucket.Before(b.Bucket)
	})
	return out
}

// Run flushes every FlushInterval, sweeps old rows hourly, and flushes one
// last time when ctx ends (shutdown), before the store closes.
func (c *Counter) Run(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(FlushInterval)
	defer t.Stop()
	lastSweep := time.Time{}
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := c.Flush(final); err != nil {
				log.Error("usage counts lost at shutdown", "error", err.Error())
			}
			cancel()
			return
		case now := <-t.C:
			if err := c.Flush(ctx); err != nil && ctx.Err() == nil {
				log.Warn("flushing usage counts failed; kept for the next flush", "error", err.Error())
			}
			if now.Sub(lastSweep) >= time.Hour {
				lastSweep = now
				c.sweep(ctx, now, log)
			}
		}
	}
}

func (c *Counter) sweep(ctx context.Context, now time.Time, log *slog.Logger) {
	if _, err := c.store.DeleteUsageBefore(ctx, persistence.UsageMinute, now.Add(-MinuteRetention)); err != nil && ctx.Err() == nil {
		log.Warn("sweeping minute usage counts failed", "error", err.Error())
	}
	if _, err := c.store.DeleteUsageBefore(ctx, persistence.UsageDay, Day(now.Add(-DayRetention))); err != nil && ctx.Err() == nil {
		log.Warn("sweeping daily usage counts failed", "error", err.Error())
	}
}

// Query is a usage report's window.
type Query struct {
	Kind, ID    string
	Granularity string    // persistence.UsageMinute or UsageDay
	From, To    time.Time // buckets in [From, To)
}

// Bounds of a report: a day of minutes, or two years of days.
const (
	MaxMinutes = 24 * 60
	MaxDays    = 2 * 366
)

// Point is one bucket of a series.
type Point struct {
	Start    time.Time
	Requests int64
}

// Report is a subject's series over a window, every bucket present, and
// the total.
type Report struct {
	Series []Point
	Total  int64
}

// Read answers a report, buckets without requests as zeros.
func Read(ctx context.Context, store Store, q Query) (*Report, error) {
	step := time.Minute
	if q.Granularity == persistence.UsageDay {
		step = 24 * time.Hour
	}
	n := int(q.To.Sub(q.From) / step)
	max := MaxMinutes
	if step != time.Minute {
		max = MaxDays
	}
	if n < 1 || n > max || !q.From.Equal(q.From.Truncate(step)) {
		return nil, extensions.NewError(400, "invalid_request", fmt.Sprintf("The window must hold 1 to %d whole %ss.", max, q.Granularity), nil)
	}
	counts, err := store.UsageSeries(ctx, q.Kind, q.ID, q.Granularity, q.From, q.To)
	if err != nil {
		return nil, err
	}
	byStart := make(map[int64]int64, len(counts))
	for _, c := range counts {
		byStart[c.Bucket.Unix()] += c.Count
	}
	r := &Report{Series: make([]Point, 0, n)}
	for i := range n {
		at := q.From.Add(time.Duration(i) * step).UTC()
		v := byStart[at.Unix()]
		r.Series = append(r.Series, Point{Start: at, Requests: v})
		r.Total += v
	}
	return r, nil
}

// Default windows: the last hour of minutes, the last 30 days.
const (
	DefaultMinutes = 60
	DefaultDays    = 30
)

// ParseWindow reads a report's granularity and window from query values:
// "day" (default) takes dates, YYYY-MM-DD, both included (the last 30 days
// by default); "minute" takes instants (RFC 3339) on whole minutes, from
// included and to excluded (the last 60 minutes, this one included, by
// default).
func ParseWindow(granularity, from, to string, now time.Time) (g string, start, end time.Time, err error) {
	var v extensions.ValidationError
	now = now.UTC()
	switch granularity {
	case "", persistence.UsageDay:
		g = persistence.UsageDay
		end, start = Day(now).AddDate(0, 0, 1), Day(now).AddDate(0, 0, 1-DefaultDays)
		if to != "" {
			t, err := time.Parse(time.DateOnly, to)
			if err != nil {
				v.Add("to", "must be a date, YYYY-MM-DD")
			}
			end = t.AddDate(0, 0, 1)
		}
		if from != "" {
			t, err := time.Parse(time.DateOnly, from)
			if err != nil {
				v.Add("from", "must be a date, YYYY-MM-DD")
			}
			start = t
		} else if to != "" {
			start = end.AddDate(0, 0, -DefaultDays)
		}
	case persistence.UsageMinute:
		g = persistence.UsageMinute
		end = now.Truncate(time.Minute).Add(time.Minute)
		start = end.Add(-DefaultMinutes * time.Minute)
		parse := func(field, s string, into *time.Time) {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil || !t.Equal(t.Truncate(time.Minute)) {
				v.Add(field, "must be an instant on a whole minute, RFC 3339 (2025-01-02T15:04:00Z)")
				return
			}
			*into = t.UTC()
		}
		if to != "" {
			parse("to", to, &end)
			if from == "" {
				start = end.Add(-DefaultMinutes * time.Minute)
			}
		}
		if from != "" {
			parse("from", from, &start)
		}
	default:
		v.Add("granularity", "must be minute or day")
	}
	if err := v.Err(); err != nil {
		return "", start, end, err
	}
	max, step := MaxDays, 24*time.Hour
	if g == persistence.UsageMinute {
		max, step = MaxMinutes, time.Minute
	}
	switch n := end.Sub(start) / step; {
	case n < 1:
		v.Add("from", "must be before to")
	case n > time.Duration(max):
		v.Add("from", "the window may hold at most %d %ss", max, g)
	}
	return g, start, end, v.Err()
}

// Report reads a report from the counter's store (what has been flushed,
// by every replica).
func (c *Counter) Report(ctx context.Context, q Query) (*Report, error) { return Read(ctx, c.store, q) }
