// Command loadgen benchmarks identityd (issue 2, item 10): it starts a fresh
// server as a child process with rate limits off, creates service accounts,
// then measures client-credentials grants/s and introspections/s, and for
// people (people.go) authorization-code flows with a live SSO session,
// refresh grants, JWT access tokens and password sign-ins, at a fixed
// concurrency, with p50/p99 latency and the server's peak RSS.
//
// Usage (what `make bench` runs):
//
//	go build -o /tmp/identityd-bench ./cmd/identityd
//	go run ./cmd/loadgen -server /tmp/identityd-bench [-database postgres://...] [-out docs/benchmarks.md]
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"
)

type config struct {
	server      string
	database    string
	concurrency int
	accounts    int
	duration    time.Duration
	warmup      time.Duration
	out         string
	phases      string // all, machine, people, embedded or passkeys (parts of people), hitl or webhooks
	cpuProfile  string
}

// account holds a service account's precomputed Authorization header, so
// workers do not rebuild it per request.
type account struct{ id, secret, basic string }

// newAccount encodes the credentials for client_secret_basic: RFC 6749
// §2.3.1 form-urlencodes id and secret before the Basic encoding.
func newAccount(id, secret string) account {
	raw := url.QueryEscape(id) + ":" + url.QueryEscape(secret)
	return account{id, secret, "Basic " + base64.StdEncoding.EncodeToString([]byte(raw))}
}

func main() {
	var cfg config
	flag.StringVar(&cfg.server, "server", "", "path to the built identityd binary (required)")
	flag.StringVar(&cfg.database, "database", "", "IDENTITYD_DATABASE_URL (default: fresh SQLite file in a temp dir; a postgres:// URL must point at a fresh database)")
	flag.IntVar(&cfg.concurrency, "concurrency", 32, "concurrent clients")
	flag.IntVar(&cfg.accounts, "accounts", 100, "service accounts to spread grants over")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured duration of each phase")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "unmeasured warm-up before each phase")
	flag.StringVar(&cfg.out, "out", "", "append a Markdown result row to this file")
	flag.StringVar(&cfg.phases, "phases", "all", "which phases to run: all, machine (accounts, agents, introspection), people (code flows, refresh, sign-ins, embedded sign-in, passkeys), embedded (the embedded sign-in phases alone), passkeys (the passkey phase alone), hitl (human-in-the-loop requests, decisions and, on PostgreSQL, the release of a sync wait across replicas), webhooks (event to delivery latency at 100 events/s), authz (checks against the embedded OpenFGA, a direct relation and a three-hop one) or apikeys (end-user API-key validations)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write the load generator's own CPU profile to this file (the server's: IDENTITYD_PPROF_ADDR)")
	flag.Parse()
	// Bounds keep a typo from running for hours or exhausting memory.
	if cfg.server == "" || cfg.concurrency < 1 || cfg.concurrency > 1024 || cfg.accounts < 1 || cfg.accounts > 10000 ||
		cfg.duration <= 0 || cfg.duration > 10*time.Minute || cfg.warmup < 0 || cfg.warmup > time.Minute ||
		!slices.Contains([]string{"all", "machine", "people", "embedded", "passkeys", "hitl", "webhooks", "authz", "apikeys"}, cfg.phases) {
		fmt.Fprintln(os.Stderr, "loadgen: -server is required; -concurrency 1..1024, -accounts 1..10000, -duration (0,10m], -warmup [0,1m], -phases all|machine|people|embedded|passkeys|hitl|webhooks|authz|apikeys")
		flag.Usage()
		os.Exit(2)
	}
	// SIGINT/SIGTERM cancel ctx so that run's deferred clean-up stops the server.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		defer f.Close()
	}
	err := run(ctx, cfg)
	pprof.StopCPUProfile()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	dbURL := cfg.database
	if dbURL == "" {
		dir, err := os.MkdirTemp("", "identityd-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dbURL = "sqlite://" + filepath.Join(dir, "bench.db") // absolute path: sqlite:///tmp/...
	}
	adminID, adminSecret := "bench-admin", randomString(32, base64.RawURLEncoding.EncodeToString)
	systemSecret := randomString(32, hex.EncodeToString)

	// The people phases read e-mailed sign-in codes from an SMTP server of
	// their own (embedded.go).
	var box *mailbox
	var env []string
	if cfg.phases != "machine" && cfg.phases != "hitl" && cfg.phases != "webhooks" && cfg.phases != "authz" && cfg.phases != "apikeys" {
		var err error
		if box, err = startMailbox(); err != nil {
			return fmt.Errorf("SMTP server: %w", err)
		}
		defer box.close()
		env = box.env()
	}
	// The webhook phase's receiver listens on 127.0.0.1.
	env = append(env, "IDENTITYD_WEBHOOK_ALLOW_PRIVATE=true")
	srv, err := startServer(ctx, cfg.server, dbURL, adminID, adminSecret, systemSecret, env...)
	if err != nil {
		return err
	}
	defer srv.stop()

	// One transport for every request, with an idle pool as large as the
	// worker count, so that the benchmark measures requests, not TCP set-up.
	// Proxy is nil: traffic goes only to the child on 127.0.0.1.
	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        cfg.concurrency,
		MaxIdleConnsPerHost: cfg.concurrency,
		IdleConnTimeout:     90 * time.Second,
	}
	defer tr.CloseIdleConnections()
	c := &client{base: srv.base, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}

	admin, err := c.token(ctx, newAccount(adminID, adminSecret))
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	var m2m machineResults
	if cfg.phases == "all" || cfg.phases == "machine" {
		if m2m, err = runMachine(ctx, cfg, c, srv.cmd.Process.Pid, admin); err != nil {
			return err
		}
	}

	// People: code flows with a live session, refresh, JWT access tokens,
	// password sign-ins; then the embedded sign-in API (embedded.go).
	var people peopleResults
	if cfg.phases == "all" || cfg.phases == "people" {
		if people, err = runPeople(ctx, cfg, c, srv.cmd.Process.Pid, admin); err != nil {
			return fmt.Errorf("people: %w", err)
		}
	}
	if cfg.phases == "all" || cfg.phases == "people" || cfg.phases == "embedded" {
		if people.embedded, err = runEmbedded(ctx, cfg, c, srv.cmd.Process.Pid, admin, box); err != nil {
			return fmt.Errorf("embedded sign-in: %w", err)
		}
	}

	if cfg.phases == "all" || cfg.phases == "people" || cfg.phases == "passkeys" {
		if people.passkeys, err = runPasskeys(ctx, cfg, c, srv.cmd.Process.Pid, admin); err != nil {
			return fmt.Errorf("passkeys: %w", err)
		}
	}

	// Fine-grained authorization: checks through the API (authz.go).
	var checks authzResults
	if cfg.phases == "all" || cfg.phases == "authz" {
		if checks, err = runAuthz(ctx, cfg, c, srv.cmd.Process.Pid, admin); err != nil {
			return fmt.Errorf("authz: %w", err)
		}
	}

	// End-user API keys: validations (apikeys.go).
	var apiKeys apiKeyResults
	if cfg.phases == "all" || cfg.phases == "apikeys" {
		if apiKeys, err = runAPIKeys(ctx, cfg, c, srv.cmd.Process.Pid, admin); err != nil {
			return fmt.Errorf("api keys: %w", err)
		}
	}

	// Human-in-the-loop: requests and decisions (hitl.go).
	var approvals hitlResults
	if cfg.phases == "all" || cfg.phases == "hitl" {
		if approvals, err = runHITL(ctx, cfg, c, srv.cmd.Process.Pid, admin); err != nil {
			return fmt.Errorf("hitl: %w", err)
		}
	}

	// Webhooks: event to delivery (webhooks.go).
	var hooks webhookResults
	if cfg.phases == "all" || cfg.phases == "webhooks" {
		if hooks, err = runWebhooks(ctx, cfg, c, admin); err != nil {
			return fmt.Errorf("webhooks: %w", err)
		}
	}

	// Kill propagation, and the release of a sync wait, need a second
	// replica on the same database, which only PostgreSQL offers.
	if strings.HasPrefix(dbURL, "postgres") && (cfg.phases == "all" || cfg.phases == "hitl") {
		if approvals.release, err = hitlRelease(ctx, cfg, c, srv, dbURL, adminID, adminSecret, systemSecret, admin); err != nil {
			return fmt.Errorf("hitl release: %w", err)
		}
	}
	var kill []time.Duration
	if strings.HasPrefix(dbURL, "postgres") && cfg.phases != "hitl" && cfg.phases != "webhooks" && cfg.phases != "authz" && cfg.phases != "apikeys" {
		if kill, err = killPropagation(ctx, cfg, c, srv, dbURL, adminID, adminSecret, systemSecret, admin); err != nil {
			return fmt.Errorf("kill propagation: %w", err)
		}
	}

	// VmHWM disappears with the process, so read it before stopping the server.
	rssMB, rssErr := peakRSSMB(srv.cmd.Process.Pid)
	if rssErr != nil {
		fmt.Fprintln(os.Stderr, "loadgen: peak RSS unavailable:", rssErr)
	}
	r := report{
		cfg: cfg, db: dbKind(dbURL), machineResults: m2m, people: people, hitl: approvals, webhooks: hooks, authz: checks, apiKeys: apiKeys, kill: kill, rssMB: rssMB,
		machine: machineInfo(cfg.server),
	}
	r.print(os.Stdout)
	if cfg.out != "" {
		return r.appendRow(cfg.out)
	}
	return nil
}

// machineResults are the phases of service accounts and agents.
type machineResults struct {
	grants, detailGrants phaseResult // without and with authorization_details
	agentGrants          phaseResult
	exchanges            phaseResult // federation exchanges, warm key set
	intro                phaseResult
}

// runMachine creates service accounts and agents, then measures their
// grants, federation exchanges and introspection.
func runMachine(ctx context.Context, cfg config, c *client, pid int, admin string) (r machineResults, err error) {
	accounts := make([]account, cfg.accounts)
	agents := make([]account, cfg.accounts)
	for i := range accounts {
		if accounts[i], err = c.create(ctx, admin, "/api/v1/service-accounts", map[string]any{"name": fmt.Sprintf("bench-%d", i+1), "scopes": []string{"users:read"}}); err != nil {
			return r, fmt.Errorf("create service account %d: %w", i+1, err)
		}
		if agents[i], err = c.create(ctx, admin, "/api/v1/agents", map[string]any{"name": fmt.Sprintf("bench-agent-%d", i+1), "type": "service", "capabilities": []string{"read_users"}}); err != nil {
			return r, fmt.Errorf("create agent %d: %w", i+1, err)
		}
	}

	r.grants, err = runPhase(ctx, "grants", cfg, pid, func(ctx context.Context, n uint64) error {
		_, err := c.token(ctx, accounts[n%uint64(len(accounts))])
		return err
	})
	if err != nil {
		return r, err
	}
	// The same grants asking for authorization_details (RFC 9396): parsed,
	// checked against a registered type's JSON Schema, bound to the token.
	if err := c.adminJSON(ctx, admin, "/api/v1/rar/types", paymentType, nil); err != nil {
		return r, fmt.Errorf("register the RAR type: %w", err)
	}
	detailsForm := "grant_type=client_credentials&authorization_details=" + url.QueryEscape(paymentDetails)
	r.detailGrants, err = runPhase(ctx, "details grants", cfg, pid, func(ctx context.Context, n uint64) error {
		var out struct {
			AccessToken string            `json:"access_token"`
			Details     []json.RawMessage `json:"authorization_details"`
		}
		if err := c.postForm(ctx, "/api/v1/oauth/token", accounts[n%uint64(len(accounts))], detailsForm, &out); err != nil {
			return err
		}
		if out.AccessToken == "" || len(out.Details) != 1 {
			return errors.New("token response without the granted authorization_details")
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	// Agent grants carry agent claims and a token_issued audit entry
	// committed with each token.
	r.agentGrants, err = runPhase(ctx, "agent grants", cfg, pid, func(ctx context.Context, n uint64) error {
		_, err := c.token(ctx, agents[n%uint64(len(agents))])
		return err
	})
	if err != nil {
		return r, err
	}

	// Workload identity federation: agents trade a platform token (a signed
	// JWT, verified against the issuer's key set, cached after the warm-up)
	// for an access token.
	fed, err := setupFederation(ctx, c, admin, agents)
	if err != nil {
		return r, fmt.Errorf("federation: %w", err)
	}
	defer fed.close()
	r.exchanges, err = runPhase(ctx, "exchanges", cfg, pid, func(ctx context.Context, n uint64) error {
		return c.exchange(ctx, fed.forms[n%uint64(len(fed.forms))])
	})
	if err != nil {
		return r, err
	}

	// Introspect a fixed pool of live tokens, each with its owning account's
	// credentials, so the phase measures lookups rather than token issuance.
	type ownedToken struct {
		form  string // "token=..."
		owner account
	}
	pool := make([]ownedToken, max(1000, len(accounts)))
	for i := range pool {
		owner := accounts[i%len(accounts)]
		tok, err := c.token(ctx, owner)
		if err != nil {
			return r, fmt.Errorf("token for introspection pool: %w", err)
		}
		pool[i] = ownedToken{"token=" + url.QueryEscape(tok), owner}
	}
	r.intro, err = runPhase(ctx, "introspections", cfg, pid, func(ctx context.Context, n uint64) error {
		t := pool[n%uint64(len(pool))]
		return c.introspect(ctx, t.owner, t.form)
	})
	if err != nil {
		return r, err
	}
	return r, nil
}

// client speaks the few identityd endpoints the benchmark needs.
type client struct {
	base string
	http *http.Client
}

// token runs a client_credentials grant with client_secret_basic and returns
// the access token; anything but 200 with a token is an error.
func (c *client) token(ctx context.Context, a account) (string, error) {
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := c.postForm(ctx, "/api/v1/oauth/token", a, "grant_type=client_credentials", &out); err != nil {
		return "", err
	}
	if out.AccessToken == "" {
		return "", errors.New("token response without access_token")
	}
	return out.AccessToken, nil
}

// introspect succeeds only for 200 with "active": true.
func (c *client) introspect(ctx context.Context, a account, form string) error {
	var out struct {
		Active bool `json:"active"`
	}
	if err := c.postForm(ctx, "/api/v1/oauth/introspect", a, form, &out); err != nil {
		return err
	}
	if !out.Active {
		return errors.New("introspection: token not active")
	}
	return nil
}

func (c *client) postForm(ctx context.Context, path string, a account, form string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, strings.NewReader(form))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", a.basic)
	return c.do(req, http.StatusOK, out)
}

// create registers a service account or an agent through the admin API and
// returns its credentials.
func (c *client) create(ctx context.Context, adminToken, path string, fields map[string]any) (account, error) {
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, strings.NewReader(string(body)))
	if err != nil {
		return account{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	var out struct {
		ClientID     string `json:"clientId"`
		ClientSecret string `json:"clientSecret"`
	}
	if err := c.do(req, http.StatusCreated, &out); err != nil {
		return account{}, err
	}
	if out.ClientID == "" || out.ClientSecret == "" {
		return account{}, errors.New("response without clientId/clientSecret")
	}
	return newAccount(out.ClientID, out.ClientSecret), nil
}

// paymentType is a RAR type like the ones a payments API registers; the
// benchmark's details ask for one payment of it.
var paymentType = map[string]any{
	"type": "payment_initiation", "allowedActions": []string{"initiate", "status", "cancel"},
	"allowedLocations": []string{"https://pay.example/payments"},
	"schema": map[string]any{
		"type": "object", "required": []string{"instructedAmount", "creditorName", "creditorAccount"},
		"properties": map[string]any{
			"instructedAmount": map[string]any{"type": "object", "required": []string{"currency", "amount"}, "properties": map[string]any{
				"currency": map[string]any{"enum": []string{"EUR", "USD", "GBP"}},
				"amount":   map[string]any{"type": "string", "pattern": `^[0-9]+(\.[0-9]{1,2})?$`},
			}},
			"creditorName":    map[string]any{"type": "string", "maxLength": 70},
			"creditorAccount": map[string]any{"type": "object", "required": []string{"iban"}, "properties": map[string]any{"iban": map[string]any{"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"}}},
		},
	},
}

const paymentDetails = `[{"type":"payment_initiation","actions":["initiate","status"],"locations":["https://pay.example/payments"],` +
	`"instructedAmount":{"currency":"EUR","amount":"123.50"},"creditorName":"Merchant A","creditorAccount":{"iban":"DE02100100109307118603"}}]`

// do sends req, checks the status and decodes the JSON body into out. The
// body is always read to the end so that the connection is reused.
func (c *client) do(req *http.Request, want int, out any) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: status %d: %.200s", req.Method, req.URL.Path, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s %s: decode: %w", req.Method, req.URL.Path, err)
	}
	return nil
}

func randomString(n int, encode func([]byte) string) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return encode(b)
}

func dbKind(u string) string {
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		return "postgres"
	}
	return "sqlite"
}

// killPropagation starts a second replica on the same database and, round
// after round, kills an agent through the first while the second keeps
// calling the API with the agent's token (cached there): the time from
// sending the kill to the second replica's first 401.
func killPropagation(ctx context.Context, cfg config, c *client, first *server, dbURL, adminID, adminSecret, systemSecret, admin string) ([]time.Duration, error) {
	second, err := startServer(ctx, cfg.server, dbURL, adminID, adminSecret, systemSecret)
	if err != nil {
		return nil, err
	}
	defer second.stop()
	c2 := &client{base: second.base, http: c.http}
	const rounds = 20
	out := make([]time.Duration, 0, rounds)
	for i := range rounds {
		body, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("kill-%d", i), "type": "service", "capabilities": []string{"read_users"}})
		var agent struct {
			ID, ClientID, ClientSecret string
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, first.base+"/api/v1/agents", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+admin)
		if err := c.do(req, http.StatusCreated, &agent); err != nil {
			return nil, err
		}
		token, err := c2.token(ctx, newAccount(agent.ClientID, agent.ClientSecret))
		if err != nil {
			return nil, err
		}
		whoami := func() (int, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, second.base+"/api/v1/m2m/whoami", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := c.http.Do(req)
			if err != nil {
				return 0, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		if st, err := whoami(); err != nil || st != http.StatusOK {
			return nil, fmt.Errorf("whoami before the kill: %d %v", st, err)
		}
		refused := make(chan time.Time, 1)
		go func() {
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
				if st, err := whoami(); err == nil && st == http.StatusUnauthorized {
					refused <- time.Now()
					return
				}
			}
			close(refused)
		}()
		start := time.Now()
		kreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, first.base+"/api/v1/agents/"+agent.ID+"/kill", strings.NewReader(`{"reason":"benchmark"}`))
		kreq.Header.Set("Content-Type", "application/json")
		kreq.Header.Set("Authorization", "Bearer "+admin)
		var killed map[string]any
		if err := c.do(kreq, http.StatusOK, &killed); err != nil {
			return nil, err
		}
		at, ok := <-refused
		if !ok {
			return nil, errors.New("the second replica never refused the killed agent's token")
		}
		out = append(out, at.Sub(start))
	}
	return out, nil
}
