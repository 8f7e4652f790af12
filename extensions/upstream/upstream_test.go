package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

func ptr[T any](v T) *T { return &v }

// TestApplyRules: the admin input's rules, every problem at once, without
// a store (no applications named) or a network (no discovery here).
func TestApplyRules(t *testing.T) {
	s := New(nil, nil, []byte("a system secret for this test only"), Config{Issuer: "https://id.example/"})
	full := func() Input {
		return Input{Name: ptr("acme-sso"), DisplayName: ptr(" Acme SSO "), Issuer: ptr("https://sso.acme.example"), ClientID: ptr("identityd"),
			ClientSecret: ptr("s3cret")}
	}
	cases := []struct {
		name   string
		in     func() Input
		create bool
		fields []string
	}{
		{"complete", full, true, nil},
		{"nothing", func() Input { return Input{} }, true, []string{"name", "displayName", "issuer", "clientId", "clientSecret"}},
		{"patch of nothing", func() Input { return Input{} }, false, nil},
		{"a method's name", func() Input { i := full(); i.Name = ptr("Password"); return i }, true, []string{"name"}},
		{"magic-link", func() Input { i := full(); i.Name = ptr("magic-link"); return i }, true, []string{"name"}},
		{"underscore", func() Input { i := full(); i.Name = ptr("magic_link"); return i }, true, []string{"name"}},
		{"space", func() Input { i := full(); i.Name = ptr("acme sso"); return i }, true, []string{"name"}},
		{"too long", func() Input { i := full(); i.Name = ptr(strings.Repeat("a", 65)); return i }, true, []string{"name"}},
		{"renamed", func() Input { return Input{Name: ptr("other")} }, false, []string{"name"}},
		{"same name in a patch", func() Input { return Input{Name: ptr("acme-sso")} }, false, nil},
		{"ftp issuer", func() Input { i := full(); i.Issuer = ptr("ftp://sso.example"); return i }, true, []string{"issuer"}},
		{"http issuer off loopback", func() Input { i := full(); i.Issuer = ptr("http://sso.example"); return i }, true, []string{"issuer"}},
		{"http loopback issuer", func() Input { i := full(); i.Issuer = ptr("http://127.0.0.1:9000"); return i }, true, nil},
		{"issuer with a query", func() Input { i := full(); i.Issuer = ptr("https://sso.example/?tenant=1"); return i }, true, []string{"issuer"}},
		{"issuer with a fragment", func() Input { i := full(); i.Issuer = ptr("https://sso.example/#x"); return i }, true, []string{"issuer"}},
		{"blank display name", func() Input { i := full(); i.DisplayName = ptr("  "); return i }, true, []string{"displayName"}},
		{"control character", func() Input { i := full(); i.DisplayName = ptr("a\x00b"); return i }, true, []string{"displayName"}},
		{"empty secret", func() Input { i := full(); i.ClientSecret = ptr(""); return i }, true, []string{"clientSecret"}},
		{"no openid", func() Input { i := full(); i.Scopes = ptr([]string{"email"}); return i }, true, []string{"scopes"}},
		{"bad scope", func() Input { i := full(); i.Scopes = ptr([]string{"openid", "a\"b"}); return i }, true, []string{"scopes"}},
		{"too many scopes", func() Input {
			i := full()
			l := []string{"openid"}
			for n := range 20 {
				l = append(l, "s"+strings.Repeat("x", n))
			}
			i.Scopes = &l
			return i
		}, true, []string{"scopes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &persistence.IdentityProvider{ID: "0198", Name: "acme-sso"}
			err := s.apply(context.Background(), p, c.in(), c.create)
			var v *extensions.ValidationError
			if len(c.fields) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.As(err, &v) {
				t.Fatalf("want fields %v refused, got %v", c.fields, err)
			}
			for _, f := range c.fields {
				if v.Fields[f] == "" {
					t.Errorf("%s not refused: %v", f, v.Fields)
				}
			}
			if len(v.Fields) != len(c.fields) {
				t.Errorf("refused %v, want exactly %v", v.Fields, c.fields)
			}
		})
	}
}

// TestCreateDefaults: a complete create fills the defaults and seals the
// secret, bound to the provider.
func TestCreateDefaults(t *testing.T) {
	s := New(nil, nil, []byte("a system secret for this test only"), Config{Issuer: "https://id.example/"})
	p := &persistence.IdentityProvider{ID: "provider-1"}
	in := Input{Name: ptr("acme-sso"), DisplayName: ptr(" Acme SSO "), Issuer: ptr("https://sso.acme.example"), ClientID: ptr("identityd"),
		ClientSecret: ptr("s3cret")}
	if err := s.apply(context.Background(), p, in, true); err != nil {
		t.Fatal(err)
	}
	if p.DisplayName != "Acme SSO" || strings.Join(p.Scopes, " ") != "openid email profile" || p.Applications == nil || len(p.Applications) != 0 {
		t.Fatalf("defaults %+v", p)
	}
	if strings.Contains(string(p.ClientSecretSealed), "s3cret") {
		t.Fatal("the secret is stored in clear")
	}
	if plain, err := s.secrets.Open(p.ClientSecretSealed, []byte("provider-1")); err != nil || string(plain) != "s3cret" {
		t.Fatalf("open: %q %v", plain, err)
	}
	if _, err := s.secrets.Open(p.ClientSecretSealed, []byte("provider-2")); err == nil {
		t.Fatal("a sealed secret opens for another provider")
	}
	if s.RedirectURI() != "https://id.example"+CallbackPath {
		t.Fatalf("redirect URI %s", s.RedirectURI())
	}
}

// TestEmailVerified: only true (or the string "true") vouches for an
// e-mail.
func TestEmailVerified(t *testing.T) {
	for raw, want := range map[string]bool{`true`: true, `"true"`: true, ` true `: true, `false`: false, `"false"`: false, `1`: false,
		`"TRUE"`: false, `null`: false, ``: false, `"yes"`: false} {
		if got := verified(json.RawMessage(raw)); got != want {
			t.Errorf("email_verified %s: %v, want %v", raw, got, want)
		}
	}
}

// TestBeginRefusals: a provider the application does not offer, a browser
// without a cookie, and a finished flow are refused before any request
// leaves.
func TestBeginRefusals(t *testing.T) {
	s := New(nil, nil, []byte("a system secret for this test only"), Config{Issuer: "https://id.example"})
	app := &persistence.Client{ID: "app_one", App: &persistence.AppFacts{}}
	p := &persistence.IdentityProvider{ID: "p", Name: "acme-sso", Issuer: "https://sso.example", Applications: []string{"app_two"}}
	if _, err := s.Begin(context.Background(), p, app, "browser", Target{}); !errors.Is(err, ErrNotOffered) {
		t.Fatalf("not offered: %v", err)
	}
	p.Applications = []string{"app_one"}
	if _, err := s.Begin(context.Background(), p, app, "", Target{}); !errors.Is(err, ErrNotOffered) {
		t.Fatalf("no browser: %v", err)
	}
	for _, step := range []string{"done", "mfa"} {
		f := &persistence.SignInFlow{ID: "f", ClientID: "app_one", Step: step}
		if _, err := s.Begin(context.Background(), p, app, "browser", Target{Flow: f}); err == nil {
			t.Fatalf("a %s flow began", step)
		}
	}
	f := &persistence.SignInFlow{ID: "f", ClientID: "app_other", Step: "email"}
	if _, err := s.Begin(context.Background(), p, app, "browser", Target{Flow: f}); err == nil {
		t.Fatal("another application's flow began")
	}
}
