// Package webhooks sends signed HTTP notifications of the events in
// identityd's logs (issue 18), after Standard Webhooks
// (https://www.standardwebhooks.com): an endpoint names the event types it
// wants; every entry of those types is written, in the transaction that
// logs it, to an outbox (persistence/webhooks.go) that a dispatcher
// delivers at least once, in order per endpoint while it answers, retried
// over more than a day. No HTTP serving here (handlers/webhooks.go).
package webhooks

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateWebhookEndpoint(ctx context.Context, e *persistence.WebhookEndpoint) error
	GetWebhookEndpoint(ctx context.Context, id string) (*persistence.WebhookEndpoint, error)
	ListWebhookEndpoints(ctx context.Context, p persistence.Page) ([]persistence.WebhookEndpoint, int, error)
	UpdateWebhookEndpoint(ctx context.Context, id string, now time.Time, fn func(*persistence.WebhookEndpoint) error) (*persistence.WebhookEndpoint, error)
	DeleteWebhookEndpoint(ctx context.Context, id string) error
	QueueWebhook(ctx context.Context, d *persistence.WebhookDelivery) error
	DueWebhookEndpoints(ctx context.Context, now time.Time, limit int) ([]string, error)
	ClaimWebhookEndpoint(ctx context.Context, id string, now, until time.Time) (bool, error)
	ReleaseWebhookEndpoint(ctx context.Context, id string) error
	DueWebhooks(ctx context.Context, endpointID string, now time.Time, limit int) ([]persistence.WebhookDelivery, error)
	RecordWebhookAttempt(ctx context.Context, d *persistence.WebhookDelivery, a persistence.Attempt) (bool, error)
	ListWebhookDeliveries(ctx context.Context, f persistence.WebhookFilter, p persistence.Page) ([]persistence.WebhookDelivery, int, error)
	GetWebhookDelivery(ctx context.Context, endpointID, id string) (*persistence.WebhookDelivery, error)
	RedeliverWebhook(ctx context.Context, endpointID, id string, now time.Time) (*persistence.WebhookDelivery, error)
	DeleteDeliveredWebhooks(ctx context.Context, before time.Time) (int64, error)
}

// Bounds.
const (
	MaxEndpoints      = 100
	MaxDescription    = 500
	MaxURL            = 2000
	SecretBytes       = 32             // Standard Webhooks: 24 to 64 bytes
	RotationGrace     = 24 * time.Hour // the previous secret signs too, for this long
	secretPrefix      = "whsec_"
	disabledByRequest = "disabled"
)

// Refusals.
var (
	ErrTooMany = extensions.Conflict("too_many_endpoints", "There are as many webhook endpoints as the server allows; delete some first.",
		map[string]any{"max": MaxEndpoints})
	ErrDisabled = extensions.Conflict("endpoint_disabled", "The endpoint is disabled; enable it (PATCH enabled: true) first.", nil)
)

// Config is how the service is set up.
type Config struct {
	// AllowPrivate allows http URLs and endpoints on private, loopback and
	// link-local addresses (IDENTITYD_WEBHOOK_ALLOW_PRIVATE: tests and
	// closed networks). Off, they are refused at creation when the URL names
	// such an address, and at connect time whatever the name resolves to.
	AllowPrivate bool
	Now          func() time.Time
}

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	sealer *oauth.Sealer
	cfg    Config
}

// SealPurpose is the purpose of the key endpoints' secrets are sealed with.
const SealPurpose = "webhook secrets"

// New returns a Service sealing secrets with a key derived from the
// system secret for SealPurpose alone.
func New(store Store, systemSecret []byte, cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = extensions.Now
	}
	return &Service{store: store, sealer: oauth.NewSealer(systemSecret, SealPurpose), cfg: cfg}
}

// Input is what an endpoint is created with.
type Input struct {
	URL         string   `json:"url"`
	Description string   `json:"description"`
	EventTypes  []string `json:"eventTypes"`
}

// Patch is a change to an endpoint: nil fields stay.
type Patch struct {
	URL         *string   `json:"url"`
	Description *string   `json:"description"`
	EventTypes  *[]string `json:"eventTypes"`
	Enabled     *bool     `json:"enabled"`
}

func (s *Service) checkURL(v *extensions.ValidationError, raw string) {
	if err := s.validURL(raw); err != nil {
		v.Add("url", "%s", err.Error())
	}
}

// validURL: absolute, no user info or fragment, https; and unless private
// addresses are allowed, not naming one literally (names are checked when
// they are dialled: see guard).
func (s *Service) validURL(raw string) error {
	if len(raw) > MaxURL {
		return errors.New("must be at most 2000 characters")
	}
	if !extensions.ValidText(raw) {
		return errors.New("must be a URL")
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "":
		return errors.New("must be an absolute URL")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return errors.New("must not contain a fragment")
	case u.User != nil:
		return errors.New("must not contain user information")
	case u.Scheme != "https" && !(u.Scheme == "http" && s.cfg.AllowPrivate):
		return errors.New("scheme must be https")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return errors.New("must have a port from 1 to 65535")
		}
	}
	if numericHost(u.Host, u.Hostname()) {
		return errors.New("must name its host as a DNS name, an IPv4 address in dotted-quad form (such as 192.0.2.1) or an IPv6 address in brackets")
	}
	if s.cfg.AllowPrivate {
		return nil
	}
	host := strings.TrimSuffix(u.Hostname(), ".") // "localhost." is localhost
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return errors.New("must not name a loopback, private or link-local address")
	}
	if ip, err := netip.ParseAddr(host); err == nil && !public(ip) {
		return errors.New("must not name a loopback, private or link-local address")
	}
	return nil
}

// numericHost tells whether a URL's host is a number in a form other than
// canonical dotted-quad IPv4 or bracketed IPv6: 2130706433, 127.1,
// 0x7f000001, 0177.0.0.1, 127.0.0.1. (trailing dot). Some resolvers read
// such hosts as addresses (inet_aton), Go's as names that never resolve,
// and the WHATWG URL standard as IPv4 whenever the last label is a number
// ("ends in a number"): refused, whatever private addresses are allowed,
// rather than stored and never reached.
func numericHost(host, name string) bool {
	if strings.HasPrefix(host, "[") { // an IPv6 literal; url.Parse has checked it
		return false
	}
	if ip, err := netip.ParseAddr(name); err == nil && ip.Is4() {
		return false // dotted quad, no leading zeros (netip refuses them)
	}
	labels := strings.Split(strings.ToLower(name), ".")
	last := labels[len(labels)-1]
	if last == "" && len(labels) > 1 {
		last = labels[len(labels)-2] // "127.0.0.1.": the label before the root
	}
	return last != "" && (strings.Trim(last, "0123456789") == "" ||
		strings.HasPrefix(last, "0x") && strings.Trim(last[2:], "0123456789abcdef") == "")
}

func checkTypes(v *extensions.ValidationError, types []string) []string {
	if len(types) == 0 {
		v.Add("eventTypes", "must name at least one event type")
		return nil
	}
	if len(types) > len(Catalog) {
		v.Add("eventTypes", "must name at most %d event types", len(Catalog))
		return nil
	}
	for _, t := range types {
		if !known(t) {
			v.Add("eventTypes", "%q is not an event type (see GET /api/v1/webhooks/event-types)", extensions.Truncate(t, 64))
			return nil
		}
	}
	out := extensions.Distinct(types)
	slices.Sort(out)
	return out
}

// NewSecret returns a fresh signing secret in the Standard Webhooks form,
// whsec_ and the base64 of random bytes.
func NewSecret() (string, error) {
	b := make([]byte, SecretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return secretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// seal and open keep secrets at rest: signing needs them in the clear, so
// they are sealed (bound to the endpoint id) rather than hashed.
func (s *Service) seal(id, secret string) []byte { return s.sealer.Seal([]byte(secret), []byte(id)) }

func (s *Service) open(id string, sealed []byte) (string, error) {
	plain, err := s.sealer.Open(sealed, []byte(id))
	return string(plain), err
}

// Create adds an endpoint and answers it with its secret, shown this once.
func (s *Service) Create(ctx context.Context, in Input) (*persistence.WebhookEndpoint, string, error) {
	var v extensions.ValidationError
	s.checkURL(&v, in.URL)
	v.CheckText("description", in.Description, false, MaxDescription)
	types := checkTypes(&v, in.EventTypes)
	if err := v.Err(); err != nil {
		return nil, "", err
	}
	if _, total, err := s.store.ListWebhookEndpoints(ctx, persistence.Page{Limit: 1}); err != nil {
		return nil, "", err
	} else if total >= MaxEndpoints {
		return nil, "", ErrTooMany
	}
	secret, err := NewSecret()
	if err != nil {
		return nil, "", err
	}
	now := s.cfg.Now()
	e := &persistence.WebhookEndpoint{ID: uuid.Must(uuid.NewV7()).String(), URL: in.URL, Description: in.Description, EventTypes: types,
		Enabled: true, LeaseUntil: time.Unix(0, 0).UTC(), CreatedAt: now, UpdatedAt: now}
	e.Secret = s.seal(e.ID, secret)
	if err := s.store.CreateWebhookEndpoint(ctx, e); err != nil {
		return nil, "", err
	}
	return e, secret, nil
}

// ids checks record ids before they reach the store: anything but a UUID
// names no record.
func ids(id ...string) error {
	for _, v := range id {
		if uuid.Validate(v) != nil {
			return persistence.ErrNotFound
		}
	}
	return nil
}

// Get reads an endpoint.
func (s *Service) Get(ctx context.Context, id string) (*persistence.WebhookEndpoint, error) {
	if err := ids(id); err != nil {
		return nil, err
	}
	return s.store.GetWebhookEndpoint(ctx, id)
}

// List returns one page of endpoints and the total.
func (s *Service) List(ctx context.Context, p persistence.Page) ([]persistence.WebhookEndpoint, int, error) {
	return s.store.ListWebhookEndpoints(ctx, p)
}

// Update changes an endpoint. Enabling a disabled endpoint clears its
// failure and has its waiting messages tried at once.
func (s *Service) Update(ctx context.Context, id string, p Patch) (*persistence.WebhookEndpoint, error) {
	var v extensions.ValidationError
	if p.URL != nil {
		s.checkURL(&v, *p.URL)
	}
	if p.Description != nil {
		v.CheckText("description", *p.Description, false, MaxDescription)
	}
	var types []string
	if p.EventTypes != nil {
		types = checkTypes(&v, *p.EventTypes)
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	if err := ids(id); err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	return s.store.UpdateWebhookEndpoint(ctx, id, now, func(e *persistence.WebhookEndpoint) error {
		if p.URL != nil {
			e.URL = *p.URL
		}
		if p.Description != nil {
			e.Description = *p.Description
		}
		if types != nil {
			e.EventTypes = types
		}
		if p.Enabled != nil && *p.Enabled != e.Enabled {
			e.Enabled = *p.Enabled
			e.DisabledReason, e.FailingSince = "", nil
			if !e.Enabled {
				e.DisabledReason = disabledByRequest
			}
		}
		e.UpdatedAt = now
		return nil
	})
}

// Delete removes an endpoint and its messages.
func (s *Service) Delete(ctx context.Context, id string) error {
	if err := ids(id); err != nil {
		return err
	}
	return s.store.DeleteWebhookEndpoint(ctx, id)
}

// RotateSecret gives an endpoint a new secret, answered this once; the
// previous one keeps signing beside it for RotationGrace, so that the
// receiver can switch without losing a message.
func (s *Service) RotateSecret(ctx context.Context, id string) (*persistence.WebhookEndpoint, string, error) {
	if err := ids(id); err != nil {
		return nil, "", err
	}
	secret, err := NewSecret()
	if err != nil {
		return nil, "", err
	}
	now := s.cfg.Now()
	e, err := s.store.UpdateWebhookEndpoint(ctx, id, now, func(e *persistence.WebhookEndpoint) error {
		sealed := s.seal(e.ID, secret)
		until := now.Add(RotationGrace)
		e.OldSecret, e.OldSecretUntil, e.Secret, e.UpdatedAt = e.Secret, &until, sealed, now
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return e, secret, nil
}

// Test queues a webhook.test message for one endpoint.
func (s *Service) Test(ctx context.Context, id string) (*persistence.WebhookDelivery, error) {
	e, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if !e.Enabled {
		return nil, ErrDisabled
	}
	now := s.cfg.Now()
	msg := uuid.Must(uuid.NewV7()).String()
	payload, err := persistence.WebhookPayload(TestEvent, now, map[string]any{"endpointId": e.ID, "eventId": msg})
	if err != nil {
		return nil, err
	}
	d := &persistence.WebhookDelivery{ID: uuid.Must(uuid.NewV7()).String(), EndpointID: e.ID, MessageID: "msg_" + msg, EventType: TestEvent,
		Payload: payload, Status: persistence.DeliveryPending, NextAttemptAt: now, CreatedAt: now}
	return d, s.store.QueueWebhook(ctx, d)
}

// Deliveries returns one page of an endpoint's messages, newest first.
func (s *Service) Deliveries(ctx context.Context, id, status string, p persistence.Page) ([]persistence.WebhookDelivery, int, error) {
	if _, err := s.Get(ctx, id); err != nil {
		return nil, 0, err
	}
	switch status {
	case "", persistence.DeliveryPending, persistence.DeliveryDelivered, persistence.DeliveryFailed:
	default:
		var v extensions.ValidationError
		v.Add("status", "must be pending, delivered or failed")
		return nil, 0, v.Err()
	}
	return s.store.ListWebhookDeliveries(ctx, persistence.WebhookFilter{EndpointID: id, Status: status}, p)
}

// Delivery reads one of an endpoint's messages.
func (s *Service) Delivery(ctx context.Context, id, deliveryID string) (*persistence.WebhookDelivery, error) {
	if err := ids(id, deliveryID); err != nil {
		return nil, err
	}
	return s.store.GetWebhookDelivery(ctx, id, deliveryID)
}

// Redeliver sends a message again, with a new schedule.
func (s *Service) Redeliver(ctx context.Context, id, deliveryID string) (*persistence.WebhookDelivery, error) {
	if err := ids(id, deliveryID); err != nil {
		return nil, err
	}
	return s.store.RedeliverWebhook(ctx, id, deliveryID, s.cfg.Now())
}
