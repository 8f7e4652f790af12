package webhooks

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func TestValidURL(t *testing.T) {
	strict, open := &Service{}, &Service{cfg: Config{AllowPrivate: true}}
	for _, c := range []struct {
		url          string
		strict, open bool
	}{
		{"https://hooks.example.com/in", true, true},
		{"https://hooks.example.com:8443/in?x=1", true, true},
		{"http://hooks.example.com/in", false, true},
		{"https://127.0.0.1/in", false, true},
		{"https://[::1]/in", false, true},
		{"https://10.1.2.3/in", false, true},
		{"https://169.254.169.254/latest/meta-data", false, true},
		{"https://[fe80::1]/in", false, true},
		{"https://localhost/in", false, true},
		{"https://LOCALHOST./in", false, true},
		{"https://api.localhost/in", false, true},
		{"https://100.64.0.1/in", false, true},
		{"https://[::ffff:10.0.0.1]/in", false, true},
		{"https://93.184.216.34/in", true, true},
		{"https://hooks.example.com:0/in", false, false},
		{"https://hooks.example.com:70000/in", false, false},
		{"https://user:pw@hooks.example.com/in", false, false},
		{"https://hooks.example.com/in#x", false, false},
		{"ftp://hooks.example.com/in", false, false},
		{"/relative", false, false},
		{"https://hooks.example.com/\x00", false, false},
		{"https://" + strings.Repeat("a", 2000) + ".example/", false, false},
		// Numeric hosts in any form but dotted quad or brackets: never
		// reached (Go resolves them as names), so refused whatever
		// AllowPrivate says.
		{"https://2130706433/in", false, false},
		{"https://127.1/in", false, false},
		{"https://0x7f000001/in", false, false},
		{"https://0X7F.0.0.1/in", false, false},
		{"https://0177.0.0.1/in", false, false},
		{"https://127.000.000.001/in", false, false},
		{"https://127.0.0.1./in", false, false},
		{"https://1.2.3.4.5/in", false, false},
		{"https://93.184.216.34.:8443/in", false, false},
		{"https://3627733026:443/in", false, false},
		{"https://hooks.example.com./in", true, true},
		{"https://0xcafe.example/in", true, true},
		{"https://1password.example/in", true, true},
		{"https://[::ffff:7f00:1]/in", false, true},
	} {
		if got := strict.validURL(c.url) == nil; got != c.strict {
			t.Errorf("strict %q: valid %v, want %v", c.url, got, c.strict)
		}
		if got := open.validURL(c.url) == nil; got != c.open {
			t.Errorf("open %q: valid %v, want %v", c.url, got, c.open)
		}
	}
}

func TestPublic(t *testing.T) {
	for addr, want := range map[string]bool{
		"93.184.216.34": true, "2606:2800:220:1:248:1893:25c8:1946": true, "8.8.8.8": true,
		"127.0.0.1": false, "::1": false, "10.0.0.1": false, "172.16.5.4": false, "192.168.1.1": false,
		"169.254.169.254": false, "fe80::1": false, "fc00::1": false, "0.0.0.0": false, "::": false,
		"100.64.1.1": false, "192.0.0.8": false, "198.18.0.1": false, "240.0.0.1": false, "255.255.255.255": false,
		"224.0.0.1": false, "ff02::1": false, "::ffff:127.0.0.1": false, "64:ff9b::a00:1": false, "2002:a00:1::": false,
	} {
		if got := public(netip.MustParseAddr(addr)); got != want {
			t.Errorf("public(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestSchedule: the retries span more than a day (issue 18: "retried with
// backoff over at least 24 hours").
func TestSchedule(t *testing.T) {
	var total time.Duration
	for i, d := range Schedule {
		if i > 0 && d < Schedule[i-1] {
			t.Fatalf("the schedule shrinks at %d", i)
		}
		total += d
	}
	if total < DisableAfter {
		t.Fatalf("retries span %v, less than %v", total, DisableAfter)
	}
}

// clock is a test's time, moved by hand.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return extensions.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// receiver records what an endpoint was sent and answers what it is told.
type receiver struct {
	mu       sync.Mutex
	got      []received
	statuses []int // answered in turn; then 204
}

type received struct {
	header http.Header
	body   []byte
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.got = append(r.got, received{req.Header.Clone(), body})
	status := http.StatusNoContent
	if len(r.statuses) > 0 {
		status, r.statuses = r.statuses[0], r.statuses[1:]
	}
	r.mu.Unlock()
	w.WriteHeader(status)
}

func (r *receiver) messages() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDispatcher delivers through real HTTP from a real store: signed so
// that the Standard Webhooks library verifies it, in order, retried on the
// schedule after a failure, signed with both secrets during a rotation,
// and refused at connect time when the address is not public.
func TestDispatcher(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		store.RouteWebhooks(Routes())
		var c clock
		key := []byte("a system secret for the webhook tests")
		svc := New(store, key, Config{AllowPrivate: true, Now: c.now})
		recv := &receiver{statuses: []int{http.StatusInternalServerError}}
		srv := httptest.NewServer(recv)
		t.Cleanup(srv.Close)
		e, secret, err := svc.Create(ctx, Input{URL: srv.URL + "/hook", EventTypes: []string{"user.signed_in", "session.ended"}})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); svc.Dispatcher(slog.New(slog.NewTextHandler(io.Discard, nil))).Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })

		at := c.now()
		events := []persistence.AuthEvent{
			{ID: uuid.Must(uuid.NewV7()).String(), Type: persistence.EventSignIn, CreatedAt: at},
			{ID: uuid.Must(uuid.NewV7()).String(), Type: persistence.EventSessionEnded, CreatedAt: at.Add(time.Millisecond)},
			{ID: uuid.Must(uuid.NewV7()).String(), Type: persistence.EventTokenRefreshed, CreatedAt: at.Add(2 * time.Millisecond)}, // not in the catalog
		}
		if err := store.AppendAuthEvents(ctx, events...); err != nil {
			t.Fatal(err)
		}
		// The first attempt fails (500); the next message still goes (order
		// is kept while the endpoint answers, not behind a failed message);
		// the failed one waits for its retry.
		waitFor(t, "the first two attempts", func() bool { return len(recv.messages()) == 2 })
		// The receiver answers before the dispatcher records: wait for the
		// second message's record, whose success clears the failure.
		var list []persistence.WebhookDelivery
		waitFor(t, "the attempts recorded", func() bool {
			list, _, err = svc.Deliveries(ctx, e.ID, persistence.DeliveryPending, persistence.Page{Limit: 10})
			got, _ := svc.Get(ctx, e.ID)
			return err == nil && len(list) == 1 && got.FailingSince == nil
		})
		if list[0].Attempts != 1 || list[0].LastStatus == nil || *list[0].LastStatus != 500 {
			t.Fatalf("pending %+v", list)
		}
		if n := len(recv.messages()); n != 2 {
			t.Fatalf("%d requests before the retry was due", n)
		}
		c.advance(Schedule[0])
		waitFor(t, "the retry", func() bool { return len(recv.messages()) == 3 })
		got := recv.messages()
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range got {
			if err := wh.VerifyIgnoringTimestamp(m.body, m.header); err != nil {
				t.Fatalf("message %d does not verify: %v", i, err)
			}
		}
		if got[0].header.Get("webhook-id") != "msg_"+events[0].ID || got[1].header.Get("webhook-id") != "msg_"+events[1].ID ||
			got[2].header.Get("webhook-id") != "msg_"+events[0].ID {
			t.Fatalf("order or ids: %s %s %s", got[0].header.Get("webhook-id"), got[1].header.Get("webhook-id"), got[2].header.Get("webhook-id"))
		}
		if got[0].header.Get("webhook-timestamp") == got[2].header.Get("webhook-timestamp") {
			t.Fatal("a retry carries the first attempt's timestamp")
		}
		if !strings.Contains(string(got[1].body), `"type":"session.ended"`) {
			t.Fatalf("body %s", got[1].body)
		}

		// A rotation: both secrets sign during the grace, the new one alone after.
		_, fresh, err := svc.RotateSecret(ctx, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Test(ctx, e.ID); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the test message", func() bool { return len(recv.messages()) == 4 })
		whNew, _ := standardwebhooks.NewWebhook(fresh)
		m := recv.messages()[3]
		if wh.VerifyIgnoringTimestamp(m.body, m.header) != nil || whNew.VerifyIgnoringTimestamp(m.body, m.header) != nil {
			t.Fatalf("during the grace both secrets must verify: %s", m.header.Get("webhook-signature"))
		}
		c.advance(RotationGrace + time.Second)
		if _, err := svc.Test(ctx, e.ID); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the second test message", func() bool { return len(recv.messages()) == 5 })
		m = recv.messages()[4]
		if wh.VerifyIgnoringTimestamp(m.body, m.header) == nil || whNew.VerifyIgnoringTimestamp(m.body, m.header) != nil {
			t.Fatalf("after the grace only the new secret verifies: %s", m.header.Get("webhook-signature"))
		}
		if err := whNew.Verify(m.body, m.header); err == nil {
			// webhook-timestamp is the (moved) test clock: more than a day ahead.
			t.Fatal("a timestamp a day off verified")
		}

		// Without AllowPrivate the loopback receiver is refused when dialled.
		strict := New(store, key, Config{Now: c.now})
		d := strict.Dispatcher(slog.New(slog.NewTextHandler(io.Discard, nil)))
		waitFor(t, "the last delivery recorded", func() bool {
			due, err := store.DueWebhooks(ctx, e.ID, c.now(), 1)
			return err == nil && len(due) == 0
		})
		probe := &persistence.WebhookDelivery{ID: uuid.NewString(), EndpointID: e.ID, MessageID: "msg_x", Payload: "{}"}
		signers, _ := strict.signers(e, c.now())
		a := d.attempt(ctx, e, signers, probe)
		if !strings.HasPrefix(a.Error, "refused") || a.Next == nil || a.Status != nil {
			t.Fatalf("attempt %+v", a)
		}
		if n := len(recv.messages()); n != 5 {
			t.Fatalf("the refused attempt reached the receiver: %d", n)
		}
	})
}

// TestRedirectNotFollowed: a 3xx is a failed attempt, its target never asked.
func TestRedirectNotFollowed(t *testing.T) {
	var asked atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { asked.Store(true) }))
	t.Cleanup(target.Close)
	from := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusTemporaryRedirect))
	t.Cleanup(from.Close)
	svc := New(nil, []byte("a system secret for the webhook tests"), Config{AllowPrivate: true})
	secret, _ := NewSecret()
	e := &persistence.WebhookEndpoint{ID: uuid.NewString(), URL: from.URL}
	e.Secret = svc.seal(e.ID, secret)
	signers, err := svc.signers(e, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := svc.Dispatcher(slog.New(slog.NewTextHandler(io.Discard, nil))).attempt(context.Background(), e, signers,
		&persistence.WebhookDelivery{ID: uuid.NewString(), MessageID: "msg_1", Payload: "{}"})
	if a.Status == nil || *a.Status != http.StatusTemporaryRedirect || !strings.Contains(a.Error, "redirects are not followed") || asked.Load() {
		t.Fatalf("attempt %+v, target asked %v", a, asked.Load())
	}
	// A sealed secret opens only for its endpoint.
	if _, err := svc.open(uuid.NewString(), e.Secret); err == nil {
		t.Fatal("a secret opened under another endpoint's id")
	}
	if !errors.Is(ids("not-a-uuid"), persistence.ErrNotFound) {
		t.Fatal("a malformed id reached the store")
	}
}

// syncLog is a log's text, written by the dispatcher's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A slow receiver (each answer taking longer than a record's deadline
// divided among the round's messages) gets each message once: every
// attempt is recorded with a deadline of its own, the endpoint's claim is
// released at the end of the round, and nothing is logged as failed. With
// one deadline for the whole round, the third record missed it: the
// message, delivered, stayed due, the claim stayed held (the endpoint
// stalled until it lapsed) and the log blamed storage.
func TestSlowReceiver(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		store.RouteWebhooks(Routes())
		var c clock
		svc := New(store, []byte("a system secret for the webhook tests"), Config{AllowPrivate: true, Now: c.now})
		const slow, messages = 300 * time.Millisecond, 4
		recv := &receiver{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(slow)
			recv.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		e, _, err := svc.Create(ctx, Input{URL: srv.URL + "/hook", EventTypes: []string{"user.signed_in"}})
		if err != nil {
			t.Fatal(err)
		}
		var log syncLog
		d := svc.Dispatcher(slog.New(slog.NewTextHandler(&log, nil)))
		d.record = 2 * slow // a round of four messages takes twice as long
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); d.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })

		at := c.now()
		for i := range messages {
			ev := persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: persistence.EventSignIn, CreatedAt: at.Add(time.Duration(i) * time.Millisecond)}
			if err := store.AppendAuthEvents(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "every message recorded as delivered", func() bool {
			list, _, err := svc.Deliveries(ctx, e.ID, persistence.DeliveryDelivered, persistence.Page{Limit: 10})
			return err == nil && len(list) == messages
		})
		waitFor(t, "the claim released", func() bool {
			got, err := store.GetWebhookEndpoint(ctx, e.ID)
			return err == nil && got.LeaseUntil.Before(c.now())
		})
		// Past the time a stuck claim would lapse: nothing goes out again.
		c.advance(claimFor + time.Second)
		time.Sleep(3 * d.tick)
		got := recv.messages()
		seen := map[string]bool{}
		for _, m := range got {
			seen[m.header.Get("webhook-id")] = true
		}
		if len(got) != messages || len(seen) != messages {
			t.Fatalf("%d requests for %d messages, %d distinct", len(got), messages, len(seen))
		}
		list, _, err := svc.Deliveries(ctx, e.ID, persistence.DeliveryDelivered, persistence.Page{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range list {
			if m.Attempts != 1 {
				t.Errorf("delivery %s: %d attempts recorded", m.ID, m.Attempts)
			}
		}
		if l := log.String(); strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Fatalf("the log says something failed:\n%s", l)
		}
	})
}
