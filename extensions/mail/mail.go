// Package mail sends identityd's e-mail: through SMTP (a well-kept client,
// go-mail) when configured, or to the log in development; and through an
// outbox, so that a message is committed with what it announces and
// retried until it is delivered.
package mail

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	gomail "github.com/wneessen/go-mail"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Message is one e-mail with a plain-text and an HTML body.
type Message struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	Text    string `json:"text"`
	HTML    string `json:"html"`
}

// Sender delivers a message.
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// smtpSender sends through an SMTP server.
type smtpSender struct {
	from string
	opts []gomail.Option
	host string
}

// NewSMTP returns a Sender for an SMTP URL:
//
//	smtp://[user:pass@]host[:port][?starttls=required|opportunistic|off]   (port 587; STARTTLS required by default)
//	smtps://[user:pass@]host[:port]                                        (port 465; TLS from the start)
//
// With credentials, the client authenticates with PLAIN (which the client
// only does over TLS, or to a local server).
func NewSMTP(rawURL, from string) (Sender, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, errors.New("must be an smtp:// or smtps:// URL with a host")
	}
	opts := []gomail.Option{gomail.WithTimeout(15 * time.Second)}
	port := 587
	switch u.Scheme {
	case "smtps":
		port = 465
		opts = append(opts, gomail.WithSSL())
	case "smtp":
		policy := gomail.TLSMandatory
		switch u.Query().Get("starttls") {
		case "", "required":
		case "opportunistic":
			policy = gomail.TLSOpportunistic
		case "off":
			policy = gomail.NoTLS
		default:
			return nil, errors.New("starttls must be required, opportunistic or off")
		}
		opts = append(opts, gomail.WithTLSPolicy(policy))
	default:
		return nil, errors.New("must be an smtp:// or smtps:// URL")
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return nil, errors.New("has an invalid port")
		}
	}
	opts = append(opts, gomail.WithPort(port))
	if u.User != nil {
		pass, _ := u.User.Password()
		opts = append(opts, gomail.WithSMTPAuth(gomail.SMTPAuthPlain), gomail.WithUsername(u.User.Username()), gomail.WithPassword(pass))
	}
	if _, err := gomail.NewClient(u.Hostname(), opts...); err != nil {
		return nil, err
	}
	return &smtpSender{from: from, opts: opts, host: u.Hostname()}, nil
}

func (s *smtpSender) Send(ctx context.Context, m Message) error {
	msg := gomail.NewMsg()
	if err := msg.From(s.from); err != nil {
		return fmt.Errorf("from address: %w", err)
	}
	if err := msg.To(m.To); err != nil {
		return fmt.Errorf("recipient: %w", err)
	}
	msg.Subject(m.Subject)
	msg.SetDate()
	msg.SetMessageID()
	msg.SetBodyString(gomail.TypeTextPlain, m.Text)
	if m.HTML != "" {
		msg.AddAlternativeString(gomail.TypeTextHTML, m.HTML)
	}
	c, err := gomail.NewClient(s.host, s.opts...)
	if err != nil {
		return err
	}
	return c.DialAndSendWithContext(ctx, msg)
}

// Probe implements Prober: a connection, EHLO (with STARTTLS and AUTH as
// configured) and QUIT.
func (s *smtpSender) Probe(ctx context.Context) error {
	opts := s.opts
	if dl, ok := ctx.Deadline(); ok { // the client's own timeout governs all but the dial
		opts = append(slices.Clip(opts), gomail.WithTimeout(time.Until(dl)))
	}
	c, err := gomail.NewClient(s.host, opts...)
	if err != nil {
		return err
	}
	if err := c.DialWithContext(ctx); err != nil {
		return err
	}
	return c.Close()
}

// Prober is a Sender that can tell, cheaply and without sending, whether
// its server answers.
type Prober interface {
	Probe(ctx context.Context) error
}

// LogSender writes messages to the log: development without SMTP. The
// messages carry links with tokens; never use it in production.
type LogSender struct{ Log *slog.Logger }

// Send implements Sender.
func (l LogSender) Send(_ context.Context, m Message) error {
	l.Log.Warn("e-mail not sent (IDENTITYD_SMTP_URL is not set); its text follows", "to", m.To, "subject", m.Subject, "text", m.Text)
	return nil
}

// Store is the outbox storage.
type Store interface {
	DueMail(ctx context.Context, now time.Time, limit int) ([]persistence.Mail, error)
	ClaimMail(ctx context.Context, m *persistence.Mail, until time.Time) (bool, error)
	MailSent(ctx context.Context, id string, at time.Time) error
	MailFailed(ctx context.Context, id string, next time.Time, reason string) error
}

// Outbox seals messages for storage and delivers stored ones.
type Outbox struct {
	store  Store
	sender Sender
	aead   cipher.AEAD
	log    *slog.Logger
	now    func() time.Time
	kick   chan struct{}
	tick   time.Duration // how often Run looks for due messages unkicked (retries)
	probe  time.Duration // how often Run asks a Prober's server, while messages wait (see recover)
	record time.Duration // how long one write of what was sent may take

	// Run's own (and deliver's, which Run calls): the messages this outbox
	// failed, by id, with the next attempt they wait for; and whether a
	// probe found the server silent since.
	waiting map[string]time.Time
	down    bool
}

// NewOutbox returns an outbox sealing with key (32 bytes, derived from the
// system secret) and delivering through sender.
func NewOutbox(store Store, sender Sender, key []byte, log *slog.Logger) (*Outbox, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Outbox{store: store, sender: sender, aead: aead, log: log, now: extensions.Now, kick: make(chan struct{}, 1), tick: 2 * time.Second,
		probe: time.Second, record: 10 * time.Second, waiting: map[string]time.Time{}}, nil
}

// Record seals a message into an outbox record, due now; the caller commits
// it with what the message announces, then calls Kick.
func (o *Outbox) Record(m Message) (*persistence.Mail, error) {
	plain, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	id := uuid.Must(uuid.NewV7()).String()
	nonce := make([]byte, o.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	now := o.now().UTC()
	return &persistence.Mail{
		ID: id, Recipient: m.To, Subject: m.Subject, Sealed: o.aead.Seal(nonce, nonce, plain, []byte(id)),
		NextAttemptAt: now, CreatedAt: now,
	}, nil
}

func (o *Outbox) open(m *persistence.Mail) (Message, error) {
	var msg Message
	n := o.aead.NonceSize()
	if len(m.Sealed) < n {
		return msg, errors.New("sealed message too short")
	}
	plain, err := o.aead.Open(nil, m.Sealed[:n], m.Sealed[n:], []byte(m.ID))
	if err != nil {
		return msg, err
	}
	return msg, json.Unmarshal(plain, &msg)
}

// Kick asks the outbox to deliver now rather than at its next tick.
func (o *Outbox) Kick() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// MaxAttempts is how often a message is tried before the outbox gives up
// on it (the record stays, with its last error).
const MaxAttempts = 12

// backoff is the wait after the n-th failed attempt: 5 s doubling, at most
// an hour (twelve attempts span 2 h 25 min: TestBackoff).
func backoff(n int) time.Duration {
	return min(5*time.Second<<min(n, 20), time.Hour)
}

// Run delivers due messages until ctx ends: at every kick, and every few
// seconds for retries. A full batch is followed by the next at once, so a
// backlog drains at the speed of delivery, not a batch per tick.
func (o *Outbox) Run(ctx context.Context) {
	t := time.NewTicker(o.tick)
	defer t.Stop()
	probe := time.NewTicker(o.probe)
	defer probe.Stop()
	for {
		for o.deliver(ctx) == deliveryBatch && ctx.Err() == nil {
		}
		select {
		case <-ctx.Done():
			return
		case <-o.kick:
		case <-t.C:
		case <-probe.C:
			o.recover(ctx)
		}
	}
}

// probeTimeout bounds a probe: Run waits for it.
const probeTimeout = 3 * time.Second

// recover makes the messages that wait on their backoff due at once when
// the server answers again after an outage: the backoff (5 s, doubling)
// would otherwise deliver them up to twice the outage late, and a person
// waits for their code. While messages wait, the server is probed (a
// connection and EHLO, no message); a probe that fails marks an outage,
// and the next that succeeds ends it. A probe that succeeds without an
// outage says the failures were the messages' own (a refused recipient):
// they keep their backoff, so that none is retried every second.
func (o *Outbox) recover(ctx context.Context) {
	p, ok := o.sender.(Prober)
	if !ok || len(o.waiting) == 0 {
		o.down = false
		return
	}
	probeCtx, cancel := context.WithTimeout(ctx, probeTimeout)
	err := p.Probe(probeCtx)
	cancel()
	if err != nil {
		o.down = true
		return
	}
	down := o.down
	o.down = false
	waiting := o.waiting
	o.waiting = map[string]time.Time{}
	if !down {
		return
	}
	now := o.now()
	for id, next := range waiting {
		// Due now, if no one moved its next attempt since (a claim moves
		// it the same way).
		if _, err := o.store.ClaimMail(ctx, &persistence.Mail{ID: id, NextAttemptAt: next}, now); err != nil {
			return
		}
	}
	o.log.Info("the mail server answers again; sending the messages that waited", "count", len(waiting))
}

// deliveryBatch is how many due messages one delivery round reads.
const deliveryBatch = 50

// deliver tries the due messages, a batch of them, and answers how many it
// claimed (fewer than a batch: nothing more is due, or storage fails).
func (o *Outbox) deliver(ctx context.Context) int {
	due, err := o.store.DueMail(ctx, o.now(), deliveryBatch)
	if err != nil {
		if ctx.Err() == nil {
			o.log.Error("reading the mail outbox failed", "error", err.Error())
		}
		return 0
	}
	// What was sent is recorded even when the outbox is stopping: a message
	// delivered but not recorded would go out again after a restart. Each
	// write has its own deadline: a batch's sends take longer than one may.
	record := func(write func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.record)
		defer cancel()
		return write(ctx)
	}
	claimed := 0
	for i := range due {
		m := &due[i]
		// Claimed for longer than an attempt takes: another replica skips
		// it, and a crash mid-attempt retries it after that.
		if ok, err := o.store.ClaimMail(ctx, m, o.now().Add(5*time.Minute)); err != nil || !ok {
			continue
		}
		claimed++
		msg, err := o.open(m)
		if err == nil {
			sendCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = o.sender.Send(sendCtx, msg)
			cancel()
		}
		delete(o.waiting, m.ID)
		if err == nil {
			if err := record(func(ctx context.Context) error { return o.store.MailSent(ctx, m.ID, o.now()) }); err != nil {
				o.log.Error("recording a sent e-mail failed; it may be sent again", "mail_id", m.ID, "error", err.Error())
			}
			continue
		}
		// In microseconds, as PostgreSQL keeps it: recover finds it by it.
		next := o.now().Add(backoff(m.Attempts)).Truncate(time.Microsecond)
		if m.Attempts+1 >= MaxAttempts {
			next = o.now().Add(100 * 365 * 24 * time.Hour) // given up: kept for the record
			o.log.Error("giving up on an e-mail", "mail_id", m.ID, "attempts", m.Attempts+1, "error", err.Error())
		} else {
			o.log.Warn("e-mail delivery failed; will retry", "mail_id", m.ID, "attempt", m.Attempts+1, "retry_at", next, "error", err.Error())
		}
		if err := record(func(ctx context.Context) error { return o.store.MailFailed(ctx, m.ID, next, err.Error()) }); err != nil {
			o.log.Error("recording a failed e-mail failed", "mail_id", m.ID, "error", err.Error())
		} else if m.Attempts+1 < MaxAttempts {
			o.waiting[m.ID] = next
		}
	}
	return claimed
}
