package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/identityd/identityd/extensions/directory"
)

// People signing in: what a browser and an application do, over HTTP. A
// browser is a cookie jar that follows redirects by hand, so that the
// application's callback (never served) ends the walk.

const (
	benchRedirect = "http://127.0.0.1:9/callback" // the application's callback: never requested
	benchEmail    = "bench@example.com"
	benchPassword = "correct horse battery staple"
)

// peopleResults are the people phases' figures.
type peopleResults struct {
	codeRS256, codeES256, refresh, refreshID, jwtTokens, signIns phaseResult
	argonRate                                                    float64 // raw argon2id hashes/s on this machine, same parameters
	embedded                                                     embeddedResults
	passkeys                                                     passkeyResults // passkey sign-ins, begin and finish (passkeys.go)
}

// browser is one person's browser: its cookies, no automatic redirects.
func (c *client) browser() *http.Client { return browserOver(c.http.Transport) }

func browserOver(tr http.RoundTripper) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second, Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signInSources is how many loopback addresses the password sign-ins come
// from. The server lets one address begin 60 sign-in flows a minute whatever
// IDENTITYD_RATE_LIMITS says (handlers' flow budget); a site's people sign
// in from many addresses, and so does the benchmark.
const signInSources = 64

// fromSources are transports whose connections leave from 127.0.1.1,
// 127.0.1.2, …: on Linux every 127/8 address is the loopback's.
func fromSources(base *http.Transport, n int) []*http.Transport {
	trs := make([]*http.Transport, n)
	for i := range trs {
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}}
		trs[i] = base.Clone()
		trs[i].DialContext = d.DialContext
		trs[i].MaxIdleConnsPerHost = 2
	}
	return trs
}

var (
	formAction = regexp.MustCompile(`<form method="post" action="([^"]+)"`)
	hiddenRe   = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)
)

// walk sends req and follows redirects until the application's callback
// (answered as its URL) or a page (answered as its body).
func walk(b *http.Client, req *http.Request) (*url.URL, string, error) {
	for range 10 {
		resp, err := b.Do(req)
		if err != nil {
			return nil, "", err
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return nil, "", err
		}
		switch {
		case resp.StatusCode >= 300 && resp.StatusCode < 400:
			next, err := req.URL.Parse(resp.Header.Get("Location"))
			if err != nil {
				return nil, "", err
			}
			if strings.HasPrefix(next.String(), benchRedirect) {
				return next, "", nil
			}
			if req, err = http.NewRequestWithContext(req.Context(), http.MethodGet, next.String(), nil); err != nil {
				return nil, "", err
			}
		case resp.StatusCode == http.StatusOK:
			return req.URL, string(body), nil
		default:
			return nil, "", fmt.Errorf("%s %s: status %d: %.200s", req.Method, req.URL.Path, resp.StatusCode, body)
		}
	}
	return nil, "", errors.New("too many redirects")
}

// submit posts a page's form with its hidden fields and the given ones.
func submit(ctx context.Context, b *http.Client, page *url.URL, body string, fields url.Values) (*url.URL, string, error) {
	m := formAction.FindStringSubmatch(body)
	if m == nil {
		return nil, "", fmt.Errorf("no form on %s: %.300s", page.Path, body)
	}
	action, err := page.Parse(html.UnescapeString(m[1]))
	if err != nil {
		return nil, "", err
	}
	form := url.Values{}
	for _, h := range hiddenRe.FindAllStringSubmatch(body, -1) {
		if form.Get(h[1]) == "" { // the first form's fields
			form.Set(h[1], html.UnescapeString(h[2]))
		}
	}
	for k, v := range fields {
		form[k] = v
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, action.String(), strings.NewReader(form.Encode()))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return walk(b, req)
}

// authorization is one authorization request with PKCE.
type authorization struct {
	url, verifier string
}

func (c *client) authorization(a account, scope string) authorization {
	verifier := randomString(32, base64.RawURLEncoding.EncodeToString)
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"client_id": {a.id}, "redirect_uri": {benchRedirect}, "response_type": {"code"}, "scope": {scope},
		"state": {randomString(12, base64.RawURLEncoding.EncodeToString)}, "nonce": {randomString(12, base64.RawURLEncoding.EncodeToString)},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
	return authorization{url: c.base + "/api/v1/oauth/authorize?" + q.Encode(), verifier: verifier}
}

// signIn walks the hosted page (e-mail, then password) and answers the code.
func (c *client) signIn(ctx context.Context, b *http.Client, az authorization) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, az.url, nil)
	if err != nil {
		return "", err
	}
	at, body, err := walk(b, req)
	for _, step := range []url.Values{{"email": {benchEmail}}, {"password": {benchPassword}}} {
		if err != nil || body == "" {
			break
		}
		at, body, err = submit(ctx, b, at, body, step)
	}
	if err != nil {
		return "", err
	}
	if body != "" {
		return "", fmt.Errorf("sign-in ended on a page: %.300s", body)
	}
	return codeOf(at)
}

// authorize asks for a code with the browser's live session: no page.
func (c *client) authorize(ctx context.Context, b *http.Client, az authorization) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, az.url, nil)
	if err != nil {
		return "", err
	}
	at, body, err := walk(b, req)
	if err != nil {
		return "", err
	}
	if body != "" {
		return "", errors.New("a page where the session should have answered")
	}
	return codeOf(at)
}

func codeOf(callback *url.URL) (string, error) {
	q := callback.Query()
	if q.Get("code") == "" {
		return "", fmt.Errorf("no code: %s", q.Get("error"))
	}
	return q.Get("code"), nil
}

// tokens are a token response's parts the benchmark checks.
type tokens struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	IDToken      string `json:"id_token"`
}

func (c *client) exchangeCode(ctx context.Context, a account, code, verifier string) (tokens, error) {
	var out tokens
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {benchRedirect}, "code_verifier": {verifier}}
	err := c.postForm(ctx, "/api/v1/oauth/token", a, form.Encode(), &out)
	return out, err
}

func (c *client) refresh(ctx context.Context, a account, token string) (tokens, error) {
	var out tokens
	err := c.postForm(ctx, "/api/v1/oauth/token", a, "grant_type=refresh_token&refresh_token="+url.QueryEscape(token), &out)
	if err == nil && (out.AccessToken == "" || out.RefreshToken == "") {
		err = errors.New("refresh without an access and a refresh token")
	}
	return out, err
}

// runPeople registers two applications (RS256 with opaque access tokens,
// ES256 with JWT access tokens) and a person, signs the person in once on the
// hosted page, and measures: complete code flows with that live session
// (authorize, code, token exchange with PKCE, ID token), refresh grants
// (opaque access tokens; again with openid, signing an RS256 ID token each),
// refresh grants that issue ES256 JWT access tokens, and password sign-ins
// through the hosted page beside the raw argon2id rate of this machine.
func runPeople(ctx context.Context, cfg config, c *client, pid int, admin string) (peopleResults, error) {
	var r peopleResults
	// A confidential application authenticates as any client does.
	newApp := func(name string, fields map[string]any) (account, error) {
		fields["name"], fields["redirectUris"] = name, []string{benchRedirect}
		return c.create(ctx, admin, "/api/v1/applications", fields)
	}
	rs, err := newApp("bench-rs256", map[string]any{})
	if err != nil {
		return r, fmt.Errorf("register an application: %w", err)
	}
	es, err := newApp("bench-es256", map[string]any{"idTokenSigningAlg": "ES256", "accessTokenFormat": "jwt"})
	if err != nil {
		return r, fmt.Errorf("register an application: %w", err)
	}
	var user map[string]any
	body, _ := json.Marshal(map[string]any{"email": benchEmail, "name": "Bench Person", "password": benchPassword})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/v1/m2m/users", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+admin)
	if err := c.do(req, http.StatusCreated, &user); err != nil {
		return r, fmt.Errorf("create a person: %w", err)
	}

	// One browser, one session, signed in once.
	b := c.browser()
	if _, err := c.signIn(ctx, b, c.authorization(rs, "openid")); err != nil {
		return r, fmt.Errorf("sign in: %w", err)
	}
	flow := func(a account) func(ctx context.Context, n uint64) error {
		return func(ctx context.Context, n uint64) error {
			az := c.authorization(a, "openid email profile")
			code, err := c.authorize(ctx, b, az)
			if err != nil {
				return err
			}
			t, err := c.exchangeCode(ctx, a, code, az.verifier)
			if err == nil && (t.IDToken == "" || t.AccessToken == "") {
				err = errors.New("code exchange without an ID token")
			}
			return err
		}
	}
	if r.codeRS256, err = runPhase(ctx, "code flows RS256", cfg, pid, flow(rs)); err != nil {
		return r, err
	}
	if r.codeES256, err = runPhase(ctx, "code flows ES256", cfg, pid, flow(es)); err != nil {
		return r, err
	}

	// Refresh: a pool of token families, each used by one worker at a time.
	pool := func(a account, scope string) (chan string, error) {
		ch := make(chan string, 2*cfg.concurrency)
		for range cap(ch) {
			az := c.authorization(a, scope)
			code, err := c.authorize(ctx, b, az)
			if err != nil {
				return nil, err
			}
			t, err := c.exchangeCode(ctx, a, code, az.verifier)
			if err != nil {
				return nil, err
			}
			if t.RefreshToken == "" {
				return nil, errors.New("offline_access without a refresh token")
			}
			ch <- t.RefreshToken
		}
		return ch, nil
	}
	rotate := func(a account, ch chan string, jwt bool) func(ctx context.Context, n uint64) error {
		return func(ctx context.Context, n uint64) error {
			old := <-ch
			t, err := c.refresh(ctx, a, old)
			if err != nil {
				ch <- old // rotation did not happen: the family lives on
				return err
			}
			ch <- t.RefreshToken
			if jwt && strings.Count(t.AccessToken, ".") != 2 {
				return errors.New("not a JWT access token")
			}
			return nil
		}
	}
	// The refresh grant itself: an opaque access token, a new refresh token.
	ch, err := pool(rs, "offline_access")
	if err != nil {
		return r, fmt.Errorf("refresh pool: %w", err)
	}
	if r.refresh, err = runPhase(ctx, "refresh grants", cfg, pid, rotate(rs, ch, false)); err != nil {
		return r, err
	}
	// With openid, each refresh also signs a new RS256 ID token.
	if ch, err = pool(rs, "openid offline_access"); err != nil {
		return r, fmt.Errorf("refresh pool: %w", err)
	}
	if r.refreshID, err = runPhase(ctx, "refresh + RS256 ID", cfg, pid, rotate(rs, ch, false)); err != nil {
		return r, err
	}
	// Without openid: the refresh issues a JWT access token and no ID token.
	if ch, err = pool(es, "offline_access"); err != nil {
		return r, fmt.Errorf("JWT refresh pool: %w", err)
	}
	if r.jwtTokens, err = runPhase(ctx, "JWT access tokens", cfg, pid, rotate(es, ch, true)); err != nil {
		return r, err
	}

	// Password sign-ins: a new browser each, through both pages, from
	// signInSources addresses in turn.
	sources := fromSources(c.http.Transport.(*http.Transport), signInSources)
	defer func() {
		for _, tr := range sources {
			tr.CloseIdleConnections()
		}
	}()
	if r.signIns, err = runPhase(ctx, "password sign-ins", cfg, pid, func(ctx context.Context, n uint64) error {
		_, err := c.signIn(ctx, browserOver(sources[n%signInSources]), c.authorization(rs, "openid"))
		return err
	}); err != nil {
		return r, err
	}
	r.argonRate = argonRate(ctx, cfg.duration)
	return r, nil
}

// argonRate is how many argon2id hashes with the directory's parameters this
// machine computes per second with every core busy (the server idle).
func argonRate(ctx context.Context, d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 { // more than the cores: the directory bounds hashes at once itself
		wg.Go(func() {
			for ctx.Err() == nil && time.Since(start) < d {
				if _, err := directory.HashPassword(benchPassword); err == nil {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}
