package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Helpers shared by the service-account, OAuth and server scenarios.

// as is s answering to another (sub)test: s.do then fails that test.
func (s *server) as(t *testing.T) *server {
	c := *s
	c.t = t
	return &c
}

// basic is the Authorization header of client_secret_basic (RFC 6749
// §2.3.1: both halves form-encoded first).
func basic(clientID, secret string) []string {
	raw := url.QueryEscape(clientID) + ":" + url.QueryEscape(secret)
	return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte(raw))}
}

// post is client_secret_post: the credentials as form values.
func post(form url.Values, clientID, secret string) url.Values {
	out := url.Values{}
	for k, v := range form {
		out[k] = slices.Clone(v)
	}
	out.Set("client_id", clientID)
	out.Set("client_secret", secret)
	return out
}

func ccForm(scope string) url.Values {
	f := url.Values{"grant_type": {"client_credentials"}}
	if scope != "" {
		f.Set("scope", scope)
	}
	return f
}

// tokenResponse is a successful token-endpoint answer.
type tokenResponse struct {
	AccessToken string  `json:"access_token"`
	TokenType   string  `json:"token_type"`
	ExpiresIn   float64 `json:"expires_in"`
	Scope       string  `json:"scope"`
}

func decodeToken(t *testing.T, r *response) tokenResponse {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("token endpoint: %d %s", r.Status, r.Body)
	}
	var tr tokenResponse
	if err := json.Unmarshal(r.Body, &tr); err != nil || tr.AccessToken == "" {
		t.Fatalf("token response %s: %v", r.Body, err)
	}
	return tr
}

// introspect asks about token as the client id/secret (HTTP Basic) and
// returns the 200 answer.
func (s *server) introspect(t *testing.T, token, clientID, secret string) map[string]any {
	t.Helper()
	r := s.as(t).do(http.MethodPost, "/api/v1/oauth/introspect", url.Values{"token": {token}}, basic(clientID, secret)...)
	if r.Status != http.StatusOK {
		t.Fatalf("introspect: %d %s", r.Status, r.Body)
	}
	return r.JSON(t)
}

// expectInactive checks the exact RFC 7662 answer for a token the caller
// may not know about: {"active":false} and nothing else.
func expectInactive(t *testing.T, m map[string]any) {
	t.Helper()
	if len(m) != 1 || m["active"] != false {
		t.Fatalf("want exactly {\"active\":false}, got %v", m)
	}
}

func expectActive(t *testing.T, m map[string]any, clientID string) {
	t.Helper()
	if m["active"] != true || m["client_id"] != clientID {
		t.Fatalf("want active token of %s, got %v", clientID, m)
	}
}

// expectRFC6749 checks an OAuth endpoint's error: status, error code, and
// the RFC 6749 §5.2 shape (error_description, not the API envelope).
func expectRFC6749(t *testing.T, r *response, status int, code string) {
	t.Helper()
	expectOAuthError(t, r, status, code)
	m := r.JSON(t)
	if d, _ := m["error_description"].(string); d == "" {
		t.Fatalf("RFC 6749 error without error_description: %s", r.Body)
	}
	if _, ok := m["message"]; ok {
		t.Fatalf("OAuth endpoint answered the API envelope instead of an RFC 6749 error: %s", r.Body)
	}
}

// exactKeys checks that m has exactly these members.
func exactKeys(t *testing.T, m map[string]any, keys ...string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(keys))
	if !slices.Equal(got, want) {
		t.Fatalf("members %v, want %v", got, want)
	}
}

// isoZ parses an ISO 8601 UTC time written with Z.
func isoZ(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	if !strings.HasSuffix(s, "Z") {
		t.Fatalf("time %v is not ISO 8601 UTC with Z", v)
	}
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return tm
}

func strs(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// send is a request from a goroutine other than the test's: it returns
// errors instead of failing the test.
func send(method, rawURL string, body io.Reader, headers ...string) (*response, error) {
	req, err := http.NewRequest(method, rawURL, body)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// raw sends a request over its own TCP connection, writing the body while
// it reads the answer, so that a server that answers before it has read a
// large body is seen as it answers (no broken pipe in between). chunked
// sends the body without Content-Length.
func (s *server) raw(t *testing.T, method, path string, body []byte, chunked bool, headers ...string) *response {
	t.Helper()
	u, _ := url.Parse(s.URL)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	req, _ := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if chunked {
		req.ContentLength = -1
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.TransferEncoding = []string{"chunked"}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	go func() { _ = req.Write(conn) }() // a write error is fine: the answer counts
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrape reads /metrics and parses its samples.
func (s *server) scrape(t *testing.T) ([]sample, string) {
	t.Helper()
	r := s.as(t).do(http.MethodGet, "/metrics", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", r.Status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("/metrics Content-Type %q, want the Prometheus text format", ct)
	}
	var out []sample
	for line := range strings.SplitSeq(string(r.Body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("not a Prometheus sample line: %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("sample value in %q: %v", line, err)
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[p[1]] = p[2]
		}
		out = append(out, sample{name: m[1], labels: labels, value: v})
	}
	return out, string(r.Body)
}

// value is the sample with this name whose labels include want (0 when
// there is none).
func value(samples []sample, name string, want map[string]string) float64 {
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range want {
			if s.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			return s.value
		}
	}
	return 0
}

func describe(r *response) string { return fmt.Sprintf("%d %s", r.Status, r.Body) }

// startLogged is start, and on failure the test's output ends with the
// server's log (the tail of it), for the cause of a 500 or a refusal.
func startLogged(t *testing.T, dbURL string, extra ...string) *server {
	t.Helper()
	return logged(t, start(t, dbURL, extra...))
}

// sibling starts another server on s's database (a replica, or the same
// deployment after a crash), its log shown when the test fails.
func (s *server) sibling(t *testing.T, extra ...string) *server {
	t.Helper()
	return logged(t, startOn(t, s.DB, extra...))
}

// logged shows s's log when the test fails.
func logged(t *testing.T, s *server) *server {
	t.Cleanup(func() {
		if t.Failed() {
			time.Sleep(100 * time.Millisecond) // the log pipe lags a little
			l := s.logs.String()
			if len(l) > 20000 {
				l = "…" + l[len(l)-20000:]
			}
			t.Logf("identityd log:\n%s", l)
		}
	})
	return s
}

// waitLog waits until the server's log holds want (the log pipe lags).
func (s *server) waitLog(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("log never showed %q:\n%s", want, s.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// actorOf is the client id of an audit entry's structured actor ({"sub",
// "clientId", ...}); "" when the entry has none.
func actorOf(entry map[string]any) string {
	a, _ := entry["actor"].(map[string]any)
	id, _ := a["clientId"].(string)
	return id
}

// runBrowserSuite runs a Node browser suite (e2e/node/script, one test at
// a time) with env added to this process's, and fails t unless every test
// ran and passed. With IDENTITYD_SCREENS=1 (make screens) the SQLite run
// also gets SCREENS_DIR, docs/screens, for the suites that photograph
// their pages.
func runBrowserSuite(t *testing.T, dbURL, script string, env ...string) {
	t.Helper()
	if os.Getenv("IDENTITYD_SCREENS") == "1" && strings.HasPrefix(dbURL, "sqlite") {
		screens, err := filepath.Abs("../docs/screens")
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, "SCREENS_DIR="+screens)
	}
	cmd := exec.Command("node", "--test", "--test-concurrency=1", script)
	cmd.Dir = "node"
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "# fail 0") || strings.Contains(string(out), "# pass 0") {
		t.Fatalf("browser suite %s failed: %v\n%s", script, err, out)
	}
}

// needBrowser fails t unless node and Debian's chromium are there: the
// browser suites run on both.
func needBrowser(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is required for the end-to-end suite")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("Debian's chromium is required at %s (apt-get install chromium)", chromiumPath)
	}
}
