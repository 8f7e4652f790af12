package risk

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadGeo(t *testing.T) {
	// Out of order, with a header, a comment, a blank line, CRLF line
	// ends, spaces, lower-case countries and an IPv4-mapped range.
	file := "start_ip, end_ip, country, lat, lon\r\n" +
		"# test ranges\r\n" +
		"2001:db8::,2001:db8:0:ffff:ffff:ffff:ffff:ffff,nz,-41.2866,174.7756\r\n" +
		"\r\n" +
		" 192.0.2.0 , 192.0.2.127 , GB , 51.5072 , -0.1276 \r\n" +
		"::ffff:192.0.2.128,::ffff:192.0.2.255,IE,53.3498,-6.2603\r\n" +
		"2001:db8:1::,2001:db8:1::,US,40.7128,-74.006\r\n" +
		"0.0.0.0,0.0.0.0,ZZ,0,0\r\n" +
		"255.255.255.255,255.255.255.255,ZZ,90,180\r\n"
	g, err := ReadGeo(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if g.Len() != 6 {
		t.Fatalf("%d ranges, want 6", g.Len())
	}
	nz := Location{"NZ", -41.2866, 174.7756}
	gb := Location{"GB", 51.5072, -0.1276}
	for _, c := range []struct {
		ip   string
		want Location
		ok   bool
	}{
		{"192.0.2.0", gb, true},
		{"192.0.2.127", gb, true},
		{"192.0.2.128", Location{"IE", 53.3498, -6.2603}, true},
		{"::ffff:192.0.2.5", gb, true}, // a mapped address is the IPv4 one
		{"192.0.3.0", Location{}, false},
		{"192.0.1.255", Location{}, false},
		{"0.0.0.0", Location{"ZZ", 0, 0}, true},
		{"255.255.255.255", Location{"ZZ", 90, 180}, true},
		{"2001:db8::", nz, true},
		{"2001:db8::1%eth0", nz, true},
		{"2001:db8:0:ffff:ffff:ffff:ffff:ffff", nz, true},
		{"2001:db8:1::", Location{"US", 40.7128, -74.006}, true},
		{"2001:db8:1::1", Location{}, false},
		{"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", Location{}, false},
		{"::", Location{}, false},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Location{}, false},
		{"::c000:205", Location{}, false}, // IPv4-compatible (not mapped): IPv6, not 192.0.2.5
	} {
		got, ok := g.Locate(netip.MustParseAddr(c.ip))
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %+v %v, want %+v %v", c.ip, got, ok, c.want, c.ok)
		}
	}
	if _, ok := g.Locate(netip.Addr{}); ok {
		t.Error("the zero address was located")
	}
}

func TestReadGeoRefuses(t *testing.T) {
	good := "192.0.2.0,192.0.2.255,GB,51.5,-0.1"
	for _, c := range []struct {
		name, file, want string
	}{
		{"empty", "", "no ranges"},
		{"only a header and comments", geoHeader + "\n# nothing\n", "no ranges"},
		{"too few fields", good + "\n10.0.0.0,10.0.0.255,GB,51.5\n", "line 2: 4 fields, want 5"},
		{"too many fields", "10.0.0.0,10.0.0.255,GB,51.5,-0.1,x\n", "line 1: 6 fields"},
		{"a quoted field", `"10.0.0.0","10.0.0.255","GB","51.5","-0.1"` + "\n", `line 1: start_ip: "\"10.0.0.0\"" is not an IP address`},
		{"a CIDR", "10.0.0.0/8,10.255.255.255,GB,1,1\n", "line 1: start_ip"},
		{"a bad end", "10.0.0.0,10.0.0.256,GB,1,1\n", "line 1: end_ip"},
		{"a zone", "fe80::%eth0,fe80::ffff,GB,1,1\n", `line 1: start_ip: "fe80::%eth0" has a zone`},
		{"mixed families", "10.0.0.0,::ffff:ffff,GB,1,1\n", "line 1: start_ip and end_ip are not both"},
		{"backwards", "10.0.0.9,10.0.0.1,GB,1,1\n", "line 1: start_ip is after end_ip"},
		{"a three-letter country", "10.0.0.0,10.0.0.1,GBR,1,1\n", `line 1: country "GBR"`},
		{"no country", "10.0.0.0,10.0.0.1,,1,1\n", `line 1: country ""`},
		{"a non-ASCII country", "10.0.0.0,10.0.0.1,É,1,1\n", "line 1: country"},
		{"latitude out of range", "10.0.0.0,10.0.0.1,GB,90.5,1\n", `line 1: lat: "90.5" is not a number of degrees from -90 to 90`},
		{"longitude out of range", "10.0.0.0,10.0.0.1,GB,1,-180.01\n", "line 1: lon:"},
		{"NaN", "10.0.0.0,10.0.0.1,GB,NaN,1\n", "line 1: lat:"},
		{"infinity", "10.0.0.0,10.0.0.1,GB,1,Inf\n", "line 1: lon:"},
		{"words", "10.0.0.0,10.0.0.1,GB,north,1\n", "line 1: lat:"},
		{"the header later", good + "\n" + geoHeader + "\n", "line 2: start_ip"},
		{"overlapping ranges", "# a\n" + good + "\n192.0.2.255,192.0.3.0,FR,48.9,2.4\n", "line 3: range 192.0.2.255-192.0.3.0 overlaps line 2's 192.0.2.0-192.0.2.255"},
		{"a range inside another", "10.0.0.5,10.0.0.6,FR,1,1\n" + good + "\n10.0.0.0,10.0.0.255,GB,1,1\n", "line 1: range 10.0.0.5-10.0.0.6 overlaps line 3's"},
		{"a mapped range overlapping", good + "\n::ffff:192.0.2.9,::ffff:192.0.2.9,FR,1,1\n", "overlaps"},
		{"a line too long", good + "\n" + strings.Repeat("1", 70000) + "\n", "line 2: bufio.Scanner: token too long"},
	} {
		_, err := ReadGeo(strings.NewReader(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

func TestLoadGeoFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "geo.csv")
	if err := os.WriteFile(path, []byte(testGeo), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := LoadGeoFile(path)
	if err != nil || g.Len() != 4 {
		t.Fatalf("%v, %v", g, err)
	}
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte(testGeo+"junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadGeoFile(bad); err == nil || err.Error() != fmt.Sprintf("geolocation file %s: line 6: 1 fields, want 5: start_ip,end_ip,country,lat,lon", bad) {
		t.Fatalf("a malformed file: %v", err)
	}
	if _, err := LoadGeoFile(filepath.Join(dir, "missing.csv")); err == nil || !strings.Contains(err.Error(), "missing.csv") {
		t.Fatalf("a missing file: %v", err)
	}
}

func TestLoadConfig(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	c, err := LoadConfig(env(nil))
	if err != nil || c != DefaultConfig() || len(c.Enabled()) != 4 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	if g, err := c.OpenGeo(); g != nil || err != nil {
		t.Fatalf("no file: %v %v", g, err)
	}
	c, err = LoadConfig(env(map[string]string{"IDENTITYD_RISK_DISABLED": " velocity, new_device ", "IDENTITYD_GEOIP_FILE": " /nonexistent/geo.csv "}))
	if err != nil || c.Velocity || c.NewDevice || !c.UnusualLocation || !c.ImpossibleTravel || c.GeoFile != "/nonexistent/geo.csv" {
		t.Fatalf("two off: %+v %v", c, err)
	}
	if got := c.Enabled(); len(got) != 2 || got[0] != RuleUnusualLocation || got[1] != RuleImpossibleTravel {
		t.Fatalf("enabled: %v", got)
	}
	if g, err := c.OpenGeo(); g != nil || err == nil {
		t.Fatalf("a missing file opened: %v %v", g, err)
	}
	if c, err := LoadConfig(env(map[string]string{"IDENTITYD_RISK_DISABLED": "all"})); err != nil || len(c.Enabled()) != 0 {
		t.Fatalf("all off: %+v %v", c, err)
	}
	_, err = LoadConfig(env(map[string]string{"IDENTITYD_RISK_DISABLED": "velocity,newdevice,geo"}))
	if err == nil || !strings.Contains(err.Error(), `"newdevice" is not a rule`) || !strings.Contains(err.Error(), `"geo" is not a rule`) {
		t.Fatalf("unknown rules: %v", err)
	}
}
