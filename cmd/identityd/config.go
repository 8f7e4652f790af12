package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	netmail "net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/extensions/risk"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	requsage "github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/persistence"
)

// Config is identityd's whole configuration, read from IDENTITYD_* variables.
type Config struct {
	Addr              string
	Issuer            string
	DatabaseURL       string
	AdminClientID     string
	AdminClientSecret string
	SystemSecret      string
	AccessTokenTTL    time.Duration
	RefreshReuseGrace time.Duration // IDENTITYD_REFRESH_REUSE_GRACE: how long a used refresh token still refreshes (an honest retry)
	MaxDelegation     int           // actors in a delegated token's act chain
	DelegationMaxTTL  time.Duration // IDENTITYD_DELEGATION_MAX_TTL: the longest a person's delegation to an agent (CIBA) may last
	SMTPURL           string
	MailFrom          string
	InviteTTL         time.Duration
	PasskeyTimeout    time.Duration // how long a passkey ceremony lives
	SessionIdle       time.Duration // an SSO session ends after this long unused
	SessionMax        time.Duration // and this long after sign-in, whatever its use
	RateLimits        bool
	RedisURL          string
	LogLevel          slog.Level
	ShutdownGrace     time.Duration // how long a stopping server drains before it closes
	Risk              risk.Config   // IDENTITYD_RISK_DISABLED, IDENTITYD_GEOIP_FILE
	CaptchaVerifyURL  string        // a siteverify-compatible endpoint; set, forgot-password needs a captcha
	CaptchaSecret     string
	CaptchaWidget     string // turnstile, hcaptcha or recaptcha: the widget the hosted forgot page shows
	CaptchaSiteKey    string
	PrivilegedMaxAge  time.Duration   // IDENTITYD_PRIVILEGED_MAX_AGE: how recent a sign-in a credential change needs
	WebhookPrivate    bool            // IDENTITYD_WEBHOOK_ALLOW_PRIVATE: webhooks may use http and private addresses
	Tiers             []requsage.Tier // IDENTITYD_TIER_LIMITS over the spec's numbers
}

// parseSeconds reads a duration given as whole seconds ("300") or as a Go
// duration ("5m", "90s") in whole seconds.
func parseSeconds(v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > int64(math.MaxInt64/time.Second) {
			return 0, errors.New("out of range")
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err == nil && d%time.Second != 0 {
		err = errors.New("not whole seconds")
	}
	return d, err
}

// minSystemSecret is the shortest IDENTITYD_SYSTEM_SECRET accepted (it keys
// every HMAC identityd computes).
const minSystemSecret = 32

// LoadConfig reads the configuration and reports every problem at once.
func LoadConfig(getenv func(string) string) (Config, error) {
	get := func(key, def string) string {
		if v := strings.TrimSpace(getenv(key)); v != "" {
			return v
		}
		return def
	}
	c := Config{
		Addr:              get("IDENTITYD_ADDR", "127.0.0.1:8080"),
		Issuer:            strings.TrimSuffix(get("IDENTITYD_ISSUER", "http://localhost:8080"), "/"),
		DatabaseURL:       get("IDENTITYD_DATABASE_URL", "sqlite://./data/identityd.db"),
		AdminClientID:     get("IDENTITYD_ADMIN_CLIENT_ID", ""),
		AdminClientSecret: getenv("IDENTITYD_ADMIN_CLIENT_SECRET"),
		SystemSecret:      getenv("IDENTITYD_SYSTEM_SECRET"),
		RedisURL:          get("IDENTITYD_REDIS_URL", ""),
		SMTPURL:           get("IDENTITYD_SMTP_URL", ""),
		MailFrom:          get("IDENTITYD_MAIL_FROM", "identityd <noreply@localhost>"),
		CaptchaVerifyURL:  get("IDENTITYD_CAPTCHA_VERIFY_URL", ""),
		CaptchaSecret:     getenv("IDENTITYD_CAPTCHA_SECRET"),
		CaptchaWidget:     get("IDENTITYD_CAPTCHA_WIDGET", ""),
		CaptchaSiteKey:    get("IDENTITYD_CAPTCHA_SITE_KEY", ""),
	}
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}

	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		bad("IDENTITYD_ADDR", "must be host:port (%v)", err)
	}
	if u, err := url.Parse(c.Issuer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		// RFC 8414 §2: an https URL with no query or fragment; http is
		// tolerated for development on loopback and behind a TLS proxy.
		bad("IDENTITYD_ISSUER", "must be an absolute http(s) URL without query or fragment")
	}
	if _, _, err := persistence.ParseURL(c.DatabaseURL); err != nil {
		bad("IDENTITYD_DATABASE_URL", "%v", err)
	}
	switch {
	case (c.AdminClientID == "") != (c.AdminClientSecret == ""):
		bad("IDENTITYD_ADMIN_CLIENT_ID/SECRET", "set both or neither")
	case c.AdminClientSecret != "" && len(c.AdminClientSecret) < serviceaccounts.MinAdminSecretLength:
		bad("IDENTITYD_ADMIN_CLIENT_SECRET", "must be at least %d characters", serviceaccounts.MinAdminSecretLength)
	case len(c.AdminClientID) > 200 || strings.ContainsAny(c.AdminClientID, " \t\r\n:"):
		bad("IDENTITYD_ADMIN_CLIENT_ID", "must be at most 200 characters, without spaces or colons")
	}
	if c.SystemSecret != "" && len(c.SystemSecret) < minSystemSecret {
		bad("IDENTITYD_SYSTEM_SECRET", "must be at least %d characters", minSystemSecret)
	}
	ttl, err := strconv.Atoi(get("IDENTITYD_ACCESS_TOKEN_TTL", "3600"))
	if err != nil || ttl < 1 || ttl > 86400 {
		bad("IDENTITYD_ACCESS_TOKEN_TTL", "must be whole seconds from 1 to 86400")
	}
	c.AccessTokenTTL = time.Duration(ttl) * time.Second
	// Long enough for a client to retry after a lost answer or a restart,
	// short enough that a thief's replay is still caught (Okta allows 0-60 s).
	if c.RefreshReuseGrace, err = parseSeconds(get("IDENTITYD_REFRESH_REUSE_GRACE", "10s")); err != nil || c.RefreshReuseGrace < 0 || c.RefreshReuseGrace > 5*time.Minute {
		bad("IDENTITYD_REFRESH_REUSE_GRACE", "must be whole seconds (10) or a Go duration in whole seconds (10s), from 0 to 5 minutes; 0 turns it off")
	}
	if c.MaxDelegation, err = strconv.Atoi(get("IDENTITYD_MAX_DELEGATION_DEPTH", "5")); err != nil || c.MaxDelegation < 1 || c.MaxDelegation > 20 {
		bad("IDENTITYD_MAX_DELEGATION_DEPTH", "must be a whole number from 1 to 20")
	}
	// 30 days by default, as a person's refresh token; at most a year.
	delegationTTL, err := strconv.Atoi(get("IDENTITYD_DELEGATION_MAX_TTL", "2592000"))
	if err != nil || delegationTTL < 60 || delegationTTL > 365*86400 {
		bad("IDENTITYD_DELEGATION_MAX_TTL", "must be whole seconds from 60 to 31536000 (365 days)")
	}
	c.DelegationMaxTTL = time.Duration(delegationTTL) * time.Second
	if c.SMTPURL != "" {
		if _, err := mail.NewSMTP(c.SMTPURL, c.MailFrom); err != nil {
			bad("IDENTITYD_SMTP_URL", "%v", err)
		}
	}
	if a, err := netmail.ParseAddress(c.MailFrom); err != nil || a.Address == "" {
		bad("IDENTITYD_MAIL_FROM", "must be an e-mail address, optionally with a name: identityd <noreply@example.com>")
	}
	inviteTTL, err := strconv.Atoi(get("IDENTITYD_INVITE_TTL", "259200"))
	if err != nil || inviteTTL < 1 || inviteTTL > 30*86400 {
		bad("IDENTITYD_INVITE_TTL", "must be whole seconds from 1 to 2592000 (30 days)")
	}
	c.InviteTTL = time.Duration(inviteTTL) * time.Second
	passkeyTimeout, err := strconv.Atoi(get("IDENTITYD_PASSKEY_TIMEOUT", "300"))
	if err != nil || passkeyTimeout < 1 || passkeyTimeout > 600 {
		bad("IDENTITYD_PASSKEY_TIMEOUT", "must be whole seconds from 1 to 600")
	}
	c.PasskeyTimeout = time.Duration(passkeyTimeout) * time.Second
	idle, err := strconv.Atoi(get("IDENTITYD_SESSION_IDLE", "86400"))
	if err != nil || idle < 60 || idle > 365*86400 {
		bad("IDENTITYD_SESSION_IDLE", "must be whole seconds from 60 to 31536000 (365 days)")
	}
	c.SessionIdle = time.Duration(idle) * time.Second
	most, err := strconv.Atoi(get("IDENTITYD_SESSION_MAX", "1209600"))
	if err != nil || most < 60 || most > 365*86400 {
		bad("IDENTITYD_SESSION_MAX", "must be whole seconds from 60 to 31536000 (365 days)")
	} else if most < idle {
		bad("IDENTITYD_SESSION_MAX", "must not be shorter than IDENTITYD_SESSION_IDLE")
	}
	c.SessionMax = time.Duration(most) * time.Second
	// Every credential added or removed is e-mailed (issue 39): the link
	// notice can no longer be turned off, and saying so is an error rather
	// than a setting silently ignored.
	if v := get("IDENTITYD_LINK_NOTICE", "true"); v != "true" {
		bad("IDENTITYD_LINK_NOTICE", "is no longer a setting: every sign-in method linked is e-mailed to the account; remove it (or set true)")
	}
	if c.PrivilegedMaxAge, err = parseSeconds(get("IDENTITYD_PRIVILEGED_MAX_AGE", "300")); err != nil || c.PrivilegedMaxAge < time.Second {
		bad("IDENTITYD_PRIVILEGED_MAX_AGE", "must be whole seconds (300) or a Go duration (5m) of at least 1s")
	}
	switch get("IDENTITYD_WEBHOOK_ALLOW_PRIVATE", "false") {
	case "true":
		c.WebhookPrivate = true
	case "false":
	default:
		bad("IDENTITYD_WEBHOOK_ALLOW_PRIVATE", "must be true or false")
	}
	tiers, err := requsage.ParseTiers(get("IDENTITYD_TIER_LIMITS", ""))
	if err != nil {
		bad("IDENTITYD_TIER_LIMITS", "%v", err)
	}
	c.Tiers = tiers
	switch get("IDENTITYD_RATE_LIMITS", "on") {
	case "on":
		c.RateLimits = true
	case "off":
	default:
		bad("IDENTITYD_RATE_LIMITS", "must be on or off")
	}
	if c.RedisURL != "" {
		if u, err := url.Parse(c.RedisURL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			bad("IDENTITYD_REDIS_URL", "must be a redis:// or rediss:// URL")
		}
	}
	grace, err := strconv.Atoi(get("IDENTITYD_SHUTDOWN_GRACE", "5"))
	if err != nil || grace < 0 || grace > 300 {
		bad("IDENTITYD_SHUTDOWN_GRACE", "must be whole seconds from 0 to 300")
	}
	c.ShutdownGrace = time.Duration(grace) * time.Second
	if err := c.LogLevel.UnmarshalText([]byte(get("IDENTITYD_LOG_LEVEL", "info"))); err != nil {
		bad("IDENTITYD_LOG_LEVEL", "must be debug, info, warn or error")
	}
	if c.Risk, err = risk.LoadConfig(getenv); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.CaptchaVerifyURL == "" && c.CaptchaSecret != "":
		bad("IDENTITYD_CAPTCHA_VERIFY_URL", "is required with IDENTITYD_CAPTCHA_SECRET")
	case c.CaptchaVerifyURL != "" && c.CaptchaSecret == "":
		bad("IDENTITYD_CAPTCHA_SECRET", "is required with IDENTITYD_CAPTCHA_VERIFY_URL")
	case c.CaptchaVerifyURL != "":
		if u, err := url.Parse(c.CaptchaVerifyURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad("IDENTITYD_CAPTCHA_VERIFY_URL", "must be an absolute http(s) URL, such as https://challenges.cloudflare.com/turnstile/v0/siteverify")
		}
	}
	if c.CaptchaWidget != "" || c.CaptchaSiteKey != "" {
		if _, ok := reset.NewWidget(c.CaptchaWidget, c.CaptchaSiteKey); !ok {
			bad("IDENTITYD_CAPTCHA_WIDGET", "must be turnstile, hcaptcha or recaptcha, with IDENTITYD_CAPTCHA_SITE_KEY")
		}
		if c.CaptchaSiteKey == "" || strings.ContainsAny(c.CaptchaSiteKey, "\"'<> ") {
			bad("IDENTITYD_CAPTCHA_SITE_KEY", "is required with IDENTITYD_CAPTCHA_WIDGET: the provider's site key")
		}
		if c.CaptchaVerifyURL == "" {
			bad("IDENTITYD_CAPTCHA_WIDGET", "needs IDENTITYD_CAPTCHA_VERIFY_URL and IDENTITYD_CAPTCHA_SECRET")
		}
	}
	return c, errors.Join(errs...)
}
