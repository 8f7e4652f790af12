// Package pages renders identityd's hosted pages (sign-in, sign-out, their
// errors) from templates and a style sheet embedded in the binary, with the
// headers every page carries, and keeps the browser's cookies and the forms'
// CSRF tokens. The pages use nothing from another origin, and no script but
// the passkey step's own file (passkey.js), on the pages that offer one.
package pages

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/identityd/identityd/extensions"
)

//go:embed web
var web embed.FS

var templates = map[string]*template.Template{}

// funcs are the templates' own functions. visible shows the control and
// format characters of text someone else wrote (an agent's context, a
// name, a binding message) as escapes such as <U+202E>, never applied: a
// bidi override would make "users/\u202e24" read "users/42" (issue 39).
var funcs = template.FuncMap{"visible": extensions.Visible}

func init() {
	for _, name := range []string{"email", "password", "otp", "linksent", "magiclink", "mfa", "message", "logout", "linkoffer", "linkpassword", "linkcode", "continue", "forgot", "reset", "approval", "consent"} {
		templates[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(web, "web/layout.html", "web/"+name+".html"))
	}
}

// AssetsPath is where the pages' style sheet and script are served.
const AssetsPath = "/signin/assets"

// Assets serves the embedded style sheet and the passkey script; they
// change only with the binary.
func Assets() http.Handler {
	sub, _ := fs.Sub(web, "web")
	files := http.StripPrefix(AssetsPath, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, ".css") && !strings.HasSuffix(r.URL.Path, ".js") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		w.Header().Set("Content-Security-Policy", "default-src 'none'")
		files.ServeHTTP(w, r)
	})
}

// Page is what a template shows. Hidden fields are re-sent by a form.
type Page struct {
	Title         string
	AppName       string
	Flow          string
	CSRF          string
	Email         string
	Error         string // the refusal; linked to its field (aria-describedby)
	Message       string
	Detail        string
	Action        string
	RestartAction string
	Hidden        []Field
	Alternatives  []Alternative // other methods the person may switch to
	Resend        *Alternative  // the step's own method again: a new code or link
	MethodAction  string        // where an alternative's form posts
	Providers     []Alternative // upstream sign-in providers: "Continue with …" (Method: the provider's name)
	ProvidersPost string        // where a provider's button posts
	Next          template.URL  // where a page that moves on leads (meta refresh): a URL the server made
	Captcha       *Captcha      // a captcha widget the form shows (its script admitted by the CSP)
	ForgotLink    string        // the password step's "Forgot password?" link
	BackLink      string        // a way back to the sign-in ("" for none)
	Passkey       *Passkey      // the passkey button (and the e-mail field's autofill), shown by passkey.js
	Approval      *Approval     // the HITL request the approval page shows
	Consent       *Consent      // the delegation the consent page shows
	Assets        string
}

// Passkey is a page's passkey ceremony: passkey.js asks Options for the
// options of navigator.credentials.get (the form's flow and CSRF token
// posted) and posts the credential, as JSON in the field credential, with
// the form to Action.
type Passkey struct {
	Options, Action, Label string
	Conditional            bool   // the e-mail field offers passkeys too
	Only                   bool   // the step's only way on: its main button, no other form
	Error                  string // a refused passkey
}

// Approval is what the approval page shows of a HITL request: the agent,
// the call it asks to make (method, path, body pretty-printed; "" when it
// names none) and its own context. What the agent wrote is escaped like
// any other text, and its control and format characters shown (visible).
type Approval struct {
	AgentName, AgentType, TrustLevel string
	Action, Resource, Context        string
	Method, Path, Body               string
	Status, ExpiresAt, TimeLeft      string
}

// Consent is what the consent page shows of a delegation request (CIBA),
// in words; the agent's own (its name, the binding message, details) are
// escaped like any other text.
type Consent struct {
	AgentName, AgentType, TrustLevel string
	BindingMessage                   string
	Scopes, Details                  []string
	Lifetime                         string
	Status, ExpiresAt, TimeLeft      string
	Until                            string   // ExpiresAt for a person to read
	Lifetimes                        []Option // what the person may approve it for, while pending; none when only what was asked
}

// Option is one choice of a select.
type Option struct {
	Value, Label string
	Selected     bool
}

// Captcha is a captcha provider's widget on a form: its script, the
// element it fills, the site key, and the origins it loads from.
type Captcha struct {
	Script, Class, SiteKey string
	Sources                []string
}

// Alternative is another sign-in method a step offers: a button that
// posts its method name.
type Alternative struct{ Method, Label string }

// Field is a hidden form field.
type Field struct{ Name, Value string }

// Render writes a page with status and the hosted pages' headers;
// formTargets are origins (or schemes) the page's forms may end up at
// through redirects, beside this server (CSP form-action governs the
// whole redirect chain of a form's submission).
func Render(w http.ResponseWriter, status int, name string, p Page, formTargets ...string) {
	p.Assets = AssetsPath
	var buf bytes.Buffer
	if err := templates[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		slog.Error("rendering a page failed", "page", name, "error", err.Error())
		http.Error(w, "An internal error occurred.", http.StatusInternalServerError)
		return
	}
	SetHeaders(w.Header(), formTargets...)
	switch {
	case p.Captcha != nil:
		w.Header().Set("Content-Security-Policy", captchaCSP(p.Captcha.Sources, formTargets...))
	case p.Passkey != nil:
		w.Header().Set("Content-Security-Policy", passkeyCSP(formTargets...))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// SetHeaders sets the headers of every hosted page and of the redirects
// the pages lead to: a strict Content-Security-Policy, no framing, no
// referrer, no caching.
func SetHeaders(h http.Header, formTargets ...string) {
	h.Set("Content-Security-Policy", CSP(formTargets...))
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
}

// CSP is the pages' Content-Security-Policy.
func CSP(formTargets ...string) string {
	action := "'self'"
	for _, t := range slices.Compact(slices.Sorted(slices.Values(formTargets))) {
		if t != "" {
			action += " " + t
		}
	}
	return "default-src 'none'; style-src 'self'; img-src 'self'; form-action " + action +
		"; frame-ancestors 'none'; base-uri 'none'"
}

// captchaCSP is CSP admitting a captcha widget: its script, frames,
// styles and connections from sources, and nothing else beyond the pages'.
func captchaCSP(sources []string, formTargets ...string) string {
	src := strings.Join(sources, " ")
	return strings.Replace(CSP(formTargets...), "default-src 'none'; style-src 'self';",
		"default-src 'none'; script-src "+src+"; frame-src "+src+"; connect-src "+src+"; style-src 'self' "+src+";", 1)
}

// passkeyCSP is CSP admitting the pages' own passkey script and its
// fetch of the options, from this server only.
func passkeyCSP(formTargets ...string) string {
	return strings.Replace(CSP(formTargets...), "default-src 'none';", "default-src 'none'; script-src 'self'; connect-src 'self';", 1)
}

// Target is the CSP source that admits a redirect URI: its origin (an
// http(s) URI), or its scheme (a native application's custom scheme,
// RFC 8252); "" for what is neither.
func Target(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || strings.ContainsAny(raw, " ;,'\"") {
		return ""
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return ""
		}
		return u.Scheme + "://" + u.Host
	default:
		return u.Scheme + ":"
	}
}

// --- cookies

// Cookies names and sets the pages' cookies. Over https they carry Secure
// and the __Host- prefix (which binds them to this host and path /).
type Cookies struct{ Secure bool }

// NewCookies for an issuer URL.
func NewCookies(issuer string) Cookies { return Cookies{Secure: strings.HasPrefix(issuer, "https://")} }

// Cookie names without their prefix.
const (
	sessionCookie = "identityd_session" // the SSO session's secret
	browserCookie = "identityd_browser" // the browser's secret: flow binding, CSRF
	deviceCookie  = "identityd_device"  // the device's secret: sign-in risk (new_device)
)

// DeviceLifetime is how long the device cookie lasts: a device stays
// known across sessions and browser restarts.
const DeviceLifetime = 400 * 24 * time.Hour // the longest browsers keep a cookie (RFC 6265bis)

func (c Cookies) name(base string) string {
	if c.Secure {
		return "__Host-" + base
	}
	return base
}

// Session is the SSO session cookie's secret, "" when absent.
func (c Cookies) Session(r *http.Request) string { return c.read(r, sessionCookie) }

// Browser is the browser cookie's secret, "" when absent.
func (c Cookies) Browser(r *http.Request) string { return c.read(r, browserCookie) }

func (c Cookies) read(r *http.Request, base string) string {
	ck, err := r.Cookie(c.name(base))
	if err != nil || len(ck.Value) > 128 {
		return ""
	}
	return ck.Value
}

// SetSession sets the session cookie; it lasts as long as the browser
// session: the server decides when the SSO session ends.
func (c Cookies) SetSession(w http.ResponseWriter, secret string) { c.set(w, sessionCookie, secret, 0) }

// ClearSession removes the session cookie.
func (c Cookies) ClearSession(w http.ResponseWriter) { c.set(w, sessionCookie, "", -1) }

// SetBrowser sets the browser cookie.
func (c Cookies) SetBrowser(w http.ResponseWriter, secret string) { c.set(w, browserCookie, secret, 0) }

// Device is the device cookie's secret, "" when absent.
func (c Cookies) Device(r *http.Request) string { return c.read(r, deviceCookie) }

// SetDevice sets the device cookie.
func (c Cookies) SetDevice(w http.ResponseWriter, secret string) {
	c.set(w, deviceCookie, secret, int(DeviceLifetime/time.Second))
}

func (c Cookies) set(w http.ResponseWriter, base, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: c.name(base), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: c.Secure, SameSite: http.SameSiteLaxMode,
	})
}

// --- CSRF

// CSRF makes and checks the forms' tokens: an HMAC, under a key of its own,
// of the browser cookie's secret and the form's purpose (a flow id, or
// "logout"). A token is good only in the browser it was made for and for
// the form it was made for; another site can neither read the cookie nor
// compute the token.
type CSRF struct{ key []byte }

// PurposeCSRF is the HKDF label of the CSRF key.
const PurposeCSRF = "csrf token"

// NewCSRF keys the tokens (oauth.DeriveKey(secret, PurposeCSRF)).
func NewCSRF(key []byte) *CSRF { return &CSRF{key: key} }

// Token is the token of a form in the browser holding browserSecret.
func (c *CSRF) Token(browserSecret, purpose string) string {
	return base64.RawURLEncoding.EncodeToString(c.mac(browserSecret, purpose))
}

// Valid checks a token in constant time; no browser secret, no token.
func (c *CSRF) Valid(browserSecret, purpose, token string) bool {
	if browserSecret == "" || token == "" {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(token)
	return err == nil && hmac.Equal(got, c.mac(browserSecret, purpose))
}

func (c *CSRF) mac(browserSecret, purpose string) []byte {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(browserSecret))
	m.Write([]byte{0})
	m.Write([]byte(purpose))
	return m.Sum(nil)
}
