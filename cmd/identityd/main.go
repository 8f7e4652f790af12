// Command identityd is the identity server: `identityd serve` runs it,
// `identityd migrate` applies the database migrations and exits, and
// `identityd keys rotate` and `identityd admin reset` act on the configured
// database without a server.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/ory/fosite"
	"github.com/redis/go-redis/v9"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/store/memory"
	redisstore "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/analytics"
	"github.com/identityd/identityd/extensions/apikeys"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/extensions/authz"
	"github.com/identityd/identityd/extensions/ciba"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/extensions/jit"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/extensions/risk"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/extensions/upstream"
	requsage "github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/extensions/webhooks"
	"github.com/identityd/identityd/extensions/workload"
	"github.com/identityd/identityd/handlers"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

const usage = `usage: identityd <command>

commands:
  serve         run the server (migrations are applied first)
  migrate       apply the database migrations and exit
  keys rotate   make new signing keys the signers; the keys they replace stay
                published until what they signed has expired
  admin reset   issue a new secret for the bootstrap admin (or make an admin
                if no account holds the admin scope) and print it once

Configuration comes from IDENTITYD_* environment variables; see README.md.
`

func main() {
	command := strings.Join(os.Args[1:], " ")
	if !slices.Contains([]string{"serve", "migrate", "keys rotate", "admin reset"}, command) {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cfg, err := LoadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "identityd: configuration:\n%v\n", err)
		os.Exit(2)
	}
	// The log is held back until the server has made its bootstrap admin,
	// so that generated credentials come first on stderr, apart from every
	// JSON line (see bootstrapAdmin).
	held := &heldLog{w: os.Stderr, buf: &bytes.Buffer{}}
	log := slog.New(slog.NewJSONHandler(held, &slog.HandlerOptions{Level: cfg.LogLevel}))
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch command {
	case "serve":
		err = serve(ctx, cfg, log, held)
	case "migrate":
		held.release("")
		err = migrate(ctx, cfg, log)
	case "keys rotate":
		held.release("")
		err = rotateKeys(ctx, cfg, log)
	case "admin reset":
		held.release("")
		err = resetAdmin(ctx, cfg, log)
	}
	held.release("") // a server that failed to start
	if err != nil {
		log.Error("identityd stopped", "error", err.Error())
		os.Exit(1)
	}
}

func openDatabase(ctx context.Context, cfg Config, log *slog.Logger) (*sqlx.DB, persistence.Dialect, error) {
	db, dialect, err := persistence.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, "", err
	}
	applied, err := persistence.Migrate(ctx, db.DB, dialect)
	if err != nil {
		db.Close()
		return nil, "", err
	}
	// OpenFGA's own migrations, in their own version table (persistence/fga.go).
	fgaApplied, err := persistence.MigrateFGA(ctx, db.DB, dialect)
	if err != nil {
		db.Close()
		return nil, "", err
	}
	log.Info("database ready", "dialect", string(dialect), "migrations_applied", applied, "openfga_migrations_applied", fgaApplied)
	return db, dialect, nil
}

func migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	db, _, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	return db.Close()
}

func serve(ctx context.Context, cfg Config, log *slog.Logger, held *heldLog) error {
	tuneGC()
	tuneScheduler(cfg)
	store, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer store.Close()

	secret, err := systemSecret(ctx, cfg, store, log)
	if err != nil {
		return err
	}
	keys, err := oauth.LoadKeys(ctx, store, secret)
	if err != nil {
		return fmt.Errorf("signing keys: %w", err)
	}
	details, federation := rar.New(store), workload.New(store)
	// Human-in-the-loop approvals; their tokens through authorization_details.
	approvals := hitl.New(store)
	detailsPolicy := hitl.Details{HITL: approvals, Next: details}
	// People's delegations to agents (CIBA): they last as long as an access token.
	delegations := ciba.New(store, ciba.Config{Hasher: oauth.NewHasher(secret, ciba.PurposeAuthReqID), Details: detailsPolicy,
		DefaultLifetime: cfg.AccessTokenTTL, MaxLifetime: cfg.DelegationMaxTTL})
	provider := oauth.NewProvider(oauth.Config{
		Issuer: cfg.Issuer, AccessTokenTTL: cfg.AccessTokenTTL, RefreshReuseGrace: cfg.RefreshReuseGrace, SystemSecret: secret,
		Details: detailsPolicy, Federation: federation, Delegation: agents.Delegation{}, MaxDelegation: cfg.MaxDelegation,
		Backchannel: delegations,
	}, store, keys)
	accounts := serviceaccounts.New(store, provider.Hasher)
	if err := bootstrapAdmin(ctx, cfg, accounts, log, held); err != nil {
		return fmt.Errorf("bootstrap admin: %w", err)
	}
	go keys.Watch(ctx) // rotations by other replicas and by `identityd keys rotate`

	// E-mail: SMTP when configured, else the log (development). Messages go
	// through the outbox, sealed with a key derived from the system secret.
	var sender mail.Sender = mail.LogSender{Log: log}
	if cfg.SMTPURL != "" {
		if sender, err = mail.NewSMTP(cfg.SMTPURL, cfg.MailFrom); err != nil {
			return fmt.Errorf("IDENTITYD_SMTP_URL: %w", err)
		}
	} else {
		log.Warn("IDENTITYD_SMTP_URL is not set: e-mail (invite links included) is written to this log instead of sent; set it in production")
	}
	outbox, err := mail.NewOutbox(store, sender, oauth.DeriveKey(secret, "mail outbox"), log)
	if err != nil {
		return err
	}
	approvals.Notify(outbox, cfg.Issuer)   // approvers are e-mailed a link to the approval page
	delegations.Notify(outbox, cfg.Issuer) // people asked, a link to the consent page
	mailCtx, stopMail := context.WithCancel(ctx)
	mailDone := make(chan struct{})
	go func() { defer close(mailDone); outbox.Run(mailCtx) }()
	defer func() { stopMail(); <-mailDone }() // before the store closes

	// Webhooks: the logs' entries of the catalog's types go to the outbox in
	// their own transactions; the dispatcher delivers them.
	store.RouteWebhooks(webhooks.Routes())
	hooks := webhooks.New(store, secret, webhooks.Config{AllowPrivate: cfg.WebhookPrivate})
	if cfg.WebhookPrivate {
		log.Warn("IDENTITYD_WEBHOOK_ALLOW_PRIVATE is true: webhooks may use http and reach loopback, private and link-local addresses")
	}
	hooksCtx, stopHooks := context.WithCancel(ctx)
	hooksDone := make(chan struct{})
	go func() { defer close(hooksDone); hooks.Dispatcher(log).Run(hooksCtx) }()
	defer func() { stopHooks(); <-hooksDone }() // before the store closes

	metrics := handlers.NewMetrics()
	provider.OnIssue = func(_ context.Context, req fosite.AccessRequester) {
		metrics.TokensIssued.WithLabelValues(req.GetGrantTypes()[0]).Inc()
	}
	var limitStore limiter.Store
	if cfg.RateLimits {
		if limitStore, err = newLimitStore(cfg); err != nil {
			return err
		}
	}
	// Wrong second-factor codes count in the rate-limit store (shared through
	// Redis), or in process when limits are off: that bound always holds.
	secondFactor := mfa.New(store, secret, mfa.Config{Issuer: cfg.Issuer, Tries: limitStore, Outbox: outbox})
	geo, err := cfg.Risk.OpenGeo()
	if err != nil {
		return fmt.Errorf("IDENTITYD_GEOIP_FILE: %w", err)
	}
	passkeyService, err := passkeys.New(store, passkeys.Config{Issuer: cfg.Issuer, Outbox: outbox, Timeout: cfg.PasskeyTimeout})
	if err != nil {
		return err
	}
	signIn, err := signin.New(store, secret, signin.Config{Idle: cfg.SessionIdle, Max: cfg.SessionMax, Outbox: outbox, Issuer: cfg.Issuer,
		SecondFactor: secondFactor, Risk: risk.New(store, secret, cfg.Risk, geo), PasskeyFactor: passkeyService.AsFactor})
	if err != nil {
		return err
	}
	var captcha *reset.Captcha
	if cfg.CaptchaVerifyURL != "" {
		captcha = &reset.Captcha{VerifyURL: cfg.CaptchaVerifyURL, Secret: cfg.CaptchaSecret}
		captcha.Widget, _ = reset.NewWidget(cfg.CaptchaWidget, cfg.CaptchaSiteKey) // nil when none is configured
	}
	passwordReset := reset.New(store, secret, reset.Config{Outbox: outbox, Issuer: cfg.Issuer, Captcha: captcha})
	// Fine-grained authorization: OpenFGA in this process, on this database.
	fgaStore, err := persistence.OpenFGADatastore(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("OpenFGA datastore: %w", err)
	}
	engine, err := authz.New(ctx, fgaStore, store)
	if err != nil {
		fgaStore.Close()
		return err
	}
	defer engine.Close()
	engine.CacheGrants(store) // API-key validation asks on every call
	// End-user API keys (their last use written in batches) and usage
	// counts (flushed in batches): both flush a last time at shutdown,
	// before the store closes.
	keys2 := apikeys.New(store, secret)
	counter := requsage.NewCounter(store)
	batchCtx, stopBatches := context.WithCancel(context.Background())
	batchesDone := make(chan struct{}, 2)
	go func() { keys2.Run(batchCtx, log); batchesDone <- struct{}{} }()
	go func() { counter.Run(batchCtx, log); batchesDone <- struct{}{} }()
	defer func() { stopBatches(); <-batchesDone; <-batchesDone }()
	// A sweeper writes due HITL timeouts to the audit trail (reads never
	// wait for it: extensions/hitl Status).
	go sweepHITL(ctx, approvals, log)
	// identityd's own application, through which its pages sign people in.
	apps := applications.New(store, provider.Hasher)
	var accountSealer *oauth.Sealer
	if _, err := apps.EnsureAccount(ctx, cfg.Issuer); err != nil {
		log.Warn("identityd's own application could not be made: the approval and consent pages will not sign people in", "error", err.Error())
	} else {
		accountSealer = oauth.NewSealer(secret, handlers.PurposeAccountState)
	}
	people := directory.New(store)
	people.Notify(outbox, cfg.Issuer) // a changed address: its old one is told
	draining := &atomic.Bool{}
	srv := &http.Server{
		Addr: cfg.Addr,
		Handler: handlers.New(handlers.Options{
			Provider: provider, ServiceAccounts: accounts, Applications: apps, Agents: agents.New(store, provider.Hasher), RAR: details, Workload: federation,
			Directory: people, Invites: invites.New(store, secret, outbox, cfg.Issuer, cfg.InviteTTL),
			SignIn: signIn, MFA: secondFactor, Reset: passwordReset, CSRF: pages.NewCSRF(oauth.DeriveKey(secret, pages.PurposeCSRF)), Health: store.Health, Draining: draining, Units: store.InTx, Logger: log,
			Metrics: metrics, RateLimits: handlers.DefaultRateLimits(), LimitStore: limitStore,
			Upstream: upstream.New(store, signIn, secret, upstream.Config{Issuer: cfg.Issuer}), Passkeys: passkeyService,
			HITL: approvals, JIT: jit.New(store, approvals), CIBA: delegations, AccountSealer: accountSealer, Webhooks: hooks,
			Authz: engine, Analytics: analytics.New(store), APIKeys: keys2, Usage: counter, Tiers: cfg.Tiers, PrivilegedMaxAge: cfg.PrivilegedMaxAge,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go sweep(ctx, store, keys, cfg, log)
	if addr := os.Getenv("IDENTITYD_PPROF_ADDR"); addr != "" {
		// Profiling for operators, on its own listener (keep it on loopback).
		go func() { log.Warn("pprof server stopped", "error", http.ListenAndServe(addr, pprofMux()).Error()) }()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("identityd listening", "addr", cfg.Addr, "issuer", cfg.Issuer, "rate_limits", cfg.RateLimits, "gomaxprocs", runtime.GOMAXPROCS(0))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Drain: /health answers 503 and every answer closes its connection,
	// for the grace period, so that load balancers and clients move away
	// while requests still succeed; then the listener closes and requests
	// under way finish. Closing kept-alive connections at once would reset
	// requests already sent on them.
	log.Info("draining", "grace_seconds", cfg.ShutdownGrace.Seconds())
	draining.Store(true)
	approvals.Stop() // sync waits answer what they have
	time.Sleep(cfg.ShutdownGrace)
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// tuneGC trades memory the server has to spare for CPU it does not: the
// token path allocates a great deal of short-lived garbage, and Go's default
// (collect when the heap doubles) spends a large share of a small machine on
// collection. GOGC 400 with a soft limit of 150 MiB keeps the heap small in
// absolute terms, plus room for the password hashes running at once (each
// holds 64 MiB for a moment); an operator's GOGC or GOMEMLIMIT wins.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(150<<20 + directory.HashingMemory())
	}
}

// tuneScheduler gives Go's scheduler one processor more than it would take
// (the CPUs, or the container's CPU limit) when the database is SQLite. Its
// one writer and the goroutine syncing its log spend much of their time in
// fsync and pwrite; back from such a call, a goroutine whose processor went
// to the request handlers meanwhile queues behind them, and the writer sets
// the pace of every sign-in. With one processor spare, it takes that one
// instead (measured: passkey sign-ins +6%, docs/benchmarks.md). An
// operator's GOMAXPROCS wins. Setting it stops Go from following a later
// change of the container's CPU limit, as the environment variable would.
func tuneScheduler(cfg Config) {
	if dialect, _, _ := persistence.ParseURL(cfg.DatabaseURL); dialect == persistence.SQLite && os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
	}
}

// systemSecret is IDENTITYD_SYSTEM_SECRET, or else the one stored in the
// database, made on first start: every replica then shares it.
func systemSecret(ctx context.Context, cfg Config, store *persistence.Store, log *slog.Logger) ([]byte, error) {
	if cfg.SystemSecret != "" {
		return []byte(cfg.SystemSecret), nil
	}
	stored, err := store.Setting(ctx, systemSecretKey)
	if errors.Is(err, persistence.ErrNotFound) {
		stored, err = store.SetSettingOnce(ctx, systemSecretKey, oauth.NewSecret())
		log.Warn("IDENTITYD_SYSTEM_SECRET is not set: using a generated secret stored in the database; set it in production")
	}
	if err != nil {
		return nil, fmt.Errorf("system secret: %w", err)
	}
	return []byte(stored), nil
}

// serversSecret is the system secret the server uses, for the commands:
// never generated here, since the server may have one configured.
func serversSecret(ctx context.Context, cfg Config, store *persistence.Store) ([]byte, error) {
	if cfg.SystemSecret != "" {
		return []byte(cfg.SystemSecret), nil
	}
	stored, err := store.Setting(ctx, systemSecretKey)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, errors.New("IDENTITYD_SYSTEM_SECRET is not set and the database holds no generated one: run this command with the server's configuration")
	} else if err != nil {
		return nil, fmt.Errorf("system secret: %w", err)
	}
	return []byte(stored), nil
}

// systemSecretKey is the setting that holds a generated system secret.
const systemSecretKey = "system_secret"

// bootstrapAdmin makes sure an admin service account exists: the configured
// one, or, on first start without one, a generated one whose credentials
// are shown once on stderr, before any log line (held until then).
func bootstrapAdmin(ctx context.Context, cfg Config, accounts *serviceaccounts.Service, log *slog.Logger, held *heldLog) error {
	if cfg.AdminClientID != "" {
		held.release("")
		sa, err := accounts.EnsureAdmin(ctx, cfg.AdminClientID, cfg.AdminClientSecret)
		if err == nil {
			log.Info("bootstrap admin ready", "client_id", sa.ClientID)
		}
		return err
	}
	clientID, secret, created, err := accounts.GenerateAdminIfNone(ctx)
	if err != nil || !created {
		held.release("")
		return err
	}
	held.release(credentialsBlock("created an admin service account", clientID, secret))
	return nil
}

// credentialsBlock shows admin credentials once, as one block marked at
// both ends, none of whose lines a JSON log parser could take for a log
// line: generated at a first start, or issued by `identityd admin reset`.
func credentialsBlock(what, clientID, secret string, notes ...string) string {
	const rule = "======================================================================"
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\nidentityd: %s. Its secret is shown only this once:\n\n", rule, what)
	fmt.Fprintf(&b, "  client_id:     %s\n  client_secret: %s\n\n", clientID, secret)
	for _, n := range notes {
		fmt.Fprintf(&b, "%s\n", n)
	}
	fmt.Fprintf(&b, "Keep the secret safe. If it is lost, `identityd admin reset` issues a new one.\n%s\n\n", rule)
	return b.String()
}

// heldLog is stderr for the log, holding lines back until released.
type heldLog struct {
	mu  sync.Mutex
	w   io.Writer
	buf *bytes.Buffer // nil once released
}

func (h *heldLog) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.buf != nil {
		return h.buf.Write(p)
	}
	return h.w.Write(p)
}

// release writes first (a credentials block, or nothing), then the lines
// held, and stops holding; later calls do nothing.
func (h *heldLog) release(first string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.buf == nil {
		return
	}
	_, _ = io.WriteString(h.w, first)
	_, _ = h.w.Write(h.buf.Bytes())
	h.buf = nil
}

// rotateKeys is `identityd keys rotate`: new signing keys sign from now on,
// on every server of the database (at once on PostgreSQL through its
// notice, within oauth.KeyReload otherwise); the keys they replace stay
// published until what they signed has expired.
func rotateKeys(ctx context.Context, cfg Config, log *slog.Logger) error {
	store, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer store.Close()
	// The new keys are sealed as the server seals them: with its system secret.
	secret, err := serversSecret(ctx, cfg, store)
	if err != nil {
		return err
	}
	added, retired, err := oauth.RotateKeys(ctx, store, oauth.NewSealer(secret, oauth.PurposeSigningKey))
	if err != nil {
		return fmt.Errorf("rotate signing keys: %w", err)
	}
	for _, k := range added {
		fmt.Printf("active   %s  %s\n", k.Alg, k.KID)
	}
	for _, kid := range retired {
		fmt.Printf("retired  %s\n", kid)
	}
	return nil
}

// resetAdmin is `identityd admin reset`: a new secret for the bootstrap
// admin, printed once; the old one stops working at once in the database.
func resetAdmin(ctx context.Context, cfg Config, log *slog.Logger) error {
	store, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer store.Close()
	// The secret must be hashed as the server hashes it: with its system
	// secret.
	secret, err := serversSecret(ctx, cfg, store)
	if err != nil {
		return err
	}
	sa, adminSecret, err := serviceaccounts.New(store, oauth.NewSecretHasher(secret)).ResetAdmin(ctx, cfg.AdminClientID)
	if err != nil {
		return fmt.Errorf("admin reset: %w", err)
	}
	if err := store.AnnounceToServers(ctx); err != nil {
		return fmt.Errorf("admin reset: the new secret is stored, but running servers were not told (restart them): %w", err)
	}
	var notes []string
	if cfg.AdminClientID != "" {
		notes = append(notes, "IDENTITYD_ADMIN_CLIENT_SECRET is set: put this secret there, or the next start of identityd restores the configured one.")
	}
	if dialect, _, _ := persistence.ParseURL(cfg.DatabaseURL); dialect == persistence.SQLite {
		notes = append(notes, fmt.Sprintf("A running identityd on this SQLite database refuses the old secret within %s.", persistence.EpochPoll))
	}
	fmt.Print(credentialsBlock("issued a new secret for the admin service account", sa.ClientID, adminSecret, notes...))
	return nil
}

// openStore opens the configured database, applying pending migrations.
func openStore(ctx context.Context, cfg Config, log *slog.Logger) (*persistence.Store, error) {
	db, dialect, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	store, err := persistence.New(ctx, db, dialect, cfg.DatabaseURL)
	if err != nil {
		db.Close()
		return nil, err
	}
	return store, nil
}

func pprofMux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return m
}

func newLimitStore(cfg Config) (limiter.Store, error) {
	opts := limiter.StoreOptions{Prefix: "identityd", CleanUpInterval: time.Minute}
	if cfg.RedisURL == "" {
		return memory.NewStoreWithOptions(opts), nil
	}
	ro, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("IDENTITYD_REDIS_URL: %w", err)
	}
	return redisstore.NewStoreWithOptions(redis.NewClient(ro), opts)
}

// sweep deletes, once a minute, expired token rows, codes and refresh
// tokens (refused anyway: this keeps the tables small), the records of e-mail sent more than
// mailRetention ago (their text is gone already) and retired signing keys
// whose window has passed (they left JWKS already).
func sweep(ctx context.Context, store *persistence.Store, keys *oauth.KeySet, cfg Config, log *slog.Logger) {
	ttl := cfg.AccessTokenTTL
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n, err := store.DeleteExpiredTokens(ctx, now, ttl); err != nil {
				log.Warn("sweeping expired tokens failed", "error", err.Error())
			} else if n > 0 {
				log.Debug("swept expired tokens", "count", n)
			}
			if _, err := store.DeleteExpiredFlows(ctx, now); err != nil {
				log.Warn("sweeping expired codes and refresh tokens failed", "error", err.Error())
			}
			if _, err := store.DeleteSentMail(ctx, now.Add(-mailRetention)); err != nil {
				log.Warn("sweeping sent e-mail failed", "error", err.Error())
			}
			if _, err := keys.Sweep(ctx, now); err != nil {
				log.Warn("sweeping retired signing keys failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredSSOSessions(ctx, now, cfg.SessionIdle); err != nil {
				log.Warn("ending expired sessions failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredSignInFlows(ctx, now); err != nil {
				log.Warn("sweeping expired sign-in flows failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredEmailChallenges(ctx, now); err != nil {
				log.Warn("sweeping expired e-mailed codes and links failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredMFAPending(ctx, now); err != nil {
				log.Warn("sweeping expired step-ups failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredUpstream(ctx, now); err != nil {
				log.Warn("sweeping expired upstream sign-ins and pending links failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredPasswordResets(ctx, now); err != nil {
				log.Warn("sweeping expired password reset tokens failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredLinkingTokens(ctx, now); err != nil {
				log.Warn("sweeping expired linking tokens failed", "error", err.Error())
			}
			if _, err := store.DeleteExpiredPasskeyChallenges(ctx, now); err != nil {
				log.Warn("sweeping expired passkey ceremonies failed", "error", err.Error())
			}
			// Roll up the analytics of the days that ended, so that no
			// overview pays for it (persistence/analytics.go).
			if _, err := store.RollAuthDays(ctx, persistence.DayOf(now)-rollDays, persistence.DayOf(now), now); err != nil {
				log.Warn("rolling up the analytics of past days failed; overviews roll them when they read them", "error", err.Error())
			}
			if _, err := store.RollAuthHours(ctx, persistence.HourOf(now)-48, persistence.HourOf(now), now); err != nil {
				log.Warn("rolling up the analytics of past hours failed; overviews roll them when they read them", "error", err.Error())
			}
			if err := store.DeleteAuthHoursBefore(ctx, persistence.HourOf(now)-72); err != nil {
				log.Warn("sweeping old hourly analytics failed", "error", err.Error())
			}
		}
	}
}

// rollDays is how far back the sweeper rolls up analytics (the longest
// window a dashboard reads by default, and its 30 days of monthly actives).
const rollDays = 62

// mailRetention is how long the record of a sent message is kept.
const mailRetention = 30 * 24 * time.Hour

// sweepHITL writes due HITL timeouts every few seconds until ctx ends.
func sweepHITL(ctx context.Context, approvals *hitl.Service, log *slog.Logger) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := approvals.Sweep(ctx); err != nil && ctx.Err() == nil {
				log.Warn("writing HITL timeouts failed; reads are exact regardless", "error", err.Error())
			}
		}
	}
}
