package reset

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/identityd/identityd/extensions"
)

// Captcha verifies captcha tokens at a siteverify-compatible endpoint, as
// Cloudflare Turnstile, hCaptcha and Google reCAPTCHA offer: a form POST of
// secret, response and remoteip, answered by JSON whose success says
// whether the token is good.
type Captcha struct {
	VerifyURL string
	Secret    string
	Client    *http.Client // nil: a client with a 10-second timeout
	// Widget is the provider's widget the hosted forgot page shows; nil:
	// none (the hosted page then cannot be used, and applications ask
	// through their own page and the API).
	Widget *Widget
}

// Widget is a captcha provider's browser widget: its script, the element
// it fills, the site key, and the origins the page's Content-Security-
// Policy must admit for it (script, frames, styles, connections).
type Widget struct {
	Provider string // turnstile, hcaptcha, recaptcha
	SiteKey  string
	Script   string
	Class    string
	Sources  []string
}

// Widgets are the providers whose widget the hosted page can show.
var Widgets = map[string]Widget{
	"turnstile": {Provider: "turnstile", Script: "https://challenges.cloudflare.com/turnstile/v0/api.js", Class: "cf-turnstile",
		Sources: []string{"https://challenges.cloudflare.com"}},
	"hcaptcha": {Provider: "hcaptcha", Script: "https://js.hcaptcha.com/1/api.js", Class: "h-captcha",
		Sources: []string{"https://hcaptcha.com", "https://*.hcaptcha.com"}},
	"recaptcha": {Provider: "recaptcha", Script: "https://www.google.com/recaptcha/api.js", Class: "g-recaptcha",
		Sources: []string{"https://www.google.com/recaptcha/", "https://www.gstatic.com/recaptcha/", "https://recaptcha.google.com/recaptcha/"}},
}

// NewWidget is the widget of provider with siteKey; false for a provider
// it does not know.
func NewWidget(provider, siteKey string) (*Widget, bool) {
	w, ok := Widgets[provider]
	if !ok {
		return nil, false
	}
	w.SiteKey = siteKey
	return &w, true
}

// Refusals of captcha checks (ours: the spec names captchaToken only).
var (
	ErrCaptchaRequired = extensions.NewError(http.StatusBadRequest, "captcha_required", "Complete the captcha and send its token as captchaToken.",
		map[string]any{"field": "captchaToken"})
	ErrCaptchaFailed = extensions.NewError(http.StatusBadRequest, "captcha_failed", "The captcha was not solved. Try again.",
		map[string]any{"field": "captchaToken"})
	ErrCaptchaUnavailable = extensions.NewError(http.StatusServiceUnavailable, "temporarily_unavailable",
		"The captcha cannot be checked now. Try again in a moment.", nil)
)

// maxCaptchaToken bounds what is sent on of a token (Turnstile's are at
// most 2,048 characters).
const maxCaptchaToken = 4096

// Verify checks token, solved from remoteIP. It fails closed: a provider
// that cannot be reached refuses (ErrCaptchaUnavailable), since an
// operator who turned the captcha on wants no request without one.
func (c *Captcha) Verify(ctx context.Context, token, remoteIP string) error {
	token = strings.TrimSpace(token)
	if token == "" {
		return ErrCaptchaRequired
	}
	if len(token) > maxCaptchaToken {
		return ErrCaptchaFailed
	}
	form := url.Values{"secret": {c.Secret}, "response": {token}}
	if remoteIP != "" {
		form.Set("remoteip", remoteIP)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.VerifyURL, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	client := c.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%w (%v)", ErrCaptchaUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w (siteverify answered %d)", ErrCaptchaUnavailable, resp.StatusCode)
	}
	var answer struct {
		Success bool `json:"success"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&answer); err != nil {
		return fmt.Errorf("%w (siteverify's answer: %v)", ErrCaptchaUnavailable, err)
	}
	if !answer.Success {
		return ErrCaptchaFailed
	}
	return nil
}
