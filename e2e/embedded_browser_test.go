package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The embedded sign-in API from an application's own page in Debian's
// Chromium (e2e/node/embedded.browser.mjs): the page (embedded.page.mjs,
// served as a file) computes PKCE, calls identityd cross-origin, and hands
// the code to the application's backend, which is this test: it exchanges
// the code at code/exchange with the application's secret (server-side, no
// Origin) and verifies the ID token with coreos/go-oidc. The same page from
// an origin no application registered, and from one another application
// registered, is refused. The e-mailed code and link come from the SMTP
// server in the test.

// embeddedApp is an application's web server on loopback, reached by the
// browser as http://localhost:PORT (an origin applications may register:
// http is allowed on loopback, and the rpId defaults to localhost).
type embeddedApp struct {
	Origin  string // http://localhost:PORT, what the browser sends
	Backend string // http://127.0.0.1:PORT, for Node's own requests
	s       *server
	box     *mailServer
	script  []byte

	mu       sync.Mutex
	clientID string
	secret   string
	sessions []embeddedSession
	reports  []embeddedReport
	problems []string
	read     map[string]int // messages per address /last-* has shown
}

// embeddedSession is a code the backend exchanged: the ID token's claims.
type embeddedSession struct {
	Sub   string   `json:"sub"`
	Email string   `json:"email"`
	AMR   []string `json:"amr"`
}

// embeddedReport is a call the page saw fail.
type embeddedReport struct {
	Step    string `json:"step"`
	Name    string `json:"name"`
	Message string `json:"message"`
}

var embeddedPage = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Acme Embedded</title>
<script type="module" src="/app.mjs"></script></head>
<body data-issuer="{{.Issuer}}" data-client-id="{{.ClientID}}" data-redirect-uri="{{.Redirect}}">
<h1>Acme</h1><pre id="result"></pre></body></html>
`))

// startEmbeddedApp serves the page until the test ends, on 127.0.0.1 and,
// when it can, on [::1] at the same port (the browser may try either for
// localhost).
func startEmbeddedApp(t *testing.T, s *server, box *mailServer, script []byte) *embeddedApp {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	a := &embeddedApp{Origin: fmt.Sprintf("http://localhost:%d", port), Backend: fmt.Sprintf("http://127.0.0.1:%d", port), s: s, box: box, script: script, read: map[string]int{}}
	srv := &http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	if l6, err := net.Listen("tcp", fmt.Sprintf("[::1]:%d", port)); err == nil {
		go func() { _ = srv.Serve(l6) }()
	}
	t.Cleanup(func() { _ = srv.Close() })
	return a
}

func (a *embeddedApp) use(clientID, secret string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clientID, a.secret = clientID, secret
}

// seen is what the application server recorded: the backend's sessions,
// the page's failed calls, and the backend's own problems.
func (a *embeddedApp) seen() ([]embeddedSession, []embeddedReport, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.sessions), slices.Clone(a.reports), slices.Clone(a.problems)
}

func (a *embeddedApp) problem(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.problems = append(a.problems, fmt.Sprintf(format, args...))
}

func (a *embeddedApp) routes() http.Handler {
	mux := http.NewServeMux()
	page := func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		data := map[string]string{"Issuer": a.s.URL, "ClientID": a.clientID, "Redirect": a.Origin + "/callback"}
		a.mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = embeddedPage.Execute(w, data)
	}
	mux.HandleFunc("GET /{$}", page)
	mux.HandleFunc("GET /callback", page)
	mux.HandleFunc("GET /app.mjs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = w.Write(a.script)
	})
	// The test's own window on the mailbox: what the newest message to
	// ?email= that it has not shown yet carried (waiting for one).
	last := func(w http.ResponseWriter, r *http.Request, find func(text string) string) {
		email := r.URL.Query().Get("email")
		deadline := time.Now().Add(10 * time.Second)
		var msgs []*mailMsg
		for {
			msgs = a.box.to(email)
			a.mu.Lock()
			fresh := len(msgs) > a.read[email]
			if fresh {
				a.read[email] = len(msgs)
			}
			a.mu.Unlock()
			if fresh {
				break
			}
			if time.Now().After(deadline) {
				http.Error(w, "no new message", http.StatusNotFound)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		m, err := parseSent(msgs[len(msgs)-1].Raw)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		found := find(m.Text)
		if found == "" {
			http.Error(w, "not in the newest message: "+m.Subject, http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte(found))
	}
	mux.HandleFunc("GET /last-code", func(w http.ResponseWriter, r *http.Request) {
		last(w, r, func(text string) string {
			if m := mailedOTP.FindStringSubmatch(text); m != nil {
				return m[1]
			}
			return ""
		})
	})
	mux.HandleFunc("GET /last-link", func(w http.ResponseWriter, r *http.Request) {
		last(w, r, linkPattern(a.s.URL+embeddedLinkURL).FindString)
	})
	mux.HandleFunc("POST /session", a.session)
	mux.HandleFunc("POST /report", func(w http.ResponseWriter, r *http.Request) {
		var rep embeddedReport
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.reports = append(a.reports, rep)
		a.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// session is the application's backend: the page's code and verifier
// exchanged at code/exchange with the application's credentials, the ID
// token verified with coreos/go-oidc.
func (a *embeddedApp) session(w http.ResponseWriter, r *http.Request) {
	var in struct{ Code, Verifier string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Code == "" || in.Verifier == "" {
		a.problem("backend: a session request without code or verifier (%v)", err)
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	clientID, secret := a.clientID, a.secret
	a.mu.Unlock()
	reply := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	body, _ := json.Marshal(map[string]string{"code": in.Code, "client_id": clientID, "client_secret": secret, "code_verifier": in.Verifier})
	res, err := send(http.MethodPost, a.s.URL+embeddedAuth+"/code/exchange", bytes.NewReader(body), "Content-Type", "application/json")
	if err != nil {
		a.problem("backend: code/exchange: %v", err)
		reply(http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	var tok struct {
		AccessToken string `json:"access_token"`
		IDToken     string `json:"id_token"`
	}
	if res.Status != http.StatusOK || json.Unmarshal(res.Body, &tok) != nil || tok.IDToken == "" || tok.AccessToken == "" {
		reply(http.StatusBadGateway, map[string]any{"error": "code/exchange", "status": res.Status, "answer": string(res.Body)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	provider, err := oidc.NewProvider(ctx, a.s.URL)
	if err != nil {
		a.problem("backend: discovery: %v", err)
		reply(http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	idt, err := provider.Verifier(&oidc.Config{ClientID: clientID}).Verify(ctx, tok.IDToken)
	if err != nil {
		a.problem("backend: ID token: %v", err)
		reply(http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	var s embeddedSession
	if err := idt.Claims(&s); err != nil || s.Sub != idt.Subject {
		a.problem("backend: ID token claims: %v", err)
		reply(http.StatusBadGateway, map[string]string{"error": "claims"})
		return
	}
	a.mu.Lock()
	a.sessions = append(a.sessions, s)
	a.mu.Unlock()
	reply(http.StatusOK, s)
}

// requestLine is one of the server's request log lines.
type requestLine struct {
	Method, Path string
	Status       int
}

func requestLines(logs string) []requestLine {
	var out []requestLine
	for line := range strings.SplitSeq(logs, "\n") {
		var l struct {
			Msg    string `json:"msg"`
			Method string `json:"method"`
			Path   string `json:"path"`
			Status int    `json:"status"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "request" {
			out = append(out, requestLine{l.Method, l.Path, l.Status})
		}
	}
	return out
}

func TestEmbeddedSignInBrowser(t *testing.T) {
	needBrowser(t)
	script, err := os.ReadFile("node/embedded.page.mjs")
	if err != nil {
		t.Fatal(err)
	}
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env()...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write")
		app := startEmbeddedApp(t, s, box, script)
		stranger := startEmbeddedApp(t, s, box, script)  // an origin no application registered
		neighbour := startEmbeddedApp(t, s, box, script) // an origin another application registered
		clientID, secret := s.registerApp(t, admin, map[string]any{
			"name": "Acme Embedded", "redirectUris": []string{app.Origin + "/callback"}, "webOrigins": []string{app.Origin},
			"signInMethods": []string{"password", "otp", "magic-link"},
		})
		s.registerApp(t, admin, map[string]any{
			"name": "Acme Other", "redirectUris": []string{neighbour.Origin + "/callback"}, "webOrigins": []string{neighbour.Origin},
		})
		for _, a := range []*embeddedApp{app, stranger, neighbour} {
			a.use(clientID, secret) // every page names the application
		}
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
		const otpEmail, pwEmail = "lin@example.com", "pat@example.com"
		otpID, pwID := person(otpEmail, ""), person(pwEmail, plPassword)

		runBrowserSuite(t, dbURL, "embedded.browser.mjs", "IDENTITYD_ISSUER="+s.URL, "CHROMIUM="+chromiumPath,
			"APP_ORIGIN="+app.Origin, "APP_BACKEND="+app.Backend, "STRANGER_ORIGIN="+stranger.Origin, "NEIGHBOUR_ORIGIN="+neighbour.Origin,
			"OTP_EMAIL="+otpEmail, "OTP_USER_ID="+otpID, "PW_EMAIL="+pwEmail, "PW_USER_ID="+pwID, "PASSWORD="+plPassword)
		time.Sleep(100 * time.Millisecond) // the log pipe lags a little
		lines := requestLines(s.logs.String())

		// The backend exchanged three codes: the code's, the password's and
		// the link's, for the right people.
		sessions, reports, _ := app.seen()
		strangerSessions, strangerReports, _ := stranger.seen()
		neighbourSessions, neighbourReports, _ := neighbour.seen()
		for _, a := range []*embeddedApp{app, stranger, neighbour} {
			if _, _, problems := a.seen(); len(problems) > 0 {
				t.Errorf("application backend %s: %v", a.Origin, problems)
			}
		}
		var subs []string
		for _, se := range sessions {
			subs = append(subs, se.Sub)
		}
		if !slices.Equal(subs, []string{otpID, pwID, otpID}) {
			t.Fatalf("the backend's sessions %v, want %s (code), %s (password), %s (link)", sessions, otpID, pwID, otpID)
		}
		if !slices.Contains(sessions[0].AMR, "otp") || !slices.Contains(sessions[1].AMR, "pwd") || sessions[0].Email != otpEmail {
			t.Fatalf("the backend's sessions %+v", sessions)
		}
		if len(reports) != 0 || len(strangerSessions)+len(neighbourSessions) != 0 {
			t.Fatalf("the registered page failed (%v), or a refused one signed in (%v %v)", reports, strangerSessions, neighbourSessions)
		}
		// The refused pages saw their fetches fail.
		want := []embeddedReport{{Step: "check-email", Name: "TypeError"}, {Step: "otp/send", Name: "TypeError"}}
		for i := range strangerReports {
			strangerReports[i].Message = "" // the browser's own words
		}
		if !slices.Equal(strangerReports, want) {
			t.Fatalf("the stranger page's reports %v, want %v", strangerReports, want)
		}
		if len(neighbourReports) != 1 || neighbourReports[0].Step != "check-email" || neighbourReports[0].Name != "TypeError" {
			t.Fatalf("the neighbour page's reports %v", neighbourReports)
		}
		// The refused otp/send sent nothing: the code and the link only.
		if n := len(box.to(otpEmail)); n != 2 {
			t.Fatalf("%d messages to %s, want the code and the link", n, otpEmail)
		}

		// What the server answered: every JSON call was preflighted and the
		// preflight answered 204; the stranger's preflights 403; the
		// neighbour's preflight passed (its origin is registered) and its
		// call itself was refused, 403.
		count := func(method, path string, status int) int {
			n := 0
			for _, l := range lines {
				if l.Method == method && l.Path == embeddedAuth+path && l.Status == status {
					n++
				}
			}
			return n
		}
		for _, p := range []string{"/check-email", "/otp/send", "/otp/verify", "/password", "/magic-link/send"} {
			if count(http.MethodOptions, p, http.StatusNoContent) == 0 {
				t.Errorf("no preflight of %s answered 204: %v", p, lines)
			}
		}
		if n := count(http.MethodOptions, "/check-email", http.StatusForbidden); n != 1 {
			t.Errorf("%d preflights of check-email refused, want the stranger's one", n)
		}
		if n := count(http.MethodOptions, "/otp/send", http.StatusForbidden); n != 1 {
			t.Errorf("%d preflights of otp/send refused, want the stranger's one", n)
		}
		if n := count(http.MethodPost, "/check-email", http.StatusForbidden); n != 1 {
			t.Errorf("%d check-email calls refused with 403, want the neighbour's one", n)
		}
		if n := count(http.MethodPost, "/otp/send", http.StatusOK); n != 1 {
			t.Errorf("%d otp/send calls served, want one", n)
		}

		// The same, asked directly with each Origin.
		checkBody := map[string]any{"clientId": clientID, "email": otpEmail}
		r := s.embed(t, "/check-email", checkBody, "Origin", app.Origin)
		if r.Status != http.StatusOK || r.Header.Get("Access-Control-Allow-Origin") != app.Origin || !slices.Contains(r.Header.Values("Vary"), "Origin") {
			t.Fatalf("check-email from the registered origin: %d %v", r.Status, r.Header)
		}
		for _, origin := range []string{stranger.Origin, neighbour.Origin, "http://127.0.0.1:" + strings.TrimPrefix(app.Origin, "http://localhost:"), app.Origin + ".evil.example"} {
			r := s.embed(t, "/check-email", checkBody, "Origin", origin)
			expectSignInError(t, r, http.StatusForbidden, "origin_not_allowed")
			if acao := r.Header.Get("Access-Control-Allow-Origin"); acao != "" {
				t.Fatalf("refused origin %s answered with Access-Control-Allow-Origin %q", origin, acao)
			}
		}
		preflight := func(origin string) *response {
			return s.as(t).do(http.MethodOptions, embeddedAuth+"/otp/verify", nil, "Origin", origin,
				"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type")
		}
		r = preflight(app.Origin)
		h := r.Header
		if r.Status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != app.Origin ||
			!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "content-type") {
			t.Fatalf("preflight from the registered origin: %d %v", r.Status, h)
		}
		if r := preflight(stranger.Origin); r.Status != http.StatusForbidden || r.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("preflight from an unregistered origin: %d %v", r.Status, r.Header)
		}
		// The backend's exchange carries no Origin; from a page's origin it
		// is still refused for a foreign one.
		expectSignInError(t, s.embed(t, "/code/exchange", map[string]any{"code": "x", "client_id": clientID, "client_secret": secret, "code_verifier": "y"},
			"Origin", stranger.Origin), http.StatusForbidden, "origin_not_allowed")
	})
}

// A page from a registered origin that meets the embedded API's limit per
// address (20 calls a minute) must be able to read the 429 rate_limited
// answer, as it reads every other refusal: with Access-Control-Allow-Origin
// (and Vary: Origin). Without it, the browser hands the page a TypeError
// and the page cannot tell a limit from a network failure.
func TestEmbeddedRateLimitedAnswerCORS(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_RATE_LIMITS=on")
		const origin = "http://localhost:5173"
		clientID, _ := s.registerApp(t, s.adminToken(), map[string]any{
			"name": "Acme Embedded", "redirectUris": []string{origin + "/callback"}, "webOrigins": []string{origin},
		})
		for i := range 40 {
			r := s.embed(t, "/check-email", map[string]any{"clientId": clientID, "email": fmt.Sprintf("n%d@example.com", i)}, "Origin", origin)
			if r.Status == http.StatusOK {
				if r.Header.Get("Access-Control-Allow-Origin") != origin {
					t.Fatalf("call %d: 200 without Access-Control-Allow-Origin: %v", i, r.Header)
				}
				continue
			}
			expectSignInError(t, r, http.StatusTooManyRequests, "rate_limited")
			if i < 20 {
				t.Fatalf("limited after %d calls, want 20", i)
			}
			if got := r.Header.Get("Access-Control-Allow-Origin"); got != origin || !slices.Contains(r.Header.Values("Vary"), "Origin") {
				t.Fatalf("the 429 to a registered origin is unreadable by its page: Access-Control-Allow-Origin %q, Vary %v (want %q, Origin)",
					got, r.Header.Values("Vary"), origin)
			}
			return
		}
		t.Fatal("40 calls from one address were never limited")
	})
}
