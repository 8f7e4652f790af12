// Command identityd is the identity server: `identityd serve` runs it,
// `identityd migrate` applies the database migrations and exits.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
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
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/extensions/workload"
	"github.com/identityd/identityd/handlers"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

const usage = `usage: identityd <command>

commands:
  serve     run the server (migrations are applied first)
  migrate   apply the database migrations and exit

Configuration comes from IDENTITYD_* environment variables; see README.md.
`

func main() {
	if len(os.Args) != 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cfg, err := LoadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "identityd: configuration:\n%v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch os.Args[1] {
	case "serve":
		err = serve(ctx, cfg, log)
	case "migrate":
		err = migrate(ctx, cfg, log)
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
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
	log.Info("database ready", "dialect", string(dialect), "migrations_applied", applied)
	return db, dialect, nil
}

func migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	db, _, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	return db.Close()
}

func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	tuneGC()
	db, dialect, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	store, err := persistence.New(ctx, db, dialect, cfg.DatabaseURL)
	if err != nil {
		db.Close()
		return err
	}
	defer store.Close()

	secret, err := systemSecret(ctx, cfg, store, log)
	if err != nil {
		return err
	}
	keys, err := oauth.LoadKeys(ctx, store)
	if err != nil {
		return fmt.Errorf("signing keys: %w", err)
	}
	details, federation := rar.New(store), workload.New(store)
	provider := oauth.NewProvider(oauth.Config{
		Issuer: cfg.Issuer, AccessTokenTTL: cfg.AccessTokenTTL, SystemSecret: secret,
		Details: details, Federation: federation, Delegation: agents.Delegation{}, MaxDelegation: cfg.MaxDelegation,
	}, store, keys)
	accounts := serviceaccounts.New(store, provider.Hasher)
	if err := bootstrapAdmin(ctx, cfg, accounts, log); err != nil {
		return fmt.Errorf("bootstrap admin: %w", err)
	}

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
	mailCtx, stopMail := context.WithCancel(ctx)
	mailDone := make(chan struct{})
	go func() { defer close(mailDone); outbox.Run(mailCtx) }()
	defer func() { stopMail(); <-mailDone }() // before the store closes

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
	draining := &atomic.Bool{}
	srv := &http.Server{
		Addr: cfg.Addr,
		Handler: handlers.New(handlers.Options{
			Provider: provider, ServiceAccounts: accounts, Agents: agents.New(store, provider.Hasher), RAR: details, Workload: federation,
			Directory: directory.New(store), Invites: invites.New(store, provider.Hasher, outbox, cfg.Issuer, cfg.InviteTTL), Health: store.Health, Draining: draining, Units: store.InTx, Logger: log,
			Metrics: metrics, RateLimits: handlers.DefaultRateLimits(), LimitStore: limitStore,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go sweep(ctx, store, cfg.AccessTokenTTL, log)
	if addr := os.Getenv("IDENTITYD_PPROF_ADDR"); addr != "" {
		// Profiling for operators, on its own listener (keep it on loopback).
		go func() { log.Warn("pprof server stopped", "error", http.ListenAndServe(addr, pprofMux()).Error()) }()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("identityd listening", "addr", cfg.Addr, "issuer", cfg.Issuer, "rate_limits", cfg.RateLimits)
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
// absolute terms; an operator's GOGC or GOMEMLIMIT wins.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(150 << 20)
	}
}

// systemSecret is IDENTITYD_SYSTEM_SECRET, or else the one stored in the
// database, made on first start: every replica then shares it.
func systemSecret(ctx context.Context, cfg Config, store *persistence.Store, log *slog.Logger) ([]byte, error) {
	if cfg.SystemSecret != "" {
		return []byte(cfg.SystemSecret), nil
	}
	const key = "system_secret"
	stored, err := store.Setting(ctx, key)
	if errors.Is(err, persistence.ErrNotFound) {
		stored, err = store.SetSettingOnce(ctx, key, oauth.NewSecret())
		log.Warn("IDENTITYD_SYSTEM_SECRET is not set: using a generated secret stored in the database; set it in production")
	}
	if err != nil {
		return nil, fmt.Errorf("system secret: %w", err)
	}
	return []byte(stored), nil
}

// bootstrapAdmin makes sure an admin service account exists: the configured
// one, or, on first start without one, a generated one shown once on stderr.
func bootstrapAdmin(ctx context.Context, cfg Config, accounts *serviceaccounts.Service, log *slog.Logger) error {
	if cfg.AdminClientID != "" {
		sa, err := accounts.EnsureAdmin(ctx, cfg.AdminClientID, cfg.AdminClientSecret)
		if err == nil {
			log.Info("bootstrap admin ready", "client_id", sa.ClientID)
		}
		return err
	}
	clientID, secret, created, err := accounts.GenerateAdminIfNone(ctx)
	if err != nil || !created {
		return err
	}
	fmt.Fprintf(os.Stderr, "\nidentityd: created an admin service account. Its secret is shown only this once:\n"+
		"  client_id:     %s\n  client_secret: %s\n\n", clientID, secret)
	return nil
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

// sweep deletes, once a minute, expired token rows (refused anyway: this
// keeps the table small) and the records of e-mail sent more than
// mailRetention ago (their text is gone already).
func sweep(ctx context.Context, store *persistence.Store, ttl time.Duration, log *slog.Logger) {
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
			if _, err := store.DeleteSentMail(ctx, now.Add(-mailRetention)); err != nil {
				log.Warn("sweeping sent e-mail failed", "error", err.Error())
			}
		}
	}
}

// mailRetention is how long the record of a sent message is kept.
const mailRetention = 30 * 24 * time.Hour
