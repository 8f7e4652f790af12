package risk

import (
	"bytes"
	"context"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

var systemSecret = []byte("a system secret of thirty-two bytes!")

// The places of the tests' addresses.
const testGeo = `start_ip,end_ip,country,lat,lon
192.0.2.0,192.0.2.255,GB,51.5072,-0.1276
198.51.100.0,198.51.100.255,FR,48.8566,2.3522
203.0.113.0,203.0.113.255,AU,-33.8688,151.2093
2001:db8::,2001:db8::ffff,US,40.7128,-74.0060
`

var (
	london  = netip.MustParseAddr("192.0.2.10")
	paris   = netip.MustParseAddr("198.51.100.10")
	sydney  = netip.MustParseAddr("203.0.113.10")
	newYork = netip.MustParseAddr("2001:db8::10")
	nowhere = netip.MustParseAddr("10.0.0.1") // not in the file
)

// clock is the tests' fixed time.
var clock = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type fixture struct {
	svc   *Service
	store *persistence.Store
}

func newFixture(t *testing.T, dbURL string, cfg Config) *fixture {
	t.Helper()
	geo, err := ReadGeo(strings.NewReader(testGeo))
	if err != nil {
		t.Fatal(err)
	}
	store := dbtest.Store(t, dbURL)
	return &fixture{svc: New(store, systemSecret, cfg, geo), store: store}
}

func (f *fixture) user(t *testing.T) string {
	t.Helper()
	n := clock.Add(-24 * time.Hour)
	u := &persistence.User{ID: uuid.NewString(), Email: uuid.NewString() + "@example.com", Status: "active",
		Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
	if err := f.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u.ID
}

func (f *fixture) assess(t *testing.T, in Input) []string {
	t.Helper()
	a, err := f.svc.Assess(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if a.StepUp != (len(a.Rules) > 0) {
		t.Fatalf("step-up %v with rules %v", a.StepUp, a.Rules)
	}
	return a.Rules
}

func (f *fixture) success(t *testing.T, userID string, ip netip.Addr, device string, at time.Time) {
	t.Helper()
	if err := f.store.RecordRiskSignIn(context.Background(), f.svc.SignIn(userID, ip, device, at)); err != nil {
		t.Fatal(err)
	}
}

func TestNewDevice(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		f := newFixture(t, dbURL, DefaultConfig())
		ada := f.user(t)
		laptop, phone := NewDeviceSecret(), NewDeviceSecret()

		// The first sign-in has nothing to compare with: no step-up,
		// whether or not the browser has a cookie yet.
		for _, device := range []string{"", laptop} {
			if got := f.assess(t, Input{UserID: ada, IP: london, DeviceSecret: device, At: clock}); got != nil {
				t.Fatalf("first sign-in (device %q): %v", device, got)
			}
		}
		f.success(t, ada, london, laptop, clock)

		for _, c := range []struct {
			name, device string
			want         []string
		}{
			{"the known device", laptop, nil},
			{"another device", phone, []string{RuleNewDevice}},
			{"no device cookie", "", []string{RuleNewDevice}},
			{"a cookie that is a known device's hash", string(f.svc.deviceHash(laptop)), []string{RuleNewDevice}},
		} {
			if got := f.assess(t, Input{UserID: ada, IP: london, DeviceSecret: c.device, At: clock.Add(time.Hour)}); !slices.Equal(got, c.want) {
				t.Errorf("%s: %v, want %v", c.name, got, c.want)
			}
		}

		// Once remembered, the phone is known too; a sign-in without a
		// cookie remembers no device, but is history: the next sign-in
		// without one is stepped up.
		f.success(t, ada, london, phone, clock.Add(time.Hour))
		if got := f.assess(t, Input{UserID: ada, IP: london, DeviceSecret: phone, At: clock.Add(2 * time.Hour)}); got != nil {
			t.Fatalf("a remembered device: %v", got)
		}
		bob := f.user(t)
		f.success(t, bob, london, "", clock)
		if got := f.assess(t, Input{UserID: bob, IP: london, At: clock.Add(time.Hour)}); !slices.Equal(got, []string{RuleNewDevice}) {
			t.Fatalf("after a sign-in without a cookie: %v", got)
		}

		// Only the keyed hash is stored, never the secret, under a key of
		// its own purpose (a client-secret digest of it would differ).
		h, err := f.store.RiskHistory(context.Background(), ada)
		if err != nil {
			t.Fatal(err)
		}
		clientDigest, _ := oauth.NewSecretHasher(systemSecret).Hash(context.Background(), []byte(laptop))
		for _, d := range h.DeviceHashes {
			if bytes.Contains(d, []byte(laptop)) || bytes.Equal(d, clientDigest) || len(d) != 32 {
				t.Fatalf("stored device %x", d)
			}
		}
		if len(h.DeviceHashes) != 2 {
			t.Fatalf("%d devices remembered, want 2", len(h.DeviceHashes))
		}
	})
}

func TestNewDeviceKeepsTheMostRecent(t *testing.T) {
	f := newFixture(t, dbtest.URLs(t)["sqlite"], DefaultConfig())
	ada := f.user(t)
	first := NewDeviceSecret()
	f.success(t, ada, london, first, clock)
	for i := range Keep {
		f.success(t, ada, london, NewDeviceSecret(), clock.Add(time.Duration(i+1)*time.Minute))
	}
	if got := f.assess(t, Input{UserID: ada, IP: london, DeviceSecret: first, At: clock.Add(time.Hour)}); !slices.Equal(got, []string{RuleNewDevice}) {
		t.Fatalf("a device %d devices ago: %v", Keep, got)
	}
}

func TestVelocity(t *testing.T) {
	f := newFixture(t, dbtest.URLs(t)["sqlite"], DefaultConfig())
	ctx := context.Background()
	attacker := netip.MustParseAddr("192.0.2.66")
	fail := func(ip netip.Addr, email string, at time.Time) { f.svc.RecordFailure(ctx, ip, email, at) }
	velocity := func(in Input) bool { return slices.Contains(f.assess(t, in), RuleVelocity) }

	// Nine failures over three e-mails: not yet.
	for i := range VelocityFailures - 1 {
		fail(attacker, []string{"a@example.com", "b@example.com", "c@example.com"}[i%3], clock.Add(time.Duration(i)*time.Second))
	}
	at := clock.Add(time.Minute)
	if velocity(Input{Email: "a@example.com", IP: attacker, At: at}) {
		t.Fatal("triggered below the failure count")
	}
	fail(attacker, "A@Example.com ", clock.Add(30*time.Second)) // the same e-mail as a@
	for _, c := range []struct {
		name string
		in   Input
		want bool
	}{
		{"unknown e-mail", Input{Email: "z@example.com", IP: attacker, At: at}, true},
		{"a known person", Input{UserID: f.user(t), Email: "a@example.com", IP: attacker, At: at}, true},
		{"another address", Input{Email: "a@example.com", IP: london, At: at}, false},
		{"no address", Input{Email: "a@example.com", At: at}, false},
		{"after the window", Input{Email: "a@example.com", IP: attacker, At: clock.Add(VelocityWindow + time.Second)}, false},
	} {
		if got := velocity(c.in); got != c.want {
			t.Errorf("%s: velocity %v, want %v", c.name, got, c.want)
		}
	}

	// Many failures for one e-mail are one person's mistakes (or a guess
	// at one account, which its own rate limit answers); the e-mail tried
	// now counts among the distinct ones.
	office := netip.MustParseAddr("198.51.100.7")
	for i := range 2 * VelocityFailures {
		fail(office, "a@example.com", clock.Add(time.Duration(i)*time.Second))
	}
	if velocity(Input{Email: "a@example.com", IP: office, At: at}) {
		t.Fatal("one e-mail's failures triggered")
	}
	fail(office, "b@example.com", at)
	if velocity(Input{Email: "a@example.com", IP: office, At: at}) {
		t.Fatal("two e-mails' failures triggered")
	}
	if !velocity(Input{Email: "c@example.com", IP: office, At: at}) {
		t.Fatal("a third e-mail tried after two failed did not trigger")
	}

	// IPv6 addresses count by their /64.
	for i := range VelocityFailures {
		ip := netip.MustParseAddr("2001:db8:1:2::1").Next()
		for range i {
			ip = ip.Next()
		}
		fail(ip, []string{"a@example.com", "b@example.com", "c@example.com"}[i%3], clock)
	}
	if !velocity(Input{Email: "a@example.com", IP: netip.MustParseAddr("2001:db8:1:2:ffff::1"), At: at}) {
		t.Fatal("a /64's failures were not counted together")
	}
	if velocity(Input{Email: "a@example.com", IP: netip.MustParseAddr("2001:db8:1:3::1"), At: at}) {
		t.Fatal("another /64 was counted")
	}

	// Turned off, failures are neither counted nor assessed.
	off := DefaultConfig()
	off.Velocity = false
	g := newFixture(t, dbtest.URLs(t)["sqlite"], off)
	for i := range VelocityFailures {
		g.svc.RecordFailure(ctx, attacker, []string{"a@example.com", "b@example.com", "c@example.com"}[i%3], clock)
	}
	if got := g.assess(t, Input{Email: "a@example.com", IP: attacker, At: at}); got != nil || len(g.svc.failures.byAddr) != 0 {
		t.Fatalf("velocity off: %v, %d addresses counted", got, len(g.svc.failures.byAddr))
	}
}

// The failures' memory is bounded: the least recently failing address is
// forgotten first, and each keeps its last ringSize failures.
func TestFailuresBounded(t *testing.T) {
	f := newFailures(2)
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	spray := func(ip netip.Addr) {
		for i := range VelocityFailures {
			f.add(ip, string(rune('a'+i%3))+"@example.com", clock)
		}
	}
	spray(a)
	spray(b)
	spray(a) // a is now the most recent
	spray(c) // b goes
	for ip, want := range map[netip.Addr]bool{a: true, b: false, c: true} {
		if got := f.suspicious(ip, "x@example.com", clock); got != want {
			t.Errorf("%s: %v, want %v", ip, got, want)
		}
	}
	if len(f.byAddr) != 2 || f.order.Len() != 2 {
		t.Fatalf("%d addresses kept", len(f.byAddr))
	}
	// ringSize later failures for one e-mail push out the spray.
	for range ringSize {
		f.add(a, "a@example.com", clock)
	}
	if f.suspicious(a, "a@example.com", clock) {
		t.Fatal("failures beyond the ring were counted")
	}
}

func TestUnusualLocation(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		f := newFixture(t, dbURL, DefaultConfig())
		ada := f.user(t)
		device := NewDeviceSecret()
		// A sign-in not located is history, but no country to compare.
		f.success(t, ada, nowhere, device, clock)
		if got := f.assess(t, Input{UserID: ada, IP: paris, DeviceSecret: device, At: clock.Add(48 * time.Hour)}); got != nil {
			t.Fatalf("no located sign-in to compare with: %v", got)
		}
		f.success(t, ada, london, device, clock.Add(time.Hour))
		f.success(t, ada, newYork, device, clock.Add(24*time.Hour))
		later := clock.Add(72 * time.Hour)
		for _, c := range []struct {
			name string
			ip   netip.Addr
			want []string
		}{
			{"the last country", newYork, nil},
			{"an earlier country", london, nil},
			{"a new country", paris, []string{RuleUnusualLocation}},
			{"not located", nowhere, nil},
		} {
			if got := f.assess(t, Input{UserID: ada, IP: c.ip, DeviceSecret: device, At: later}); !slices.Equal(got, c.want) {
				t.Errorf("%s: %v, want %v", c.name, got, c.want)
			}
		}
		// A country is remembered for Keep sign-ins.
		for i := range Keep {
			f.success(t, ada, newYork, device, later.Add(time.Duration(i)*time.Hour))
		}
		if got := f.assess(t, Input{UserID: ada, IP: london, DeviceSecret: device, At: later.Add(48 * time.Hour)}); !slices.Equal(got, []string{RuleUnusualLocation}) {
			t.Fatalf("a country %d sign-ins ago: %v", Keep, got)
		}
	})
}

func TestImpossibleTravel(t *testing.T) {
	f := newFixture(t, dbtest.URLs(t)["sqlite"], DefaultConfig())
	device := NewDeviceSecret()
	for _, c := range []struct {
		name string
		from netip.Addr
		to   netip.Addr
		in   time.Duration
		want []string
	}{
		// Same country, far: New York is the only US range, so London to
		// Sydney and back is the test of distance within the rule.
		{"London to Paris in a minute (under the minimum distance)", london, paris, time.Minute, []string{RuleUnusualLocation}},
		{"London to Sydney in an hour", london, sydney, time.Hour, []string{RuleUnusualLocation, RuleImpossibleTravel}},
		{"London to Sydney in a day", london, sydney, 24 * time.Hour, []string{RuleUnusualLocation}},
		{"London to New York in 5 hours (1,114 km/h)", london, newYork, 5 * time.Hour, []string{RuleUnusualLocation, RuleImpossibleTravel}},
		{"London to New York in 6 hours (928 km/h)", london, newYork, 6 * time.Hour, []string{RuleUnusualLocation}},
		{"London to Sydney at the same instant", london, sydney, 0, []string{RuleUnusualLocation, RuleImpossibleTravel}},
		{"London to Sydney, before the last sign-in", london, sydney, -time.Minute, []string{RuleUnusualLocation, RuleImpossibleTravel}},
		{"back in London", london, london, time.Minute, nil},
	} {
		ada := f.user(t)
		f.success(t, ada, c.from, device, clock)
		if got := f.assess(t, Input{UserID: ada, IP: c.to, DeviceSecret: device, At: clock.Add(c.in)}); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}

	// A later sign-in not located does not hide the last located one.
	ada := f.user(t)
	f.success(t, ada, london, device, clock)
	f.success(t, ada, nowhere, device, clock.Add(30*time.Minute))
	f.success(t, ada, sydney, device, clock.Add(2*time.Hour)) // (itself impossible)
	if got := f.assess(t, Input{UserID: ada, IP: london, DeviceSecret: device, At: clock.Add(3 * time.Hour)}); !slices.Equal(got, []string{RuleImpossibleTravel}) {
		t.Fatalf("Sydney to London in an hour: %v", got)
	}
}

// A rule turned off never triggers; without a Geo the location rules rest.
func TestRulesOff(t *testing.T) {
	url := dbtest.URLs(t)["sqlite"]
	attacker := netip.MustParseAddr("203.0.113.66") // in Sydney
	for _, rule := range Rules {
		cfg, err := LoadConfig(func(k string) string {
			if k == "IDENTITYD_RISK_DISABLED" {
				return rule
			}
			return ""
		})
		if err != nil {
			t.Fatal(err)
		}
		f := newFixture(t, url, cfg)
		ada := f.user(t)
		f.success(t, ada, london, NewDeviceSecret(), clock)
		for i := range VelocityFailures {
			f.svc.RecordFailure(context.Background(), attacker, []string{"a@example.com", "b@example.com", "c@example.com"}[i%3], clock.Add(59*time.Minute))
		}
		// From Sydney an hour after London, on a new device, from the
		// spraying address: every rule but the one off.
		in := Input{UserID: ada, Email: "a@example.com", IP: attacker, DeviceSecret: NewDeviceSecret(), At: clock.Add(time.Hour)}
		want := slices.DeleteFunc(slices.Clone(Rules), func(r string) bool { return r == rule })
		if got := f.assess(t, in); !slices.Equal(got, want) {
			t.Errorf("%s off: %v, want %v", rule, got, want)
		}
	}

	f := newFixture(t, url, DefaultConfig())
	f.svc.geo = nil
	ada := f.user(t)
	device := NewDeviceSecret()
	f.success(t, ada, london, device, clock)
	if got := f.assess(t, Input{UserID: ada, IP: sydney, DeviceSecret: device, At: clock.Add(time.Minute)}); got != nil {
		t.Fatalf("without a Geo: %v", got)
	}
}

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		name                   string
		lat1, lon1, lat2, lon2 float64
		km                     float64
	}{
		{"London-Paris", 51.5072, -0.1276, 48.8566, 2.3522, 344},
		{"London-New York", 51.5072, -0.1276, 40.7128, -74.0060, 5570},
		{"London-Sydney", 51.5072, -0.1276, -33.8688, 151.2093, 16994},
		{"across the date line", 0, 179.5, 0, -179.5, 111},
		{"antipodes", 0, 0, 0, 180, math.Pi * earthRadius},
		{"the same place", 10, 10, 10, 10, 0},
	} {
		got := distance(c.lat1, c.lon1, c.lat2, c.lon2)
		back := distance(c.lat2, c.lon2, c.lat1, c.lon1)
		if math.Abs(got-c.km) > 0.005*c.km+1 || math.Abs(got-back) > 1e-6 {
			t.Errorf("%s: %.1f km (back %.1f), want %.0f", c.name, got, back, c.km)
		}
	}
}

func TestNewDeviceSecret(t *testing.T) {
	a, b := NewDeviceSecret(), NewDeviceSecret()
	if len(a) != 43 || a == b {
		t.Fatalf("secrets %q %q", a, b)
	}
}
