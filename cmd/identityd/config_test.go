package main

import (
	"strings"
	"testing"
	"time"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestConfigDefaults(t *testing.T) {
	c, err := LoadConfig(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.Issuer != "http://localhost:8080" || c.DatabaseURL != "sqlite://./data/identityd.db" ||
		c.AccessTokenTTL != time.Hour || !c.RateLimits || c.RedisURL != "" || c.SessionIdle != 24*time.Hour || c.SessionMax != 14*24*time.Hour ||
		c.PasskeyTimeout != 5*time.Minute || c.DelegationMaxTTL != 30*24*time.Hour || c.RefreshReuseGrace != 10*time.Second ||
		c.PrivilegedMaxAge != 5*time.Minute {
		t.Fatalf("defaults %+v", c)
	}
}

// Every problem is reported at once.
func TestConfigReportsEveryProblem(t *testing.T) {
	_, err := LoadConfig(env(map[string]string{
		"IDENTITYD_ADDR":                 "nonsense",
		"IDENTITYD_ISSUER":               "ftp://x",
		"IDENTITYD_DATABASE_URL":         "mysql://x",
		"IDENTITYD_ADMIN_CLIENT_ID":      "admin",
		"IDENTITYD_SYSTEM_SECRET":        "short",
		"IDENTITYD_ACCESS_TOKEN_TTL":     "1h",
		"IDENTITYD_MAX_DELEGATION_DEPTH": "0",
		"IDENTITYD_DELEGATION_MAX_TTL":   "0",
		"IDENTITYD_RATE_LIMITS":          "maybe",
		"IDENTITYD_REDIS_URL":            "http://x",
		"IDENTITYD_LOG_LEVEL":            "loud",
		"IDENTITYD_ADMIN_CLIENT_SECRET":  "",
		"IDENTITYD_PRIVILEGED_MAX_AGE":   "0",
	}))
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, key := range []string{"IDENTITYD_ADDR", "IDENTITYD_ISSUER", "IDENTITYD_DATABASE_URL", "IDENTITYD_ADMIN_CLIENT_ID/SECRET",
		"IDENTITYD_SYSTEM_SECRET", "IDENTITYD_ACCESS_TOKEN_TTL", "IDENTITYD_MAX_DELEGATION_DEPTH", "IDENTITYD_DELEGATION_MAX_TTL", "IDENTITYD_RATE_LIMITS", "IDENTITYD_REDIS_URL", "IDENTITYD_LOG_LEVEL", "IDENTITYD_PRIVILEGED_MAX_AGE"} {
		if !strings.Contains(err.Error(), key+":") {
			t.Errorf("no problem reported for %s in:\n%v", key, err)
		}
	}
}

func TestConfigValues(t *testing.T) {
	long := strings.Repeat("s", 32)
	cases := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"postgres URL", map[string]string{"IDENTITYD_DATABASE_URL": "postgres://u@127.0.0.1/db"}, true},
		{"absolute sqlite", map[string]string{"IDENTITYD_DATABASE_URL": "sqlite:///var/lib/identityd.db"}, true},
		{"admin pair", map[string]string{"IDENTITYD_ADMIN_CLIENT_ID": "admin", "IDENTITYD_ADMIN_CLIENT_SECRET": long}, true},
		{"admin secret too short", map[string]string{"IDENTITYD_ADMIN_CLIENT_ID": "admin", "IDENTITYD_ADMIN_CLIENT_SECRET": "short"}, false},
		{"admin id with colon", map[string]string{"IDENTITYD_ADMIN_CLIENT_ID": "a:b", "IDENTITYD_ADMIN_CLIENT_SECRET": long}, false},
		{"ttl lower bound", map[string]string{"IDENTITYD_ACCESS_TOKEN_TTL": "1"}, true},
		{"session lifetimes", map[string]string{"IDENTITYD_SESSION_IDLE": "3600", "IDENTITYD_SESSION_MAX": "3600"}, true},
		{"session idle too short", map[string]string{"IDENTITYD_SESSION_IDLE": "59"}, false},
		{"session max below idle", map[string]string{"IDENTITYD_SESSION_IDLE": "7200", "IDENTITYD_SESSION_MAX": "3600"}, false},
		{"session max not a number", map[string]string{"IDENTITYD_SESSION_MAX": "2w"}, false},
		{"ttl zero", map[string]string{"IDENTITYD_ACCESS_TOKEN_TTL": "0"}, false},
		{"ttl above a day", map[string]string{"IDENTITYD_ACCESS_TOKEN_TTL": "86401"}, false},
		{"delegation depth", map[string]string{"IDENTITYD_MAX_DELEGATION_DEPTH": "3"}, true},
		{"refresh reuse grace in seconds", map[string]string{"IDENTITYD_REFRESH_REUSE_GRACE": "30"}, true},
		{"refresh reuse grace as a duration", map[string]string{"IDENTITYD_REFRESH_REUSE_GRACE": "1m30s"}, true},
		{"refresh reuse grace off", map[string]string{"IDENTITYD_REFRESH_REUSE_GRACE": "0"}, true},
		{"refresh reuse grace negative", map[string]string{"IDENTITYD_REFRESH_REUSE_GRACE": "-1s"}, false},
		{"refresh reuse grace above 5 minutes", map[string]string{"IDENTITYD_REFRESH_REUSE_GRACE": "301"}, false},
		{"refresh reuse grace not a duration", map[string]string{"IDENTITYD_REFRESH_REUSE_GRACE": "soon"}, false},
		{"delegation lifetime", map[string]string{"IDENTITYD_DELEGATION_MAX_TTL": "604800"}, true},
		{"delegation lifetime lower bound", map[string]string{"IDENTITYD_DELEGATION_MAX_TTL": "60"}, true},
		{"delegation lifetime too short", map[string]string{"IDENTITYD_DELEGATION_MAX_TTL": "59"}, false},
		{"delegation lifetime above a year", map[string]string{"IDENTITYD_DELEGATION_MAX_TTL": "31536001"}, false},
		{"delegation lifetime not a number", map[string]string{"IDENTITYD_DELEGATION_MAX_TTL": "7d"}, false},
		{"passkey timeout", map[string]string{"IDENTITYD_PASSKEY_TIMEOUT": "600"}, true},
		{"passkey timeout zero", map[string]string{"IDENTITYD_PASSKEY_TIMEOUT": "0"}, false},
		{"passkey timeout above ten minutes", map[string]string{"IDENTITYD_PASSKEY_TIMEOUT": "601"}, false},
		{"delegation depth above 20", map[string]string{"IDENTITYD_MAX_DELEGATION_DEPTH": "21"}, false},
		{"rate limits off", map[string]string{"IDENTITYD_RATE_LIMITS": "off"}, true},
		{"issuer with query", map[string]string{"IDENTITYD_ISSUER": "https://id.example?x=1"}, false},
		{"https issuer", map[string]string{"IDENTITYD_ISSUER": "https://id.example/"}, true},
		{"redis", map[string]string{"IDENTITYD_REDIS_URL": "redis://127.0.0.1:6379/0"}, true},
		{"captcha", map[string]string{"IDENTITYD_CAPTCHA_VERIFY_URL": "https://challenges.cloudflare.com/turnstile/v0/siteverify", "IDENTITYD_CAPTCHA_SECRET": "s"}, true},
		{"captcha without a secret", map[string]string{"IDENTITYD_CAPTCHA_VERIFY_URL": "https://challenges.cloudflare.com/turnstile/v0/siteverify"}, false},
		{"captcha secret without a URL", map[string]string{"IDENTITYD_CAPTCHA_SECRET": "s"}, false},
		{"captcha URL not http", map[string]string{"IDENTITYD_CAPTCHA_VERIFY_URL": "ftp://x/siteverify", "IDENTITYD_CAPTCHA_SECRET": "s"}, false},
		{"captcha widget", map[string]string{"IDENTITYD_CAPTCHA_VERIFY_URL": "https://api.hcaptcha.com/siteverify", "IDENTITYD_CAPTCHA_SECRET": "s",
			"IDENTITYD_CAPTCHA_WIDGET": "hcaptcha", "IDENTITYD_CAPTCHA_SITE_KEY": "10000000-ffff-ffff-ffff-000000000001"}, true},
		{"captcha widget unknown", map[string]string{"IDENTITYD_CAPTCHA_VERIFY_URL": "https://x.example/siteverify", "IDENTITYD_CAPTCHA_SECRET": "s",
			"IDENTITYD_CAPTCHA_WIDGET": "friendly", "IDENTITYD_CAPTCHA_SITE_KEY": "k"}, false},
		{"captcha widget without a site key", map[string]string{"IDENTITYD_CAPTCHA_VERIFY_URL": "https://x.example/siteverify", "IDENTITYD_CAPTCHA_SECRET": "s",
			"IDENTITYD_CAPTCHA_WIDGET": "turnstile"}, false},
		{"captcha widget without verification", map[string]string{"IDENTITYD_CAPTCHA_WIDGET": "turnstile", "IDENTITYD_CAPTCHA_SITE_KEY": "k"}, false},
	}
	for _, c := range cases {
		_, err := LoadConfig(env(c.env))
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v", c.name, err)
		}
	}
}

// IDENTITYD_PRIVILEGED_MAX_AGE: whole seconds or a Go duration, from 1 s.
func TestConfigPrivilegedMaxAge(t *testing.T) {
	for v, want := range map[string]time.Duration{"1": time.Second, "2s": 2 * time.Second, "300": 5 * time.Minute, "15m": 15 * time.Minute,
		"1h30m": 90 * time.Minute, "86400": 24 * time.Hour, " 60 ": time.Minute} {
		c, err := LoadConfig(env(map[string]string{"IDENTITYD_PRIVILEGED_MAX_AGE": v}))
		if err != nil || c.PrivilegedMaxAge != want {
			t.Errorf("%q: %v, %v; want %v", v, c.PrivilegedMaxAge, err, want)
		}
	}
	for _, v := range []string{"0", "0s", "-5", "-1m", "500ms", "1.5s", "5 minutes", "1e3", "99999999999999999999", "9223372037s"} {
		_, err := LoadConfig(env(map[string]string{"IDENTITYD_PRIVILEGED_MAX_AGE": v}))
		if err == nil || !strings.Contains(err.Error(), "IDENTITYD_PRIVILEGED_MAX_AGE:") {
			t.Errorf("%q accepted: %v", v, err)
		}
	}
	// The link notice is no longer a setting: turning it off is reported.
	if _, err := LoadConfig(env(map[string]string{"IDENTITYD_LINK_NOTICE": "false"})); err == nil || !strings.Contains(err.Error(), "IDENTITYD_LINK_NOTICE:") {
		t.Errorf("IDENTITYD_LINK_NOTICE=false: %v", err)
	}
	if _, err := LoadConfig(env(map[string]string{"IDENTITYD_LINK_NOTICE": "true"})); err != nil {
		t.Errorf("IDENTITYD_LINK_NOTICE=true: %v", err)
	}
}
