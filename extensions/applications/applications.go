// Package applications holds the rules for applications, the OpenID Connect
// clients people sign in through: what a valid registration is, and how
// their credentials are made and rotated.
package applications

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateApplication(ctx context.Context, a *persistence.Application) error
	GetApplication(ctx context.Context, id string) (*persistence.Application, error)
	ListApplications(ctx context.Context, p persistence.Page) ([]persistence.Application, int, error)
	UpdateApplication(ctx context.Context, id string, fn func(*persistence.Application) error) (*persistence.Application, error)
	DeleteApplication(ctx context.Context, id string) error
}

// Values and bounds of the fields (docs/decisions.md, "Applications").
const (
	FormatOpaque = "opaque"
	FormatJWT    = "jwt"

	maxName       = 200
	maxURIs       = 20
	minAccessTTL  = 60
	maxAccessTTL  = 86400
	minRefreshTTL = 300
	maxRefreshTTL = 365 * 86400
)

// SignInMethods are the methods an application may offer; DefaultSignInMethods
// the spec's default.
var (
	SignInMethods        = []string{"password", "otp", "magic-link", "passkey"}
	DefaultSignInMethods = []string{"password", "otp", "magic-link"}
	mfaPolicies          = []string{"off", "optional", "required"}
	mfaFactors           = []string{"totp", "passkey"}
	idTokenAlgs          = []string{"RS256", "ES256"}
)

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	hasher extensions.Hasher
	now    func() time.Time
}

// New returns a Service.
func New(store Store, hasher extensions.Hasher) *Service {
	return &Service{store: store, hasher: hasher, now: extensions.Now}
}

// MFA is an application's multi-factor policy.
type MFA struct {
	Policy  string   `json:"policy"`
	Factors []string `json:"factors"`
}

// Input is a whole registration; Create fills in defaults for what is nil.
type Input struct {
	Name                   string
	Type                   string
	RedirectURIs           []string
	PostLogoutRedirectURIs []string
	WebOrigins             []string
	RPID                   string
	SignInMethods          []string
	MFA                    *MFA
	AccessTokenFormat      string
	IDTokenSigningAlg      string
	AccessTokenTTL         *int
	RefreshTokenTTL        *int
	AdminConsole           bool
}

// Patch changes the fields that are set. An explicit null lifetime goes
// back to the server's default (ClearAccessTTL, ClearRefreshTTL).
type Patch struct {
	Name                   *string
	Type                   *string
	RedirectURIs           *[]string
	PostLogoutRedirectURIs *[]string
	WebOrigins             *[]string
	RPID                   *string
	SignInMethods          *[]string
	MFA                    *MFA
	AccessTokenFormat      *string
	IDTokenSigningAlg      *string
	AccessTokenTTL         *int
	RefreshTokenTTL        *int
	ClearAccessTTL         bool
	ClearRefreshTTL        bool
	AdminConsole           *bool
}

// defaults fills what a new registration left out.
func (in *Input) defaults() {
	if in.Type == "" {
		in.Type = persistence.AppConfidential
	}
	if in.SignInMethods == nil {
		in.SignInMethods = slices.Clone(DefaultSignInMethods)
	}
	if in.MFA == nil {
		in.MFA = &MFA{Policy: "off", Factors: []string{}}
	}
	if in.AccessTokenFormat == "" {
		in.AccessTokenFormat = FormatOpaque
	}
	if in.IDTokenSigningAlg == "" {
		in.IDTokenSigningAlg = "RS256"
	}
}

// nativeScheme is a private-use URI scheme as RFC 8252 §7.1 has native apps
// use: a reverse domain name, so it contains a period.
var nativeScheme = regexp.MustCompile(`^[a-z][a-z0-9+\-]*(\.[a-z0-9+\-]+)+$`)

// checkRedirect checks a redirect or post-logout URI: CheckHTTPSURL's rules,
// or for a public (native) application a private-use scheme (RFC 8252 §7.1).
func checkRedirect(raw, typ string) error {
	err := extensions.CheckHTTPSURL(raw)
	if err == nil || typ != persistence.AppPublic {
		return err
	}
	u, perr := url.Parse(raw)
	if perr != nil || len(raw) > 2000 || strings.Contains(raw, "#") || !nativeScheme.MatchString(u.Scheme) || u.Scheme == "http" || u.Scheme == "https" {
		return fmt.Errorf("%s; a native application may use a private-use scheme in reverse domain form (com.example.app:/callback)", err)
	}
	return nil
}

// checkOrigin checks a web origin: scheme, host and port only, https, or
// http on loopback.
func checkOrigin(raw string) error {
	if err := extensions.CheckHTTPSURL(raw); err != nil {
		return err
	}
	u, _ := url.Parse(raw)
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || strings.HasSuffix(raw, "/") {
		return fmt.Errorf("must be an origin: scheme, host and port, with no path or query")
	}
	return nil
}

// hostName matches a DNS host name (letters, digits, hyphens; dotted labels).
var hostName = regexp.MustCompile(`^(?i:[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.(?i:[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?))*$`)

// validate checks every field and reports every problem at once; it removes
// repeated list items and fills rpId when it is empty.
func (in *Input) validate() error {
	var v extensions.ValidationError
	v.CheckText("name", in.Name, true, maxName)
	in.Name = strings.TrimSpace(in.Name)
	if in.Type != persistence.AppConfidential && in.Type != persistence.AppPublic {
		v.Add("type", "must be confidential or public")
	}
	uris := func(field string, list []string, required bool, check func(string) error) []string {
		for i, u := range list {
			if err := check(u); err != nil {
				v.Add(fmt.Sprintf("%s[%d]", field, i), "%s", err)
			}
		}
		list = extensions.Distinct(list)
		switch {
		case required && len(list) == 0:
			v.Add(field, "at least one is required")
		case len(list) > maxURIs:
			v.Add(field, "at most %d", maxURIs)
		}
		return list
	}
	redirect := func(u string) error { return checkRedirect(u, in.Type) }
	in.RedirectURIs = uris("redirectUris", in.RedirectURIs, true, redirect)
	in.PostLogoutRedirectURIs = uris("postLogoutRedirectUris", in.PostLogoutRedirectURIs, false, redirect)
	in.WebOrigins = uris("webOrigins", in.WebOrigins, false, checkOrigin)
	in.checkRPID(&v)
	for i, m := range in.SignInMethods {
		if !slices.Contains(SignInMethods, m) {
			v.Add(fmt.Sprintf("signInMethods[%d]", i), "must be one of %s", strings.Join(SignInMethods, ", "))
		}
	}
	if in.SignInMethods = extensions.Distinct(in.SignInMethods); len(in.SignInMethods) == 0 {
		v.Add("signInMethods", "at least one method is required")
	}
	if !slices.Contains(mfaPolicies, in.MFA.Policy) {
		v.Add("mfa.policy", "must be off, optional or required")
	}
	if in.MFA.Factors == nil {
		in.MFA.Factors = []string{}
	}
	for i, f := range in.MFA.Factors {
		if !slices.Contains(mfaFactors, f) {
			v.Add(fmt.Sprintf("mfa.factors[%d]", i), "must be totp or passkey")
		}
	}
	if in.MFA.Factors = extensions.Distinct(in.MFA.Factors); in.MFA.Policy == "required" && len(in.MFA.Factors) == 0 {
		v.Add("mfa.factors", "a required policy needs at least one factor")
	}
	if in.AccessTokenFormat != FormatOpaque && in.AccessTokenFormat != FormatJWT {
		v.Add("accessTokenFormat", "must be opaque or jwt")
	}
	if !slices.Contains(idTokenAlgs, in.IDTokenSigningAlg) {
		v.Add("idTokenSigningAlg", "must be RS256 or ES256")
	}
	if t := in.AccessTokenTTL; t != nil && (*t < minAccessTTL || *t > maxAccessTTL) {
		v.Add("accessTokenTtl", "must be %d to %d seconds", minAccessTTL, maxAccessTTL)
	}
	if t := in.RefreshTokenTTL; t != nil && (*t < minRefreshTTL || *t > maxRefreshTTL) {
		v.Add("refreshTokenTtl", "must be %d to %d seconds", minRefreshTTL, maxRefreshTTL)
	}
	return v.Err()
}

// checkRPID fills rpId with the host of the first web redirect URI when it
// is empty, and checks it is a host name that every web origin's host equals
// or lies under (WebAuthn §5.1.4.1: an RP ID is the origin's effective domain
// or a registrable suffix of it).
func (in *Input) checkRPID(v *extensions.ValidationError) {
	if in.RPID == "" {
		for _, r := range in.RedirectURIs {
			if u, err := url.Parse(r); err == nil && (u.Scheme == "https" || u.Scheme == "http") {
				in.RPID = strings.ToLower(u.Hostname())
				break
			}
		}
	}
	if in.RPID == "" {
		return // a native application without web pages: passkeys need an rpId first
	}
	in.RPID = strings.ToLower(in.RPID)
	if len(in.RPID) > 253 || !hostName.MatchString(in.RPID) {
		v.Add("rpId", "must be a host name")
		return
	}
	for i, o := range in.WebOrigins {
		u, err := url.Parse(o)
		if err != nil {
			continue
		}
		if h := strings.ToLower(u.Hostname()); h != in.RPID && !strings.HasSuffix(h, "."+in.RPID) {
			v.Add(fmt.Sprintf("webOrigins[%d]", i), "the host must be the rpId %q or under it", in.RPID)
		}
	}
}

// ClientIDPrefix begins every application's client id.
const ClientIDPrefix = persistence.ApplicationClientPrefix

// NewClientID returns a fresh client id: "app_" and 128 random bits.
func NewClientID() string { return ClientIDPrefix + strings.ToLower(rand.Text()) }

// Create registers an application. A confidential one gets a secret,
// returned here once and stored only as its keyed hash.
func (s *Service) Create(ctx context.Context, in Input) (*persistence.Application, string, error) {
	in.defaults()
	if err := in.validate(); err != nil {
		return nil, "", err
	}
	var secret string
	var hash []byte
	if in.Type == persistence.AppConfidential {
		secret = oauth.NewSecret()
		var err error
		if hash, err = s.hasher.Hash(ctx, []byte(secret)); err != nil {
			return nil, "", err
		}
	}
	now := s.now()
	a := &persistence.Application{ID: uuid.Must(uuid.NewV7()).String(), ClientID: NewClientID(), SecretHash: hash, CreatedAt: now, UpdatedAt: now}
	in.apply(a)
	if err := s.store.CreateApplication(ctx, a); err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// apply writes a validated registration into the record.
func (in *Input) apply(a *persistence.Application) {
	a.Name, a.Type, a.RedirectURIs, a.PostLogoutRedirectURIs, a.WebOrigins = in.Name, in.Type, in.RedirectURIs, in.PostLogoutRedirectURIs, in.WebOrigins
	a.RPID, a.SignInMethods, a.AccessTokenFormat, a.IDTokenSigningAlg = in.RPID, in.SignInMethods, in.AccessTokenFormat, in.IDTokenSigningAlg
	a.MFA = persistence.JSONObject{"policy": in.MFA.Policy, "factors": in.MFA.Factors}
	a.AccessTokenTTL, a.RefreshTokenTTL, a.AdminConsole = in.AccessTokenTTL, in.RefreshTokenTTL, in.AdminConsole
}

// input is the record as a registration, to patch and validate again.
func input(a *persistence.Application) Input {
	in := Input{
		Name: a.Name, Type: a.Type, RedirectURIs: a.RedirectURIs, PostLogoutRedirectURIs: a.PostLogoutRedirectURIs,
		WebOrigins: a.WebOrigins, RPID: a.RPID, SignInMethods: a.SignInMethods, AccessTokenFormat: a.AccessTokenFormat,
		IDTokenSigningAlg: a.IDTokenSigningAlg, AccessTokenTTL: a.AccessTokenTTL, RefreshTokenTTL: a.RefreshTokenTTL,
		AdminConsole: a.AdminConsole, MFA: MFAOf(a),
	}
	return in
}

// MFAOf reads an application's stored multi-factor policy.
func MFAOf(a *persistence.Application) *MFA {
	m := &MFA{Policy: "off", Factors: []string{}}
	if p, ok := a.MFA["policy"].(string); ok {
		m.Policy = p
	}
	if fs, ok := a.MFA["factors"].([]any); ok {
		for _, f := range fs {
			if s, ok := f.(string); ok {
				m.Factors = append(m.Factors, s)
			}
		}
	}
	return m
}

// Get reads one application.
func (s *Service) Get(ctx context.Context, id string) (*persistence.Application, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetApplication(ctx, id)
}

// List returns one page of applications and the total.
func (s *Service) List(ctx context.Context, p persistence.Page) ([]persistence.Application, int, error) {
	return s.store.ListApplications(ctx, p)
}

// ErrTypeChange refuses a change of type: a confidential application's
// clients hold a secret a public one cannot keep, and the other way round
// the server would have to mint one; register a new application instead.
var ErrTypeChange = extensions.NewError(http.StatusBadRequest, "invalid_request",
	"An application's type cannot change; register a new application.", map[string]any{"field": "type"})

// Update applies a patch under the row lock, validating the result.
func (s *Service) Update(ctx context.Context, id string, p Patch) (*persistence.Application, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateApplication(ctx, id, func(a *persistence.Application) error {
		in := input(a)
		if p.Type != nil && *p.Type != a.Type {
			return ErrTypeChange
		}
		set := func(dst *string, src *string) {
			if src != nil {
				*dst = *src
			}
		}
		setList := func(dst *[]string, src *[]string) {
			if src != nil {
				*dst = *src
			}
		}
		set(&in.Name, p.Name)
		set(&in.RPID, p.RPID)
		set(&in.AccessTokenFormat, p.AccessTokenFormat)
		set(&in.IDTokenSigningAlg, p.IDTokenSigningAlg)
		setList(&in.RedirectURIs, p.RedirectURIs)
		setList(&in.PostLogoutRedirectURIs, p.PostLogoutRedirectURIs)
		setList(&in.WebOrigins, p.WebOrigins)
		setList(&in.SignInMethods, p.SignInMethods)
		if p.RedirectURIs != nil && p.RPID == nil && a.RPID == defaultRPID(a.RedirectURIs) {
			in.RPID = "" // derived before: derive it again from the new URIs
		}
		if p.MFA != nil {
			in.MFA = p.MFA
		}
		if p.AccessTokenTTL != nil || p.ClearAccessTTL {
			in.AccessTokenTTL = p.AccessTokenTTL
		}
		if p.RefreshTokenTTL != nil || p.ClearRefreshTTL {
			in.RefreshTokenTTL = p.RefreshTokenTTL
		}
		if p.AdminConsole != nil {
			in.AdminConsole = *p.AdminConsole
		}
		if err := in.validate(); err != nil {
			return err
		}
		in.apply(a)
		a.UpdatedAt = s.now()
		return nil
	})
}

// defaultRPID is the rpId Create derives from these redirect URIs.
func defaultRPID(redirects []string) string {
	in := Input{RedirectURIs: redirects}
	in.checkRPID(&extensions.ValidationError{})
	return in.RPID
}

// ErrPublicRotate refuses to rotate a public application's secret: it has
// none (RFC 6749 §2.1: a public client cannot keep one).
var ErrPublicRotate = extensions.Conflict("no_secret", "A public application has no secret to rotate.", nil)

// Rotate replaces a confidential application's secret. The old one stops
// working when this returns: only the new hash is stored.
func (s *Service) Rotate(ctx context.Context, id string) (*persistence.Application, string, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, "", persistence.ErrNotFound
	}
	secret := oauth.NewSecret()
	hash, err := s.hasher.Hash(ctx, []byte(secret))
	if err != nil {
		return nil, "", err
	}
	a, err := s.store.UpdateApplication(ctx, id, func(a *persistence.Application) error {
		if a.Type == persistence.AppPublic {
			return ErrPublicRotate
		}
		now := s.now()
		a.SecretHash, a.UpdatedAt, a.RotatedAt = hash, now, &now
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// Delete removes the application. Its tokens stop working with it: a token
// is valid only while its client exists.
func (s *Service) Delete(ctx context.Context, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	return s.store.DeleteApplication(ctx, id)
}
