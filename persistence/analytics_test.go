package persistence_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions/analytics"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func authEvent(typ, user, app, method string, mfa bool, at time.Time) persistence.AuthEvent {
	e := persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: typ, CreatedAt: at, Data: persistence.JSONObject{}}
	if user != "" {
		e.UserID = ptr(user)
	}
	if app != "" {
		e.ApplicationID = ptr(app)
	}
	if method != "" {
		e.Data["method"] = method
	}
	if mfa {
		e.Data["mfa"] = true
	}
	return e
}

// Counts over closed days (read from daily rollups, rolled on first read),
// the open day's closed hours (hourly rollups) and its current hour (the
// log) agree with the log, and a rolled period is rolled once. The clock is
// fixed at 20:30 UTC today, so that today has closed hours.
func TestAnalyticsRollups(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		today := persistence.DayOf(now())
		clock := today.Start().Add(20*time.Hour + 30*time.Minute)
		app, ann, bob, cid, dee := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
		at := func(daysAgo int) time.Time { return (today - persistence.Day(daysAgo)).Start().Add(time.Hour) }
		events := []persistence.AuthEvent{
			authEvent(persistence.EventSignIn, ann, app, "pwd", false, at(3)),
			authEvent(persistence.EventSignIn, ann, app, "pwd", true, at(3)),
			authEvent(persistence.EventSignIn, bob, "", "otp", false, at(2)),
			authEvent(persistence.EventSignInFailed, bob, app, "password", false, at(2)),
			authEvent(persistence.EventSessionStarted, bob, app, "", false, at(2)),
			authEvent(persistence.EventSignIn, cid, app, "pwd", false, today.Start().Add(5*time.Hour+10*time.Minute)), // a closed hour of today
			authEvent(persistence.EventSignIn, ann, app, "pwd", false, clock.Add(-time.Second)),                       // the current hour
			authEvent(persistence.EventSignIn, dee, app, "pwd", false, clock.Add(-time.Second)),
			authEvent(persistence.EventSignIn, ann, app, "pwd", false, at(40)), // outside the window
		}
		if err := s.AppendAuthEvents(ctx, events...); err != nil {
			t.Fatal(err)
		}
		counts, err := s.SignInCounts(ctx, today-29, today, clock)
		if err != nil {
			t.Fatal(err)
		}
		sum := map[string]int64{}
		for _, c := range counts {
			sum[fmt.Sprintf("%s/%s/%s/%v", c.Type, c.ApplicationID, c.Method, c.MFA)] += c.N
		}
		want := map[string]int64{
			"sign_in/" + app + "/pwd/false": 4, "sign_in/" + app + "/pwd/true": 1, "sign_in//otp/false": 1, "sign_in_failed/" + app + "/password/false": 1,
		}
		if fmt.Sprint(sum) != fmt.Sprint(want) {
			t.Fatalf("counts %v, want %v", sum, want)
		}
		// The closed days and today's closed hours are rolled now; rolling
		// again rolls nothing.
		if n, err := s.RollAuthDays(ctx, today-29, today, clock); err != nil || n != 0 {
			t.Fatalf("days rolled again: %d, %v", n, err)
		}
		if n, err := s.RollAuthHours(ctx, today.FirstHour(), persistence.HourOf(clock), clock); err != nil || n != 0 {
			t.Fatalf("hours rolled again: %d, %v", n, err)
		}
		// An event stamped late into a rolled day or hour is not counted:
		// rolled periods do not change (the grace exists for that).
		if err := s.AppendAuthEvents(ctx, authEvent(persistence.EventSignIn, bob, app, "pwd", false, at(3)),
			authEvent(persistence.EventSignIn, bob, app, "pwd", false, today.Start().Add(5*time.Hour))); err != nil {
			t.Fatal(err)
		}
		again, err := s.SignInCounts(ctx, today-29, today, clock)
		if err != nil {
			t.Fatal(err)
		}
		total := func(cs []persistence.SignInCount) (n int64) {
			for _, c := range cs {
				n += c.N
			}
			return n
		}
		if total(again) != total(counts) {
			t.Fatalf("a rolled period changed: %d → %d", total(counts), total(again))
		}

		// Active people: ann and bob on closed days; cid in a closed hour
		// of today; dee only in the current hour (ann too, seen before).
		closed, err := s.ActiveUsersClosed(ctx, today-29, today-1, clock)
		if err != nil || closed != 2 {
			t.Fatalf("closed active: %d, %v", closed, err)
		}
		hours, err := s.ActiveUsersOpenHours(ctx, today-29, today, persistence.ClosedHourBefore(clock), clock)
		if err != nil || hours != 1 {
			t.Fatalf("active in today's closed hours: %d, %v", hours, err)
		}
		tail, err := s.ActiveUsersOpenTail(ctx, today-29, today, persistence.ClosedHourBefore(clock), clock.Add(time.Second))
		if err != nil || tail != 1 {
			t.Fatalf("active in the current hour: %d, %v", tail, err)
		}
		days, err := s.ActiveUserDays(ctx, today-3, today, clock)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range days {
			got = append(got, fmt.Sprintf("%d:%s", today-d.Day, d.UserID))
		}
		slices.Sort(got)
		wantDays := []string{"0:" + ann, "0:" + bob, "0:" + cid, "0:" + dee, "2:" + bob, "3:" + ann} // today is read from the log: bob's late event counts there
		slices.Sort(wantDays)
		if !slices.Equal(got, wantDays) {
			t.Fatalf("user days %v, want %v", got, wantDays)
		}

		// Through the service: the overview adds them up, the same when
		// remembered.
		svc := analytics.New(s).At(func() time.Time { return clock })
		for range 2 {
			o, err := svc.Overview(ctx, analytics.Window{From: today - 29, To: today})
			if err != nil {
				t.Fatal(err)
			}
			if o.SignIns != 6 || o.Failures != 1 || o.ActiveUsers != 4 || o.MFA.SignIns != 1 {
				t.Fatalf("overview %+v", o)
			}
		}
		// A window that ended yesterday: closed days only.
		o, err := svc.Overview(ctx, analytics.Window{From: today - 29, To: today - 1})
		if err != nil || o.SignIns != 3 || o.ActiveUsers != 2 {
			t.Fatalf("yesterday's overview %+v, %v", o, err)
		}

		// The log searched newest first, in pages.
		var seen []string
		var after *persistence.AuthEventCursor
		for range 10 {
			page, err := s.SearchAuthEvents(ctx, persistence.AuthEventFilter{ApplicationID: app, Types: []string{persistence.EventSignIn}}, 2, after)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page {
				seen = append(seen, e.ID)
			}
			if len(page) < 2 {
				break
			}
			last := page[len(page)-1]
			after = &persistence.AuthEventCursor{CreatedAt: last.CreatedAt, ID: last.ID}
		}
		if len(seen) != 8 {
			t.Fatalf("paged search saw %d events, want 8", len(seen))
		}
		// Hourly rollups older than asked go.
		if err := s.DeleteAuthHoursBefore(ctx, persistence.HourOf(clock)+1); err != nil {
			t.Fatal(err)
		}
		if n, err := s.RollAuthHours(ctx, today.FirstHour(), today.FirstHour(), clock); err != nil || n != 1 {
			t.Fatalf("an hour swept is rolled again: %d, %v", n, err)
		}
	})
}

// The reads of one application: who signed in through it, its live sessions.
func TestApplicationScopedReads(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		app := uuid.NewString()
		var ids []string
		for i := range 3 {
			u := persistence.User{ID: uuid.Must(uuid.NewV7()).String(), Email: fmt.Sprintf("u%d@example.com", i), Status: "active", Metadata: persistence.JSONObject{}, CreatedAt: now(), UpdatedAt: now()}
			if err := s.CreateUser(ctx, &u); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, u.ID)
		}
		// u0 twice through app, u1 once through another, u2 failed through app.
		if err := s.AppendAuthEvents(ctx,
			authEvent(persistence.EventSignIn, ids[0], app, "pwd", false, now()),
			authEvent(persistence.EventSignIn, ids[0], app, "pwd", false, now()),
			authEvent(persistence.EventSignIn, ids[1], uuid.NewString(), "pwd", false, now()),
			authEvent(persistence.EventSignInFailed, ids[2], app, "password", false, now())); err != nil {
			t.Fatal(err)
		}
		users, total, err := s.ListApplicationUsers(ctx, app, persistence.Page{Limit: 10})
		if err != nil || total != 1 || len(users) != 1 || users[0].ID != ids[0] {
			t.Fatalf("application users: %v %d %v", users, total, err)
		}
		list, total, err := s.ListApplicationSessions(ctx, app, now(), now().Add(-time.Hour), persistence.Page{Limit: 10})
		if err != nil || total != 0 || len(list) != 0 {
			t.Fatalf("no sessions: %v %d %v", list, total, err)
		}
	})
}

// Migration 0027 on a database from before it: the people who signed in
// through an application are read from the log once; later sign-ins add
// to them through the trigger; and the migration goes down and up again.
func TestMigrationApplicationUsers(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, p := migratedTo(t, dbURL, 26)
		app, other := uuid.NewString(), uuid.NewString()
		var ids []string
		for i := range 4 {
			id := uuid.Must(uuid.NewV7()).String()
			email := fmt.Sprintf("m%d@example.com", i)
			if _, err := db.ExecContext(ctx, db.Rebind(`INSERT INTO users (id, email, email_key, status, metadata, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)`),
				id, email, email, "active", "{}", now(), now()); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		// Before: m0 twice through app, m1 failed through it, m2 through
		// another application.
		for _, e := range []persistence.AuthEvent{authEvent(persistence.EventSignIn, ids[0], app, "pwd", false, now()),
			authEvent(persistence.EventSignIn, ids[0], app, "pwd", false, now()),
			authEvent(persistence.EventSignInFailed, ids[1], app, "pwd", false, now()),
			authEvent(persistence.EventSignIn, ids[2], other, "pwd", false, now())} {
			if _, err := db.ExecContext(ctx, db.Rebind(`INSERT INTO auth_events (id, type, user_id, application_id, data, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
				e.ID, e.Type, e.UserID, e.ApplicationID, "{}", e.CreatedAt); err != nil {
				t.Fatal(err)
			}
		}
		users := func(t *testing.T, s *persistence.Store, app string) []string {
			t.Helper()
			list, total, err := s.ListApplicationUsers(ctx, app, persistence.Page{Limit: 10})
			if err != nil || total != len(list) {
				t.Fatalf("application users: %v %d %v", list, total, err)
			}
			var out []string
			for _, u := range list {
				out = append(out, u.ID)
			}
			return out
		}
		s := dbtest.Store(t, dbURL) // migrated to the newest
		if got := users(t, s, app); !slices.Equal(got, ids[:1]) {
			t.Fatalf("after the migration: %v", got)
		}
		if err := s.AppendAuthEvents(ctx, authEvent(persistence.EventSignIn, ids[3], app, "pwd", false, now()),
			authEvent(persistence.EventSignIn, ids[0], app, "pwd", false, now())); err != nil {
			t.Fatal(err)
		}
		if got := users(t, s, app); !slices.Equal(got, []string{ids[0], ids[3]}) {
			t.Fatalf("after two more sign-ins: %v", got)
		}
		if _, err := p.DownTo(ctx, 26); err != nil {
			t.Fatal(err)
		}
		if got := users(t, dbtest.Store(t, dbURL), app); !slices.Equal(got, []string{ids[0], ids[3]}) {
			t.Fatalf("down and up again: %v", got)
		}
	})
}

// BenchmarkAnalyticsOverview measures the overview of 30 days over
// 1,000,000 auth events (ten thousand people, 20 applications), and the
// event search, on each dialect (make bench). Events are spread evenly
// over 30 days ending 3 minutes before the end of today (UTC), the
// overview's worst case: a whole day open, read from the log.
func BenchmarkAnalyticsOverview(b *testing.B) {
	for name, dbURL := range dbtest.URLs(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s := dbtest.Store(b, dbURL)
			db, _, err := persistence.Open(ctx, dbURL)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			const n, users, apps = 1_000_000, 10_000, 20
			// The worst case: the end of a UTC day, when today (read from
			// the log, not the rollups) holds a whole day of events.
			end := persistence.DayOf(time.Now()).Start().Add(24*time.Hour - 3*time.Minute)
			start := end.Add(-30 * 24 * time.Hour)
			clock := func() time.Time { return end }
			rng := rand.New(rand.NewPCG(1, 2))
			userIDs, appIDs := make([]string, users), make([]string, apps)
			for i := range userIDs {
				userIDs[i] = uuid.NewString()
			}
			for i := range appIDs {
				appIDs[i] = uuid.NewString()
			}
			types := []string{persistence.EventSignIn, persistence.EventSignIn, persistence.EventSignIn, persistence.EventSignIn,
				persistence.EventSessionStarted, persistence.EventSessionStarted, persistence.EventTokenRefreshed, persistence.EventSignInFailed, persistence.EventSessionEnded, persistence.EventLogout}
			methods := []string{"pwd", "pwd", "pwd", "otp", "email", "hwk"}
			const per = 500
			cols := strings.Repeat("?, ", 10) + "?"
			row := "(" + cols + ")"
			stmt := db.Rebind(`INSERT INTO auth_events (id, type, user_id, application_id, client_id, session_id, reason, ip, user_agent, data, created_at) VALUES ` +
				strings.TrimSuffix(strings.Repeat(row+", ", per), ", "))
			args := make([]any, 0, per*11)
			for i := range n {
				// In floating point: i × 30 days in nanoseconds overflows int64.
				at := start.Add(time.Duration(float64(end.Sub(start)-time.Second) * float64(i) / n))
				typ := types[rng.IntN(len(types))]
				data := `{}`
				if typ == persistence.EventSignIn || typ == persistence.EventSignInFailed {
					data = fmt.Sprintf(`{"method":%q}`, methods[rng.IntN(len(methods))])
					if typ == persistence.EventSignIn && rng.IntN(5) == 0 {
						data = strings.TrimSuffix(data, "}") + `,"mfa":true}`
					}
				}
				args = append(args, uuid.Must(uuid.NewV7()).String(), typ, userIDs[rng.IntN(users)], appIDs[rng.IntN(apps)], "app_x", nil, "", "", "", data, at)
				if len(args) == cap(args) {
					if _, err := db.ExecContext(ctx, stmt, args...); err != nil {
						b.Fatal(err)
					}
					args = args[:0]
				}
			}
			// What the sweeper does once a minute: the closed days rolled.
			t0 := time.Now()
			rolled, err := s.RollAuthDays(ctx, persistence.DayOf(start), persistence.DayOf(end), end)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("rolled %d days in %.0f ms", rolled, ms(time.Since(t0)))
			// The steady state autovacuum (PostgreSQL) reaches on its own:
			// statistics for the planner, the rollups' included; SQLite's
			// planner reads ANALYZE's too.
			analyze := `ANALYZE`
			if name == "postgres" {
				analyze = `VACUUM ANALYZE`
			}
			if _, err := db.ExecContext(ctx, analyze); err != nil {
				b.Fatal(err)
			}
			svc := analytics.New(s).At(clock)
			today := persistence.DayOf(end)
			win := analytics.Window{From: today - 29, To: today}
			t0 = time.Now()
			if _, err := svc.Overview(ctx, win); err != nil {
				b.Fatal(err)
			}
			b.Logf("first overview (counts the closed days' distinct people once) %.1f ms", ms(time.Since(t0)))
			queries := map[string]func(i int) error{
				"overview 30 days": func(int) error { _, err := svc.Overview(ctx, win); return err },
				"overview 30 days, cold service": func(int) error {
					_, err := analytics.New(s).At(clock).Overview(ctx, win)
					return err
				},
				"events by user": func(i int) error {
					_, _, err := svc.Events(ctx, analytics.EventQuery{UserID: userIDs[i%users], Limit: 50})
					return err
				},
				"events failures of an app": func(i int) error {
					_, _, err := svc.Events(ctx, analytics.EventQuery{ApplicationID: appIDs[i%apps], Outcome: "failure", Limit: 50})
					return err
				},
			}
			names := make([]string, 0, len(queries))
			for q := range queries {
				names = append(names, q)
			}
			slices.Sort(names)
			b.ResetTimer()
			for _, q := range names {
				rounds := 200
				if strings.Contains(q, "cold") {
					rounds = 20
				}
				var lat []time.Duration
				for i := range rounds {
					t0 := time.Now()
					if err := queries[q](i); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				b.Logf("%-32s p50 %7.2f ms  p99 %7.2f ms", q, ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]))
				b.ReportMetric(ms(lat[len(lat)*99/100]), strings.NewReplacer(" ", "_", ",", "").Replace(q)+"_p99_ms")
			}
		})
	}
}
