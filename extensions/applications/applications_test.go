package applications_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newService(t *testing.T, dbURL string) (*applications.Service, *oauth.SecretHasher) {
	t.Helper()
	h := oauth.NewSecretHasher([]byte("test system secret of some length"))
	return applications.New(dbtest.Store(t, dbURL), h), h
}

func ptr[T any](v T) *T { return &v }

func list(items ...string) *[]string { return &items }

// base is a valid minimal input: a name and a redirect URI.
func base() applications.Input {
	return applications.Input{Name: ptr("Notes"), RedirectURIs: list("https://notes.example.com/callback")}
}

// with returns base() changed by fn.
func with(fn func(in *applications.Input)) applications.Input {
	in := base()
	fn(&in)
	return in
}

// fieldsOf is the set of fields err reports, or nil when err is nil; any
// other error fails the test.
func fieldsOf(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve *extensions.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err %v, want a validation error", err)
	}
	return slices.Sorted(maps.Keys(ve.Fields))
}

func TestCreateRules(t *testing.T) {
	svc, _ := newService(t, dbtest.URLs(t)["sqlite"])
	ctx := context.Background()
	public := func(in *applications.Input) { in.Type = ptr("public") }
	cases := []struct {
		name   string
		in     applications.Input
		fields []string // the fields reported; none: valid
	}{
		{"minimal", base(), nil},
		{"own reset page", with(func(in *applications.Input) {
			in.PasswordResetURI = ptr("https://notes.example.com/account/reset?lang=en")
		}), nil},
		{"no reset page", with(func(in *applications.Input) { in.PasswordResetURI = ptr("") }), nil},
		{"reset page elsewhere", with(func(in *applications.Input) { in.PasswordResetURI = ptr("https://evil.example/reset") }), []string{"passwordResetUri"}},
		{"reset page on another port", with(func(in *applications.Input) { in.PasswordResetURI = ptr("https://notes.example.com:8443/reset") }), []string{"passwordResetUri"}},
		{"reset page over http", with(func(in *applications.Input) { in.PasswordResetURI = ptr("http://notes.example.com/reset") }), []string{"passwordResetUri"}},
		{"reset page with a fragment", with(func(in *applications.Input) { in.PasswordResetURI = ptr("https://notes.example.com/reset#x") }), []string{"passwordResetUri"}},
		{"reset page on loopback", with(func(in *applications.Input) {
			in.RedirectURIs = list("http://127.0.0.1:9999/callback")
			in.PasswordResetURI = ptr("http://127.0.0.1:9999/reset")
		}), nil},
		{"no name", with(func(in *applications.Input) { in.Name = nil }), []string{"name"}},
		{"blank name", with(func(in *applications.Input) { in.Name = ptr("  ") }), []string{"name"}},
		{"control character in name", with(func(in *applications.Input) { in.Name = ptr("a\x01") }), []string{"name"}},
		{"long name", with(func(in *applications.Input) { in.Name = ptr(strings.Repeat("é", 201)) }), []string{"name"}},
		{"unknown type", with(func(in *applications.Input) { in.Type = ptr("spa") }), []string{"type"}},
		{"no redirect URI", with(func(in *applications.Input) { in.RedirectURIs = nil }), []string{"redirectUris"}},
		{"empty redirect URIs", with(func(in *applications.Input) { in.RedirectURIs = list() }), []string{"redirectUris"}},
		{"loopback http", with(func(in *applications.Input) {
			in.RedirectURIs = list("http://127.0.0.1:8080/cb", "http://localhost/cb", "http://[::1]:9/cb")
		}), nil},
		{"http elsewhere", with(func(in *applications.Input) {
			in.RedirectURIs = list("https://ok.example/cb", "http://evil.example/cb")
		}), []string{"redirectUris[1]"}},
		{"fragment", with(func(in *applications.Input) { in.RedirectURIs = list("https://a.example/cb#x") }), []string{"redirectUris[0]"}},
		{"empty fragment", with(func(in *applications.Input) { in.RedirectURIs = list("https://a.example/cb#") }), []string{"redirectUris[0]"}},
		{"relative", with(func(in *applications.Input) { in.RedirectURIs = list("/cb") }), []string{"redirectUris[0]"}},
		{"user info", with(func(in *applications.Input) { in.RedirectURIs = list("https://u:p@a.example/cb") }), []string{"redirectUris[0]"}},
		{"too many", with(func(in *applications.Input) {
			var l []string
			for i := range 21 {
				l = append(l, "https://a.example/"+string(rune('a'+i)))
			}
			in.RedirectURIs = &l
		}), []string{"redirectUris"}},
		{"custom scheme, confidential", with(func(in *applications.Input) { in.RedirectURIs = list("com.example.notes:/cb") }), []string{"redirectUris[0]"}},
		{"custom scheme, public", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("com.example.notes:/cb", "com.example.notes://callback")
		}), nil},
		{"custom scheme without a period", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("notes:/cb")
		}), []string{"redirectUris[0]"}},
		{"javascript, public", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("javascript:alert(1)")
		}), []string{"redirectUris[0]"}},
		{"custom scheme with an empty label", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("com..notes:/cb")
		}), []string{"redirectUris[0]"}},
		{"custom scheme with a fragment", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("com.example.notes:/cb#f")
		}), []string{"redirectUris[0]"}},
		{"custom scheme without a path", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("com.example.notes:")
		}), []string{"redirectUris[0]"}},
		{"post-logout URIs by the same rules", with(func(in *applications.Input) {
			in.PostLogoutRedirectURIs = list("https://notes.example.com/bye", "http://evil.example/bye", "com.example.notes:/bye")
		}), []string{"postLogoutRedirectUris[1]", "postLogoutRedirectUris[2]"}},
		{"origins", with(func(in *applications.Input) {
			in.WebOrigins = list("https://notes.example.com", "https://NOTES.example.com:8443")
		}), nil},
		{"origin with a path", with(func(in *applications.Input) { in.WebOrigins = list("https://notes.example.com/") }), []string{"webOrigins[0]"}},
		{"origin with a query", with(func(in *applications.Input) { in.WebOrigins = list("https://notes.example.com?") }), []string{"webOrigins[0]"}},
		{"origin over http", with(func(in *applications.Input) { in.WebOrigins = list("http://notes.example.com") }), []string{"webOrigins[0]"}},
		{"origin not an origin", with(func(in *applications.Input) { in.WebOrigins = list("notes.example.com") }), []string{"webOrigins[0]"}},
		{"origin outside rpId", with(func(in *applications.Input) { in.WebOrigins = list("https://other.example.com") }), []string{"webOrigins[0]"}},
		{"origin under a parent rpId", with(func(in *applications.Input) {
			in.RPID = ptr("example.com")
			in.WebOrigins = list("https://other.example.com", "https://example.com")
		}), nil},
		// Browsers send an international host in its A-label form: the
		// Unicode form would never match (and passed the rpId test below).
		{"international origin in Unicode", with(func(in *applications.Input) {
			in.RPID, in.WebOrigins = ptr("example.com"), list("https://bücher.example.com")
		}), []string{"webOrigins[0]"}},
		{"international origin as an A-label", with(func(in *applications.Input) {
			in.RPID, in.WebOrigins = ptr("example.com"), list("https://xn--bcher-kva.example.com")
		}), nil},
		{"rpId a suffix but not a parent", with(func(in *applications.Input) {
			in.RPID = ptr("ample.com")
			in.WebOrigins = list("https://example.com")
		}), []string{"webOrigins[0]"}},
		{"rpId an address", with(func(in *applications.Input) { in.RPID = ptr("127.0.0.1") }), []string{"rpId"}},
		{"rpId with a port", with(func(in *applications.Input) { in.RPID = ptr("example.com:443") }), []string{"rpId"}},
		{"rpId with a trailing dot", with(func(in *applications.Input) { in.RPID = ptr("example.com.") }), []string{"rpId"}},
		{"rpId with a bad label", with(func(in *applications.Input) { in.RPID = ptr("-example.com") }), []string{"rpId"}},
		{"loopback origin needs a host name rpId", with(func(in *applications.Input) {
			in.RedirectURIs = list("http://127.0.0.1:3000/cb")
			in.WebOrigins = list("http://127.0.0.1:3000")
		}), []string{"rpId"}},
		{"passkeys need an rpId", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("com.example.notes:/cb")
			in.SignInMethods = list("passkey")
		}), []string{"rpId"}},
		{"passkeys with a given rpId", with(func(in *applications.Input) {
			public(in)
			in.RedirectURIs = list("com.example.notes:/cb")
			in.RPID = ptr("notes.example.com")
			in.SignInMethods = list("passkey")
		}), nil},
		{"every method", with(func(in *applications.Input) { in.SignInMethods = list("password", "otp", "magic-link", "passkey") }), nil},
		{"unknown method", with(func(in *applications.Input) { in.SignInMethods = list("password", "sms") }), []string{"signInMethods[1]"}},
		{"no method", with(func(in *applications.Input) { in.SignInMethods = list() }), []string{"signInMethods"}},
		{"mfa optional", with(func(in *applications.Input) {
			in.MFA = &applications.MFA{Policy: "optional", Factors: []string{"totp", "passkey"}}
		}), nil},
		{"mfa required without factors", with(func(in *applications.Input) { in.MFA = &applications.MFA{Policy: "required"} }), []string{"mfa.factors"}},
		{"mfa unknown policy", with(func(in *applications.Input) { in.MFA = &applications.MFA{Policy: "always", Factors: []string{"totp"}} }), []string{"mfa.policy"}},
		{"mfa without a policy", with(func(in *applications.Input) { in.MFA = &applications.MFA{Factors: []string{"totp"}} }), []string{"mfa.policy"}},
		{"mfa unknown factor", with(func(in *applications.Input) {
			in.MFA = &applications.MFA{Policy: "required", Factors: []string{"sms"}}
		}), []string{"mfa.factors[0]"}},
		{"jwt and ES256", with(func(in *applications.Input) { in.AccessTokenFormat, in.IDTokenSigningAlg = ptr("jwt"), ptr("ES256") }), nil},
		{"unknown format", with(func(in *applications.Input) { in.AccessTokenFormat = ptr("JWT") }), []string{"accessTokenFormat"}},
		{"unknown alg", with(func(in *applications.Input) { in.IDTokenSigningAlg = ptr("HS256") }), []string{"idTokenSigningAlg"}},
		{"lifetimes at their bounds", with(func(in *applications.Input) {
			in.AccessTokenTTL = applications.Seconds{Set: true, Value: ptr(60)}
			in.RefreshTokenTTL = applications.Seconds{Set: true, Value: ptr(31536000)}
		}), nil},
		{"lifetimes past their bounds", with(func(in *applications.Input) {
			in.AccessTokenTTL = applications.Seconds{Set: true, Value: ptr(86401)}
			in.RefreshTokenTTL = applications.Seconds{Set: true, Value: ptr(299)}
		}), []string{"accessTokenTtl", "refreshTokenTtl"}},
		{"everything wrong at once", applications.Input{Type: ptr("x"), SignInMethods: list(), AccessTokenFormat: ptr("x")},
			[]string{"accessTokenFormat", "name", "redirectUris", "signInMethods", "type"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			app, secret, err := svc.Create(ctx, c.in)
			if got := fieldsOf(t, err); !slices.Equal(got, slices.Sorted(slices.Values(c.fields))) {
				t.Fatalf("fields %v, want %v (%v)", got, c.fields, err)
			}
			if err == nil && (!strings.HasPrefix(app.ClientID, "app_") || app.Type == "public" && secret != "" || app.Type == "confidential" && len(secret) != 43) {
				t.Fatalf("created %+v with secret %q", app, secret)
			}
		})
	}
}

// Defaults, normal forms and what is stored.
func TestCreateDefaults(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		svc, h := newService(t, dbURL)
		ctx := context.Background()
		app, secret, err := svc.Create(ctx, applications.Input{
			Name: ptr("  Notes "), RedirectURIs: list("http://127.0.0.1:9/cb", "https://Notes.Example.com/cb", "https://Notes.Example.com/cb"),
			WebOrigins: list("https://NOTES.example.com:443", "https://notes.example.com", "https://Sub.Notes.example.com:8443"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if app.Name != "Notes" || app.Type != "confidential" || len(app.RedirectURIs) != 2 || app.RPID != "notes.example.com" ||
			!slices.Equal(app.WebOrigins, []string{"https://notes.example.com", "https://sub.notes.example.com:8443"}) ||
			!slices.Equal(app.SignInMethods, []string{"password", "otp", "magic-link"}) ||
			app.AccessTokenFormat != "opaque" || app.IDTokenSigningAlg != "RS256" || app.AccessTokenTTL != nil || app.RefreshTokenTTL != nil || app.AdminConsole {
			t.Fatalf("defaults: %+v", app)
		}
		if m := applications.MFAOf(app); m.Policy != "off" || m.Factors == nil || len(m.Factors) != 0 {
			t.Fatalf("mfa default: %+v", m)
		}
		if err := h.Compare(ctx, app.SecretHash, []byte(secret)); err != nil {
			t.Fatalf("the stored hash does not match the secret: %v", err)
		}
		stored, err := svc.Get(ctx, app.ID)
		if err != nil || stored.RPID != app.RPID || !slices.Equal(stored.WebOrigins, app.WebOrigins) || applications.MFAOf(stored).Policy != "off" {
			t.Fatalf("stored: %+v %v", stored, err)
		}
		// localhost is a host name: the default rpId of a loopback app.
		local, _, err := svc.Create(ctx, applications.Input{Name: ptr("Local"), RedirectURIs: list("http://127.0.0.1/cb", "http://localhost:3000/cb")})
		if err != nil || local.RPID != "localhost" {
			t.Fatalf("loopback default rpId: %+v %v", local, err)
		}
		// A native app with only a private-use scheme has no default rpId.
		native, secret, err := svc.Create(ctx, applications.Input{Name: ptr("Native"), Type: ptr("public"), RedirectURIs: list("com.example.notes:/cb")})
		if err != nil || native.RPID != "" || secret != "" || native.SecretHash != nil {
			t.Fatalf("native: %+v %q %v", native, secret, err)
		}
	})
}

func TestUpdateRotateDelete(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		svc, h := newService(t, dbURL)
		ctx := context.Background()
		app, secret, err := svc.Create(ctx, with(func(in *applications.Input) {
			in.AccessTokenTTL = applications.Seconds{Set: true, Value: ptr(600)}
		}))
		if err != nil {
			t.Fatal(err)
		}

		// A patch changes what it names and keeps the rest.
		got, err := svc.Update(ctx, app.ID, applications.Input{
			Name: ptr("Renamed"), MFA: &applications.MFA{Policy: "required", Factors: []string{"totp", "totp"}}, AdminConsole: ptr(true),
			RefreshTokenTTL: applications.Seconds{Set: true, Value: ptr(3600)},
		})
		if err != nil || got.Name != "Renamed" || !got.AdminConsole || *got.AccessTokenTTL != 600 || *got.RefreshTokenTTL != 3600 ||
			!slices.Equal(applications.MFAOf(got).Factors, []string{"totp"}) || got.RedirectURIs[0] != "https://notes.example.com/callback" ||
			got.UpdatedAt.Before(app.UpdatedAt) {
			t.Fatalf("update: %+v %v", got, err)
		}
		// A lifetime set to null goes back to the server's default.
		if got, err = svc.Update(ctx, app.ID, applications.Input{AccessTokenTTL: applications.Seconds{Set: true}}); err != nil || got.AccessTokenTTL != nil {
			t.Fatalf("reset lifetime: %+v %v", got, err)
		}
		// The result is validated whole: new origins must fit the stored rpId.
		if err := fieldsOf(t, ignore(svc.Update(ctx, app.ID, applications.Input{WebOrigins: list("https://elsewhere.example.org")}))); !slices.Equal(err, []string{"webOrigins[0]"}) {
			t.Fatalf("origins outside the stored rpId: %v", err)
		}
		// rpId "" derives the default again, from the new redirect URIs.
		if got, err = svc.Update(ctx, app.ID, applications.Input{RedirectURIs: list("https://new.example.org/cb"), RPID: ptr("")}); err != nil || got.RPID != "new.example.org" {
			t.Fatalf("derived rpId: %+v %v", got, err)
		}
		// Without rpId the stored one stays (passkeys are bound to it).
		if got, err = svc.Update(ctx, app.ID, applications.Input{RedirectURIs: list("https://third.example.net/cb")}); err != nil || got.RPID != "new.example.org" {
			t.Fatalf("kept rpId: %+v %v", got, err)
		}
		// Invalid patches change nothing.
		if f := fieldsOf(t, ignore(svc.Update(ctx, app.ID, applications.Input{Name: ptr(""), SignInMethods: list()}))); !slices.Equal(f, []string{"name", "signInMethods"}) {
			t.Fatalf("invalid patch: %v", f)
		}
		if stored, _ := svc.Get(ctx, app.ID); stored.Name != "Renamed" {
			t.Fatalf("an invalid patch was stored: %+v", stored)
		}
		// The type is fixed; naming the same type is no change.
		var ae *extensions.Error
		if _, err := svc.Update(ctx, app.ID, applications.Input{Type: ptr("public")}); !errors.As(err, &ae) || ae.Status != 400 || ae.Details["field"] != "type" {
			t.Fatalf("type change: %v", err)
		}
		if _, err := svc.Update(ctx, app.ID, applications.Input{Type: ptr("confidential")}); err != nil {
			t.Fatalf("same type: %v", err)
		}

		// Rotation: a new secret, the old one no longer matches.
		rotated, fresh, err := svc.Rotate(ctx, app.ID)
		if err != nil || fresh == secret || rotated.RotatedAt == nil || len(fresh) != 43 {
			t.Fatalf("rotate: %+v %q %v", rotated, fresh, err)
		}
		if h.Compare(ctx, rotated.SecretHash, []byte(fresh)) != nil || h.Compare(ctx, rotated.SecretHash, []byte(secret)) == nil {
			t.Fatal("the stored hash is not the new secret's alone")
		}
		// A public application has no secret to rotate.
		pub, _, err := svc.Create(ctx, with(func(in *applications.Input) { in.Type = ptr("public") }))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := svc.Rotate(ctx, pub.ID); !errors.Is(err, applications.ErrPublicRotate) {
			t.Fatalf("rotate public: %v", err)
		}
		if stored, _ := svc.Get(ctx, pub.ID); stored.SecretHash != nil || stored.RotatedAt != nil {
			t.Fatalf("a public application got a secret: %+v", stored)
		}

		// Unknown and malformed ids are 404s.
		for _, id := range []string{"not-a-uuid", "0190a2b4-0000-7000-8000-000000000000"} {
			if _, err := svc.Get(ctx, id); !errors.Is(err, persistence.ErrNotFound) {
				t.Fatalf("get %s: %v", id, err)
			}
			if _, err := svc.Update(ctx, id, base()); !errors.Is(err, persistence.ErrNotFound) {
				t.Fatalf("update %s: %v", id, err)
			}
			if _, _, err := svc.Rotate(ctx, id); !errors.Is(err, persistence.ErrNotFound) {
				t.Fatalf("rotate %s: %v", id, err)
			}
			if err := svc.Delete(ctx, id); !errors.Is(err, persistence.ErrNotFound) {
				t.Fatalf("delete %s: %v", id, err)
			}
		}
		if err := svc.Delete(ctx, app.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.GetByClientID(ctx, app.ClientID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("deleted: %v", err)
		}
	})
}

func ignore(_ *persistence.Application, err error) error { return err }

func TestCheckOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"https://a.example":           "https://a.example",
		"HTTPS://A.Example:443":       "https://a.example",
		"https://a.example:8443":      "https://a.example:8443",
		"http://localhost:80":         "http://localhost",
		"http://127.0.0.1:3000":       "http://127.0.0.1:3000",
		"http://[::1]:3000":           "http://[::1]:3000",
		"https://a.example/":          "",
		"https://a.example/x":         "",
		"https://a.example#":          "",
		"https://a.example:0":         "",
		"https://a.example:99999":     "",
		"https://u@a.example":         "",
		"ftp://a.example":             "",
		"http://a.example":            "",
		"a.example":                   "",
		"https://":                    "",
		"com.example.app://a.example": "",
	} {
		got, err := applications.CheckOrigin(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("CheckOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
