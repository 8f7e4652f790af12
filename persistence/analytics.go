package persistence

import (
	"context"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Authentication analytics over the auth event log (extensions/analytics).
// A day is a UTC day, numbered from 1970-01-01. Once a day is over (and a
// grace for writers stamped just before midnight has passed) its sign-ins
// are rolled up once (auth_event_days, auth_active_days); a window's counts
// are then the rollups of its closed days plus the raw events of the days
// still open, so that a 30-day overview reads a few thousand rows, not a
// million.

// Day is a UTC day: days since 1970-01-01.
type Day int

// DayOf is the UTC day of t.
func DayOf(t time.Time) Day { return Day(t.UTC().Unix() / 86400) }

// Start is the day's first instant.
func (d Day) Start() time.Time { return time.Unix(int64(d)*86400, 0).UTC() }

// RollGrace is how long after midnight a day stays open: an event is
// stamped before its commit, and replicas' clocks differ a little.
const RollGrace = 2 * time.Minute

// ClosedBefore is the first day that is not closed at now: every day before
// it is over and rolled up (or will be, when first read).
func ClosedBefore(now time.Time) Day { return DayOf(now.Add(-RollGrace)) }

// The rolled-up event types: sign-ins and failed sign-ins.
var rolledTypes = []string{EventSignIn, EventSignInFailed}

// methodExpr and mfaExpr read the sign-in method and whether a second
// factor was used from an event's data, per dialect.
func (s *Store) methodExpr() string {
	if s.dialect == Postgres {
		return `COALESCE(data->>'method', '')`
	}
	return `COALESCE(json_extract(data, '$.method'), '')`
}

func (s *Store) mfaExpr() string {
	if s.dialect == Postgres {
		return `(data->>'mfa' = 'true')`
	}
	return `(json_extract(data, '$.mfa') = 1)`
}

// RollAuthDays rolls up every closed day of [from, to] not rolled yet, one
// transaction per day, and reports how many it rolled. Two servers rolling
// the same day roll it once: the day's row is claimed first.
func (s *Store) RollAuthDays(ctx context.Context, from, to Day, now time.Time) (int, error) {
	return s.rollPeriods(ctx, dayRollup, int64(from), int64(min(to, ClosedBefore(now)-1)), now)
}

// Hour is a UTC hour: hours since 1970-01-01.
type Hour int64

// HourOf is the UTC hour of t.
func HourOf(t time.Time) Hour { return Hour(t.UTC().Unix() / 3600) }

// Start is the hour's first instant.
func (h Hour) Start() time.Time { return time.Unix(int64(h)*3600, 0).UTC() }

// FirstHour is the day's first hour.
func (d Day) FirstHour() Hour { return Hour(d) * 24 }

// ClosedHourBefore is the first hour that is not closed at now.
func ClosedHourBefore(now time.Time) Hour { return HourOf(now.Add(-RollGrace)) }

// RollAuthHours rolls up every closed hour of [from, to] not rolled yet,
// as RollAuthDays does days: the hours of the days still open are read
// from these.
func (s *Store) RollAuthHours(ctx context.Context, from, to Hour, now time.Time) (int, error) {
	return s.rollPeriods(ctx, hourRollup, int64(from), int64(min(to, ClosedHourBefore(now)-1)), now)
}

// DeleteAuthHoursBefore deletes the hourly rollups of hours before h (their
// days are rolled up whole by then).
func (s *Store) DeleteAuthHoursBefore(ctx context.Context, h Hour) error {
	for _, table := range []string{"auth_event_hours", "auth_active_hours", "auth_rolled_hours"} {
		if _, err := s.db.ExecContext(ctx, s.q(`DELETE FROM `+table+` WHERE hour < ?`), h); err != nil {
			return mapError(err)
		}
	}
	return nil
}

// rollup names one granularity's tables and its periods' length.
type rollup struct {
	key, rolled, events, active string
	seconds                     int64
}

var (
	dayRollup  = rollup{key: "day", rolled: "auth_rolled_days", events: "auth_event_days", active: "auth_active_days", seconds: 86400}
	hourRollup = rollup{key: "hour", rolled: "auth_rolled_hours", events: "auth_event_hours", active: "auth_active_hours", seconds: 3600}
)

func (r rollup) start(p int64) time.Time { return time.Unix(p*r.seconds, 0).UTC() }

func (s *Store) rollPeriods(ctx context.Context, r rollup, from, to int64, now time.Time) (int, error) {
	if to < from {
		return 0, nil
	}
	var done []int64
	if err := s.db.SelectContext(ctx, &done, s.q(`SELECT `+r.key+` FROM `+r.rolled+` WHERE `+r.key+` >= ? AND `+r.key+` <= ?`), from, to); err != nil {
		return 0, mapError(err)
	}
	rolled := map[int64]bool{}
	for _, p := range done {
		rolled[p] = true
	}
	n := 0
	for p := from; p <= to; p++ {
		if rolled[p] {
			continue
		}
		if err := s.rollPeriod(ctx, r, p, now); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func (s *Store) rollPeriod(ctx context.Context, r rollup, p int64, now time.Time) error {
	start, end := r.start(p), r.start(p+1)
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`INSERT INTO `+r.rolled+` (`+r.key+`, rolled_at) VALUES (?, ?) ON CONFLICT (`+r.key+`) DO NOTHING`), p, now.UTC())
		if err != nil {
			return nil, mapError(err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, mapError(err) // rolled by another server meanwhile
		}
		q, args, err := sqlx.In(`INSERT INTO `+r.events+` (`+r.key+`, type, application_id, method, mfa, n)
			SELECT CAST(? AS bigint), type, COALESCE(application_id, ''), m, f, COUNT(*) FROM (
				SELECT type, `+s.appText()+` AS application_id, `+s.methodExpr()+` AS m, COALESCE(`+s.mfaExpr()+`, false) AS f
				FROM auth_events WHERE type IN (?) AND created_at >= ? AND created_at < ?) e
			GROUP BY type, application_id, m, f`, p, rolledTypes, start, end)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(q), args...); err != nil {
			return nil, mapError(err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO `+r.active+` (`+r.key+`, user_id)
			SELECT DISTINCT CAST(? AS bigint), user_id FROM auth_events WHERE type = ? AND created_at >= ? AND created_at < ? AND user_id IS NOT NULL`),
			p, EventSignIn, start, end); err != nil {
			return nil, mapError(err)
		}
		return nil, nil
	})
}

// appText is application_id as text (PostgreSQL's is a uuid).
func (s *Store) appText() string {
	if s.dialect == Postgres {
		return `application_id::text`
	}
	return `application_id`
}

// SignInCount is how many sign-ins (Type sign_in) or failed sign-ins
// (sign_in_failed) one application (or none: "") saw by one method, with a
// second factor or without.
type SignInCount struct {
	Type          string `db:"type"`
	ApplicationID string `db:"application_id"`
	Method        string `db:"method"`
	MFA           bool   `db:"mfa"`
	N             int64  `db:"n"`
}

// SignInCounts counts the sign-ins and failed sign-ins of the days [from,
// to] up to now: ClosedSignIns and OpenSignIns together.
func (s *Store) SignInCounts(ctx context.Context, from, to Day, now time.Time) ([]SignInCount, error) {
	closed, err := s.ClosedSignIns(ctx, from, to, now)
	if err != nil {
		return nil, err
	}
	open, err := s.OpenSignIns(ctx, from, to, now)
	return append(closed, open...), err
}

// ClosedSignIns counts those of the closed days of [from, to], from their
// rollups (rolling what is not yet): the answer never changes.
func (s *Store) ClosedSignIns(ctx context.Context, from, to Day, now time.Time) ([]SignInCount, error) {
	closed := min(to, ClosedBefore(now)-1)
	out := []SignInCount{}
	if closed < from {
		return out, nil
	}
	if _, err := s.RollAuthDays(ctx, from, closed, now); err != nil {
		return nil, err
	}
	err := s.db.SelectContext(ctx, &out, s.q(`SELECT type, application_id, method, mfa, SUM(n) AS n FROM auth_event_days
		WHERE day >= ? AND day <= ? GROUP BY type, application_id, method, mfa`), from, closed)
	return out, mapError(err)
}

// OpenSignIns counts those of the days of [from, to] still open at now:
// their closed hours from the hourly rollups, the current hour from the log.
func (s *Store) OpenSignIns(ctx context.Context, from, to Day, now time.Time) ([]SignInCount, error) {
	open := max(from, ClosedBefore(now))
	out := []SignInCount{}
	if open > to {
		return out, nil
	}
	first, tail := open.FirstHour(), min(ClosedHourBefore(now), (to+1).FirstHour())
	if tail > first {
		if _, err := s.RollAuthHours(ctx, first, tail-1, now); err != nil {
			return nil, err
		}
		if err := s.db.SelectContext(ctx, &out, s.q(`SELECT type, application_id, method, mfa, SUM(n) AS n FROM auth_event_hours
			WHERE hour >= ? AND hour < ? GROUP BY type, application_id, method, mfa`), first, tail); err != nil {
			return nil, mapError(err)
		}
	}
	q, args, err := sqlx.In(`SELECT type, application_id, m AS method, f AS mfa, COUNT(*) AS n FROM (
			SELECT type, COALESCE(`+s.appText()+`, '') AS application_id, `+s.methodExpr()+` AS m, COALESCE(`+s.mfaExpr()+`, false) AS f
			FROM auth_events WHERE type IN (?) AND created_at >= ? AND created_at < ?) e
		GROUP BY type, application_id, m, f`, rolledTypes, max(tail, first).Start(), (to + 1).Start())
	if err != nil {
		return nil, err
	}
	var live []SignInCount
	if err := s.db.SelectContext(ctx, &live, s.q(q), args...); err != nil {
		return nil, mapError(err)
	}
	return append(out, live...), nil
}

// ActiveUsersClosed is how many distinct people signed in on the closed
// days [from, to] (to must be closed: the answer never changes).
func (s *Store) ActiveUsersClosed(ctx context.Context, from, to Day, now time.Time) (int64, error) {
	if _, err := s.RollAuthDays(ctx, from, to, now); err != nil {
		return 0, err
	}
	var n int64
	err := s.db.GetContext(ctx, &n, s.q(`SELECT COUNT(DISTINCT user_id) FROM auth_active_days WHERE day >= ? AND day <= ?`), from, to)
	return n, mapError(err)
}

// ActiveUsersOpenHours is how many distinct people signed in in the closed
// hours [open's first hour, until) and on none of the closed days [from,
// open-1] (rolling those hours): the answer never changes.
func (s *Store) ActiveUsersOpenHours(ctx context.Context, from, open Day, until Hour, now time.Time) (int64, error) {
	first := open.FirstHour()
	if until <= first {
		return 0, nil
	}
	if _, err := s.RollAuthHours(ctx, first, until-1, now); err != nil {
		return 0, err
	}
	var n int64
	err := s.db.GetContext(ctx, &n, s.q(`SELECT COUNT(DISTINCT h.user_id) FROM auth_active_hours h
		WHERE h.hour >= ? AND h.hour < ?
		AND NOT EXISTS (SELECT 1 FROM auth_active_days d WHERE d.user_id = h.user_id AND d.day >= ? AND d.day < ?)`),
		first, until, from, open)
	return n, mapError(err)
}

// ActiveUsersOpenTail is how many distinct people signed in from the start
// of hour tail until end and neither on the closed days [from, open-1] nor
// in the hours [open's first hour, tail): what the current hour adds.
func (s *Store) ActiveUsersOpenTail(ctx context.Context, from, open Day, tail Hour, end time.Time) (int64, error) {
	var n int64
	err := s.db.GetContext(ctx, &n, s.q(`SELECT COUNT(DISTINCT e.user_id) FROM auth_events e
		WHERE e.type = ? AND e.created_at >= ? AND e.created_at < ? AND e.user_id IS NOT NULL
		AND NOT EXISTS (SELECT 1 FROM auth_active_days d WHERE d.user_id = e.user_id AND d.day >= ? AND d.day < ?)
		AND NOT EXISTS (SELECT 1 FROM auth_active_hours h WHERE h.user_id = e.user_id AND h.hour >= ? AND h.hour < ?)`),
		EventSignIn, tail.Start(), end.UTC(), from, open, open.FirstHour(), tail)
	return n, mapError(err)
}

// UserDay is one person active on one day.
type UserDay struct {
	Day    Day    `db:"day"`
	UserID string `db:"user_id"`
}

// ActiveUserDays lists who signed in on which day of [from, to], each
// person once a day, ordered by day.
func (s *Store) ActiveUserDays(ctx context.Context, from, to Day, now time.Time) ([]UserDay, error) {
	closed := min(to, ClosedBefore(now)-1)
	if _, err := s.RollAuthDays(ctx, from, closed, now); err != nil {
		return nil, err
	}
	out := []UserDay{}
	if closed >= from {
		if err := s.db.SelectContext(ctx, &out, s.q(`SELECT day, `+s.userText("user_id")+` AS user_id FROM auth_active_days WHERE day >= ? AND day <= ? ORDER BY day`), from, closed); err != nil {
			return nil, mapError(err)
		}
	}
	for d := max(from, closed+1); d <= to; d++ {
		var ids []string
		if err := s.db.SelectContext(ctx, &ids, s.q(`SELECT DISTINCT `+s.userText("user_id")+` FROM auth_events WHERE type = ? AND created_at >= ? AND created_at < ? AND user_id IS NOT NULL`),
			EventSignIn, d.Start(), (d + 1).Start()); err != nil {
			return nil, mapError(err)
		}
		for _, id := range ids {
			out = append(out, UserDay{Day: d, UserID: id})
		}
	}
	return out, nil
}

func (s *Store) userText(col string) string {
	if s.dialect == Postgres {
		return col + "::text"
	}
	return col
}

// NewUsers counts the people created in [from, to).
func (s *Store) NewUsers(ctx context.Context, from, to time.Time) (int64, error) {
	var n int64
	err := s.db.GetContext(ctx, &n, s.q(`SELECT COUNT(*) FROM users WHERE created_at >= ? AND created_at < ?`), from.UTC(), to.UTC())
	return n, mapError(err)
}

// AuthEventFilter narrows a search of the event log; empty fields match
// anything. Types, when given, are the types kept.
type AuthEventFilter struct {
	Types         []string
	UserID        string
	ApplicationID string
	From, To      *time.Time // [From, To)
}

// AuthEventCursor is where a page of the search ends: the last event's
// time and id (the log is read newest first).
type AuthEventCursor struct {
	CreatedAt time.Time
	ID        string
}

// SearchAuthEvents reads up to limit events matching f, newest first,
// after the cursor when one is given.
func (s *Store) SearchAuthEvents(ctx context.Context, f AuthEventFilter, limit int, after *AuthEventCursor) ([]AuthEvent, error) {
	var where []string
	var args []any
	if len(f.Types) > 0 {
		where, args = append(where, `type IN (?)`), append(args, f.Types)
	}
	if f.UserID != "" {
		where, args = append(where, `user_id = ?`), append(args, f.UserID)
	}
	if f.ApplicationID != "" {
		where, args = append(where, `application_id = ?`), append(args, f.ApplicationID)
	}
	if f.From != nil {
		where, args = append(where, `created_at >= ?`), append(args, f.From.UTC())
	}
	if f.To != nil {
		where, args = append(where, `created_at < ?`), append(args, f.To.UTC())
	}
	if after != nil {
		where, args = append(where, `(created_at < ? OR (created_at = ? AND id < ?))`), append(args, after.CreatedAt.UTC(), after.CreatedAt.UTC(), after.ID)
	}
	q := `SELECT ` + authEventColumns + ` FROM auth_events`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, limit)
	q, args, err := sqlx.In(q, args...)
	if err != nil {
		return nil, err
	}
	out := []AuthEvent{}
	return out, mapError(s.db.SelectContext(ctx, &out, s.q(q), args...))
}
