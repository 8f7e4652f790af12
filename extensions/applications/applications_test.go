package applications

import (
	"errors"
	"slices"
	"testing"

	"github.com/identityd/identityd/extensions"
)

func TestValidate(t *testing.T) {
	ttl := func(n int) *int { return &n }
	web := []string{"https://app.example.com/callback"}
	for _, c := range []struct {
		name   string
		in     Input
		fields []string // the fields refused; none: valid
	}{
		{"defaults", Input{Name: "Web", RedirectURIs: web}, nil},
		{"no name", Input{RedirectURIs: web}, []string{"name"}},
		{"no redirect", Input{Name: "Web"}, []string{"redirectUris"}},
		{"http on loopback", Input{Name: "Dev", RedirectURIs: []string{"http://127.0.0.1:8000/cb"}}, nil},
		{"http elsewhere", Input{Name: "Web", RedirectURIs: []string{"http://app.example.com/cb"}}, []string{"redirectUris[0]"}},
		{"fragment", Input{Name: "Web", RedirectURIs: []string{"https://app.example.com/cb#x"}}, []string{"redirectUris[0]"}},
		{"native scheme, public", Input{Name: "App", Type: "public", RedirectURIs: []string{"com.example.app:/callback"}}, nil},
		{"native scheme, confidential", Input{Name: "App", RedirectURIs: []string{"com.example.app:/callback"}}, []string{"redirectUris[0]"}},
		{"scheme without a period", Input{Name: "App", Type: "public", RedirectURIs: []string{"myapp:/callback"}}, []string{"redirectUris[0]"}},
		{"javascript scheme", Input{Name: "App", Type: "public", RedirectURIs: []string{"javascript:alert(1)"}}, []string{"redirectUris[0]"}},
		{"bad type", Input{Name: "Web", Type: "spa", RedirectURIs: web}, []string{"type"}},
		{"logout uri", Input{Name: "Web", RedirectURIs: web, PostLogoutRedirectURIs: []string{"ftp://x"}}, []string{"postLogoutRedirectUris[0]"}},
		{"origin with path", Input{Name: "Web", RedirectURIs: web, WebOrigins: []string{"https://app.example.com/x"}}, []string{"webOrigins[0]"}},
		{"origin under rpId", Input{Name: "Web", RedirectURIs: web, RPID: "example.com", WebOrigins: []string{"https://login.example.com"}}, nil},
		{"origin outside rpId", Input{Name: "Web", RedirectURIs: web, WebOrigins: []string{"https://evil.example.net"}}, []string{"webOrigins[0]"}},
		{"suffix is not a parent", Input{Name: "Web", RedirectURIs: web, RPID: "ample.com", WebOrigins: []string{"https://example.com"}}, []string{"webOrigins[0]"}},
		{"rpId not a host", Input{Name: "Web", RedirectURIs: web, RPID: "https://x"}, []string{"rpId"}},
		{"methods", Input{Name: "Web", RedirectURIs: web, SignInMethods: []string{"password", "sms"}}, []string{"signInMethods[1]"}},
		{"no methods", Input{Name: "Web", RedirectURIs: web, SignInMethods: []string{}}, []string{"signInMethods"}},
		{"mfa required without factor", Input{Name: "Web", RedirectURIs: web, MFA: &MFA{Policy: "required"}}, []string{"mfa.factors"}},
		{"mfa bad", Input{Name: "Web", RedirectURIs: web, MFA: &MFA{Policy: "always", Factors: []string{"sms"}}}, []string{"mfa.factors[0]", "mfa.policy"}},
		{"formats", Input{Name: "Web", RedirectURIs: web, AccessTokenFormat: "paseto", IDTokenSigningAlg: "HS256"}, []string{"accessTokenFormat", "idTokenSigningAlg"}},
		{"lifetimes", Input{Name: "Web", RedirectURIs: web, AccessTokenTTL: ttl(59), RefreshTokenTTL: ttl(400 * 86400)}, []string{"accessTokenTtl", "refreshTokenTtl"}},
		{"lifetimes in range", Input{Name: "Web", RedirectURIs: web, AccessTokenTTL: ttl(600), RefreshTokenTTL: ttl(86400)}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.defaults()
			err := in.validate()
			var v *extensions.ValidationError
			if len(c.fields) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.As(err, &v) {
				t.Fatalf("want a validation error on %v, got %v", c.fields, err)
			}
			var got []string
			for f := range v.Fields {
				got = append(got, f)
			}
			slices.Sort(got)
			if !slices.Equal(got, c.fields) {
				t.Fatalf("fields %v, want %v (%v)", got, c.fields, err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	in := Input{Name: " Web ", RedirectURIs: []string{"https://App.Example.com/cb", "https://app.example.com/cb2", "https://App.Example.com/cb"}}
	in.defaults()
	if err := in.validate(); err != nil {
		t.Fatal(err)
	}
	if in.Name != "Web" || in.Type != "confidential" || in.RPID != "app.example.com" || len(in.RedirectURIs) != 2 ||
		!slices.Equal(in.SignInMethods, []string{"password", "otp", "magic-link"}) || in.MFA.Policy != "off" ||
		in.AccessTokenFormat != "opaque" || in.IDTokenSigningAlg != "RS256" {
		t.Fatalf("%+v", in)
	}
}
