// Package risk tells a sign-in that looks unlike the person's own from one
// that does, so that sign-in can ask for a second factor (a step-up). It is
// asked at the check-email and password steps of sign-in, hosted and
// embedded, and told of every failure and success. Four rules:
//
//   - velocity: the address has failed many sign-ins, for several e-mail
//     addresses, in a short while (a password spray or credential stuffing);
//   - new_device: the browser's device cookie is not among the person's
//     known devices (or it has none);
//   - unusual_location: the address is located in a country none of the
//     person's recent sign-ins came from;
//   - impossible_travel: reaching the address's location from the last
//     located sign-in's, in the time since, is faster than an airliner.
//
// A person with no sign-in remembered (a new account, or the first sign-in
// since the engine was enabled) is compared with nothing: only velocity can
// trigger. The location rules need a Geo (an IP-geolocation source); without
// one they never trigger. No HTTP here: the device cookie is set and read by
// the HTTP layer, and the auth events of triggered rules are written by
// sign-in (persistence.EventRiskTriggered, reason the rule's name).
package risk

import (
	"context"
	"crypto/subtle"
	"math"
	"net/netip"
	"time"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Names of the rules: stable, they are written to the auth event log and
// named in IDENTITYD_RISK_DISABLED.
const (
	RuleNewDevice        = "new_device"
	RuleVelocity         = "velocity"
	RuleUnusualLocation  = "unusual_location"
	RuleImpossibleTravel = "impossible_travel"
)

// Rules lists every rule, in the order an Assessment names them.
var Rules = []string{RuleVelocity, RuleNewDevice, RuleUnusualLocation, RuleImpossibleTravel}

// What the rules compare with, and their thresholds.
const (
	// Keep is how many devices and how many sign-ins are remembered per
	// person, the most recent of each: enough for the browsers and
	// countries of a person's ordinary life, bounded so that a person's
	// history stays a few rows whatever their age.
	Keep = 20

	// Velocity triggers for an address with at least VelocityFailures
	// failed sign-ins over at least VelocityEmails distinct e-mail
	// addresses (the one being tried counts) in the last VelocityWindow.
	// One person mistyping their password fails for one e-mail; a
	// household or office behind one address rarely for three; a spray
	// tries many.
	VelocityFailures = 10
	VelocityEmails   = 3
	VelocityWindow   = 10 * time.Minute

	// Impossible travel: faster than MaxTravelSpeed (km/h, faster than
	// airliners cruise) over at least MinTravelDistance (km: nearer
	// locations are within the error of IP geolocation, and of a mobile
	// network's exit points).
	MaxTravelSpeed    = 1000.0
	MinTravelDistance = 500.0
)

// PurposeDeviceCookie is the purpose of the key device cookie secrets are
// hashed with (see oauth.DeriveKey).
const PurposeDeviceCookie = "device cookie"

// Store is what the risk engine needs from storage.
type Store interface {
	RiskHistory(ctx context.Context, userID string) (*persistence.RiskHistory, error)
}

// Service applies the rules; it is safe for concurrent use.
type Service struct {
	store    Store
	cfg      Config
	geo      Geo // nil: the location rules never trigger
	devices  *oauth.SecretHasher
	failures *failures
}

// New makes the service; geo may be nil (see Config.OpenGeo).
func New(store Store, systemSecret []byte, cfg Config, geo Geo) *Service {
	return &Service{
		store: store, cfg: cfg, geo: geo,
		devices:  oauth.NewHasher(systemSecret, PurposeDeviceCookie),
		failures: newFailures(maxAddresses),
	}
}

// NewDeviceSecret is the secret of a new device cookie: 256 bits from
// crypto/rand. The HTTP layer sets it, long-lived, on a browser without one,
// and passes it back in every Input and RecordSuccess.
func NewDeviceSecret() string { return oauth.NewSecret() }

// Input is one sign-in attempt to assess.
type Input struct {
	UserID       string     // "" when the e-mail is not a known person's
	Email        string     // as typed; counts as one of the address's e-mails for velocity
	IP           netip.Addr // the client's address (invalid: unknown)
	DeviceSecret string     // the device cookie's secret, "" without one
	NoDevice     bool       // the channel carries no device cookie (the embedded API): new_device is not assessed
	At           time.Time  // when; zero: now
}

// Assessment is what the rules found: the names of those that triggered,
// in the order of Rules, and whether sign-in must ask for a second factor.
type Assessment struct {
	Rules  []string
	StepUp bool
}

func (a *Assessment) trigger(rule string) {
	a.Rules = append(a.Rules, rule)
	a.StepUp = true
}

// Assess applies the enabled rules to an attempt. It writes nothing; an
// error is the store's (the caller chooses: refuse, or step up anyway).
func (s *Service) Assess(ctx context.Context, in Input) (Assessment, error) {
	at := in.At
	if at.IsZero() {
		at = extensions.Now()
	}
	var a Assessment
	if s.cfg.Velocity && s.failures.suspicious(in.IP, in.Email, at) {
		a.trigger(RuleVelocity)
	}
	locating := s.geo != nil && (s.cfg.UnusualLocation || s.cfg.ImpossibleTravel)
	if in.UserID == "" || !(s.cfg.NewDevice || locating) {
		return a, nil // the other rules compare with a person's history
	}
	h, err := s.store.RiskHistory(ctx, in.UserID)
	if err != nil {
		return Assessment{}, err
	}
	// A person with no sign-in remembered has nothing to be unlike and is
	// not stepped up: a new account, and every existing person once when
	// the engine is first enabled (rather than all of them at once). The
	// price: a stolen password used before its owner's first sign-in
	// passes these rules (velocity and the rate limits still apply).
	first := len(h.DeviceHashes) == 0 && len(h.SignIns) == 0
	if s.cfg.NewDevice && !first && !in.NoDevice && !s.knownDevice(h.DeviceHashes, in.DeviceSecret) {
		a.trigger(RuleNewDevice)
	}
	if !first && locating {
		if here, ok := s.locate(in.IP); ok {
			if s.cfg.UnusualLocation && unusualCountry(h.SignIns, here.Country) {
				a.trigger(RuleUnusualLocation)
			}
			if s.cfg.ImpossibleTravel && impossibleTravel(h.SignIns, here, at) {
				a.trigger(RuleImpossibleTravel)
			}
		}
	}
	return a, nil
}

// RecordFailure counts a failed sign-in from ip for email, for velocity.
// The count is kept in this process's memory (see failures).
func (s *Service) RecordFailure(_ context.Context, ip netip.Addr, email string, at time.Time) {
	if !s.cfg.Velocity {
		return
	}
	if at.IsZero() {
		at = extensions.Now()
	}
	s.failures.add(ip, email, at)
}

// SignIn is a successful sign-in as the rules remember it: its device
// (when it has a device cookie) and its location (when its address is
// located), the person keeping Keep of each. The sign-in writes it with
// its session (persistence.Opening). It holds whatever rules are enabled,
// so that a rule turned on later has a history.
func (s *Service) SignIn(userID string, ip netip.Addr, deviceSecret string, at time.Time) persistence.RiskSignIn {
	if at.IsZero() {
		at = extensions.Now()
	}
	r := persistence.RiskSignIn{UserID: userID, Location: persistence.SignInLocation{At: at}, Keep: Keep}
	if deviceSecret != "" { // a sign-in without a cookie has no device to remember
		r.DeviceHash = s.deviceHash(deviceSecret)
	}
	if here, ok := s.locate(ip); ok {
		r.Location.Country, r.Location.Lat, r.Location.Lon = here.Country, here.Lat, here.Lon
	}
	return r
}

func (s *Service) deviceHash(secret string) []byte {
	h, _ := s.devices.Hash(context.Background(), []byte(secret)) // an HMAC: never fails
	return h
}

// knownDevice tells whether secret's hash is among the known ones,
// comparing each in constant time. No cookie is no known device.
func (s *Service) knownDevice(known [][]byte, secret string) bool {
	if secret == "" {
		return false
	}
	h := s.deviceHash(secret)
	found := 0
	for _, k := range known {
		found |= subtle.ConstantTimeCompare(k, h)
	}
	return found == 1
}

func (s *Service) locate(ip netip.Addr) (Location, bool) {
	if s.geo == nil || !ip.IsValid() {
		return Location{}, false
	}
	return s.geo.Locate(ip)
}

// unusualCountry tells whether country is none of the located recent
// sign-ins' countries; with none located there is nothing to compare.
func unusualCountry(signIns []persistence.SignInLocation, country string) bool {
	located := false
	for _, si := range signIns {
		if si.Country == "" {
			continue
		}
		if si.Country == country {
			return false
		}
		located = true
	}
	return located
}

// impossibleTravel compares with the most recent located sign-in: one
// from an address that was not located tells nothing of where the person
// was, and skipping it only lengthens the time allowed.
func impossibleTravel(signIns []persistence.SignInLocation, here Location, at time.Time) bool {
	for _, si := range signIns { // most recent first
		if si.Country == "" {
			continue
		}
		km := distance(si.Lat, si.Lon, here.Lat, here.Lon)
		if km < MinTravelDistance {
			return false
		}
		hours := at.Sub(si.At).Hours()
		return hours <= 0 || km/hours > MaxTravelSpeed
	}
	return false
}

// earthRadius is the Earth's mean radius in km (IUGG).
const earthRadius = 6371.0088

// distance is the great-circle distance in km between two points given in
// degrees (the haversine formula; the Earth as a sphere errs by under 0.5%,
// far less than geolocation does).
func distance(lat1, lon1, lat2, lon2 float64) float64 {
	rad := math.Pi / 180
	dLat, dLon := (lat2-lat1)*rad, (lon2-lon1)*rad
	a := math.Sin(dLat/2)*math.Sin(dLat/2) + math.Cos(lat1*rad)*math.Cos(lat2*rad)*math.Sin(dLon/2)*math.Sin(dLon/2)
	return 2 * earthRadius * math.Asin(math.Sqrt(min(a, 1)))
}
