package usage

import (
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence"
)

func TestParseTiers(t *testing.T) {
	got, err := ParseTiers("")
	if err != nil || len(got) != 3 || got[0] != (Tier{Free, 60, 1000}) || got[1] != (Tier{Startup, 600, 50_000}) || got[2] != (Tier{Enterprise, 10_000, 5_000_000}) {
		t.Fatalf("spec tiers: %v %v", got, err)
	}
	got, err = ParseTiers(" free=1000/20 , enterprise=1/2")
	if err != nil || got[0] != (Tier{Free, 1000, 20}) || got[1].PerDay != 50_000 || got[2] != (Tier{Enterprise, 1, 2}) {
		t.Fatalf("override: %v %v", got, err)
	}
	for _, bad := range []string{"gold=1/2", "free=1", "free=0/5", "free=-1/5", "free=a/b", "free", ","} {
		if _, err := ParseTiers(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDays(t *testing.T) {
	for _, c := range []struct{ at, day, next string }{
		{"2026-03-04T00:00:00Z", "2026-03-04T00:00:00Z", "2026-03-05T00:00:00Z"},
		{"2026-03-04T23:59:59.999Z", "2026-03-04T00:00:00Z", "2026-03-05T00:00:00Z"},
		{"2026-03-04T23:30:00-02:00", "2026-03-05T00:00:00Z", "2026-03-06T00:00:00Z"}, // a UTC day, not the caller's
		{"2024-12-31T12:00:00Z", "2024-12-31T00:00:00Z", "2025-01-01T00:00:00Z"},
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		if d := Day(at).Format(time.RFC3339); d != c.day {
			t.Errorf("Day(%s) = %s, want %s", c.at, d, c.day)
		}
		if n := NextDay(at).Format(time.RFC3339); n != c.next {
			t.Errorf("NextDay(%s) = %s, want %s", c.at, n, c.next)
		}
	}
}

func TestParseWindow(t *testing.T) {
	now := time.Date(2026, 3, 4, 10, 20, 30, 0, time.UTC)
	for _, c := range []struct {
		g, from, to   string
		wantG, start  string
		end, badField string
	}{
		{"", "", "", "day", "2026-02-03T00:00:00Z", "2026-03-05T00:00:00Z", ""},
		{"day", "2026-03-01", "2026-03-02", "day", "2026-03-01T00:00:00Z", "2026-03-03T00:00:00Z", ""},
		{"day", "", "2026-03-02", "day", "2026-02-01T00:00:00Z", "2026-03-03T00:00:00Z", ""},
		{"minute", "", "", "minute", "2026-03-04T09:21:00Z", "2026-03-04T10:21:00Z", ""},
		{"minute", "2026-03-04T10:00:00Z", "2026-03-04T10:05:00Z", "minute", "2026-03-04T10:00:00Z", "2026-03-04T10:05:00Z", ""},
		{"hour", "", "", "", "", "", "granularity"},
		{"day", "yesterday", "", "", "", "", "from"},
		{"day", "2026-03-02", "2026-03-01", "", "", "", "from"},
		{"day", "2020-01-01", "2026-01-01", "", "", "", "from"},
		{"minute", "2026-03-04T10:00:30Z", "", "", "", "", "from"},
		{"minute", "2026-03-03T00:00:00Z", "2026-03-04T10:00:00Z", "", "", "", "from"},
	} {
		g, start, end, err := ParseWindow(c.g, c.from, c.to, now)
		if c.badField != "" {
			if err == nil || !strings.Contains(err.Error(), c.badField+":") {
				t.Errorf("%+v: want a problem with %s, got %v", c, c.badField, err)
			}
			continue
		}
		if err != nil || g != c.wantG || start.Format(time.RFC3339) != c.start || end.Format(time.RFC3339) != c.end {
			t.Errorf("%+v: %s %s %s %v", c, g, start.Format(time.RFC3339), end.Format(time.RFC3339), err)
		}
	}
}

func TestRowsAddUpMinutesIntoDays(t *testing.T) {
	at := func(s string) int64 { t, _ := time.Parse(time.RFC3339, s); return t.Unix() / 60 }
	out := rows(map[counterKey]int64{
		{persistence.UsageServiceAccount, "a", at("2026-03-04T23:59:00Z")}: 2,
		{persistence.UsageServiceAccount, "a", at("2026-03-05T00:00:00Z")}: 3,
		{persistence.UsageServiceAccount, "a", at("2026-03-05T00:01:00Z")}: 4,
		{persistence.UsageApplication, "a", at("2026-03-05T00:01:00Z")}:    5,
	})
	days := map[string]int64{}
	minutes := 0
	for _, r := range out {
		if r.Granularity == persistence.UsageDay {
			days[r.SubjectKind+" "+r.Bucket.Format(time.DateOnly)] = r.Count
		} else {
			minutes++
		}
	}
	if minutes != 4 || len(days) != 3 || days["service_account 2026-03-04"] != 2 || days["service_account 2026-03-05"] != 7 || days["application 2026-03-05"] != 5 {
		t.Fatalf("rows: %v", out)
	}
}
