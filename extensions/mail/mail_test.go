package mail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/identityd/identityd/persistence/dbtest"
)

func TestNewSMTP(t *testing.T) {
	for raw, ok := range map[string]bool{
		"smtp://127.0.0.1:2525?starttls=off":         true,
		"smtp://user:pass@mail.example":              true,
		"smtps://user:pass@mail.example:465":         true,
		"smtp://mail.example?starttls=opportunistic": true,
		"smtp://mail.example?starttls=maybe":         false,
		"http://mail.example":                        false,
		"smtp://":                                    false,
		"smtp://mail.example:99999":                  false,
	} {
		if _, err := NewSMTP(raw, "identityd <noreply@example.com>"); (err == nil) != ok {
			t.Errorf("NewSMTP(%q) = %v, want ok %v", raw, err, ok)
		}
	}
}

func TestBackoff(t *testing.T) {
	var span time.Duration
	for n := range MaxAttempts - 1 { // the waits between twelve attempts
		span += backoff(n)
	}
	if span != 2*time.Hour+25*time.Minute+15*time.Second {
		t.Errorf("twelve attempts span %v", span)
	}
	for n, want := range map[int]time.Duration{0: 5 * time.Second, 1: 10 * time.Second, 3: 40 * time.Second, 10: time.Hour, 100: time.Hour} {
		if got := backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// flaky refuses the first failures messages, then records them.
type flaky struct {
	mu       sync.Mutex
	failures int
	sent     []Message
}

func (f *flaky) Send(_ context.Context, m Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures > 0 {
		f.failures--
		return errors.New("451 try again later")
	}
	f.sent = append(f.sent, m)
	return nil
}

// The outbox keeps a message sealed in the database until it is delivered,
// retrying after a failure, and drops the sealed text once sent.
func TestOutbox(t *testing.T) {
	store := dbtest.Store(t, dbtest.URLs(t)["sqlite"])
	sender := &flaky{failures: 1}
	key := make([]byte, 32)
	o, err := NewOutbox(store, sender, key, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	msg := Message{To: "ada@example.com", Subject: "Hello", Text: "link: https://id.example/invites/SECRET", HTML: "<p>hi</p>"}
	rec, err := o.Record(msg)
	if err != nil {
		t.Fatal(err)
	}
	if string(rec.Sealed) == "" || bytes.Contains(rec.Sealed, []byte("SECRET")) {
		t.Fatal("the stored message is not sealed")
	}
	if err := store.QueueMail(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	o.deliver(ctx) // the first attempt fails
	m, _ := store.GetMail(ctx, rec.ID)
	if m.SentAt != nil || m.Attempts != 1 || m.LastError == "" || !m.NextAttemptAt.After(time.Now()) {
		t.Fatalf("after a failure: %+v", m)
	}
	o.now = func() time.Time { return time.Now().Add(time.Minute) } // the retry is due
	o.deliver(ctx)
	m, _ = store.GetMail(ctx, rec.ID)
	if m.SentAt == nil || m.Sealed != nil || len(sender.sent) != 1 || sender.sent[0] != msg {
		t.Fatalf("after the retry: %+v, sent %v", m, sender.sent)
	}
	// A wrong key cannot open a sealed message.
	other, _ := NewOutbox(store, sender, append([]byte{1}, key[1:]...), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := other.open(rec); err == nil {
		t.Fatal("a message opened with another key")
	}
}

// counting is a sender that keeps count, and may stop the outbox while it
// sends.
type counting struct {
	mu     sync.Mutex
	n      int
	during func()
}

func (c *counting) Send(context.Context, Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.during != nil {
		c.during()
	}
	return nil
}

func (c *counting) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// A backlog of several batches drains after one kick, without waiting for
// ticks (here an hour apart).
func TestOutboxDrainsBacklog(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		sender := &counting{}
		o, err := NewOutbox(store, sender, make([]byte, 32), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		o.tick = time.Hour
		const n = 2*deliveryBatch + 7
		for i := range n {
			rec, err := o.Record(Message{To: fmt.Sprintf("p%d@example.com", i), Subject: "s", Text: "t", HTML: "h"})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.QueueMail(ctx, rec); err != nil {
				t.Fatal(err)
			}
		}
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		go o.Run(runCtx)
		deadline := time.Now().Add(30 * time.Second)
		for sender.count() < n && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := sender.count(); got != n {
			t.Fatalf("%d of %d delivered", got, n)
		}
	})
}

// A message delivered while the outbox stops is recorded as sent all the
// same, so that a restart does not send it again.
func TestOutboxRecordsSendAtStop(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		runCtx, stop := context.WithCancel(ctx)
		sender := &counting{during: stop} // the server stops while the message goes out
		o, err := NewOutbox(store, sender, make([]byte, 32), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := o.Record(Message{To: "ada@example.com", Subject: "s", Text: "t", HTML: "h"})
		if err := store.QueueMail(ctx, rec); err != nil {
			t.Fatal(err)
		}
		o.Run(runCtx) // returns once stopped
		m, err := store.GetMail(ctx, rec.ID)
		if err != nil || m.SentAt == nil || sender.count() != 1 {
			t.Fatalf("sent %d, record %+v %v", sender.count(), m, err)
		}
	})
}

// smtpBox is an in-process SMTP server that can be stopped and started
// again on its address; it refuses (550) the recipient refuse.
type smtpBox struct {
	addr, refuse string
	srv          *smtp.Server
	l            net.Listener

	mu       sync.Mutex
	rcpts    map[string]int       // RCPT TOs, refused or not: one per attempt
	received map[string]time.Time // delivered, by recipient
}

func (b *smtpBox) start(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	b.addr, b.l = l.Addr().String(), l
	b.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &boxSession{box: b}, nil }))
	b.srv.Domain = "localhost"
	b.srv.ErrorLog = stdlog.New(io.Discard, "", 0)
	go func() { _ = b.srv.Serve(l) }()
}

// stop closes the listener too: Close may come before Serve has it.
func (b *smtpBox) stop() { _ = b.srv.Close(); _ = b.l.Close() }

func (b *smtpBox) attempts(rcpt string) int { b.mu.Lock(); defer b.mu.Unlock(); return b.rcpts[rcpt] }

func (b *smtpBox) arrived(rcpt string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, ok := b.received[rcpt]
	return at, ok
}

type boxSession struct {
	box *smtpBox
	to  []string
}

func (s *boxSession) Mail(string, *smtp.MailOptions) error { return nil }

func (s *boxSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.box.mu.Lock()
	defer s.box.mu.Unlock()
	s.box.rcpts[to]++
	if to == s.box.refuse {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such mailbox"}
	}
	s.to = append(s.to, to)
	return nil
}

func (s *boxSession) Data(r io.Reader) error {
	_, _ = io.Copy(io.Discard, r)
	s.box.mu.Lock()
	defer s.box.mu.Unlock()
	for _, to := range s.to {
		s.box.received[to] = time.Now()
	}
	return nil
}

func (s *boxSession) Reset()        { s.to = nil }
func (s *boxSession) Logout() error { return nil }

// After an SMTP outage, a message waiting on its backoff goes out within
// a couple of seconds of the server's return (a probe each second while
// messages wait), not at its next retry (here 10 s after the second
// failure). A message the answering server refuses keeps its backoff: it
// is not retried every second.
func TestOutboxAfterOutage(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		store := dbtest.Store(t, dbURL)
		box := &smtpBox{addr: "127.0.0.1:0", refuse: "nobody@example.com", rcpts: map[string]int{}, received: map[string]time.Time{}}
		box.start(t)
		t.Cleanup(box.stop)
		sender, err := NewSMTP("smtp://"+box.addr+"?starttls=off", "identityd <noreply@example.com>")
		if err != nil {
			t.Fatal(err)
		}
		o, err := NewOutbox(store, sender, make([]byte, 32), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		queue := func(to string) string {
			rec, err := o.Record(Message{To: to, Subject: "Your code", Text: "123456"})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.QueueMail(ctx, rec); err != nil {
				t.Fatal(err)
			}
			o.Kick()
			return rec.ID
		}
		waitFor := func(what string, within time.Duration, ok func() bool) {
			t.Helper()
			deadline := time.Now().Add(within)
			for !ok() {
				if time.Now().After(deadline) {
					t.Fatalf("%s: not within %v", what, within)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}

		box.stop() // the outage
		id := queue("ada@example.com")
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); o.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })
		waitFor("two failed attempts", 15*time.Second, func() bool {
			m, err := store.GetMail(ctx, id)
			return err == nil && m.Attempts >= 2
		})
		box.start(t) // the next retry is 10 s away
		back := time.Now()
		waitFor("the message after the server's return", 4*time.Second, func() bool { _, ok := box.arrived("ada@example.com"); return ok })
		at, _ := box.arrived("ada@example.com")
		t.Logf("arrived %v after the server's return", at.Sub(back).Round(time.Millisecond))

		// Refused by a server that answers: left to its backoff (5 s).
		queue(box.refuse)
		waitFor("the refused attempt", 4*time.Second, func() bool { return box.attempts(box.refuse) == 1 })
		time.Sleep(2500 * time.Millisecond)
		if n := box.attempts(box.refuse); n != 1 {
			t.Fatalf("a refused message was tried %d times within its backoff", n)
		}
	})
}
