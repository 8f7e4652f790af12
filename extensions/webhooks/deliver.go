package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Schedule is the wait before each retry of a message: the retry schedule
// Standard Webhooks suggests (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h),
// eight attempts over 27 h 35 min. After the last the message has failed;
// a redelivery starts the schedule again.
var Schedule = []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// DisableAfter: an endpoint that has failed without one success for this
// long is disabled (its messages wait; PATCH enabled: true resumes them).
const DisableAfter = 24 * time.Hour

// Delivery bounds.
const (
	attemptTimeout = 15 * time.Second // one request, connection included
	roundTime      = 30 * time.Second // one replica's turn at an endpoint, then the next round
	claimFor       = 2 * time.Minute  // > roundTime + attemptTimeout: a crashed replica's claim lapses
	recordTimeout  = 10 * time.Second // one write of what was sent (an attempt's record, the claim's release)
	dueBatch       = 50
	maxParallel    = 32 // endpoints served at once
	keepDelivered  = 30 * 24 * time.Hour
	errorLength    = 300
)

// Dispatcher delivers the outbox: every tick it looks for endpoints with
// messages due and serves each (one replica at a time, its messages in
// order, one at a time) until nothing is due or its turn ends.
type Dispatcher struct {
	svc    *Service
	client *http.Client
	log    *slog.Logger
	tick   time.Duration
	record time.Duration // recordTimeout; tests shorten it
	slots  chan struct{}
	busy   sync.Map // endpoint ids served by this process now
	wg     sync.WaitGroup
}

// Dispatcher returns the service's dispatcher; Run starts it.
func (s *Service) Dispatcher(log *slog.Logger) *Dispatcher {
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: guard(s.cfg.AllowPrivate)}
	transport := &http.Transport{
		Proxy:                 nil, // never through a proxy: the guard checks the address actually dialled
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: attemptTimeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	client := &http.Client{Transport: transport, Timeout: attemptTimeout,
		// A redirect is an answer, not a new target: it could point anywhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Dispatcher{svc: s, client: client, log: log, tick: 200 * time.Millisecond, record: recordTimeout, slots: make(chan struct{}, maxParallel)}
}

// Run delivers until ctx ends, then waits for the attempts under way.
func (d *Dispatcher) Run(ctx context.Context) {
	t := time.NewTicker(d.tick)
	defer t.Stop()
	sweep := time.NewTicker(time.Hour)
	defer sweep.Stop()
	for {
		d.round(ctx)
		select {
		case <-ctx.Done():
			d.wg.Wait()
			return
		case <-t.C:
		case <-sweep.C:
			if n, err := d.svc.store.DeleteDeliveredWebhooks(ctx, d.svc.cfg.Now().Add(-keepDelivered)); err != nil {
				d.log.Warn("dropping old webhook deliveries failed", "error", err.Error())
			} else if n > 0 {
				d.log.Info("dropped old webhook deliveries", "count", n)
			}
		}
	}
}

func (d *Dispatcher) round(ctx context.Context) {
	ids, err := d.svc.store.DueWebhookEndpoints(ctx, d.svc.cfg.Now(), maxParallel)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Error("reading the webhook outbox failed", "error", err.Error())
		}
		return
	}
	for _, id := range ids {
		if _, served := d.busy.LoadOrStore(id, true); served {
			continue
		}
		select {
		case d.slots <- struct{}{}:
		default: // every slot busy: the next round
			d.busy.Delete(id)
			return
		}
		d.wg.Add(1)
		go func() {
			defer func() { <-d.slots; d.busy.Delete(id); d.wg.Done() }()
			d.serve(ctx, id)
		}()
	}
}

// serve delivers an endpoint's due messages in order, while it answers.
func (d *Dispatcher) serve(ctx context.Context, id string) {
	store, now := d.svc.store, d.svc.cfg.Now
	start := now()
	if ok, err := store.ClaimWebhookEndpoint(ctx, id, start, start.Add(claimFor)); err != nil || !ok {
		return // another replica serves it
	}
	// What was sent is recorded even when the server is stopping: a message
	// delivered but not recorded would go out again. Each write has its own
	// deadline: a round (roundTime, and an attempt begun at its end) lasts
	// longer than one write may, so a deadline set at its start would expire
	// under a slow receiver and lose the records of what it took.
	record := func(write func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.record)
		defer cancel()
		return write(ctx)
	}
	defer func() {
		if err := record(func(ctx context.Context) error { return store.ReleaseWebhookEndpoint(ctx, id) }); err != nil {
			d.log.Warn("releasing a webhook endpoint failed; its claim lapses", "endpoint_id", id, "lapses_at", start.Add(claimFor), "error", err.Error())
		}
	}()
	e, err := store.GetWebhookEndpoint(ctx, id)
	if err != nil {
		return
	}
	signers, err := d.svc.signers(e, start)
	if err != nil {
		d.log.Error("opening a webhook secret failed", "endpoint_id", id, "error", err.Error())
		return
	}
	for now().Sub(start) < roundTime && ctx.Err() == nil {
		due, err := store.DueWebhooks(ctx, id, now(), dueBatch)
		if err != nil || len(due) == 0 {
			return
		}
		for i := range due {
			m := &due[i]
			a := d.attempt(ctx, e, signers, m)
			var disabled bool
			if err := record(func(ctx context.Context) (err error) {
				disabled, err = store.RecordWebhookAttempt(ctx, m, a)
				return err
			}); err != nil {
				d.log.Error("recording a webhook attempt failed; the message will be sent again", "endpoint_id", id, "delivery_id", m.ID,
					"delivered", a.Error == "", "error", err.Error())
				return
			}
			if a.Error == "" {
				continue
			}
			d.log.Warn("webhook delivery failed", "endpoint_id", id, "delivery_id", m.ID, "attempt", m.Attempts+1, "error", a.Error,
				"retry_at", a.Next, "endpoint_disabled", disabled)
			return // the next round: no hammering an endpoint that fails
		}
	}
}

// signers are the endpoint's current secret, and the previous one during a
// rotation's grace.
func (s *Service) signers(e *persistence.WebhookEndpoint, now time.Time) ([]*standardwebhooks.Webhook, error) {
	sealed := [][]byte{e.Secret}
	if e.OldSecret != nil && e.OldSecretUntil != nil && now.Before(*e.OldSecretUntil) {
		sealed = append(sealed, e.OldSecret)
	}
	out := make([]*standardwebhooks.Webhook, 0, len(sealed))
	for _, b := range sealed {
		secret, err := s.open(e.ID, b)
		if err != nil {
			return nil, err
		}
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			return nil, err
		}
		out = append(out, wh)
	}
	return out, nil
}

// Sign is the webhook-signature header of a message: one v1 signature per
// secret, space-separated.
func Sign(signers []*standardwebhooks.Webhook, msgID string, at time.Time, body []byte) (string, error) {
	var b bytes.Buffer
	for i, wh := range signers {
		sig, err := wh.Sign(msgID, at, body)
		if err != nil {
			return "", err
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(sig)
	}
	return b.String(), nil
}

// attempt sends one message and says how it went.
func (d *Dispatcher) attempt(ctx context.Context, e *persistence.WebhookEndpoint, signers []*standardwebhooks.Webhook, m *persistence.WebhookDelivery) persistence.Attempt {
	now := d.svc.cfg.Now()
	a := persistence.Attempt{At: now, DisableAfter: now.Add(-DisableAfter)}
	fail := func(msg string) persistence.Attempt {
		a.Error = extensions.Truncate(msg, errorLength)
		if m.Attempts < len(Schedule) {
			next := now.Add(Schedule[m.Attempts])
			a.Next = &next
		}
		return a
	}
	body := []byte(m.Payload)
	sig, err := Sign(signers, m.MessageID, now, body)
	if err != nil {
		return fail("signing failed")
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return fail("invalid request: " + err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "identityd-webhooks/1")
	req.Header.Set(standardwebhooks.HeaderWebhookID, m.MessageID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	resp, err := d.client.Do(req)
	if err != nil {
		if errors.Is(err, errRefusedAddress) {
			return fail("refused: the URL's host resolves to a loopback, private or link-local address")
		}
		return fail(describe(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	resp.Body.Close()
	code := resp.StatusCode
	a.Status = &code
	switch {
	case code >= 200 && code < 300:
		return a
	case code >= 300 && code < 400:
		return fail(fmt.Sprintf("HTTP %d: redirects are not followed", code))
	default:
		return fail(fmt.Sprintf("HTTP %d", code))
	}
}

// describe says why a request failed without the URL (it may carry a
// token in its query).
func describe(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "the host name did not resolve"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Op + ": " + op.Err.Error()
	}
	return "the request failed"
}

var errRefusedAddress = errors.New("webhooks: address not allowed")

// guard refuses connections to addresses that are not public unicast,
// unless allowed: checked on the address actually dialled, after the name
// resolved, so that no DNS answer (or rebinding) can aim a request at the
// server's own network.
func guard(allowPrivate bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !public(ap.Addr()) {
			return errRefusedAddress
		}
		return nil
	}
}

// Prefixes that are not reachable public hosts, beyond what netip's
// predicates name: shared address space (RFC 6598), IETF protocol
// assignments, benchmarking (RFC 2544), documentation, the reserved 240/4,
// and the IPv6 prefixes that embed an IPv4 address (NAT64, 6to4).
var notPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
}

// public tells whether ip is a public unicast address.
func public(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || !ip.IsGlobalUnicast() || ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
		return false
	}
	for _, p := range notPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}
