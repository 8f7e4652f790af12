package applications

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Values of the enumerated fields.
const (
	MethodPassword  = "password"
	MethodOTP       = "otp"
	MethodMagicLink = "magic-link"
	MethodPasskey   = "passkey"

	MFAOff      = "off"
	MFAOptional = "optional"
	MFARequired = "required"

	FactorTOTP    = "totp"
	FactorOTP     = "otp" // a code e-mailed for the step-up
	FactorPasskey = "passkey"

	FormatOpaque = "opaque"
	FormatJWT    = "jwt"

	AlgRS256 = "RS256"
	AlgES256 = "ES256"
)

var (
	signInMethods = []string{MethodPassword, MethodOTP, MethodMagicLink, MethodPasskey}
	mfaPolicies   = []string{MFAOff, MFAOptional, MFARequired}
	mfaFactors    = []string{FactorTOTP, FactorOTP, FactorPasskey}
	types         = []string{persistence.AppConfidential, persistence.AppPublic}
	formats       = []string{FormatOpaque, FormatJWT}
	algs          = []string{AlgRS256, AlgES256}
)

// DefaultSignInMethods are the methods of an application that names none
// (spec: password, e-mail OTP and magic link).
var DefaultSignInMethods = []string{MethodPassword, MethodOTP, MethodMagicLink}

// Bounds of what an application may hold. Token lifetimes are whole
// seconds: an access token lives one minute to one day, a refresh token
// five minutes to a year (docs/decisions.md).
const (
	maxName         = 200
	maxURIs         = 20
	MinAccessTTL    = 60
	MaxAccessTTL    = 86400
	MinRefreshTTL   = 300
	MaxRefreshTTL   = 31536000
	maxHostNameSize = 253
)

// MFA is an application's multi-factor setting: a policy and the factors
// it accepts ("required" needs at least one).
type MFA struct {
	Policy  string   `json:"policy"`
	Factors []string `json:"factors"`
}

// Seconds is a lifetime a caller may set: Set tells whether it was given,
// Value nil means the server's default.
type Seconds struct {
	Set   bool
	Value *int
}

// Input is what a caller may set on an application. A nil field (or an
// unset Seconds) was not given: Create fills the default, Update keeps the
// stored value.
type Input struct {
	Name                   *string
	Type                   *string
	RedirectURIs           *[]string
	PostLogoutRedirectURIs *[]string
	WebOrigins             *[]string
	RPID                   *string // "" (or absent on create): the default, derived from the redirect URIs
	SignInMethods          *[]string
	MFA                    *MFA
	AccessTokenFormat      *string
	IDTokenSigningAlg      *string
	AccessTokenTTL         Seconds
	RefreshTokenTTL        Seconds
	AdminConsole           *bool
	AllowSignUp            *bool
	PasswordResetURI       *string // "": none (identityd's hosted reset page)
}

// apply validates the input laid over a (a new, empty record when create),
// reports every problem at once, and only then writes the result into a.
// Lists lose their repeats, keeping the first; web origins and rpId are
// stored in the lower-case form browsers send.
func (in Input) apply(a *persistence.Application, create bool) error {
	// What the record would be: the stored values, then the given ones.
	name, typ, rpID := a.Name, a.Type, a.RPID
	redirects, postLogout, origins := []string(a.RedirectURIs), []string(a.PostLogoutRedirectURIs), []string(a.WebOrigins)
	methods, mfa := []string(a.SignInMethods), MFAOf(a)
	format, alg, access, refresh, adminConsole := a.AccessTokenFormat, a.IDTokenSigningAlg, a.AccessTokenTTL, a.RefreshTokenTTL, a.AdminConsole
	if create {
		typ, methods, mfa, format, alg = persistence.AppConfidential, DefaultSignInMethods, MFA{Policy: MFAOff, Factors: []string{}}, FormatOpaque, AlgRS256
	}
	if in.Type != nil {
		if !create && *in.Type != a.Type {
			return ErrTypeChange
		}
		typ = *in.Type
	}
	set := func(dst *[]string, src *[]string) {
		if src != nil {
			*dst = *src
		}
	}
	if in.Name != nil {
		name = *in.Name
	}
	set(&redirects, in.RedirectURIs)
	set(&postLogout, in.PostLogoutRedirectURIs)
	set(&origins, in.WebOrigins)
	set(&methods, in.SignInMethods)
	if in.RPID != nil {
		rpID = *in.RPID
	}
	if create && in.RPID == nil {
		rpID = ""
	}
	if in.MFA != nil {
		mfa = *in.MFA
	}
	if in.AccessTokenFormat != nil {
		format = *in.AccessTokenFormat
	}
	if in.IDTokenSigningAlg != nil {
		alg = *in.IDTokenSigningAlg
	}
	if in.AccessTokenTTL.Set {
		access = in.AccessTokenTTL.Value
	}
	if in.RefreshTokenTTL.Set {
		refresh = in.RefreshTokenTTL.Value
	}
	if in.AdminConsole != nil {
		adminConsole = *in.AdminConsole
	}
	allowSignUp := a.AllowSignUp
	if in.AllowSignUp != nil {
		allowSignUp = *in.AllowSignUp
	}
	resetURI := a.PasswordResetURI
	if in.PasswordResetURI != nil {
		resetURI = *in.PasswordResetURI
	}

	var v extensions.ValidationError
	v.CheckText("name", name, true, maxName)
	name = strings.TrimSpace(name)
	oneOf(&v, "type", typ, types)
	public := typ == persistence.AppPublic
	if len(redirects) == 0 {
		v.Add("redirectUris", "at least one redirect URI is required")
	}
	redirects = uris(&v, "redirectUris", redirects, public)
	postLogout = uris(&v, "postLogoutRedirectUris", postLogout, public)
	origins = webOrigins(&v, origins)
	rpID = strings.ToLower(rpID)
	if rpID == "" {
		rpID = defaultRPID(redirects)
	} else if err := checkHostName(rpID); err != nil {
		v.Add("rpId", "%s", err)
	}
	if _, bad := v.Fields["rpId"]; !bad {
		for i, o := range origins {
			if host := originHost(o); rpID == "" {
				v.Add("rpId", "is required with webOrigins: no redirect URI names a host to default it to")
			} else if host != rpID && !strings.HasSuffix(host, "."+rpID) {
				v.Add(fmt.Sprintf("webOrigins[%d]", i), "host %q is not rpId %q or a subdomain of it", host, rpID)
			}
		}
	}
	methods = subset(&v, "signInMethods", methods, signInMethods)
	if len(methods) == 0 {
		v.Add("signInMethods", "at least one sign-in method is required")
	}
	oneOf(&v, "mfa.policy", mfa.Policy, mfaPolicies)
	mfa.Factors = subset(&v, "mfa.factors", mfa.Factors, mfaFactors)
	if mfa.Policy == MFARequired && len(mfa.Factors) == 0 {
		v.Add("mfa.factors", "policy required needs at least one factor")
	}
	if rpID == "" && (slices.Contains(methods, MethodPasskey) || slices.Contains(mfa.Factors, FactorPasskey)) {
		v.Add("rpId", "is required for passkeys: no redirect URI names a host to default it to")
	}
	oneOf(&v, "accessTokenFormat", format, formats)
	oneOf(&v, "idTokenSigningAlg", alg, algs)
	bounded(&v, "accessTokenTtl", access, MinAccessTTL, MaxAccessTTL)
	bounded(&v, "refreshTokenTtl", refresh, MinRefreshTTL, MaxRefreshTTL)
	checkResetURI(&v, resetURI, redirects)
	if err := v.Err(); err != nil {
		return err
	}

	a.Name, a.Type, a.RPID = name, typ, rpID
	a.RedirectURIs, a.PostLogoutRedirectURIs, a.WebOrigins = redirects, postLogout, origins
	a.SignInMethods, a.MFA = methods, storedMFA(mfa)
	a.AccessTokenFormat, a.IDTokenSigningAlg, a.AccessTokenTTL, a.RefreshTokenTTL, a.AdminConsole = format, alg, access, refresh, adminConsole
	a.AllowSignUp, a.PasswordResetURI = allowSignUp, resetURI
	return nil
}

// checkResetURI checks an application's own password-reset page: an
// https URL (http on a loopback host), no fragment, whose origin is the
// origin of one of its redirect URIs, as an invite's accept page must be:
// the e-mailed link carries a reset token there.
func checkResetURI(v *extensions.ValidationError, raw string, redirects []string) {
	if raw == "" {
		return
	}
	if err := extensions.CheckHTTPSURL(raw); err != nil {
		v.Add("passwordResetUri", "%s", err)
		return
	}
	origin := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return ""
		}
		return strings.ToLower(u.Scheme + "://" + u.Host)
	}
	if !slices.ContainsFunc(redirects, func(r string) bool { return origin(r) == origin(raw) }) {
		v.Add("passwordResetUri", "its origin must be the origin of one of the redirect URIs")
	}
}

func oneOf(v *extensions.ValidationError, field, value string, allowed []string) {
	if !slices.Contains(allowed, value) {
		v.Add(field, "must be one of %s", strings.Join(allowed, ", "))
	}
}

// subset checks that every item is allowed and returns the items without
// repeats (never nil).
func subset(v *extensions.ValidationError, field string, items, allowed []string) []string {
	for i, s := range items {
		if !slices.Contains(allowed, s) {
			v.Add(fmt.Sprintf("%s[%d]", field, i), "unknown value %q: must be one of %s", s, strings.Join(allowed, ", "))
		}
	}
	return extensions.Distinct(items)
}

func bounded(v *extensions.ValidationError, field string, n *int, lo, hi int) {
	if n != nil && (*n < lo || *n > hi) {
		v.Add(field, "must be from %d to %d seconds, or null for the server's default", lo, hi)
	}
}

// uris checks redirect URIs (CheckRedirectURI) and returns them without
// repeats (never nil).
func uris(v *extensions.ValidationError, field string, list []string, public bool) []string {
	for i, u := range list {
		if err := CheckRedirectURI(u, public); err != nil {
			v.Add(fmt.Sprintf("%s[%d]", field, i), "%s", err)
		}
	}
	list = extensions.Distinct(list)
	if len(list) > maxURIs {
		v.Add(field, "at most %d URIs", maxURIs)
	}
	return list
}

// CheckRedirectURI checks a redirect URI as service accounts' are checked
// (extensions.CheckHTTPSURL: https, or http on a loopback host, no
// fragment); a public application may also name a private-use URI scheme
// in reverse-domain form, as native apps do (RFC 8252 §7.1), such as
// com.example.app:/callback. The authorization endpoint matches the exact
// string.
func CheckRedirectURI(raw string, public bool) error {
	u, perr := url.Parse(raw)
	custom := perr == nil && strings.Contains(u.Scheme, ".")
	if !custom {
		err := extensions.CheckHTTPSURL(raw)
		if err != nil && public && perr == nil && u.Scheme != "" && u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("scheme must be https, or a private-use scheme in reverse-domain form such as com.example.app (RFC 8252 §7.1)")
		}
		return err
	}
	labels := strings.Split(u.Scheme, ".")
	switch {
	case !public:
		return fmt.Errorf("private-use URI schemes are for public (native) applications only; use https")
	case len(raw) > 2000:
		return fmt.Errorf("must be at most 2000 characters")
	case slices.Contains(labels, ""):
		return fmt.Errorf("scheme must be in reverse-domain form such as com.example.app (RFC 8252 §7.1)")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return fmt.Errorf("must not contain a fragment")
	case u.User != nil:
		return fmt.Errorf("must not contain user information")
	case u.Opaque == "" && u.Host == "" && u.Path == "":
		return fmt.Errorf("must have a path after the scheme, such as com.example.app:/callback")
	}
	return nil
}

// webOrigins checks origins and returns them in the serialized form
// browsers send in the Origin header (RFC 6454 §6.2: lower-case scheme
// and host, no default port), without repeats (never nil).
func webOrigins(v *extensions.ValidationError, list []string) []string {
	out := make([]string, len(list))
	for i, o := range list {
		norm, err := CheckOrigin(o)
		if err != nil {
			v.Add(fmt.Sprintf("webOrigins[%d]", i), "%s", err)
		}
		out[i] = norm
	}
	out = extensions.Distinct(out)
	if len(out) > maxURIs {
		v.Add("webOrigins", "at most %d origins", maxURIs)
	}
	return out
}

// CheckOrigin checks a web origin, scheme://host[:port] with no path,
// https or http on a loopback host, an ASCII host, and returns its
// serialized form.
func CheckOrigin(raw string) (string, error) {
	if len(raw) > 2000 {
		return "", fmt.Errorf("must be at most 2000 characters")
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "":
		return "", fmt.Errorf("must be an origin such as https://app.example.com")
	case u.User != nil:
		return "", fmt.Errorf("must not contain user information")
	case u.Path != "" || u.RawQuery != "" || u.ForceQuery || strings.Contains(raw, "#"):
		return "", fmt.Errorf("must be an origin, scheme://host[:port], with no path (not even /), query or fragment")
	case u.Scheme == "http" && !extensions.IsLoopbackHost(u.Hostname()):
		return "", fmt.Errorf("http is allowed only for loopback hosts; use https")
	case u.Scheme != "https" && u.Scheme != "http":
		return "", fmt.Errorf("scheme must be https")
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if strings.IndexFunc(host, func(r rune) bool { return r >= utf8.RuneSelf }) >= 0 {
		// Browsers send an international name as A-labels (RFC 6454 §6.1,
		// RFC 5890): a Unicode form stored here would never match.
		return "", fmt.Errorf("host must be ASCII: write an international name in its A-label form (xn--…), as browsers send it")
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port must be from 1 to 65535")
		}
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port == "" || u.Scheme == "https" && port == "443" || u.Scheme == "http" && port == "80" {
		return u.Scheme + "://" + host, nil
	}
	return u.Scheme + "://" + host + ":" + port, nil
}

// originHost is the host of a checked origin.
func originHost(origin string) string {
	u, err := url.Parse(origin)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// defaultRPID is the host of the first https or http redirect URI whose
// host is a host name (a WebAuthn relying-party id is a domain, never an
// address), or "" when there is none.
func defaultRPID(redirects []string) string {
	for _, r := range redirects {
		u, err := url.Parse(r)
		if err != nil || u.Scheme != "https" && u.Scheme != "http" {
			continue
		}
		if h := strings.ToLower(u.Hostname()); checkHostName(h) == nil {
			return h
		}
	}
	return ""
}

// checkHostName checks a WebAuthn relying-party id: a DNS host name
// (RFC 1123 labels of letters, digits and inner hyphens, A-labels for
// international names), lower case, no trailing dot, not an IP address.
func checkHostName(h string) error {
	if len(h) > maxHostNameSize || net.ParseIP(h) != nil {
		return fmt.Errorf("must be a host name such as example.com")
	}
	for _, label := range strings.Split(h, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') }) >= 0 {
			return fmt.Errorf("must be a host name such as example.com")
		}
	}
	return nil
}
