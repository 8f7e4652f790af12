package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The embedded sign-in phases (issue 12): an application's own page signs
// people in with a code they were e-mailed (POST /otp/verify, with PKCE),
// and its backend exchanges the answered authorization code for tokens
// (POST /code/exchange).
//
// Codes are single use and a person has one pending code at a time, so the
// codes are made before the phases, outside any measurement: people without
// a password are created through the M2M API, each is sent one code (POST
// /otp/send), and the server's outbox delivers it to loadgen's SMTP server
// (mailbox.go), which reads it out of the message. The verify phase uses
// each code once; its answers (authorization code and PKCE verifier) are the
// exchange phase's pool, topped up before that phase by verifying the codes
// the verify phase left (not measured either). Neither sends, deliveries nor
// the top-up are counted, and none run during a measured window. A phase
// whose pool runs out ends there and reports its rate over the time it
// measured (errPoolEmpty).

const (
	embeddedAPI = "/api/v1/embedded/auth"
	// otpTarget is the target for both phases, per second: the pool
	// of codes is sized so that a server reaching it does not run out.
	otpTarget = 3000
	// maxOTPPeople bounds the people (one code each) made for the phases.
	maxOTPPeople = 40000
	// prepareBudget bounds the time spent creating people and sending
	// codes; deliveryGrace the wait for codes sent but not yet received.
	prepareBudget = 2 * time.Minute
	deliveryGrace = time.Minute
	// aheadOfMail bounds the codes sent and not yet received. The outbox
	// delivers one batch of 50 at each send's kick, else one every 2 s:
	// a backlog left when the sends stop drains at 25 messages/s, so it
	// must stay small (the last 250 take about 10 s).
	aheadOfMail = 250
)

// embeddedResults are the embedded phases' figures and how their pools
// were made.
type embeddedResults struct {
	verify, exchange phaseResult
	people           int           // people created, one code sent to each
	sent, mailed     int           // codes sent, and received by SMTP before the verify phase
	prepare          time.Duration // creating people, sending and receiving codes
	mailRate         float64       // codes received per second during the preparation
	topUp            int           // codes left by the verify phase, verified for the exchange pool
	exchangePool     int           // authorization codes the exchange phase could use
}

// otpTicket is a mailed code with the verify request's body, made ahead.
type otpTicket struct {
	body     []byte
	verifier string
}

// authCode is an embedded sign-in's answer: what the backend exchanges.
type authCode struct{ code, verifier string }

// runEmbedded makes the application, the people and their codes, then
// measures OTP verifications and embedded code exchanges.
func runEmbedded(ctx context.Context, cfg config, c *client, pid int, admin string, box *mailbox) (embeddedResults, error) {
	var r embeddedResults
	// The backend sends its secret in the JSON body, not in a header.
	body, _ := json.Marshal(map[string]any{
		"name": "bench-embedded", "redirectUris": []string{benchRedirect}, "idTokenSigningAlg": "ES256",
		"signInMethods": []string{"otp"}, "allowSignUp": true,
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/v1/applications", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+admin)
	var app struct{ ClientID, ClientSecret string }
	if err := c.do(req, http.StatusCreated, &app); err != nil {
		return r, fmt.Errorf("register the embedded application: %w", err)
	}
	if app.ClientID == "" || app.ClientSecret == "" {
		return r, errors.New("register the embedded application: no clientId/clientSecret")
	}
	clientID, clientSecret := app.ClientID, app.ClientSecret

	// As many codes as the target rate needs over warm-up and measurement,
	// and half as many more: a server past the target should not run out.
	want := int(math.Ceil(otpTarget * (cfg.warmup + cfg.duration).Seconds() * 1.5))
	want = max(cfg.concurrency*4, min(want, maxOTPPeople))
	tickets, err := prepareCodes(ctx, cfg, c, admin, box, clientID, want, &r)
	if err != nil {
		return r, err
	}

	verified := make(chan authCode, cap(tickets))
	verify := func(ctx context.Context, t otpTicket) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+embeddedAPI+"/otp/verify", bytes.NewReader(t.body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		var out struct {
			Code        string `json:"code"`
			ExpiresIn   int    `json:"expiresIn"`
			MFARequired bool   `json:"mfaRequired"`
		}
		if err := c.do(req, http.StatusOK, &out); err != nil {
			return err
		}
		if out.Code == "" || out.ExpiresIn <= 0 {
			return fmt.Errorf("OTP verified without a code (mfaRequired %t)", out.MFARequired)
		}
		select {
		case verified <- authCode{out.Code, t.verifier}:
		default: // cannot happen: one answer per ticket
		}
		return nil
	}
	if r.verify, err = runPhase(ctx, "OTP verifications", cfg, pid, func(ctx context.Context, _ uint64) error {
		select {
		case t := <-tickets:
			return verify(ctx, t)
		default:
			return errPoolEmpty
		}
	}); err != nil {
		return r, err
	}

	// The codes the verify phase left become authorization codes too.
	var wg sync.WaitGroup
	var topUp, topUpErrs atomic.Int64
	var topUpErr error
	var once sync.Once
	for range cfg.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				select {
				case t := <-tickets:
					if err := verify(ctx, t); err != nil {
						topUpErrs.Add(1)
						once.Do(func() { topUpErr = err })
						continue
					}
					topUp.Add(1)
				default:
					return
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if n := topUpErrs.Load(); n*100 > topUp.Load()+n {
		return r, fmt.Errorf("verifying the remaining codes: %d failed; first error: %v", n, topUpErr)
	}
	r.topUp, r.exchangePool = int(topUp.Load()), len(verified)

	if r.exchange, err = runPhase(ctx, "embedded code exchanges", cfg, pid, func(ctx context.Context, _ uint64) error {
		var a authCode
		select {
		case a = <-verified:
		default:
			return errPoolEmpty
		}
		body, _ := json.Marshal(map[string]string{"code": a.code, "client_id": clientID, "client_secret": clientSecret, "code_verifier": a.verifier})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+embeddedAPI+"/code/exchange", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		var t tokens
		if err := c.do(req, http.StatusOK, &t); err != nil {
			return err
		}
		if t.AccessToken == "" || !isES256JWT(t.IDToken) {
			return errors.New("code exchange without an access token and an ES256 ID token")
		}
		return nil
	}); err != nil {
		return r, err
	}
	return r, nil
}

// prepareCodes creates up to want people without a password, sends each
// one code, and answers the codes SMTP received as verify requests ready
// to send (each with its own PKCE verifier). Bounded by prepareBudget for
// the sends and deliveryGrace for the last deliveries.
func prepareCodes(ctx context.Context, cfg config, c *client, admin string, box *mailbox, clientID string, want int, r *embeddedResults) (chan otpTicket, error) {
	start := time.Now()
	sendUntil := start.Add(prepareBudget)
	tickets := make(chan otpTicket, want)
	var (
		next, created, sent atomic.Int64
		firstErr            error
		errOnce             sync.Once
		failed              atomic.Bool
		wg                  sync.WaitGroup
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		failed.Store(true)
	}
	emails := make(map[string]bool, want) // whom a code was sent to; guarded by mu
	var mu sync.Mutex
	// Received codes become tickets as they arrive.
	got := 0
	var dup, stranger int
	take := func(m mailedCode) {
		mu.Lock()
		seen, known := emails[m.email]
		if known && !seen {
			emails[m.email] = true
		}
		mu.Unlock()
		switch {
		case !known:
			stranger++
			return
		case seen:
			dup++ // a second code replaced the first, or a resend
			return
		}
		verifier := randomString(32, base64.RawURLEncoding.EncodeToString)
		sum := sha256.Sum256([]byte(verifier))
		body, _ := json.Marshal(map[string]string{"clientId": clientID, "email": m.email, "code": m.code,
			"codeChallenge": base64.RawURLEncoding.EncodeToString(sum[:]), "codeChallengeMethod": "S256"})
		tickets <- otpTicket{body, verifier}
		got++
	}
	for range cfg.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil && !failed.Load() && time.Now().Before(sendUntil) {
				i := next.Add(1)
				if i > int64(want) {
					return
				}
				email := fmt.Sprintf("otp-%d@bench.example", i)
				body, _ := json.Marshal(map[string]any{"email": email, "name": fmt.Sprintf("OTP Person %d", i), "emailVerified": true})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/v1/m2m/users", strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+admin)
				var user map[string]any
				if err := c.do(req, http.StatusCreated, &user); err != nil {
					fail(fmt.Errorf("create a person: %w", err))
					return
				}
				created.Add(1)
				// Stay at most aheadOfMail codes ahead of the deliveries.
				for sent.Load()-box.received.Load() >= aheadOfMail && ctx.Err() == nil && time.Now().Before(sendUntil) {
					time.Sleep(5 * time.Millisecond)
				}
				if !time.Now().Before(sendUntil) {
					return // out of time: this person gets no code
				}
				mu.Lock()
				emails[email] = false
				mu.Unlock()
				body, _ = json.Marshal(map[string]string{"clientId": clientID, "email": email})
				req, _ = http.NewRequestWithContext(ctx, http.MethodPost, c.base+embeddedAPI+"/otp/send", strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				var out struct {
					Success bool `json:"success"`
				}
				if err := c.do(req, http.StatusOK, &out); err != nil || !out.Success {
					fail(fmt.Errorf("send a code: %v (success %t)", err, out.Success))
					return
				}
				sent.Add(1)
			}
		})
	}
	sending := make(chan struct{})
	go func() { wg.Wait(); close(sending) }()
	// Read codes while sending, then until every sent code has come or
	// the grace has passed.
	var graceEnd <-chan time.Time
	tick, progress := time.NewTicker(20*time.Millisecond), time.NewTicker(10*time.Second)
	defer tick.Stop()
	defer progress.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case m := <-box.codes:
			take(m)
		case <-sending:
			sending = nil
			graceEnd = time.After(deliveryGrace)
		case <-graceEnd:
			done = true
		case <-tick.C:
			done = sending == nil && int64(got+dup+stranger)+box.unreadable.Load() >= sent.Load()
		case <-progress.C:
			fmt.Fprintf(os.Stderr, "loadgen: OTP codes after %.0fs: %d people, %d codes sent, %d received\n",
				time.Since(start).Seconds(), created.Load(), sent.Load(), got)
		}
	}
	if failed.Load() {
		return nil, firstErr
	}
	r.people, r.sent, r.mailed, r.prepare = int(created.Load()), int(sent.Load()), got, time.Since(start)
	r.mailRate = float64(got) / r.prepare.Seconds()
	if got < r.sent || dup > 0 || stranger > 0 || box.unreadable.Load() > 0 || box.overflow.Load() > 0 {
		fmt.Fprintf(os.Stderr, "loadgen: OTP codes: %d sent, %d received in time, %d duplicates, %d to unknown addresses, %d unreadable messages, %d dropped\n",
			r.sent, got, dup, stranger, box.unreadable.Load(), box.overflow.Load())
	}
	if got == 0 {
		return nil, errors.New("no OTP code reached the SMTP server")
	}
	fmt.Fprintf(os.Stderr, "loadgen: %d OTP codes ready after %.0fs; the OTP verification phase begins\n", got, r.prepare.Seconds())
	return tickets, nil
}

// isES256JWT tells whether s is a compact JWS whose header says ES256.
func isES256JWT(s string) bool {
	h, _, ok := strings.Cut(s, ".")
	if !ok || strings.Count(s, ".") != 2 {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return false
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	return json.Unmarshal(raw, &hdr) == nil && hdr.Alg == "ES256"
}

// print says how the embedded phases' pools were made and what each
// operation cost the server.
func (em embeddedResults) print(w io.Writer) {
	fmt.Fprintf(w, "  OTP codes, made before the phases and not measured: %d people without a password, %d codes sent, %d received by SMTP in %.1fs (%.0f/s)\n",
		em.people, em.sent, em.mailed, em.prepare.Seconds(), em.mailRate)
	fmt.Fprintf(w, "  code exchanges' pool: %d authorization codes (%d of them from codes verified after the OTP phase, not measured)\n",
		em.exchangePool, em.topUp)
	perOp := func(p phaseResult) string {
		if p.serverCPU < 0 || p.rate <= 0 {
			return "unknown"
		}
		return fmt.Sprintf("%.3f ms", p.serverCPU/100/p.rate*1000)
	}
	fmt.Fprintf(w, "  server CPU per operation: OTP verification %s, embedded code exchange %s (server CPU %% / rate)\n", perOp(em.verify), perOp(em.exchange))
}
