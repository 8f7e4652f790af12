// Package analytics is authentication analytics over the auth event log:
// a window's overview, the log itself searched and paged, and daily,
// weekly and monthly active people. Counting happens in persistence over
// indexes and daily rollups; the rules here are the shapes, the windows and
// the cursor.
package analytics

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Store is what analytics reads (persistence.Store).
type Store interface {
	ClosedSignIns(ctx context.Context, from, to persistence.Day, now time.Time) ([]persistence.SignInCount, error)
	OpenSignIns(ctx context.Context, from, to persistence.Day, now time.Time) ([]persistence.SignInCount, error)
	ActiveUsersClosed(ctx context.Context, from, to persistence.Day, now time.Time) (int64, error)
	ActiveUsersOpenHours(ctx context.Context, from, open persistence.Day, until persistence.Hour, now time.Time) (int64, error)
	ActiveUsersOpenTail(ctx context.Context, from, open persistence.Day, tail persistence.Hour, end time.Time) (int64, error)
	ActiveUserDays(ctx context.Context, from, to persistence.Day, now time.Time) ([]persistence.UserDay, error)
	NewUsers(ctx context.Context, from, to time.Time) (int64, error)
	SearchAuthEvents(ctx context.Context, f persistence.AuthEventFilter, limit int, after *persistence.AuthEventCursor) ([]persistence.AuthEvent, error)
}

// Windows are whole UTC days.
const (
	DefaultDays   = 30  // an overview's window when none is given
	MaxDays       = 366 // the longest overview window
	MaxSeriesDays = 92  // the longest active-users series (each day reads 30 days back)
	dateLayout    = "2006-01-02"
)

// FailureTypes are the event types whose outcome is a failure; every other
// type is a success (a sign-in, a session, a code sent...).
var FailureTypes = []string{
	persistence.EventSignInFailed, persistence.EventMFAVerifyFailed, persistence.EventMFAUnavailable, persistence.EventRefreshReuse,
	persistence.EventLinkFailed, persistence.EventResetFailed, persistence.EventPasskeyRegisterFailed, persistence.EventPasskeyCloned,
}

// KnownTypes are the event types the log holds, for the type filter.
var KnownTypes = append([]string{
	persistence.EventSignIn, persistence.EventSessionStarted, persistence.EventSessionEnded, persistence.EventTokenRefreshed,
	persistence.EventLogout, persistence.EventCodeSent, persistence.EventLinkSent, persistence.EventUserSignedUp,
	persistence.EventMFAEnabled, persistence.EventMFADisabled, persistence.EventMFARecoveryCodeUsed,
	persistence.EventLinkStarted, persistence.EventIdentityLinked, persistence.EventIdentityUnlinked,
	persistence.EventResetRequested, persistence.EventResetCompleted, persistence.EventRiskTriggered,
}, FailureTypes...)

// amrMethods names the sign-in methods of the RFC 8176 values a sign_in
// event records (its session's first amr) as failed sign-ins name them.
var amrMethods = map[string]string{"pwd": "password", "email": "magic-link", "hwk": "passkey", "swk": "passkey", "fed": "upstream"}

// MethodName is the method a sign-in or failed sign-in event's data names,
// as the overview reports it: password, otp, magic-link, passkey,
// upstream, or "" when the event names none.
func MethodName(m string) string {
	if n, ok := amrMethods[m]; ok {
		return n
	}
	return m
}

// Service answers the analytics routes.
type Service struct {
	store Store
	now   func() time.Time

	mu   sync.Mutex
	memo map[memoKey]any // answers about closed days and hours: they never change
}

// memoKey names one remembered answer: what (a kind) over which periods.
type memoKey struct {
	kind    string
	a, b, c int64
}

// remembered answers the memo's value for k, or computes and keeps it.
func remembered[T any](s *Service, k memoKey, compute func() (T, error)) (T, error) {
	s.mu.Lock()
	v, ok := s.memo[k]
	s.mu.Unlock()
	if ok {
		return v.(T), nil
	}
	out, err := compute()
	if err != nil {
		return out, err
	}
	s.mu.Lock()
	if len(s.memo) >= maxMemo {
		clear(s.memo)
	}
	s.memo[k] = out
	s.mu.Unlock()
	return out, nil
}

// New returns the service.
func New(store Store) *Service {
	return &Service{store: store, now: extensions.Now, memo: map[memoKey]any{}}
}

// At is the service reading the log as of the instants now answers
// instead of the clock's (benchmarks measure the end of a day with it).
func (s *Service) At(now func() time.Time) *Service {
	return &Service{store: s.store, now: now, memo: map[memoKey]any{}}
}

// maxMemo bounds the remembered closed ranges (a dashboard asks a few).
const maxMemo = 4096

// Window is a span of whole UTC days, both ends included.
type Window struct{ From, To persistence.Day }

// ParseWindow reads from and to (YYYY-MM-DD, UTC, both included); to
// defaults to today, from to the days before it that make def days.
func ParseWindow(from, to string, def, maxDays int, now time.Time) (Window, error) {
	var v extensions.ValidationError
	w := Window{To: persistence.DayOf(now)}
	if to != "" {
		t, err := time.Parse(dateLayout, to)
		if err != nil {
			v.Add("to", "must be a date, YYYY-MM-DD")
		}
		w.To = persistence.DayOf(t)
	}
	w.From = w.To - persistence.Day(def) + 1
	if from != "" {
		t, err := time.Parse(dateLayout, from)
		if err != nil {
			v.Add("from", "must be a date, YYYY-MM-DD")
		}
		w.From = persistence.DayOf(t)
	}
	if err := v.Err(); err != nil {
		return w, err
	}
	switch {
	case w.From > w.To:
		v.Add("from", "must not be after to")
	case int(w.To-w.From)+1 > maxDays:
		v.Add("from", "the window may span at most %d days", maxDays)
	case w.To > persistence.DayOf(now)+1:
		v.Add("to", "must not be in the future")
	case w.From < 0:
		v.Add("from", "must not be before 1970-01-01")
	}
	return w, v.Err()
}

func dayString(d persistence.Day) string { return d.Start().Format(dateLayout) }

// Count is a number of sign-ins and failed sign-ins under one key.
type Count struct {
	SignIns  int64 `json:"signIns"`
	Failures int64 `json:"failures"`
}

// MethodCount is a Count of one sign-in method ("" is reported as unknown).
type MethodCount struct {
	Method string `json:"method"`
	Count
}

// AppCount is a Count of one application (nil: sign-ins through none,
// such as a failure before the application was known).
type AppCount struct {
	ApplicationID *string `json:"applicationId"`
	Count
}

// Overview is a window's summary.
type Overview struct {
	From          string        `json:"from"`
	To            string        `json:"to"`
	SignIns       int64         `json:"signIns"`
	Failures      int64         `json:"failures"`
	NewUsers      int64         `json:"newUsers"`
	ActiveUsers   int64         `json:"activeUsers"`
	MFA           MFAUsage      `json:"mfa"`
	ByMethod      []MethodCount `json:"byMethod"`
	ByApplication []AppCount    `json:"byApplication"`
}

// MFAUsage is how many sign-ins used a second factor, and their share.
type MFAUsage struct {
	SignIns int64   `json:"signIns"`
	Share   float64 `json:"share"` // of all sign-ins; 0 when there were none
}

// Overview counts the window's sign-ins, failures, new and active people
// and second-factor use, by method and by application.
func (s *Service) Overview(ctx context.Context, w Window) (*Overview, error) {
	now := s.now()
	closedTo := min(w.To, persistence.ClosedBefore(now)-1)
	counts, err := remembered(s, memoKey{"signins", int64(w.From), int64(closedTo), 0}, func() ([]persistence.SignInCount, error) {
		return s.store.ClosedSignIns(ctx, w.From, w.To, now)
	})
	if err != nil {
		return nil, err
	}
	open, err := s.store.OpenSignIns(ctx, w.From, w.To, now)
	if err != nil {
		return nil, err
	}
	counts = append(slices.Clip(counts), open...)
	o := &Overview{From: dayString(w.From), To: dayString(w.To), ByMethod: []MethodCount{}, ByApplication: []AppCount{}}
	methods, apps := map[string]*Count{}, map[string]*Count{}
	for _, c := range counts {
		c.Method = MethodName(c.Method)
		m, a := methods[c.Method], apps[c.ApplicationID]
		if m == nil {
			m = &Count{}
			methods[c.Method] = m
		}
		if a == nil {
			a = &Count{}
			apps[c.ApplicationID] = a
		}
		if c.Type == persistence.EventSignIn {
			o.SignIns += c.N
			m.SignIns += c.N
			a.SignIns += c.N
			if c.MFA {
				o.MFA.SignIns += c.N
			}
		} else {
			o.Failures += c.N
			m.Failures += c.N
			a.Failures += c.N
		}
	}
	if o.SignIns > 0 {
		o.MFA.Share = float64(o.MFA.SignIns) / float64(o.SignIns)
	}
	for k, c := range methods {
		if k == "" {
			k = "unknown"
		}
		o.ByMethod = append(o.ByMethod, MethodCount{Method: k, Count: *c})
	}
	for k, c := range apps {
		var id *string
		if k != "" {
			id = &k
		}
		o.ByApplication = append(o.ByApplication, AppCount{ApplicationID: id, Count: *c})
	}
	sort.Slice(o.ByMethod, func(i, j int) bool { return o.ByMethod[i].Method < o.ByMethod[j].Method })
	sort.Slice(o.ByApplication, func(i, j int) bool {
		a, b := o.ByApplication[i].ApplicationID, o.ByApplication[j].ApplicationID
		return a == nil && b != nil || a != nil && b != nil && *a < *b
	})
	end := (w.To + 1).Start()
	if end.After(now) {
		end = now.Add(time.Second)
	}
	if o.NewUsers, err = s.store.NewUsers(ctx, w.From.Start(), end); err != nil {
		return nil, err
	}
	if o.ActiveUsers, err = s.activeUsers(ctx, w, now); err != nil {
		return nil, err
	}
	return o, nil
}

// activeUsers counts the distinct people who signed in in the window: the
// closed days' count, plus those of the open days' closed hours who were not
// among them (both remembered: they never change), plus those of the
// current hour who were in neither.
func (s *Service) activeUsers(ctx context.Context, w Window, now time.Time) (int64, error) {
	open := max(w.From, persistence.ClosedBefore(now))
	var n int64
	if closedTo := min(w.To, open-1); closedTo >= w.From {
		c, err := remembered(s, memoKey{"active", int64(w.From), int64(closedTo), 0}, func() (int64, error) {
			return s.store.ActiveUsersClosed(ctx, w.From, closedTo, now)
		})
		if err != nil {
			return 0, err
		}
		n = c
	}
	if open > w.To {
		return n, nil
	}
	end := (w.To + 1).FirstHour()
	tail := min(persistence.ClosedHourBefore(now), end)
	hours, err := remembered(s, memoKey{"active-hours", int64(w.From), int64(open), int64(tail)}, func() (int64, error) {
		return s.store.ActiveUsersOpenHours(ctx, w.From, open, tail, now)
	})
	if err != nil {
		return 0, err
	}
	n += hours
	if tail < end {
		until := end.Start()
		if until.After(now) {
			until = now.Add(time.Second)
		}
		add, err := s.store.ActiveUsersOpenTail(ctx, w.From, open, max(tail, open.FirstHour()), until)
		if err != nil {
			return 0, err
		}
		n += add
	}
	return n, nil
}

// ActivePoint is one day of the active-users series: the distinct people
// who signed in that day, in the 7 days and in the 30 days ending with it.
type ActivePoint struct {
	Date string `json:"date"`
	DAU  int    `json:"dau"`
	WAU  int    `json:"wau"`
	MAU  int    `json:"mau"`
}

// ActiveSeries is the series over the window's days.
func (s *Service) ActiveSeries(ctx context.Context, w Window) ([]ActivePoint, error) {
	now := s.now()
	const month = 30
	days, err := s.store.ActiveUserDays(ctx, w.From-month+1, w.To, now)
	if err != nil {
		return nil, err
	}
	// last[user] is the last day seen so far; seen[d] counts the people
	// whose last day is d, so the people of the days (d-k, d] are a sum.
	last := map[string]persistence.Day{}
	seen := map[persistence.Day]int{}
	out := make([]ActivePoint, 0, int(w.To-w.From)+1)
	i := 0
	for d := w.From - month + 1; d <= w.To; d++ {
		dau := 0
		for ; i < len(days) && days[i].Day == d; i++ {
			if prev, ok := last[days[i].UserID]; ok {
				seen[prev]--
			}
			last[days[i].UserID] = d
			seen[d]++
			dau++
		}
		if d < w.From {
			continue
		}
		p := ActivePoint{Date: dayString(d), DAU: dau}
		for k := persistence.Day(0); k < month; k++ {
			if k < 7 {
				p.WAU += seen[d-k]
			}
			p.MAU += seen[d-k]
		}
		out = append(out, p)
	}
	return out, nil
}

// EventQuery is a search of the log as the API takes it.
type EventQuery struct {
	Types         []string
	UserID        string
	ApplicationID string
	From, To      string // RFC 3339 instants: [From, To)
	Outcome       string // success, failure or ""
	Limit         int
	Cursor        string
}

// Event is one entry of the log as the API shows it.
type Event struct {
	ID            string         `json:"id"`
	Type          string         `json:"type"`
	Outcome       string         `json:"outcome"`
	UserID        *string        `json:"userId"`
	ApplicationID *string        `json:"applicationId"`
	ClientID      string         `json:"clientId"`
	SessionID     *string        `json:"sessionId"`
	Reason        string         `json:"reason"`
	IP            string         `json:"ip"`
	UserAgent     string         `json:"userAgent"`
	Data          map[string]any `json:"data"`
	CreatedAt     string         `json:"createdAt"`
}

// cursor is what an opaque page cursor holds.
type cursor struct {
	T time.Time `json:"t"`
	I string    `json:"i"`
}

// ErrBadCursor refuses a cursor this server did not make.
var ErrBadCursor = extensions.NewError(http.StatusBadRequest, "invalid_cursor", "The cursor is not one a previous page gave.", map[string]any{"field": "cursor"})

// Events searches the log, newest first; the next cursor is "" on the last
// page.
func (s *Service) Events(ctx context.Context, q EventQuery) ([]Event, string, error) {
	var v extensions.ValidationError
	f := persistence.AuthEventFilter{UserID: q.UserID, ApplicationID: q.ApplicationID}
	for _, t := range q.Types {
		if !slices.Contains(KnownTypes, t) {
			v.Add("type", "%q is not an event type of the log", t)
		}
	}
	f.Types = q.Types
	switch q.Outcome {
	case "":
	case "failure":
		f.Types = filterTypes(f.Types, FailureTypes, true)
	case "success":
		f.Types = filterTypes(f.Types, FailureTypes, false)
	default:
		v.Add("outcome", "must be success or failure")
	}
	for field, id := range map[string]string{"userId": q.UserID, "applicationId": q.ApplicationID} {
		if id != "" && uuid.Validate(id) != nil {
			v.Add(field, "must be a UUID")
		}
	}
	for field, p := range map[string]*string{"from": &q.From, "to": &q.To} {
		if *p == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, *p)
		if err != nil {
			v.Add(field, "must be an RFC 3339 date-time, 2026-01-02T15:04:05Z")
			continue
		}
		if field == "from" {
			f.From = &t
		} else {
			f.To = &t
		}
	}
	if q.Limit < 1 || q.Limit > 200 {
		v.Add("limit", "must be from 1 to 200")
	}
	var after *persistence.AuthEventCursor
	if q.Cursor != "" {
		c, ok := decodeCursor(q.Cursor)
		if !ok {
			return nil, "", ErrBadCursor
		}
		after = &persistence.AuthEventCursor{CreatedAt: c.T, ID: c.I}
	}
	if err := v.Err(); err != nil {
		return nil, "", err
	}
	if len(f.Types) == 0 && (q.Outcome != "" || len(q.Types) > 0) {
		return []Event{}, "", nil // the filters exclude every type
	}
	list, err := s.store.SearchAuthEvents(ctx, f, q.Limit+1, after)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(list) > q.Limit {
		list = list[:q.Limit]
		e := list[len(list)-1]
		raw, _ := json.Marshal(cursor{T: e.CreatedAt.UTC(), I: e.ID})
		next = base64.RawURLEncoding.EncodeToString(raw)
	}
	out := make([]Event, len(list))
	for i, e := range list {
		outcome := "success"
		if slices.Contains(FailureTypes, e.Type) {
			outcome = "failure"
		}
		data := map[string]any(e.Data)
		if data == nil {
			data = map[string]any{}
		}
		out[i] = Event{ID: e.ID, Type: e.Type, Outcome: outcome, UserID: e.UserID, ApplicationID: e.ApplicationID, ClientID: e.ClientID,
			SessionID: e.SessionID, Reason: e.Reason, IP: e.IP, UserAgent: e.UserAgent, Data: data, CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339Nano)}
	}
	return out, next, nil
}

// filterTypes keeps the types (all known ones when none were asked for)
// that are, or are not, in set.
func filterTypes(types, set []string, in bool) []string {
	if len(types) == 0 {
		types = KnownTypes
	}
	out := []string{}
	for _, t := range types {
		if slices.Contains(set, t) == in {
			out = append(out, t)
		}
	}
	return out
}

func decodeCursor(s string) (cursor, bool) {
	var c cursor
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) > 256 {
		return c, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.T.IsZero() || uuid.Validate(c.I) != nil {
		return c, false
	}
	return c, true
}
