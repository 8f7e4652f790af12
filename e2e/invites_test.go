package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/http"
	"net/mail"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Invites over real HTTP with real e-mail: identityd sends through SMTP to
// a server inside the test (go-smtp on 127.0.0.1), the message is parsed
// with the standard library, and its link is followed, checked and
// accepted, on each dialect.

const (
	invitePath     = "/api/v1/m2m/users/invite"
	inviteUsers    = "/api/v1/m2m/users"
	inviteCallback = "https://app.example/callback"
	inviteTenantCB = "https://app.example/cb?tenant=7"
	inviteAccept   = "https://app.example/invites/accept?lang=en"
	inviteMailFrom = "Acme <noreply@acme.example>"
	inviteFromAddr = "noreply@acme.example"
	inviteTokenLen = 43
)

var inviteTokenShape = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// --- the SMTP server inside the test

// mailServer is an SMTP server on loopback that keeps what it receives. With
// a user it requires AUTH PLAIN with these credentials before MAIL; it can
// refuse the next attempts with a temporary error at RCPT or at DATA.
type mailServer struct {
	URL        string // IDENTITYD_SMTP_URL for it
	user, pass string

	mu         sync.Mutex
	msgs       []*mailMsg
	rcpts      []time.Time // every RCPT TO, refused or not: one per delivery attempt
	refuseRcpt int         // RCPTs still to refuse with 451
	refuseData int         // DATAs still to refuse with 451
	badAuth    int         // AUTH attempts with wrong credentials
}

// mailMsg is one message as received.
type mailMsg struct {
	From     string   // envelope sender
	To       []string // envelope recipients
	AuthUser string   // who authenticated ("" for none)
	Raw      []byte
	At       time.Time
}

var errTryLater = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Temporarily unavailable, try again later"}

type mailSession struct {
	box      *mailServer
	authUser string
	from     string
	to       []string
}

func (s *mailSession) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *mailSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if s.box.user == "" || user != s.box.user || pass != s.box.pass {
			s.box.mu.Lock()
			s.box.badAuth++
			s.box.mu.Unlock()
			return smtp.ErrAuthFailed
		}
		s.authUser = user
		return nil
	}), nil
}

func (s *mailSession) Mail(from string, _ *smtp.MailOptions) error {
	if s.box.user != "" && s.authUser == "" {
		return smtp.ErrAuthRequired
	}
	s.from = from
	return nil
}

func (s *mailSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.box.mu.Lock()
	defer s.box.mu.Unlock()
	s.box.rcpts = append(s.box.rcpts, time.Now())
	if s.box.refuseRcpt > 0 {
		s.box.refuseRcpt--
		return errTryLater
	}
	s.to = append(s.to, to)
	return nil
}

func (s *mailSession) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.box.mu.Lock()
	defer s.box.mu.Unlock()
	if s.box.refuseData > 0 {
		s.box.refuseData--
		return errTryLater
	}
	s.box.msgs = append(s.box.msgs, &mailMsg{From: s.from, To: slices.Clone(s.to), AuthUser: s.authUser, Raw: raw, At: time.Now()})
	return nil
}

func (s *mailSession) Reset()        { s.from, s.to = "", nil }
func (s *mailSession) Logout() error { return nil }

// startMail runs an SMTP server on 127.0.0.1:0 until the test ends; with a
// user, it requires AUTH PLAIN (allowed without TLS: it is loopback).
func startMail(t *testing.T, user, pass string) *mailServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	box := &mailServer{user: user, pass: pass}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &mailSession{box: box}, nil }))
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = user != "" // AUTH is offered only when credentials are expected
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	srv.MaxMessageBytes = 1 << 20
	srv.ErrorLog = log.New(io.Discard, "", 0)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	box.URL = "smtp://" + l.Addr().String() + "?starttls=off"
	if user != "" {
		box.URL = "smtp://" + url.UserPassword(user, pass).String() + "@" + l.Addr().String() + "?starttls=off"
	}
	return box
}

// env is what identityd needs to send through this server.
func (m *mailServer) env(extra ...string) []string {
	return append([]string{"IDENTITYD_SMTP_URL=" + m.URL, "IDENTITYD_MAIL_FROM=" + inviteMailFrom}, extra...)
}

// waitFor waits for the message to rcpt and returns it.
func (m *mailServer) waitFor(t *testing.T, rcpt string, timeout time.Duration) *mailMsg {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if msgs := m.to(rcpt); len(msgs) > 0 {
			return msgs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no e-mail to %s within %s", rcpt, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// to lists the messages received for rcpt.
func (m *mailServer) to(rcpt string) []*mailMsg {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*mailMsg
	for _, msg := range m.msgs {
		if slices.ContainsFunc(msg.To, func(to string) bool { return strings.EqualFold(to, rcpt) }) {
			out = append(out, msg)
		}
	}
	return out
}

// --- reading a message

// inviteMail is a received invite, parsed.
type inviteMail struct {
	Header  mail.Header
	From    *mail.Address
	To      []*mail.Address
	Subject string
	Text    string
	HTML    string
	Link    string // {issuer}/invites/{token}
	Token   string
}

// parseInvite parses raw as the invite e-mail for issuer: a
// multipart/alternative message with a text/plain and a text/html part,
// both carrying the same link {issuer}/invites/{token}.
func parseInvite(t *testing.T, raw []byte, issuer string) inviteMail {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("not an RFC 5322 message: %v\n%s", err, raw)
	}
	out := inviteMail{Header: msg.Header}
	if out.From, err = mail.ParseAddress(msg.Header.Get("From")); err != nil {
		t.Fatalf("From %q: %v", msg.Header.Get("From"), err)
	}
	if out.To, err = msg.Header.AddressList("To"); err != nil {
		t.Fatalf("To %q: %v", msg.Header.Get("To"), err)
	}
	if out.Subject, err = new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject")); err != nil {
		t.Fatalf("Subject %q: %v", msg.Header.Get("Subject"), err)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/alternative" || params["boundary"] == "" {
		t.Fatalf("Content-Type %q, want multipart/alternative with a boundary (%v)\n%s", msg.Header.Get("Content-Type"), err, raw)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextRawPart() // raw: the transfer encoding is decoded below
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("multipart: %v\n%s", err, raw)
		}
		pt, pp, err := mime.ParseMediaType(p.Header.Get("Content-Type"))
		if err != nil {
			t.Fatalf("part Content-Type %q: %v", p.Header.Get("Content-Type"), err)
		}
		if cs := pp["charset"]; cs != "" && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "us-ascii") {
			t.Fatalf("part %s has charset %q", pt, cs)
		}
		var body io.Reader = p
		switch cte := strings.ToLower(p.Header.Get("Content-Transfer-Encoding")); cte {
		case "quoted-printable":
			body = quotedprintable.NewReader(p)
		case "base64":
			body = base64.NewDecoder(base64.StdEncoding, p)
		case "", "7bit", "8bit", "binary":
		default:
			t.Fatalf("part %s with Content-Transfer-Encoding %q", pt, cte)
		}
		b, err := io.ReadAll(body)
		if err != nil {
			t.Fatalf("part %s: %v", pt, err)
		}
		switch pt {
		case "text/plain":
			if out.Text != "" {
				t.Fatalf("two text/plain parts")
			}
			out.Text = string(b)
		case "text/html":
			if out.HTML != "" {
				t.Fatalf("two text/html parts")
			}
			out.HTML = string(b)
		default:
			t.Fatalf("unexpected part %s", pt)
		}
	}
	if out.Text == "" || out.HTML == "" {
		t.Fatalf("want a text/plain and a text/html part:\n%s", raw)
	}
	linkRE := regexp.MustCompile(regexp.QuoteMeta(issuer+"/invites/") + `[A-Za-z0-9_\-]+`)
	textLinks := linkRE.FindAllString(out.Text, -1)
	htmlLinks := linkRE.FindAllString(out.HTML, -1)
	if len(textLinks) == 0 || len(htmlLinks) == 0 {
		t.Fatalf("link %s/invites/… missing: text %q, html %q", issuer, out.Text, out.HTML)
	}
	out.Link = textLinks[0]
	for _, l := range slices.Concat(textLinks, htmlLinks) {
		if l != out.Link {
			t.Fatalf("the parts carry different links: %q and %q", out.Link, l)
		}
	}
	if !strings.Contains(out.HTML, `href="`+out.Link+`"`) {
		t.Fatalf("the HTML part has no <a href> to %s:\n%s", out.Link, out.HTML)
	}
	out.Token = strings.TrimPrefix(out.Link, issuer+"/invites/")
	if len(out.Token) != inviteTokenLen || !inviteTokenShape.MatchString(out.Token) {
		t.Fatalf("token %q is not %d base64url characters", out.Token, inviteTokenLen)
	}
	return out
}

// --- the API

// inviter is a service account allowed to invite, and its token.
type inviter struct {
	account
	tok string
}

// newInviter creates a service account with these scopes and the test's
// redirect URIs and returns it with a token holding all its scopes.
func newInviter(t *testing.T, s *server, admin, name string, scopes ...string) inviter {
	t.Helper()
	a := s.as(t).createAccount(admin, map[string]any{
		"name": name, "scopes": scopes, "redirectUris": []string{inviteCallback, inviteTenantCB},
	})
	return inviter{account: a, tok: s.as(t).token(a.ClientID, a.ClientSecret, "")}
}

func invite(t *testing.T, s *server, tok string, body any) *response {
	t.Helper()
	return s.as(t).do(http.MethodPost, invitePath, body, bearer(tok)...)
}

// mustInvite invites and checks the 201 answer.
func mustInvite(t *testing.T, s *server, tok string, body map[string]any, userExists bool, ttl time.Duration) map[string]any {
	t.Helper()
	before := time.Now()
	r := invite(t, s, tok, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("invite: want 201: %s", describe(r))
	}
	m := r.JSON(t)
	exactKeys(t, m, "invite_id", "email", "status", "user_exists", "expires_at")
	if id, _ := m["invite_id"].(string); id == "" {
		t.Fatalf("no invite_id: %s", r.Body)
	}
	if m["email"] != body["email"] || m["status"] != "sent" || m["user_exists"] != userExists {
		t.Fatalf("want email %v, status sent, user_exists %v: %s", body["email"], userExists, r.Body)
	}
	exp := isoZ(t, m["expires_at"])
	if exp.Before(before.Add(ttl).Add(-2*time.Second)) || exp.After(time.Now().Add(ttl).Add(2*time.Second)) {
		t.Fatalf("expires_at %s is not about %s from now", exp, ttl)
	}
	return m
}

func acceptInvite(t *testing.T, s *server, tok, token string) *response {
	t.Helper()
	return s.as(t).do(http.MethodPost, "/api/v1/m2m/invites/"+token+"/accept", nil, bearer(tok)...)
}

func inviteStatus(t *testing.T, s *server, token string) *response {
	t.Helper()
	return s.as(t).do(http.MethodGet, "/api/v1/invites/"+token, nil)
}

// noRedirect stops at the first answer: the application's page is not
// reachable from here.
var noRedirect = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       30 * time.Second,
}

// follow opens an e-mailed link as a browser would, without going on.
func follow(t *testing.T, link string) *response {
	t.Helper()
	resp, err := noRedirect.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// expectFollow checks the 303 to the accept page: base (with its own query
// kept) plus the invite's parameters.
func expectFollow(t *testing.T, r *response, base string, want url.Values) {
	t.Helper()
	if r.Status != http.StatusSeeOther {
		t.Fatalf("follow: want 303: %s", describe(r))
	}
	if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control %q, want no-store", cc)
	}
	if rp := r.Header.Get("Referrer-Policy"); rp != "no-referrer" {
		t.Fatalf("Referrer-Policy %q, want no-referrer", rp)
	}
	loc, err := url.Parse(r.Header.Get("Location"))
	if err != nil {
		t.Fatalf("Location %q: %v", r.Header.Get("Location"), err)
	}
	b, _ := url.Parse(base)
	if loc.Scheme != b.Scheme || loc.Host != b.Host || loc.Path != b.Path || loc.Fragment != "" {
		t.Fatalf("Location %s does not lead to %s", loc, base)
	}
	q := b.Query()
	for k, v := range want {
		q[k] = v
	}
	if got := loc.Query(); !reflect.DeepEqual(got, q) {
		t.Fatalf("Location query %v, want %v", got, q)
	}
}

// userByEmail reads the one user with this address (users:read).
func userByEmail(t *testing.T, s *server, tok, email string) map[string]any {
	t.Helper()
	m := mustOK(t, s.as(t).do(http.MethodGet, inviteUsers+"?email="+url.QueryEscape(email), nil, bearer(tok)...))
	users, _ := m["users"].([]any)
	if m["total"] != 1.0 || len(users) != 1 {
		t.Fatalf("want exactly one user %s: %v", email, m)
	}
	return users[0].(map[string]any)
}

func usersWithEmail(t *testing.T, s *server, tok, email string) float64 {
	t.Helper()
	m := mustOK(t, s.as(t).do(http.MethodGet, inviteUsers+"?email="+url.QueryEscape(email), nil, bearer(tok)...))
	n, _ := m["total"].(float64)
	return n
}

// jsonValue is v as JSON decodes it (numbers float64, objects maps).
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// tokens collects the invite tokens a test saw, to look for in the log.
type tokens struct {
	mu   sync.Mutex
	list []string
}

func (k *tokens) add(tok string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.list = append(k.list, tok)
}

// expectNoTokensLogged checks that no token is in the server's output and
// that every request line of a route with a token logs the template.
func expectNoTokensLogged(t *testing.T, s *server, toks ...string) {
	t.Helper()
	time.Sleep(100 * time.Millisecond) // the log pipe lags a little
	logs := s.logs.String()
	for _, tok := range toks {
		if strings.Contains(logs, tok) {
			t.Errorf("the server log holds invite token %s", tok)
		}
	}
	seen := 0
	for line := range strings.SplitSeq(logs, "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) != nil || l["msg"] != "request" {
			continue
		}
		if route, _ := l["route"].(string); strings.Contains(route, "{token}") {
			seen++
			if l["path"] != route {
				t.Errorf("request line of %s logs path %v, want the route template", route, l["path"])
			}
		}
	}
	if len(toks) > 0 && seen == 0 {
		t.Errorf("no request line of a token route in the log")
	}
}

// --- the scenarios

// The whole flow, with and without SMTP AUTH: invite a new address, read
// the real message, follow its link, read the status, accept once.
func TestInviteFlow(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		t.Parallel()
		for _, auth := range []bool{true, false} {
			name := "without-smtp-auth"
			if auth {
				name = "with-smtp-auth"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				user, pass := "", ""
				if auth {
					user, pass = "mailer@acme.example", "s3cret:with/odd chars"
				}
				box := startMail(t, user, pass)
				s := startLogged(t, dbURL, box.env()...)
				admin := s.adminToken()
				inv := newInviter(t, s, admin, "notes-app", "users:invite", "users:read")

				email := "ada." + strings.ToLower(randomString()[:8]) + "@example.com"
				metadata := map[string]any{"plan": "pro", "seats": 3, "tags": []any{"a", "b"}, "nested": map[string]any{"ok": true}}
				created := mustInvite(t, s, inv.tok, map[string]any{
					"email": email, "redirect_uri": inviteCallback, "invite_accept_uri": inviteAccept, "state": "st-42/ü",
					"first_name": "Ada", "last_name": "Lovelace", "app_name": "Acme Notes", "metadata": metadata,
				}, false, 259200*time.Second)

				// The new user exists, invited, its address not verified yet.
				u := userByEmail(t, s, inv.tok, email)
				if u["status"] != "invited" || u["emailVerified"] != false || u["firstName"] != "Ada" || u["lastName"] != "Lovelace" {
					t.Fatalf("invited user: %v", u)
				}
				userID, _ := u["id"].(string)

				// The message, as the SMTP server received it.
				msg := box.waitFor(t, email, 15*time.Second)
				if msg.From != inviteFromAddr || !slices.Equal(msg.To, []string{email}) {
					t.Fatalf("envelope from %q to %v, want %s to %s", msg.From, msg.To, inviteFromAddr, email)
				}
				if msg.AuthUser != user {
					t.Fatalf("authenticated as %q, want %q", msg.AuthUser, user)
				}
				m := parseInvite(t, msg.Raw, s.URL)
				if m.From.Name != "Acme" || m.From.Address != inviteFromAddr {
					t.Fatalf("From %v, want %s", m.From, inviteMailFrom)
				}
				if len(m.To) != 1 || m.To[0].Address != email {
					t.Fatalf("To %v, want %s", m.To, email)
				}
				if m.Subject != "You are invited to Acme Notes" {
					t.Fatalf("Subject %q", m.Subject)
				}
				for part, body := range map[string]string{"text": m.Text, "html": m.HTML} {
					if !strings.Contains(body, "Acme Notes") || !strings.Contains(body, "Ada") {
						t.Fatalf("the %s part does not name the app and the person:\n%s", part, body)
					}
				}
				if auth && bytes.Contains(msg.Raw, []byte(pass)) {
					t.Fatalf("the message carries the SMTP password")
				}
				if len(box.to(email)) != 1 {
					t.Fatalf("%d messages to %s, want 1", len(box.to(email)), email)
				}

				// The link leads on to the accept page, as often as it is opened.
				want := url.Values{
					"invite_token": {m.Token}, "email": {email}, "app_name": {"Acme Notes"}, "user_exists": {"false"}, "state": {"st-42/ü"},
				}
				expectFollow(t, follow(t, m.Link), inviteAccept, want)
				expectFollow(t, follow(t, m.Link), inviteAccept, want)

				st := mustOK(t, inviteStatus(t, s, m.Token))
				exactKeys(t, st, "email", "app_name", "user_exists", "status", "expires_in")
				if st["email"] != email || st["app_name"] != "Acme Notes" || st["user_exists"] != false || st["status"] != "pending" {
					t.Fatalf("status: %v", st)
				}
				if left, _ := st["expires_in"].(float64); left < 259200-60 || left > 259200 || left != float64(int64(left)) {
					t.Fatalf("expires_in %v, want whole seconds just under 259200", st["expires_in"])
				}

				// Accepted once, by the account that invited.
				before := time.Now()
				acc := mustOK(t, acceptInvite(t, s, inv.tok, m.Token))
				exactKeys(t, acc, "invite_id", "email", "user_id", "user_exists", "app_name", "accepted_at", "metadata")
				if acc["invite_id"] != created["invite_id"] || acc["email"] != email || acc["user_id"] != userID ||
					acc["user_exists"] != false || acc["app_name"] != "Acme Notes" {
					t.Fatalf("accept: %v (invite %v, user %s)", acc, created["invite_id"], userID)
				}
				if at := isoZ(t, acc["accepted_at"]); at.Before(before.Add(-2*time.Second)) || at.After(time.Now().Add(2*time.Second)) {
					t.Fatalf("accepted_at %s is not now", at)
				}
				if !reflect.DeepEqual(acc["metadata"], jsonValue(t, metadata)) {
					t.Fatalf("metadata %v, want %v", acc["metadata"], metadata)
				}
				got := mustOK(t, s.do(http.MethodGet, inviteUsers+"/"+userID, nil, bearer(inv.tok)...))
				if got["emailVerified"] != true {
					t.Fatalf("emailVerified after accepting: %v", got)
				}

				// Single use: the token is gone for every route.
				expectError(t, acceptInvite(t, s, inv.tok, m.Token), http.StatusNotFound, "not_found")
				expectError(t, inviteStatus(t, s, m.Token), http.StatusNotFound, "not_found")
				expectError(t, follow(t, m.Link), http.StatusNotFound, "not_found")

				expectNoTokensLogged(t, s, m.Token)
				if auth && strings.Contains(s.logs.String(), pass) {
					t.Fatalf("the log holds the SMTP password")
				}
				if strings.Contains(s.logs.String(), "e-mail delivery failed") {
					t.Fatalf("delivery failed at first:\n%s", s.logs)
				}
			})
		}
	})
}

// Existing users, the fallback to redirect_uri, every refusal and
// concurrent accepts, on one server.
func TestInviteScenarios(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		t.Parallel()
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env()...)
		admin := s.adminToken()
		inv := newInviter(t, s, admin, "inviter", "users:invite", "users:read", "users:write")
		other := newInviter(t, s, admin, "other-inviter", "users:invite", "users:read")
		reader := newInviter(t, s, admin, "reader", "users:read")
		seen := &tokens{}
		var refusedMu sync.Mutex
		var refused []string // addresses that must get neither user nor e-mail

		addr := func(prefix string) string {
			return prefix + "." + strings.ToLower(randomString()[:10]) + "@example.com"
		}
		const ttl = 259200 * time.Second

		t.Run("group", func(t *testing.T) {
			t.Run("existing-user", func(t *testing.T) {
				t.Parallel()
				email := addr("grace")
				r := s.as(t).do(http.MethodPost, inviteUsers, map[string]any{"email": email, "firstName": "Grace", "lastName": "Hopper"}, bearer(inv.tok)...)
				if r.Status != http.StatusCreated {
					t.Fatalf("create user: %s", describe(r))
				}
				userID, _ := r.JSON(t)["id"].(string)
				created := mustInvite(t, s, inv.tok, map[string]any{
					"email": email, "redirect_uri": inviteCallback, "invite_accept_uri": inviteAccept, "app_name": "Acme Notes",
				}, true, ttl)
				m := parseInvite(t, box.waitFor(t, email, 15*time.Second).Raw, s.URL)
				seen.add(m.Token)
				expectFollow(t, follow(t, m.Link), inviteAccept, url.Values{
					"invite_token": {m.Token}, "email": {email}, "app_name": {"Acme Notes"}, "user_exists": {"true"},
				})
				if st := mustOK(t, inviteStatus(t, s, m.Token)); st["user_exists"] != true || st["status"] != "pending" {
					t.Fatalf("status: %v", st)
				}
				acc := mustOK(t, acceptInvite(t, s, inv.tok, m.Token))
				if acc["invite_id"] != created["invite_id"] || acc["user_id"] != userID || acc["user_exists"] != true {
					t.Fatalf("accept: %v, want user %s", acc, userID)
				}
				if !reflect.DeepEqual(acc["metadata"], map[string]any{}) {
					t.Fatalf("metadata %v, want {}", acc["metadata"])
				}
				u := userByEmail(t, s, inv.tok, email)
				if u["id"] != userID || u["emailVerified"] != true || u["firstName"] != "Grace" {
					t.Fatalf("user after accepting: %v", u)
				}
			})

			t.Run("invited-twice", func(t *testing.T) {
				t.Parallel()
				email := addr("twice")
				body := map[string]any{"email": email, "redirect_uri": inviteCallback}
				mustInvite(t, s, inv.tok, body, false, ttl)
				mustInvite(t, s, inv.tok, body, true, ttl) // the invited user exists now
				if n := usersWithEmail(t, s, inv.tok, email); n != 1 {
					t.Fatalf("%v users with %s, want 1", n, email)
				}
			})

			// Without invite_accept_uri the link leads to redirect_uri, its
			// query kept; without state there is none; without app_name the
			// message names "your application".
			t.Run("fallback-to-redirect-uri", func(t *testing.T) {
				t.Parallel()
				email := addr("fallback")
				mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteTenantCB}, false, ttl)
				m := parseInvite(t, box.waitFor(t, email, 15*time.Second).Raw, s.URL)
				seen.add(m.Token)
				if m.Subject != "You are invited to your application" {
					t.Fatalf("Subject %q", m.Subject)
				}
				expectFollow(t, follow(t, m.Link), inviteTenantCB, url.Values{
					"invite_token": {m.Token}, "email": {email}, "app_name": {""}, "user_exists": {"false"},
				})
				acc := mustOK(t, acceptInvite(t, s, inv.tok, m.Token))
				if acc["app_name"] != "" || !reflect.DeepEqual(acc["metadata"], map[string]any{}) {
					t.Fatalf("accept: %v", acc)
				}
			})

			// An accept page on the origin of a registered redirect URI, with
			// another path and its own query.
			t.Run("accept-uri-same-origin", func(t *testing.T) {
				t.Parallel()
				email := addr("origin")
				page := "https://APP.example/welcome/?from=mail&x=1"
				mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteCallback, "invite_accept_uri": page, "state": "s"}, false, ttl)
				m := parseInvite(t, box.waitFor(t, email, 15*time.Second).Raw, s.URL)
				seen.add(m.Token)
				r := follow(t, m.Link)
				if r.Status != http.StatusSeeOther {
					t.Fatalf("follow: %s", describe(r))
				}
				loc, _ := url.Parse(r.Header.Get("Location"))
				q := loc.Query()
				if !strings.EqualFold(loc.Host, "app.example") || loc.Path != "/welcome/" || q.Get("from") != "mail" || q.Get("x") != "1" ||
					q.Get("invite_token") != m.Token || q.Get("state") != "s" {
					t.Fatalf("Location %s", loc)
				}
			})

			t.Run("refusals", func(t *testing.T) {
				t.Parallel()
				cases := []struct {
					name   string
					body   func(email string) any
					fields []string // 400 invalid_request with details.fields
					field  string   // 400 invalid_request with details.field (decoding)
				}{
					{"wrong redirect_uri", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": "https://app.example/callback/other"}
					}, []string{"redirect_uri"}, ""},
					{"redirect_uri of another origin", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": "https://evil.example/callback"}
					}, []string{"redirect_uri"}, ""},
					{"redirect_uri with the query left off", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": "https://app.example/cb"}
					}, []string{"redirect_uri"}, ""},
					{"missing redirect_uri", func(e string) any { return map[string]any{"email": e} }, []string{"redirect_uri"}, ""},
					{"accept uri of another origin", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "invite_accept_uri": "https://evil.example/accept"}
					}, []string{"invite_accept_uri"}, ""},
					{"accept uri on another port", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "invite_accept_uri": "https://app.example:8443/accept"}
					}, []string{"invite_accept_uri"}, ""},
					{"accept uri over http", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "invite_accept_uri": "http://app.example/accept"}
					}, []string{"invite_accept_uri"}, ""},
					{"accept uri with a fragment", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "invite_accept_uri": "https://app.example/accept#top"}
					}, []string{"invite_accept_uri"}, ""},
					{"relative accept uri", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "invite_accept_uri": "/accept"}
					}, []string{"invite_accept_uri"}, ""},
					{"missing email", func(string) any { return map[string]any{"redirect_uri": inviteCallback} }, []string{"email"}, ""},
					{"bad email", func(string) any { return map[string]any{"email": "not-an-address", "redirect_uri": inviteCallback} }, []string{"email"}, ""},
					{"email with a display name", func(e string) any {
						return map[string]any{"email": "Ada <" + e + ">", "redirect_uri": inviteCallback}
					}, []string{"email"}, ""},
					{"every field wrong at once", func(string) any {
						return map[string]any{"email": "x@", "redirect_uri": "https://evil.example/", "invite_accept_uri": "https://evil.example/a"}
					}, []string{"email", "redirect_uri", "invite_accept_uri"}, ""},
					{"unknown field", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "role": "admin"}
					}, nil, "role"},
					{"metadata an array", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "metadata": []any{1, 2}}
					}, nil, "metadata"},
					{"metadata a string", func(e string) any {
						return map[string]any{"email": e, "redirect_uri": inviteCallback, "metadata": "plan=pro"}
					}, nil, "metadata"},
				}
				for _, c := range cases {
					t.Run(c.name, func(t *testing.T) {
						t.Parallel()
						email := addr("refused")
						refusedMu.Lock()
						refused = append(refused, email)
						refusedMu.Unlock()
						r := invite(t, s, inv.tok, c.body(email))
						if c.fields != nil {
							expectFields(t, r, c.fields...)
							return
						}
						d := expectError(t, r, http.StatusBadRequest, "invalid_request")
						if d["field"] != c.field {
							t.Fatalf("details.field %v, want %q: %s", d["field"], c.field, r.Body)
						}
					})
				}
				t.Run("missing scope", func(t *testing.T) {
					t.Parallel()
					email := addr("refused")
					refusedMu.Lock()
					refused = append(refused, email)
					refusedMu.Unlock()
					expectScopeRefused(t, invite(t, s, reader.tok, map[string]any{"email": email, "redirect_uri": inviteCallback}), "users:invite")
					// The inviter itself, with a token narrowed to users:read.
					narrow := s.as(t).token(inv.ClientID, inv.ClientSecret, "users:read")
					expectScopeRefused(t, invite(t, s, narrow, map[string]any{"email": email, "redirect_uri": inviteCallback}), "users:invite")
				})
				t.Run("no token", func(t *testing.T) {
					t.Parallel()
					r := s.as(t).do(http.MethodPost, invitePath, map[string]any{"email": addr("anon"), "redirect_uri": inviteCallback})
					expectError(t, r, http.StatusUnauthorized, "unauthorized")
				})
			})

			// Another account may not accept, whatever its scopes; a token
			// without users:invite may not either; then the inviter can.
			t.Run("accept-by-others", func(t *testing.T) {
				t.Parallel()
				email := addr("others")
				mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteCallback, "app_name": "X"}, false, ttl)
				m := parseInvite(t, box.waitFor(t, email, 15*time.Second).Raw, s.URL)
				seen.add(m.Token)
				expectError(t, acceptInvite(t, s, other.tok, m.Token), http.StatusForbidden, "forbidden")
				expectScopeRefused(t, acceptInvite(t, s, reader.tok, m.Token), "users:invite")
				narrow := s.as(t).token(inv.ClientID, inv.ClientSecret, "users:read")
				expectScopeRefused(t, acceptInvite(t, s, narrow, m.Token), "users:invite")
				expectError(t, s.as(t).do(http.MethodPost, "/api/v1/m2m/invites/"+m.Token+"/accept", nil), http.StatusUnauthorized, "unauthorized")
				if u := userByEmail(t, s, inv.tok, email); u["emailVerified"] != false {
					t.Fatalf("refused accepts verified the address: %v", u)
				}
				if st := mustOK(t, inviteStatus(t, s, m.Token)); st["status"] != "pending" {
					t.Fatalf("status after refused accepts: %v", st)
				}
				mustOK(t, acceptInvite(t, s, inv.tok, m.Token))
				// Accepted: others now get 404, like everyone.
				expectError(t, acceptInvite(t, s, other.tok, m.Token), http.StatusNotFound, "not_found")
			})

			t.Run("unknown-token", func(t *testing.T) {
				t.Parallel()
				bogus := strings.Repeat("A", inviteTokenLen)
				long := strings.Repeat("b", 200)
				for _, tok := range []string{bogus, long, "x"} {
					expectError(t, inviteStatus(t, s, tok), http.StatusNotFound, "not_found")
					expectError(t, follow(t, s.URL+"/invites/"+tok), http.StatusNotFound, "not_found")
					expectError(t, acceptInvite(t, s, inv.tok, tok), http.StatusNotFound, "not_found")
				}
			})

			// Many accepts of one invite at once: exactly one wins.
			t.Run("concurrent-accepts", func(t *testing.T) {
				t.Parallel()
				email := addr("race")
				mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteCallback}, false, ttl)
				m := parseInvite(t, box.waitFor(t, email, 15*time.Second).Raw, s.URL)
				seen.add(m.Token)
				const n = 12
				answers := make([]*response, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				startGate := make(chan struct{})
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-startGate
						answers[i], errs[i] = send(http.MethodPost, s.URL+"/api/v1/m2m/invites/"+m.Token+"/accept", nil, bearer(inv.tok)...)
					}()
				}
				close(startGate)
				wg.Wait()
				ok := 0
				for i := range n {
					if errs[i] != nil {
						t.Fatalf("accept %d: %v", i, errs[i])
					}
					switch answers[i].Status {
					case http.StatusOK:
						ok++
					case http.StatusNotFound:
						expectError(t, answers[i], http.StatusNotFound, "not_found")
					default:
						t.Fatalf("accept %d: %s", i, describe(answers[i]))
					}
				}
				if ok != 1 {
					t.Fatalf("%d accepts answered 200, want exactly 1", ok)
				}
				if u := userByEmail(t, s, inv.tok, email); u["emailVerified"] != true {
					t.Fatalf("user after the race: %v", u)
				}
			})
		})

		// Nothing refused left a user or an e-mail behind.
		for _, email := range refused {
			if n := usersWithEmail(t, s, inv.tok, email); n != 0 {
				t.Errorf("a refused invite created user %s", email)
			}
		}
		time.Sleep(2500 * time.Millisecond) // past the outbox's tick
		for _, email := range refused {
			if len(box.to(email)) != 0 {
				t.Errorf("a refused invite sent e-mail to %s", email)
			}
		}
		expectNoTokensLogged(t, s, seen.list...)
	})
}

// An invite past its lifetime: status, link and accept answer 410
// invite_expired; another account is still told 403 first.
func TestInviteExpiry(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		t.Parallel()
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env("IDENTITYD_INVITE_TTL=3")...)
		admin := s.adminToken()
		inv := newInviter(t, s, admin, "inviter", "users:invite", "users:read")
		other := newInviter(t, s, admin, "other", "users:invite")

		email := "late." + strings.ToLower(randomString()[:8]) + "@example.com"
		created := mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteCallback, "app_name": "Soon"}, false, 3*time.Second)
		m := parseInvite(t, box.waitFor(t, email, 10*time.Second).Raw, s.URL)
		expires := isoZ(t, created["expires_at"])
		if time.Until(expires) > 500*time.Millisecond {
			st := mustOK(t, inviteStatus(t, s, m.Token))
			if left, _ := st["expires_in"].(float64); left < 0 || left > 3 {
				t.Fatalf("expires_in %v, want 0..3", st["expires_in"])
			}
		}
		time.Sleep(time.Until(expires) + 300*time.Millisecond)

		expectError(t, inviteStatus(t, s, m.Token), http.StatusGone, "invite_expired")
		r := follow(t, m.Link)
		expectError(t, r, http.StatusGone, "invite_expired")
		if loc := r.Header.Get("Location"); loc != "" {
			t.Fatalf("an expired link redirects to %s", loc)
		}
		expectError(t, acceptInvite(t, s, other.tok, m.Token), http.StatusForbidden, "forbidden")
		expectError(t, acceptInvite(t, s, inv.tok, m.Token), http.StatusGone, "invite_expired")
		if u := userByEmail(t, s, inv.tok, email); u["emailVerified"] != false {
			t.Fatalf("an expired invite verified the address: %v", u)
		}
		expectNoTokensLogged(t, s, m.Token)
	})
}

// The SMTP server refuses the first attempt at RCPT and the second at DATA
// with 451: the outbox tries again after 5 s, then 10 s, and the message
// arrives; the invite was answered at once and accepts as usual.
func TestInviteDeliveryRetry(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		t.Parallel()
		box := startMail(t, "", "")
		box.refuseRcpt, box.refuseData = 1, 1
		s := startLogged(t, dbURL, box.env()...)
		admin := s.adminToken()
		inv := newInviter(t, s, admin, "inviter", "users:invite", "users:read")

		email := "patient." + strings.ToLower(randomString()[:8]) + "@example.com"
		began := time.Now()
		mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteCallback, "app_name": "Retry"}, false, 259200*time.Second)
		if d := time.Since(began); d > 3*time.Second {
			t.Fatalf("the invite waited %s for the e-mail", d)
		}
		s.waitLog(t, `"msg":"e-mail delivery failed; will retry"`)
		if len(box.to(email)) != 0 {
			t.Fatalf("delivered at once despite the refusal")
		}

		msg := box.waitFor(t, email, 40*time.Second)
		box.mu.Lock()
		attempts := slices.Clone(box.rcpts)
		box.mu.Unlock()
		if len(attempts) != 3 {
			t.Fatalf("%d delivery attempts, want 3 (refused at RCPT, refused at DATA, delivered)", len(attempts))
		}
		if gap := attempts[1].Sub(attempts[0]); gap < 4500*time.Millisecond || gap > 10*time.Second {
			t.Fatalf("second attempt %s after the first, want about 5 s", gap)
		}
		if gap := attempts[2].Sub(attempts[1]); gap < 9500*time.Millisecond || gap > 15*time.Second {
			t.Fatalf("third attempt %s after the second, want about 10 s", gap)
		}
		var failed []map[string]any
		for line := range strings.SplitSeq(s.logs.String(), "\n") {
			var l map[string]any
			if json.Unmarshal([]byte(line), &l) == nil && l["msg"] == "e-mail delivery failed; will retry" {
				failed = append(failed, l)
			}
		}
		if len(failed) != 2 || failed[0]["attempt"] != 1.0 || failed[1]["attempt"] != 2.0 {
			t.Fatalf("want two logged failures, attempts 1 and 2: %v", failed)
		}

		m := parseInvite(t, msg.Raw, s.URL)
		// HEAD answers as GET does: link checkers see where the link leads.
		req, _ := http.NewRequest(http.MethodHead, m.Link, nil)
		head, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		head.Body.Close()
		if head.StatusCode != http.StatusSeeOther || !strings.HasPrefix(head.Header.Get("Location"), inviteCallback) {
			t.Fatalf("HEAD on the link: %d %q", head.StatusCode, head.Header.Get("Location"))
		}
		expectFollow(t, follow(t, m.Link), inviteCallback, url.Values{
			"invite_token": {m.Token}, "email": {email}, "app_name": {"Retry"}, "user_exists": {"false"},
		})
		mustOK(t, inviteStatus(t, s, m.Token))
		acc := mustOK(t, acceptInvite(t, s, inv.tok, m.Token))
		if acc["email"] != email || acc["app_name"] != "Retry" {
			t.Fatalf("accept: %v", acc)
		}
		if n := len(box.to(email)); n != 1 {
			t.Fatalf("%d messages, want exactly 1", n)
		}
		expectNoTokensLogged(t, s, m.Token)
	})
}

// What a mail scanner or a sloppy client does with a link: HEAD, another
// method, a trailing slash. Whatever the answer, the token is never logged
// (the request line of an unmatched route logs the path as it came). Only
// the log is at stake, so SQLite alone.
func TestInviteTokenNotLoggedOnStrayRequests(t *testing.T) {
	t.Parallel()
	box := startMail(t, "", "")
	s := startLogged(t, dbtest.URLs(t)["sqlite"], box.env()...)
	inv := newInviter(t, s, s.adminToken(), "inviter", "users:invite")
	email := "probe." + strings.ToLower(randomString()[:8]) + "@example.com"
	mustInvite(t, s, inv.tok, map[string]any{"email": email, "redirect_uri": inviteCallback}, false, 259200*time.Second)
	m := parseInvite(t, box.waitFor(t, email, 10*time.Second).Raw, s.URL)
	for _, p := range []struct{ method, path string }{
		{http.MethodHead, "/invites/" + m.Token},
		{http.MethodPost, "/invites/" + m.Token},
		{http.MethodHead, "/api/v1/invites/" + m.Token},
		{http.MethodGet, "/api/v1/m2m/invites/" + m.Token + "/accept"},
		{http.MethodGet, "/invites/" + m.Token + "/"},
		{http.MethodGet, "/invites//" + m.Token},
		{http.MethodGet, "//invites/" + m.Token},
		{http.MethodGet, "/api/v1//invites/" + m.Token},
		{http.MethodHead, "/api/v1/m2m//invites/" + m.Token + "/accept"},
		{http.MethodGet, "/Invites/" + m.Token},
		{http.MethodGet, "/x/../invites/" + m.Token},
	} {
		req, _ := http.NewRequest(p.method, s.URL+p.path, nil)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		r := &response{Status: resp.StatusCode, Header: resp.Header}
		if r.Status >= 500 {
			t.Errorf("%s %s/{token}…: %d", p.method, p.path[:strings.Index(p.path, m.Token)], r.Status)
		}
	}
	expectFollow(t, follow(t, m.Link), inviteCallback, url.Values{
		"invite_token": {m.Token}, "email": {email}, "app_name": {""}, "user_exists": {"false"},
	})
	expectNoTokensLogged(t, s, m.Token)
}
