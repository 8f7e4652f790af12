package risk

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Location is where an address is: its country (ISO 3166-1 alpha-2, upper
// case) and coordinates in degrees.
type Location struct {
	Country  string
	Lat, Lon float64
}

// Geo locates addresses: the location rules' source, pluggable. Locate
// answers false for an address it does not know (private ranges, say).
type Geo interface {
	Locate(ip netip.Addr) (Location, bool)
}

// FileGeo is a Geo read from a CSV file the operator provides
// (IDENTITYD_GEOIP_FILE; none is shipped). The format, one range per line:
//
//	start_ip,end_ip,country,lat,lon
//	192.0.2.0,192.0.2.255,GB,51.5072,-0.1276
//	2001:db8::,2001:db8:ffff:ffff:ffff:ffff:ffff:ffff,NZ,-41.2866,174.7756
//
// start_ip and end_ip bound the range, both included: two IPv4 or two IPv6
// addresses (an IPv4-mapped IPv6 address counts as IPv4), start not after
// end. country is two ASCII letters (any case); lat in [-90, 90] and lon in
// [-180, 180] are decimal degrees. Fields are trimmed of spaces; there is
// no quoting (no field holds a comma). Blank lines, lines beginning with
// '#' and a first line that is the header above are skipped. The lines may
// come in any order, but no two ranges may overlap. A file that breaks any
// of this is refused whole, with the number of the line at fault.
//
// The ranges are held in one slice sorted by address and searched by
// binary search: under 100 bytes a range (a city-level database of three
// million ranges takes some 270 MB; a country-level one, a few MB).
type FileGeo struct {
	ranges []geoRange
}

var _ Geo = (*FileGeo)(nil)

type geoRange struct {
	start, end netip.Addr
	loc        Location
	line       int // in the file, for errors while loading
}

// geoHeader is the optional first line.
const geoHeader = "start_ip,end_ip,country,lat,lon"

// LoadGeoFile reads a geolocation file (see FileGeo).
func LoadGeoFile(path string) (*FileGeo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("geolocation file: %w", err)
	}
	defer f.Close()
	g, err := ReadGeo(f)
	if err != nil {
		return nil, fmt.Errorf("geolocation file %s: %w", path, err)
	}
	return g, nil
}

// ReadGeo reads the ranges of a geolocation file (see FileGeo) from r.
func ReadGeo(r io.Reader) (*FileGeo, error) {
	sc := bufio.NewScanner(r)
	countries := map[string]string{} // one string per country, not per range
	var ranges []geoRange
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || (n == 1 && strings.EqualFold(strings.ReplaceAll(line, " ", ""), geoHeader)) {
			continue
		}
		rg, err := parseRange(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if c, ok := countries[rg.loc.Country]; ok {
			rg.loc.Country = c
		} else {
			countries[rg.loc.Country] = rg.loc.Country
		}
		rg.line = n
		ranges = append(ranges, rg)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	if len(ranges) == 0 {
		return nil, errors.New("no ranges")
	}
	// Addr.Compare orders IPv4 before IPv6: one slice holds both.
	slices.SortFunc(ranges, func(a, b geoRange) int { return a.start.Compare(b.start) })
	for i := 1; i < len(ranges); i++ {
		if prev, r := ranges[i-1], ranges[i]; r.start.Compare(prev.end) <= 0 {
			return nil, fmt.Errorf("line %d: range %s-%s overlaps line %d's %s-%s", r.line, r.start, r.end, prev.line, prev.start, prev.end)
		}
	}
	return &FileGeo{ranges: ranges}, nil
}

// parseRange reads one line of a geolocation file.
func parseRange(line string) (geoRange, error) {
	fields := strings.Split(line, ",")
	if len(fields) != 5 {
		return geoRange{}, fmt.Errorf("%d fields, want 5: start_ip,end_ip,country,lat,lon", len(fields))
	}
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	var r geoRange
	var err error
	if r.start, err = parseRangeAddr(fields[0]); err != nil {
		return geoRange{}, fmt.Errorf("start_ip: %w", err)
	}
	if r.end, err = parseRangeAddr(fields[1]); err != nil {
		return geoRange{}, fmt.Errorf("end_ip: %w", err)
	}
	if r.start.Is4() != r.end.Is4() {
		return geoRange{}, errors.New("start_ip and end_ip are not both IPv4 or both IPv6")
	}
	if r.start.Compare(r.end) > 0 {
		return geoRange{}, errors.New("start_ip is after end_ip")
	}
	c := fields[2]
	if len(c) != 2 || !isLetter(c[0]) || !isLetter(c[1]) {
		return geoRange{}, fmt.Errorf("country %q is not two letters (ISO 3166-1 alpha-2)", c)
	}
	r.loc.Country = strings.ToUpper(c)
	if r.loc.Lat, err = parseDegrees(fields[3], 90); err != nil {
		return geoRange{}, fmt.Errorf("lat: %w", err)
	}
	if r.loc.Lon, err = parseDegrees(fields[4], 180); err != nil {
		return geoRange{}, fmt.Errorf("lon: %w", err)
	}
	return r, nil
}

func parseRangeAddr(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q has a zone", s)
	}
	return ip.Unmap(), nil
}

func isLetter(b byte) bool { return ('a' <= b && b <= 'z') || ('A' <= b && b <= 'Z') }

// parseDegrees reads decimal degrees within [-limit, limit].
func parseDegrees(s string, limit float64) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || v < -limit || v > limit {
		return 0, fmt.Errorf("%q is not a number of degrees from %v to %v", s, -limit, limit)
	}
	return v, nil
}

// Locate implements Geo.
func (g *FileGeo) Locate(ip netip.Addr) (Location, bool) {
	if !ip.IsValid() {
		return Location{}, false
	}
	ip = ip.Unmap().WithZone("")
	// Ranges do not overlap, so their ends are sorted as their starts: the
	// first range ending at or after ip is the only one that can hold it.
	i, _ := slices.BinarySearchFunc(g.ranges, ip, func(r geoRange, ip netip.Addr) int {
		if r.end.Compare(ip) < 0 {
			return -1
		}
		return 1
	})
	if i < len(g.ranges) && g.ranges[i].start.Compare(ip) <= 0 {
		return g.ranges[i].loc, true
	}
	return Location{}, false
}

// Len is the number of ranges.
func (g *FileGeo) Len() int { return len(g.ranges) }
