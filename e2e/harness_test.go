// Package e2e holds identityd's black-box tests: they build the real binary,
// start it on a free loopback port with a fresh database (SQLite always,
// PostgreSQL when TEST_DATABASE_URL is set), and drive it over HTTP with
// third-party clients.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

var binary string

func TestMain(m *testing.M) {
	// The quick loop (go test -short ./...) leaves out the black-box
	// tests: they build the binary and start servers, browsers and clients.
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped under -short")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "identityd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "identityd")
	build := exec.Command("go", "build", "-o", binary, "../cmd/identityd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building identityd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running identityd process.
type server struct {
	t           *testing.T
	URL         string
	DB          string // the database URL it runs on
	AdminID     string
	AdminSecret string
	env         []string
	cmd         *exec.Cmd
	logs        *syncBuffer
	exited      chan struct{}
	waitErr     error
	client      *http.Client // nil: http.DefaultClient; see at
}

// syncBuffer collects the server's stderr (its log) safely.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ports hands out the loopback ports of freePort, each once in turn.
var ports struct {
	sync.Mutex
	next, low, high int // the next to try, in [low, high)
}

// freePort returns a loopback port free now, for a server to bind later.
// It is taken below the kernel's ephemeral range: a port from that range
// (what listening on port 0 gives) can be taken meanwhile as the source
// port of any outgoing connection, and a server then failed to start with
// "address already in use". Below the range only an explicit bind takes a
// port, and this process hands each out once in turn.
func freePort(t *testing.T) int {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	if ports.high == 0 {
		ports.low, ports.high = 20000, 32768
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 {
				if first, err := strconv.Atoi(f[0]); err == nil && first > 5024 {
					ports.low, ports.high = max(1024, first-12000), first
				}
			}
		}
		ports.next = ports.low + os.Getpid()%(ports.high-ports.low)
	}
	for range ports.high - ports.low {
		port := ports.next
		if ports.next++; ports.next == ports.high {
			ports.next = ports.low
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return 0
}

func randomString() string { return strings.ToLower(rand.Text()) + strings.ToLower(rand.Text()) }

// start runs identityd on a fresh database of dbURL's dialect (servers
// share a database only when a test says so, with sibling), with rate
// limits off and a configured admin; extra
// variables (KEY=VALUE) override the defaults. The server is stopped,
// gracefully, when the test ends, and must exit cleanly.
func start(t *testing.T, dbURL string, extra ...string) *server {
	t.Helper()
	return startOn(t, dbtest.Like(t, dbURL), extra...)
}

// startOn runs identityd on exactly dbURL (see start).
func startOn(t *testing.T, dbURL string, extra ...string) *server {
	t.Helper()
	port := freePort(t)
	s := &server{t: t, URL: fmt.Sprintf("http://127.0.0.1:%d", port), DB: dbURL, AdminID: "e2e-admin", AdminSecret: randomString()}
	s.env = []string{
		"IDENTITYD_ADDR=127.0.0.1:" + fmt.Sprint(port),
		"IDENTITYD_ISSUER=" + s.URL,
		"IDENTITYD_DATABASE_URL=" + dbURL,
		"IDENTITYD_ADMIN_CLIENT_ID=" + s.AdminID,
		"IDENTITYD_ADMIN_CLIENT_SECRET=" + s.AdminSecret,
		"IDENTITYD_SYSTEM_SECRET=" + randomString(),
		"IDENTITYD_RATE_LIMITS=off",
		"IDENTITYD_SHUTDOWN_GRACE=0", // tests that drain say how long
		"IDENTITYD_LOG_LEVEL=debug",
	}
	s.env = append(s.env, extra...)
	for _, kv := range extra {
		switch k, v, _ := strings.Cut(kv, "="); k {
		case "IDENTITYD_ADMIN_CLIENT_ID":
			s.AdminID = v
		case "IDENTITYD_ADMIN_CLIENT_SECRET":
			s.AdminSecret = v
		}
	}
	s.launch()
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("identityd did not exit cleanly: %v\n%s", err, s.logs)
		}
	})
	return s
}

func (s *server) launch() {
	s.t.Helper()
	s.logs = &syncBuffer{}
	s.cmd = exec.Command(binary, "serve")
	s.cmd.Env = append(os.Environ(), s.env...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			s.t.Fatalf("identityd exited at start: %v\n%s", s.waitErr, s.logs)
		default:
		}
		if resp, err := http.Get(s.URL + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("identityd not healthy after 30s\n%s", s.logs)
}

// stop sends SIGTERM and waits for a clean exit.
func (s *server) stop() error {
	select {
	case <-s.exited:
		return s.waitErr
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return s.waitErr
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("no exit 30s after SIGTERM")
	}
}

// restart stops the server and starts it again on the same database and port.
func (s *server) restart(extra ...string) {
	s.t.Helper()
	if err := s.stop(); err != nil {
		s.t.Fatalf("stop: %v", err)
	}
	s.env = append(s.env, extra...)
	s.launch()
}

// response is a decoded HTTP answer.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r *response) JSON(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("not a JSON object (%d): %s", r.Status, r.Body)
	}
	return m
}

// do sends a request; body may be nil, a string (sent as is) or anything
// else (sent as JSON). Headers come in pairs.
func (s *server) do(method, path string, body any, headers ...string) *response {
	s.t.Helper()
	var rd io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case url.Values:
		rd = strings.NewReader(b.Encode())
		contentType = "application/x-www-form-urlencoded"
	default:
		js, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(js)
		contentType = "application/json"
	}
	req, err := http.NewRequestWithContext(context.Background(), method, s.URL+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	c := s.client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func bearer(token string) []string { return []string{"Authorization", "Bearer " + token} }

// token gets a client-credentials token with HTTP Basic; scope may be empty.
func (s *server) token(clientID, secret, scope string) string {
	s.t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}}
	if scope != "" {
		form.Set("scope", scope)
	}
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/api/v1/oauth/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(clientID), url.QueryEscape(secret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.AccessToken == "" {
		s.t.Fatalf("token for %s: status %d, err %v", clientID, resp.StatusCode, err)
	}
	return out.AccessToken
}

func (s *server) adminToken() string { return s.token(s.AdminID, s.AdminSecret, "admin") }

// account is a service account as created through the API.
type account struct {
	ID           string   `json:"id"`
	ClientID     string   `json:"clientId"`
	ClientSecret string   `json:"clientSecret"`
	Name         string   `json:"name"`
	Scopes       []string `json:"scopes"`
}

func (s *server) createAccount(admin string, body map[string]any) account {
	s.t.Helper()
	r := s.do(http.MethodPost, "/api/v1/service-accounts", body, bearer(admin)...)
	if r.Status != http.StatusCreated {
		s.t.Fatalf("create account: %d %s", r.Status, r.Body)
	}
	var a account
	if err := json.Unmarshal(r.Body, &a); err != nil {
		s.t.Fatal(err)
	}
	return a
}

// expectError checks a non-OAuth error answer: status and the spec's envelope.
func expectError(t *testing.T, r *response, status int, code string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	m := r.JSON(t)
	if m["error"] != code {
		t.Fatalf("error %v, want %q: %s", m["error"], code, r.Body)
	}
	if msg, _ := m["message"].(string); msg == "" {
		t.Fatalf("envelope without message: %s", r.Body)
	}
	details, ok := m["details"].(map[string]any)
	if !ok {
		t.Fatalf("envelope without details object: %s", r.Body)
	}
	return details
}

// expectOAuthError checks an RFC 6749 error answer.
func expectOAuthError(t *testing.T, r *response, status int, code string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if m := r.JSON(t); m["error"] != code {
		t.Fatalf("error %v, want %q: %s", m["error"], code, r.Body)
	}
}
