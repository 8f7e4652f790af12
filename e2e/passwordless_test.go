package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/http"
	"net/http/cookiejar"
	"net/mail"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/pquerna/otp/totp"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// Passwordless sign-in over real HTTP and real SMTP (issue 12): the hosted
// page's "Email me a code" and "Email me a link" with a cookie jar and
// golang.org/x/oauth2, the embedded API as an application's backend calls it,
// sign-up by code where the application allows it and its refusal where
// it does not, 409 account_exists for a person who signs in another way,
// replayed codes and links, too many wrong codes, and TOTP enrolment with
// a code computed from the secret the server answered. Codes and links are
// read from the messages identityd sends to the SMTP server in the test.

const (
	embeddedAuth    = "/api/v1/embedded/auth"
	embeddedLinkURL = embeddedAuth + "/magic-link/verify?token="
	totpPath        = "/api/v1/auth/mfa/totp"
	linkingEndpoint = "/api/v1/auth/link/initiate"
	plPassword      = "correct horse battery staple"
)

var (
	mailedOTP   = regexp.MustCompile(`(?m)^\s*(\d{6})\s*$`)
	pageFormTag = regexp.MustCompile(`(?s)<form method="post" action="([^"]+)"[^>]*>(.*?)</form>`)
	hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// --- e-mail

// sentMail is a received sign-in message: its subject and text part.
type sentMail struct {
	Subject string
	Text    string
	HTML    string
}

// readMail parses a received message (see parseSent).
func readMail(t *testing.T, raw []byte) sentMail {
	t.Helper()
	m, err := parseSent(raw)
	if err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	return m
}

// parseSent parses a received message: its subject and text/plain part
// (alone, or with a text/html one in a multipart message).
func parseSent(raw []byte) (sentMail, error) {
	var out sentMail
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return out, fmt.Errorf("not an RFC 5322 message: %w", err)
	}
	if out.Subject, err = new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject")); err != nil {
		return out, fmt.Errorf("subject %q: %w", msg.Header.Get("Subject"), err)
	}
	decode := func(cte string, r io.Reader) (string, error) {
		switch strings.ToLower(cte) {
		case "quoted-printable":
			r = quotedprintable.NewReader(r)
		case "base64":
			r = base64.NewDecoder(base64.StdEncoding, r)
		}
		b, err := io.ReadAll(r)
		return string(b), err
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		return out, fmt.Errorf("Content-Type %q: %w", msg.Header.Get("Content-Type"), err)
	}
	if !strings.HasPrefix(mt, "multipart/") {
		out.Text, err = decode(msg.Header.Get("Content-Transfer-Encoding"), msg.Body)
		return out, err
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("multipart: %w", err)
		}
		pt, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		body, err := decode(p.Header.Get("Content-Transfer-Encoding"), p)
		if err != nil {
			return out, fmt.Errorf("part %s: %w", pt, err)
		}
		switch pt {
		case "text/plain":
			out.Text = body
		case "text/html":
			out.HTML = body
		}
	}
	if out.Text == "" {
		return out, errors.New("no text/plain part")
	}
	return out, nil
}

// after waits for a message to rcpt beyond the first n received.
func (m *mailServer) after(t *testing.T, rcpt string, n int) sentMail {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if msgs := m.to(rcpt); len(msgs) > n {
			return readMail(t, msgs[n].Raw)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new e-mail to %s within 10s (%d before)", rcpt, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// otpIn is the six-digit code of a code message of appName.
func otpIn(t *testing.T, m sentMail, appName string) string {
	t.Helper()
	if m.Subject != "Your code for "+appName {
		t.Fatalf("subject %q, want the code message of %s:\n%s", m.Subject, appName, m.Text)
	}
	found := mailedOTP.FindStringSubmatch(m.Text)
	if found == nil {
		t.Fatalf("no six-digit code in:\n%s", m.Text)
	}
	if m.HTML != "" && !strings.Contains(m.HTML, found[1]) {
		t.Fatalf("the HTML part lacks the code %s", found[1])
	}
	return found[1]
}

// linkIn is the magic link (prefix + a 256-bit base64url token) of a link
// message.
func linkIn(t *testing.T, m sentMail, prefix string) string {
	t.Helper()
	found := linkPattern(prefix).FindString(m.Text)
	if len(found) != len(prefix)+43 { // 256 bits
		t.Fatalf("no link %s… with a 43-character token in %q:\n%s", prefix, m.Subject, m.Text)
	}
	if m.HTML != "" && !strings.Contains(m.HTML, `href="`+found+`"`) {
		t.Fatalf("the HTML part has no <a href> to %s:\n%s", found, m.HTML)
	}
	return found
}

// linkPattern matches a magic link: prefix and a base64url token.
func linkPattern(prefix string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(prefix) + `[A-Za-z0-9_-]+`)
}

// --- the embedded API, as an application's backend calls it (no Origin)

func (s *server) embed(t *testing.T, path string, body map[string]any, headers ...string) *response {
	t.Helper()
	return s.as(t).do(http.MethodPost, embeddedAuth+path, body, headers...)
}

// expectSignInError checks the sign-in API's error shape: error and
// error_description, nothing of the API envelope.
func expectSignInError(t *testing.T, r *response, status int, code string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	m := r.JSON(t)
	if m["error"] != code {
		t.Fatalf("error %v, want %q: %s", m["error"], code, r.Body)
	}
	if d, _ := m["error_description"].(string); d == "" {
		t.Fatalf("no error_description: %s", r.Body)
	}
	if _, ok := m["message"]; ok {
		t.Fatalf("the API envelope instead of the sign-in error shape: %s", r.Body)
	}
	return m
}

// pkce is a fresh verifier and its S256 challenge.
func pkce() (verifier, challenge string) {
	v := oauth2.GenerateVerifier()
	return v, oauth2.S256ChallengeFromVerifier(v)
}

// embeddedOTP asks otp/send for a code to email (as the application's
// backend) and answers the code read from the message that arrives.
func embeddedOTP(t *testing.T, s *server, box *mailServer, clientID, appName, email string) string {
	t.Helper()
	n := len(box.to(email))
	if r := s.embed(t, "/otp/send", map[string]any{"clientId": clientID, "email": email}); r.Status != http.StatusOK || r.JSON(t)["success"] != true {
		t.Fatalf("otp/send: %s", describe(r))
	}
	return otpIn(t, box.after(t, email, n), appName)
}

// verifyOTP answers otp/verify's authorization code.
func verifyOTP(t *testing.T, s *server, clientID, email, code, challenge string) string {
	t.Helper()
	r := s.embed(t, "/otp/verify", map[string]any{"clientId": clientID, "email": email, "code": code, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
	if r.Status != http.StatusOK {
		t.Fatalf("otp/verify: %s", describe(r))
	}
	m := r.JSON(t)
	if c, _ := m["code"].(string); c == "" || m["expiresIn"] != 600.0 {
		t.Fatalf("otp/verify answer: %s", r.Body)
	}
	if r.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("otp/verify's code without Cache-Control: no-store: %v", r.Header)
	}
	return m["code"].(string)
}

// exchangeCode is the application backend's code/exchange.
func exchangeCode(t *testing.T, s *server, clientID, secret, code, verifier string) *response {
	t.Helper()
	return s.embed(t, "/code/exchange", map[string]any{"code": code, "client_id": clientID, "client_secret": secret, "code_verifier": verifier})
}

// idClaims is what the tests read of an ID token.
type idClaims struct {
	Sub   string   `json:"sub"`
	Email string   `json:"email"`
	Nonce string   `json:"nonce"`
	AMR   []string `json:"amr"`
}

// verifyIDToken checks raw with coreos/go-oidc against the server's
// discovery and keys, for clientID, and answers its claims.
func verifyIDToken(t *testing.T, s *server, clientID, raw string) idClaims {
	t.Helper()
	ctx := context.Background()
	provider, err := oidc.NewProvider(ctx, s.URL)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	tok, err := provider.Verifier(&oidc.Config{ClientID: clientID}).Verify(ctx, raw)
	if err != nil {
		t.Fatalf("ID token: %v", err)
	}
	var c idClaims
	if err := tok.Claims(&c); err != nil {
		t.Fatal(err)
	}
	if c.Sub != tok.Subject {
		t.Fatalf("claims sub %q, token subject %q", c.Sub, tok.Subject)
	}
	return c
}

// codeExchanged checks a token answer of code/exchange and verifies its ID
// token: answers the access token and the claims.
func codeExchanged(t *testing.T, s *server, clientID string, r *response) (string, idClaims) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("code/exchange: %s", describe(r))
	}
	m := r.JSON(t)
	access, _ := m["access_token"].(string)
	idToken, _ := m["id_token"].(string)
	if refresh, _ := m["refresh_token"].(string); access == "" || idToken == "" || refresh == "" || !strings.EqualFold(fmt.Sprint(m["token_type"]), "bearer") {
		t.Fatalf("code/exchange answer: %s", r.Body)
	}
	return access, verifyIDToken(t, s, clientID, idToken)
}

// --- the hosted page, with a cookie jar

// hostedBrowser is a cookie jar that follows the server's redirects and
// stops at the application's.
type hostedBrowser struct {
	t        *testing.T
	s        *server
	c        *http.Client
	redirect string
}

func newHostedBrowser(t *testing.T, s *server, redirect string) *hostedBrowser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &hostedBrowser{t: t, s: s, redirect: redirect}
	b.c = &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), redirect) || len(via) > 10 {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	return b
}

func (b *hostedBrowser) send(req *http.Request) *response {
	b.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: body}
}

func (b *hostedBrowser) get(u string) *response {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.send(req)
}

// submit posts the page's form whose action is action (and, when method is
// given, whose hidden method field is method), with its hidden fields and
// these values, and follows the answer.
func (b *hostedBrowser) submit(page *response, action, method string, values url.Values) *response {
	b.t.Helper()
	var fields url.Values
	for _, f := range pageFormTag.FindAllStringSubmatch(string(page.Body), -1) {
		if html.UnescapeString(f[1]) != action {
			continue
		}
		found := url.Values{}
		for _, h := range hiddenField.FindAllStringSubmatch(f[2], -1) {
			found.Add(html.UnescapeString(h[1]), html.UnescapeString(h[2]))
		}
		if method == "" || found.Get("method") == method {
			fields = found
			break
		}
	}
	if fields == nil {
		b.t.Fatalf("no form %s (method %q) on the page (%d):\n%s", action, method, page.Status, page.Body)
	}
	for k, v := range values {
		fields[k] = v
	}
	req, err := http.NewRequest(http.MethodPost, b.s.URL+action, strings.NewReader(fields.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.send(req)
}

// landed checks that r sends the browser to the application's redirect
// URI and answers the query it carries.
func (b *hostedBrowser) landed(r *response) url.Values {
	b.t.Helper()
	loc := r.Header.Get("Location")
	if r.Status != http.StatusSeeOther && r.Status != http.StatusFound || !strings.HasPrefix(loc, b.redirect) {
		b.t.Fatalf("want a redirect to %s: %d %s %s", b.redirect, r.Status, loc, r.Body)
	}
	u, err := url.Parse(loc)
	if err != nil {
		b.t.Fatal(err)
	}
	return u.Query()
}

func expectPage(t *testing.T, r *response, status int, says ...string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("page status %d, want %d:\n%s", r.Status, status, r.Body)
	}
	for _, s := range says {
		if !strings.Contains(string(r.Body), s) {
			t.Fatalf("the page does not say %q:\n%s", s, r.Body)
		}
	}
}

// hostedApp is an application and its OAuth configuration (x/oauth2).
type hostedApp struct {
	name, id, secret string
	conf             *oauth2.Config
}

func newHostedApp(t *testing.T, s *server, admin, name, redirect string, extra map[string]any) hostedApp {
	t.Helper()
	body := map[string]any{"name": name, "redirectUris": []string{redirect}}
	for k, v := range extra {
		body[k] = v
	}
	id, secret := s.registerApp(t, admin, body)
	return hostedApp{name: name, id: id, secret: secret, conf: &oauth2.Config{
		ClientID: id, ClientSecret: secret, RedirectURL: redirect, Scopes: []string{"openid", "email", "profile"},
		Endpoint: oauth2.Endpoint{AuthURL: s.URL + "/api/v1/oauth/authorize", TokenURL: s.URL + tokenPath},
	}}
}

// authorization is one authorization request in flight.
type authorization struct {
	state, verifier, nonce string
}

// authorize begins an authorization with PKCE, state and nonce and answers
// the hosted page it leads to (the e-mail step).
func (b *hostedBrowser) authorize(app hostedApp) (*response, authorization) {
	b.t.Helper()
	a := authorization{state: oauth2.GenerateVerifier(), verifier: oauth2.GenerateVerifier(), nonce: oauth2.GenerateVerifier()}
	page := b.get(app.conf.AuthCodeURL(a.state, oauth2.S256ChallengeOption(a.verifier), oauth2.SetAuthURLParam("nonce", a.nonce)))
	expectPage(b.t, page, http.StatusOK, `<label for="email">Email</label>`, app.name)
	return page, a
}

// finish checks the application's answer (state, iss, code) and trades the
// code with x/oauth2, verifying the ID token: answers the token and claims.
func (b *hostedBrowser) finish(app hostedApp, a authorization, r *response) (*oauth2.Token, idClaims) {
	b.t.Helper()
	q := b.landed(r)
	if q.Get("state") != a.state || q.Get("iss") != b.s.URL || q.Get("code") == "" {
		b.t.Fatalf("authorization response %v", q)
	}
	tok, err := app.conf.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(a.verifier))
	if err != nil {
		b.t.Fatalf("x/oauth2 exchange: %v", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" || tok.AccessToken == "" {
		b.t.Fatalf("token response without an ID token or access token: %+v", tok)
	}
	c := verifyIDToken(b.t, b.s, app.id, raw)
	if c.Nonce != a.nonce {
		b.t.Fatalf("ID token nonce %q, want %q", c.Nonce, a.nonce)
	}
	return tok, c
}

// hostedOTPSignIn signs email in on the hosted page of app (whose first
// method is password): e-mail, "Email me a code", the code from the mail.
func hostedOTPSignIn(t *testing.T, s *server, box *mailServer, app hostedApp, redirect, email string) (*oauth2.Token, idClaims) {
	t.Helper()
	b := newHostedBrowser(t, s, redirect)
	page, a := b.authorize(app)
	page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
	expectPage(t, page, http.StatusOK, `<label for="password">Password</label>`, "Email me a code", "Email me a link")
	n := len(box.to(email))
	page = b.submit(page, "/signin/method", "otp", nil)
	expectPage(t, page, http.StatusOK, `<label for="code">Code</label>`, "Check your email")
	code := otpIn(t, box.after(t, email, n), app.name)
	return b.finish(app, a, b.submit(page, "/signin/otp", "", url.Values{"code": {code}}))
}

// otherCode is a six-digit code that is not code.
func otherCode(code string, i int) string {
	n, _ := strconv.Atoi(code)
	return fmt.Sprintf("%06d", (n+1+i)%1_000_000)
}

func TestPasswordless(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env()...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		notes := newHostedApp(t, s, admin, "Acme Notes", redirect, map[string]any{"signInMethods": []string{"password", "otp", "magic-link"}})
		open := newHostedApp(t, s, admin, "Acme Open", redirect, map[string]any{"signInMethods": []string{"otp", "magic-link"}, "allowSignUp": true})
		person := func(email, password string) string {
			body := map[string]any{"email": email, "name": "Ada Lovelace"}
			if password != "" {
				body["password"] = password
			}
			r := s.do(http.MethodPost, inviteUsers, body, bearer(admin)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create person: %s", describe(r))
			}
			return r.JSON(t)["id"].(string)
		}
		checkEmail := func(t *testing.T, app hostedApp, email string) map[string]any {
			t.Helper()
			r := s.embed(t, "/check-email", map[string]any{"clientId": app.id, "email": email})
			if r.Status != http.StatusOK {
				t.Fatalf("check-email: %s", describe(r))
			}
			return r.JSON(t)
		}

		t.Run("hosted page: email me a code, over SMTP, with x/oauth2 and PKCE", func(t *testing.T) {
			const email = "lin@example.com"
			id := person(email, "")
			b := newHostedBrowser(t, s, redirect)
			page, a := b.authorize(notes)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			expectPage(t, page, http.StatusOK, `<label for="password">Password</label>`)
			if len(box.to(email)) != 0 {
				t.Fatal("a message was sent before the person asked for a code")
			}
			page = b.submit(page, "/signin/method", "otp", nil)
			expectPage(t, page, http.StatusOK, `<label for="code">Code</label>`, email)
			code := otpIn(t, box.after(t, email, 0), notes.name)
			// A wrong code: the same page, with the refusal; the right one
			// still works.
			wrong := b.submit(page, "/signin/otp", "", url.Values{"code": {otherCode(code, 0)}})
			expectPage(t, wrong, http.StatusBadRequest, "The code is not right", `aria-invalid="true"`)
			tok, c := b.finish(notes, a, b.submit(wrong, "/signin/otp", "", url.Values{"code": {code}}))
			if c.Sub != id || c.Email != email || !slices.Contains(c.AMR, "otp") {
				t.Fatalf("ID token claims %+v, want sub %s, email %s, amr with otp", c, id, email)
			}
			// The person now has the otp identity: check-email offers the
			// e-mailed methods, not a password they do not have.
			if m := checkEmail(t, notes, email); m["exists"] != true || !slices.Equal(strs(m["methods"]), []string{"otp", "magic-link"}) {
				t.Fatalf("check-email after the sign-in: %v", m)
			}
			if u := userByEmail(t, s, admin, email); u["emailVerified"] != true || u["status"] != "active" {
				t.Fatalf("the person after a code proved the address: %v", u)
			}
			// The access token speaks for the person.
			in := s.introspect(t, tok.AccessToken, notes.id, notes.secret)
			if in["active"] != true || in["sub"] != id {
				t.Fatalf("introspection of the person's token: %v", in)
			}
		})

		t.Run("hosted page: a magic link", func(t *testing.T) {
			const email = "mae@example.com"
			id := person(email, "")
			b := newHostedBrowser(t, s, redirect)
			page, a := b.authorize(notes)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			page = b.submit(page, "/signin/method", "magic-link", nil)
			expectPage(t, page, http.StatusOK, "Open it on this or another device")
			m := box.after(t, email, 0)
			if m.Subject != "Sign in to "+notes.name {
				t.Fatalf("link message subject %q", m.Subject)
			}
			link := linkIn(t, m, s.URL+"/signin/magic-link?token=")
			if r := follow(t, link); r.Status != http.StatusOK { // a mail scanner's GET spends nothing
				t.Fatalf("scanner GET: %s", describe(r))
			}
			confirm := b.get(link)
			expectPage(t, confirm, http.StatusOK, "Sign in as <strong>"+email+"</strong>")
			_, c := b.finish(notes, a, b.submit(confirm, "/signin/magic-link", "", nil))
			if c.Sub != id {
				t.Fatalf("ID token sub %q, want %q", c.Sub, id)
			}
			expectPage(t, b.get(link), http.StatusBadRequest, "expired")
		})

		t.Run("sign-up by code when the application allows it", func(t *testing.T) {
			const email = "newcomer@example.com"
			if usersWithEmail(t, s, admin, email) != 0 {
				t.Fatal("the newcomer exists already")
			}
			if m := checkEmail(t, open, email); m["exists"] != false || !slices.Equal(strs(m["methods"]), []string{"otp", "magic-link"}) {
				t.Fatalf("check-email of an unknown address in a sign-up application: %v", m)
			}
			b := newHostedBrowser(t, s, redirect)
			page, a := b.authorize(open)
			// The application's first method is the code: the e-mail step sends it.
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			expectPage(t, page, http.StatusOK, `<label for="code">Code</label>`)
			code := otpIn(t, box.after(t, email, 0), open.name)
			_, c := b.finish(open, a, b.submit(page, "/signin/otp", "", url.Values{"code": {code}}))
			u := userByEmail(t, s, admin, email)
			if u["id"] != c.Sub || u["emailVerified"] != true || u["status"] != "active" {
				t.Fatalf("the signed-up person %v, ID token sub %s", u, c.Sub)
			}
			if m := checkEmail(t, open, email); m["exists"] != true {
				t.Fatalf("check-email after sign-up: %v", m)
			}
			// Embedded sign-up too: an unknown address gets a code and becomes a person.
			const other = "second-newcomer@example.com"
			verifier, challenge := pkce()
			code = verifyOTP(t, s, open.id, other, embeddedOTP(t, s, box, open.id, open.name, other), challenge)
			_, c = codeExchanged(t, s, open.id, exchangeCode(t, s, open.id, open.secret, code, verifier))
			if u := userByEmail(t, s, admin, other); u["id"] != c.Sub {
				t.Fatalf("embedded sign-up: person %v, sub %s", u, c.Sub)
			}
		})

		t.Run("no sign-up when the application does not allow it", func(t *testing.T) {
			const stranger = "stranger@example.com"
			if m := checkEmail(t, notes, stranger); m["exists"] != false || len(strs(m["methods"])) != 0 {
				t.Fatalf("check-email of an unknown address without sign-up: %v", m)
			}
			expectSignInError(t, s.embed(t, "/otp/send", map[string]any{"clientId": notes.id, "email": stranger}), http.StatusNotFound, "user_not_found")
			_, challenge := pkce()
			expectSignInError(t, s.embed(t, "/magic-link/send", map[string]any{"clientId": notes.id, "email": stranger, "redirectUri": redirect,
				"codeChallenge": challenge, "codeChallengeMethod": "S256"}), http.StatusNotFound, "user_not_found")
			expectSignInError(t, s.embed(t, "/otp/verify", map[string]any{"clientId": notes.id, "email": stranger, "code": "123456",
				"codeChallenge": challenge, "codeChallengeMethod": "S256"}), http.StatusBadRequest, "expired_token")
			// The hosted page tells nothing: the same page as for a person,
			// and no message.
			b := newHostedBrowser(t, s, redirect)
			page, _ := b.authorize(notes)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {stranger}})
			expectPage(t, b.submit(page, "/signin/method", "otp", nil), http.StatusOK, `<label for="code">Code</label>`, "If <strong>"+stranger+"</strong> can sign in with a code")
			// A message sent after those requests arrives, then none to the stranger.
			const known = "barrier@example.com"
			person(known, "")
			embeddedOTP(t, s, box, notes.id, notes.name, known)
			time.Sleep(300 * time.Millisecond)
			if n := len(box.to(stranger)); n != 0 {
				t.Fatalf("%d messages to an address without an account", n)
			}
			if n := usersWithEmail(t, s, admin, stranger); n != 0 {
				t.Fatalf("the stranger became a person: %v", n)
			}
		})

		t.Run("409 account_exists for a person who signs in with a password", func(t *testing.T) {
			const email = "pat@example.com"
			person(email, plPassword)
			if m := checkEmail(t, notes, email); m["exists"] != true || !slices.Equal(strs(m["methods"]), []string{"password"}) || m["method"] != "password" {
				t.Fatalf("check-email of a password person: %v", m)
			}
			_, challenge := pkce()
			for _, call := range []struct {
				path string
				body map[string]any
			}{
				{"/otp/send", map[string]any{"clientId": notes.id, "email": email}},
				{"/magic-link/send", map[string]any{"clientId": notes.id, "email": email, "redirectUri": redirect, "codeChallenge": challenge, "codeChallengeMethod": "S256"}},
				{"/otp/send", map[string]any{"clientId": open.id, "email": email}}, // sign-up allowed changes nothing: the account exists
			} {
				m := expectSignInError(t, s.embed(t, call.path, call.body), http.StatusConflict, "account_exists")
				exactKeys(t, m, "error", "error_description", "existingIdentities", "linkingRequired", "linkingEndpoint", "suggestion")
				if !slices.Equal(strs(m["existingIdentities"]), []string{"password"}) || m["linkingRequired"] != true ||
					m["linkingEndpoint"] != linkingEndpoint || m["suggestion"] == "" {
					t.Fatalf("%s: account_exists body %v", call.path, m)
				}
			}
			// The hosted page sends a notice instead of a code.
			b := newHostedBrowser(t, s, redirect)
			page, _ := b.authorize(notes)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			expectPage(t, b.submit(page, "/signin/method", "otp", nil), http.StatusOK, `<label for="code">Code</label>`)
			m := box.after(t, email, 0)
			if m.Subject != "Sign-in to "+notes.name || !strings.Contains(m.Text, "password") || mailedOTP.MatchString(m.Text) {
				t.Fatalf("want the other-method notice, no code: %q\n%s", m.Subject, m.Text)
			}
			if n := len(box.to(email)); n != 1 {
				t.Fatalf("%d messages to the password person, want the one notice", n)
			}
			// Their password still signs them in through the embedded API.
			verifier, challenge := pkce()
			r := s.embed(t, "/password", map[string]any{"clientId": notes.id, "email": email, "password": plPassword, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
			if r.Status != http.StatusOK {
				t.Fatalf("embedded password: %s", describe(r))
			}
			_, c := codeExchanged(t, s, notes.id, exchangeCode(t, s, notes.id, notes.secret, r.JSON(t)["code"].(string), verifier))
			if !slices.Contains(c.AMR, "pwd") {
				t.Fatalf("amr %v after a password sign-in", c.AMR)
			}
		})

		t.Run("a replayed code is refused; so is a replayed authorization code and a wrong verifier", func(t *testing.T) {
			const email = "ria@example.com"
			id := person(email, "")
			otp := embeddedOTP(t, s, box, notes.id, notes.name, email)
			verifier, challenge := pkce()
			code := verifyOTP(t, s, notes.id, email, otp, challenge)
			_, again := pkce()
			expectSignInError(t, s.embed(t, "/otp/verify", map[string]any{"clientId": notes.id, "email": email, "code": otp,
				"codeChallenge": again, "codeChallengeMethod": "S256"}), http.StatusBadRequest, "expired_token")
			if _, c := codeExchanged(t, s, notes.id, exchangeCode(t, s, notes.id, notes.secret, code, verifier)); c.Sub != id || !slices.Contains(c.AMR, "otp") {
				t.Fatalf("ID token %+v, want sub %s with amr otp", c, id)
			}
			expectOAuthError(t, exchangeCode(t, s, notes.id, notes.secret, code, verifier), http.StatusBadRequest, "invalid_grant")
			// Another sign-in's code with another verifier.
			otp = embeddedOTP(t, s, box, notes.id, notes.name, email)
			_, challenge = pkce()
			code = verifyOTP(t, s, notes.id, email, otp, challenge)
			wrong, _ := pkce()
			expectOAuthError(t, exchangeCode(t, s, notes.id, notes.secret, code, wrong), http.StatusBadRequest, "invalid_grant")
			// A third without a verifier; and a wrong secret.
			otp = embeddedOTP(t, s, box, notes.id, notes.name, email)
			verifier, challenge = pkce()
			code = verifyOTP(t, s, notes.id, email, otp, challenge)
			expectOAuthError(t, exchangeCode(t, s, notes.id, notes.secret, code, ""), http.StatusBadRequest, "invalid_grant")
			expectOAuthError(t, exchangeCode(t, s, notes.id, "not-the-secret", code, verifier), http.StatusUnauthorized, "invalid_client")
		})

		t.Run("a code signs in only where it was sent: its application, the embedded API or its hosted flow", func(t *testing.T) {
			const email = "bo@example.com"
			person(email, "")
			_, challenge := pkce()
			verify := func(app hostedApp, code string) *response {
				return s.embed(t, "/otp/verify", map[string]any{"clientId": app.id, "email": email, "code": code, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
			}
			embedded := embeddedOTP(t, s, box, notes.id, notes.name, email)
			expectSignInError(t, verify(open, embedded), http.StatusBadRequest, "expired_token") // no code was sent through Acme Open
			b := newHostedBrowser(t, s, redirect)
			page, a := b.authorize(notes)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			page = b.submit(page, "/signin/method", "otp", nil)
			hosted := otpIn(t, box.after(t, email, 1), notes.name)
			if hosted == embedded {
				t.Skip("the two codes are equal by chance")
			}
			expectSignInError(t, verify(notes, hosted), http.StatusBadRequest, "invalid_code")
			page = b.submit(page, "/signin/otp", "", url.Values{"code": {embedded}})
			expectPage(t, page, http.StatusBadRequest, "The code is not right")
			b.finish(notes, a, b.submit(page, "/signin/otp", "", url.Values{"code": {hosted}}))
			verifyOTP(t, s, notes.id, email, embedded, challenge)
		})

		t.Run("a replayed magic link is refused", func(t *testing.T) {
			const email = "lou@example.com"
			id := person(email, "")
			verifier, challenge := pkce()
			r := s.embed(t, "/magic-link/send", map[string]any{"clientId": notes.id, "email": email, "redirectUri": redirect, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
			if r.Status != http.StatusOK || r.JSON(t)["success"] != true {
				t.Fatalf("magic-link/send: %s", describe(r))
			}
			m := box.after(t, email, 0)
			if m.Subject != "Sign in to "+notes.name {
				t.Fatalf("link message subject %q", m.Subject)
			}
			link := linkIn(t, m, s.URL+embeddedLinkURL)
			token := strings.TrimPrefix(link, s.URL+embeddedLinkURL)
			// Scanners: HEAD and GET spend nothing.
			req, _ := http.NewRequest(http.MethodHead, link, nil)
			if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("HEAD of the link: %v %v", resp, err)
			}
			if r := follow(t, link); r.Status != http.StatusOK {
				t.Fatalf("scanner GET: %s", describe(r))
			}
			b := newHostedBrowser(t, s, redirect)
			confirm := b.get(link)
			expectPage(t, confirm, http.StatusOK, "Sign in as <strong>"+email+"</strong>", notes.name)
			landed := b.submit(confirm, "/signin/magic-link", "", nil)
			q := b.landed(landed)
			if q.Get("iss") != s.URL || q.Get("code") == "" {
				t.Fatalf("the application's redirect: %v", q)
			}
			if _, c := codeExchanged(t, s, notes.id, exchangeCode(t, s, notes.id, notes.secret, q.Get("code"), verifier)); c.Sub != id {
				t.Fatalf("sub %q, want %q", c.Sub, id)
			}
			// Only the application's registered redirect URIs.
			for _, bad := range []string{"https://evil.example/callback", redirect + "/other"} {
				expectSignInError(t, s.embed(t, "/magic-link/send", map[string]any{"clientId": notes.id, "email": email, "redirectUri": bad,
					"codeChallenge": challenge, "codeChallengeMethod": "S256"}), http.StatusBadRequest, "invalid_request")
			}
			// The same click again, the link again, the link in another browser.
			expectPage(t, b.submit(confirm, "/signin/magic-link", "", nil), http.StatusBadRequest, "expired")
			expectPage(t, b.get(link), http.StatusBadRequest, "expired")
			expectPage(t, newHostedBrowser(t, s, redirect).get(link), http.StatusBadRequest, "expired")
			time.Sleep(100 * time.Millisecond) // the log pipe lags a little
			if strings.Contains(s.logs.String(), token) {
				t.Fatal("the server log holds the magic link's token")
			}
		})

		t.Run("too many wrong codes: the right one is refused after five", func(t *testing.T) {
			const email = "tess@example.com"
			id := person(email, "")
			otp := embeddedOTP(t, s, box, notes.id, notes.name, email)
			_, challenge := pkce()
			verify := func(code string) *response {
				return s.embed(t, "/otp/verify", map[string]any{"clientId": notes.id, "email": email, "code": code, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
			}
			for i := range 5 {
				m := expectSignInError(t, verify(otherCode(otp, i)), http.StatusBadRequest, "invalid_code")
				if too := strings.Contains(m["error_description"].(string), "Too many"); too != (i == 4) {
					t.Fatalf("wrong code %d: %v", i+1, m)
				}
			}
			m := expectSignInError(t, verify(otp), http.StatusBadRequest, "invalid_code")
			if !strings.Contains(m["error_description"].(string), "Too many wrong codes") {
				t.Fatalf("the right code after five wrong ones: %v", m)
			}
			// A new code works.
			verifier, challenge := pkce()
			code := verifyOTP(t, s, notes.id, email, embeddedOTP(t, s, box, notes.id, notes.name, email), challenge)
			if _, c := codeExchanged(t, s, notes.id, exchangeCode(t, s, notes.id, notes.secret, code, verifier)); c.Sub != id {
				t.Fatalf("sub %q, want %q", c.Sub, id)
			}
		})

		t.Run("hosted page: five wrong codes, the right one refused, then a new code", func(t *testing.T) {
			const email = "hal@example.com"
			id := person(email, "")
			b := newHostedBrowser(t, s, redirect)
			page, a := b.authorize(notes)
			page = b.submit(page, "/signin/email", "", url.Values{"email": {email}})
			page = b.submit(page, "/signin/method", "otp", nil)
			code := otpIn(t, box.after(t, email, 0), notes.name)
			for i := range 5 {
				says := "The code is not right"
				if i == 4 {
					says = "Too many wrong codes"
				}
				page = b.submit(page, "/signin/otp", "", url.Values{"code": {otherCode(code, i)}})
				expectPage(t, page, http.StatusBadRequest, says)
			}
			page = b.submit(page, "/signin/otp", "", url.Values{"code": {code}})
			expectPage(t, page, http.StatusBadRequest, "Too many wrong codes. Ask for a new code.")
			page = b.submit(page, "/signin/method", "otp", nil) // "Send a new code"
			expectPage(t, page, http.StatusOK, `<label for="code">Code</label>`)
			fresh := otpIn(t, box.after(t, email, 1), notes.name)
			if _, c := b.finish(notes, a, b.submit(page, "/signin/otp", "", url.Values{"code": {fresh}})); c.Sub != id {
				t.Fatalf("sub %q, want %q", c.Sub, id)
			}
		})

		t.Run("TOTP enrolment with a person's token", func(t *testing.T) {
			const email = "tom@example.com"
			person(email, "")
			tok, _ := hostedOTPSignIn(t, s, box, notes, redirect, email)
			user := bearer(tok.AccessToken)
			expectError(t, s.as(t).do(http.MethodPost, totpPath+"/enroll", nil, bearer(s.adminToken())...), http.StatusForbidden, "user_token_required")
			expectError(t, s.as(t).do(http.MethodPost, totpPath+"/confirm", map[string]any{"code": "123456"}, user...), http.StatusNotFound, "mfa_not_enrolled")
			enrol := func() string {
				r := s.as(t).do(http.MethodPost, totpPath+"/enroll", nil, user...)
				if r.Status != http.StatusOK {
					t.Fatalf("enroll: %s", describe(r))
				}
				m := r.JSON(t)
				secret, _ := m["secret"].(string)
				uri, _ := m["otpauthUri"].(string)
				qr, _ := m["qrCode"].(string)
				if secret == "" || !strings.HasPrefix(uri, "otpauth://totp/") || !strings.Contains(uri, "secret="+secret) || !strings.HasPrefix(qr, "data:image/png;base64,") {
					t.Fatalf("enroll answer: %s", r.Body)
				}
				return secret
			}
			confirm := func(secret string) []string {
				code, err := totp.GenerateCode(secret, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				r := s.as(t).do(http.MethodPost, totpPath+"/confirm", map[string]any{"code": code}, user...)
				if r.Status != http.StatusOK || r.JSON(t)["enabled"] != true {
					t.Fatalf("confirm: %s", describe(r))
				}
				codes := strs(r.JSON(t)["recoveryCodes"])
				if len(codes) != 10 {
					t.Fatalf("recovery codes %v", codes)
				}
				// The same code again (its time step is taken) does not turn it off.
				expectError(t, s.as(t).do(http.MethodDelete, totpPath, map[string]any{"code": code}, user...), http.StatusBadRequest, "invalid_code")
				return codes
			}
			secret := enrol()
			now, _ := totp.GenerateCode(secret, time.Now())
			expectError(t, s.as(t).do(http.MethodPost, totpPath+"/confirm", map[string]any{"code": otherCode(now, 0)}, user...), http.StatusBadRequest, "invalid_code")
			if m := checkEmail(t, notes, email); m["mfaEnabled"] != false {
				t.Fatalf("check-email with a pending enrolment: %v", m)
			}
			confirm(secret)
			if m := checkEmail(t, notes, email); m["mfaEnabled"] != true {
				t.Fatalf("check-email with TOTP on: %v", m)
			}
			expectError(t, s.as(t).do(http.MethodPost, totpPath+"/enroll", nil, user...), http.StatusConflict, "mfa_already_enabled")
			// The next time step's code turns it off.
			next, err := totp.GenerateCode(secret, time.Now().Add(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if r := s.as(t).do(http.MethodDelete, totpPath, map[string]any{"code": next}, user...); r.Status != http.StatusNoContent {
				t.Fatalf("disable with the next code: %s", describe(r))
			}
			if m := checkEmail(t, notes, email); m["mfaEnabled"] != false {
				t.Fatalf("check-email with TOTP off: %v", m)
			}
			expectError(t, s.as(t).do(http.MethodDelete, totpPath, map[string]any{"code": next}, user...), http.StatusNotFound, "mfa_not_enabled")
			// Again, turned off with a recovery code, which works once.
			recovery := confirm(enrol())
			if r := s.as(t).do(http.MethodDelete, totpPath, map[string]any{"code": recovery[3]}, user...); r.Status != http.StatusNoContent {
				t.Fatalf("disable with a recovery code: %s", describe(r))
			}
			if m := checkEmail(t, notes, email); m["mfaEnabled"] != false {
				t.Fatalf("check-email with TOTP off: %v", m)
			}
		})
	})
}

// Two codes for one new address, in two applications that let people sign
// up, used at the same moment (two tabs, two applications): one person is
// made, and neither request fails with a server error. Each answer is a
// code for that person or a clean refusal.
func TestPasswordlessConcurrentSignUp(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env()...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:read")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		apps := []hostedApp{
			newHostedApp(t, s, admin, "Acme One", redirect, map[string]any{"signInMethods": []string{"otp"}, "allowSignUp": true}),
			newHostedApp(t, s, admin, "Acme Two", redirect, map[string]any{"signInMethods": []string{"otp"}, "allowSignUp": true}),
		}
		for round := range 4 {
			email := fmt.Sprintf("twice-%d@example.com", round)
			codes := make([]string, len(apps))
			for i, app := range apps {
				codes[i] = embeddedOTP(t, s, box, app.id, app.name, email)
			}
			verifier, challenge := pkce()
			answers := make([]*response, len(apps))
			errs := make([]error, len(apps))
			var wg sync.WaitGroup
			for i, app := range apps {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body, _ := json.Marshal(map[string]any{"clientId": app.id, "email": email, "code": codes[i], "codeChallenge": challenge, "codeChallengeMethod": "S256"})
					answers[i], errs[i] = send(http.MethodPost, s.URL+embeddedAuth+"/otp/verify", bytes.NewReader(body), "Content-Type", "application/json")
				}()
			}
			wg.Wait()
			var subs []string
			for i, r := range answers {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				switch {
				case r.Status == http.StatusOK:
					_, c := codeExchanged(t, s, apps[i].id, exchangeCode(t, s, apps[i].id, apps[i].secret, r.JSON(t)["code"].(string), verifier))
					subs = append(subs, c.Sub)
				case r.Status >= 500:
					t.Errorf("round %d, %s: two sign-ups of one new address at once: %s", round, apps[i].name, describe(r))
				}
			}
			if n := usersWithEmail(t, s, admin, email); n != 1 {
				t.Fatalf("round %d: %v people with %s", round, n, email)
			}
			id := userByEmail(t, s, admin, email)["id"]
			for _, sub := range subs {
				if sub != id {
					t.Fatalf("round %d: signed in as %s, the person is %v", round, sub, id)
				}
			}
		}
	})
}

// An e-mailed code or link past its lifetime is refused, and a fresh one
// works. Waiting ten minutes is stood in for by moving the challenge's
// expiry into the past in the server's database.
func TestExpiredCodes(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env()...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		app := newHostedApp(t, s, admin, "Acme Clock", redirect, map[string]any{"signInMethods": []string{"otp", "magic-link"}})
		const email = "kim@example.com"
		if r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": "Kim"}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		db, _, err := persistence.Open(context.Background(), s.DB)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		expire := func(t *testing.T) {
			t.Helper()
			res, err := db.Exec(db.Rebind(`UPDATE email_challenges SET expires_at = ? WHERE email_key = ? AND used_at IS NULL`), time.Now().Add(-time.Second).UTC(), email)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				t.Fatalf("%d pending challenges expired, want 1", n)
			}
		}

		// A code: expired_token, also with the right code; then a new one.
		_, challenge := pkce()
		code := embeddedOTP(t, s, box, app.id, app.name, email)
		expire(t)
		expectSignInError(t, s.embed(t, "/otp/verify", map[string]any{"clientId": app.id, "email": email, "code": code,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"}), http.StatusBadRequest, "expired_token")
		verifier, challenge := pkce()
		code = embeddedOTP(t, s, box, app.id, app.name, email)
		codeExchanged(t, s, app.id, exchangeCode(t, s, app.id, app.secret, verifyOTP(t, s, app.id, email, code, challenge), verifier))

		// A link: the page says it expired, and spends nothing.
		sent := len(box.to(email))
		if r := s.embed(t, "/magic-link/send", map[string]any{"clientId": app.id, "email": email, "redirectUri": redirect,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"}); r.Status != http.StatusOK {
			t.Fatalf("magic-link/send: %s", describe(r))
		}
		link := linkIn(t, box.after(t, email, sent), s.URL+embeddedLinkURL)
		expire(t)
		expectPage(t, newHostedBrowser(t, s, redirect).get(link), http.StatusBadRequest, "expired")
	})
}
