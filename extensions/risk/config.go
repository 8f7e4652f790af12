package risk

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Config says which rules run and where locations come from.
type Config struct {
	NewDevice, Velocity, UnusualLocation, ImpossibleTravel bool
	GeoFile                                                string // "": no geolocation, the location rules never trigger
}

// DefaultConfig runs every rule, without geolocation.
func DefaultConfig() Config {
	return Config{NewDevice: true, Velocity: true, UnusualLocation: true, ImpossibleTravel: true}
}

// LoadConfig reads the risk engine's configuration and reports every
// problem at once:
//
//   - IDENTITYD_RISK_DISABLED: rules turned off, by name, comma-separated
//     (velocity, new_device, unusual_location, impossible_travel), or all;
//     every rule runs by default;
//   - IDENTITYD_GEOIP_FILE: the path of the geolocation file (see FileGeo)
//     the location rules need; it is read by OpenGeo.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.GeoFile = strings.TrimSpace(getenv("IDENTITYD_GEOIP_FILE"))
	var errs []error
	for name := range strings.SplitSeq(getenv("IDENTITYD_RISK_DISABLED"), ",") {
		switch name = strings.TrimSpace(name); name {
		case "":
		case "all":
			c.NewDevice, c.Velocity, c.UnusualLocation, c.ImpossibleTravel = false, false, false, false
		case RuleNewDevice:
			c.NewDevice = false
		case RuleVelocity:
			c.Velocity = false
		case RuleUnusualLocation:
			c.UnusualLocation = false
		case RuleImpossibleTravel:
			c.ImpossibleTravel = false
		default:
			errs = append(errs, fmt.Errorf("IDENTITYD_RISK_DISABLED: %q is not a rule (%s, or all)", name, strings.Join(Rules, ", ")))
		}
	}
	return c, errors.Join(errs...)
}

// Enabled lists the rules that run, in the order of Rules.
func (c Config) Enabled() []string {
	on := map[string]bool{RuleNewDevice: c.NewDevice, RuleVelocity: c.Velocity, RuleUnusualLocation: c.UnusualLocation, RuleImpossibleTravel: c.ImpossibleTravel}
	return slices.DeleteFunc(slices.Clone(Rules), func(r string) bool { return !on[r] })
}

// OpenGeo loads the geolocation file; without one it returns a nil Geo
// (an untyped nil: New's geo == nil tells the location rules to rest).
func (c Config) OpenGeo() (Geo, error) {
	if c.GeoFile == "" {
		return nil, nil
	}
	g, err := LoadGeoFile(c.GeoFile)
	if err != nil {
		return nil, err
	}
	return g, nil
}
