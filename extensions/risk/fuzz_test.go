package risk

import (
	"fmt"
	"strings"
	"testing"
)

// The geolocation file is the operator's, but may come from anywhere: no
// line panics the parser, and what it accepts is a valid range that reads
// back the same when written out again.
func FuzzParseRange(f *testing.F) {
	for _, seed := range []string{
		"192.0.2.0,192.0.2.255,GB,51.5072,-0.1276",
		"2001:db8::,2001:db8::ffff,nz,-41.2866,174.7756",
		"::ffff:192.0.2.0,::ffff:192.0.2.9,IE,53.3,-6.26",
		" 0.0.0.0 , 255.255.255.255 , ZZ , 90 , -180 ",
		"10.0.0.9,10.0.0.1,GB,1,1",
		"10.0.0.0,::1,GB,1,1",
		"fe80::%eth0,fe80::1,GB,1,1",
		"1.2.3.4,1.2.3.4,GB,NaN,1e400",
		"1.2.3.4,1.2.3.4,GB,0x1p-2,-0",
		`"1.0.0.0","1.0.0.255","AU","-33.49","143.21"`,
		"1.0.0.0/24,1,AU,1,1",
		",,,,",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		r, err := parseRange(line)
		if err != nil {
			return
		}
		if r.start.Is4() != r.end.Is4() || r.start.Is4In6() || r.end.Is4In6() || r.start.Zone() != "" || r.start.Compare(r.end) > 0 {
			t.Fatalf("%q: range %s-%s", line, r.start, r.end)
		}
		if len(r.loc.Country) != 2 || strings.ToUpper(r.loc.Country) != r.loc.Country {
			t.Fatalf("%q: country %q", line, r.loc.Country)
		}
		if !(r.loc.Lat >= -90 && r.loc.Lat <= 90 && r.loc.Lon >= -180 && r.loc.Lon <= 180) {
			t.Fatalf("%q: coordinates %v,%v", line, r.loc.Lat, r.loc.Lon)
		}
		again, err := parseRange(fmt.Sprintf("%s,%s,%s,%v,%v", r.start, r.end, r.loc.Country, r.loc.Lat, r.loc.Lon))
		if err != nil || again != r {
			t.Fatalf("%q: written out and read again: %+v %v, was %+v", line, again, err, r)
		}
	})
}
