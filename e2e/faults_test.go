package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Faults: what clients are told while storage fails, and how a server
// stops. Storage failing is never an answer about the request: 503
// temporarily_unavailable (with Retry-After), nothing refused on any audit
// trail, and everything works again once storage is back.

// pgCluster is a PostgreSQL server of the test's own, which it may stop
// and start: the shared TEST_DATABASE_URL server must not be touched.
type pgCluster struct {
	t        *testing.T
	bin, dir string
	port     int
	asUser   []string // runuser prefix when running as root (initdb refuses root)
}

func startPostgres(t *testing.T) *pgCluster {
	t.Helper()
	if os.Getenv("TEST_DATABASE_URL") == "" {
		t.Skip("TEST_DATABASE_URL is not set; PostgreSQL fault tests are skipped")
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		t.Fatal("TEST_DATABASE_URL is set but no PostgreSQL server binaries are installed (/usr/lib/postgresql/*/bin)")
	}
	sort.Strings(bins)
	dir, err := os.MkdirTemp("", "identityd-e2e-pg-") // not t.TempDir: its parent is closed to the postgres user
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &pgCluster{t: t, bin: filepath.Dir(bins[len(bins)-1]), dir: dir, port: freePort(t)}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal("running as root needs the postgres user:", err)
		}
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
		c.run("chown", "-R", pg.Uid+":"+pg.Gid, c.dir) // as root, before the rest runs as postgres
	}
	c.run(filepath.Join(c.bin, "initdb"), "-D", c.dir+"/data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
	c.start()
	t.Cleanup(func() { _ = c.ctl("stop", "-m", "immediate") })
	c.run(filepath.Join(c.bin, "createdb"), "-h", "127.0.0.1", "-p", fmt.Sprint(c.port), "-U", "postgres", "identityd")
	return c
}

func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/identityd?sslmode=disable", c.port)
}

func (c *pgCluster) run(name string, args ...string) {
	c.t.Helper()
	if name != "chown" {
		args = append([]string{name}, args...)
		name, args = c.prefix(args)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func (c *pgCluster) prefix(args []string) (string, []string) {
	all := append(append([]string{}, c.asUser...), args...)
	return all[0], all[1:]
}

func (c *pgCluster) ctl(args ...string) error {
	name, all := c.prefix(append([]string{filepath.Join(c.bin, "pg_ctl"), "-D", c.dir + "/data", "-w", "-t", "60"}, args...))
	cmd := exec.Command(name, all...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %v: %v\n%s", args, err, out)
	}
	return nil
}

func (c *pgCluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off", c.port, c.dir)
	if err := c.ctl("-l", c.dir+"/log", "-o", opts, "start"); err != nil {
		c.t.Fatal(err)
	}
}

func (c *pgCluster) stop() {
	c.t.Helper()
	if err := c.ctl("stop", "-m", "immediate"); err != nil {
		c.t.Fatal(err)
	}
}

// expectUnavailable checks an answer given while storage fails: 503, the
// error code in the endpoint's shape, and Retry-After.
func expectUnavailable(t *testing.T, what string, r *response) {
	t.Helper()
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("%s while storage fails: %s (Retry-After %q), want 503 with Retry-After", what, describe(r), r.Header.Get("Retry-After"))
	}
	if m := r.JSON(t); m["error"] != "temporarily_unavailable" {
		t.Fatalf("%s while storage fails: error %v, want temporarily_unavailable", what, m["error"])
	}
}

// awaitHealth polls /health until it answers want.
func (s *server) awaitHealth(t *testing.T, want int) *response {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := s.do(http.MethodGet, "/health", nil)
		if r.Status == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health never answered %d: %s", want, describe(r))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// While PostgreSQL is down, clients with the right credentials are told
// to retry, not that their credentials or tokens are bad; agents get no
// false refusals on their trails; and all is well once it is back.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	pg := startPostgres(t)
	s := logged(t, startOn(t, pg.URL()))
	super := s.superToken()
	acct := s.createAccount(super, map[string]any{"name": "steady", "scopes": []string{"users:read"}})
	ag := s.createAgent(super, map[string]any{"name": "steady-agent", "type": "service", "capabilities": []string{"read_users"}})
	tok := s.token(acct.ClientID, acct.ClientSecret, "")
	agentTok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken

	pg.stop()
	time.Sleep(time.Second) // past the cache leases (500 ms): every answer below needs the database
	expectUnavailable(t, "a grant", s.do(http.MethodPost, tokenPath, ccForm(""), basic(acct.ClientID, acct.ClientSecret)...))
	expectUnavailable(t, "an agent's grant", s.agentToken(ag.ClientID, ag.ClientSecret, ""))
	expectUnavailable(t, "a grant with the secret in the body", s.do(http.MethodPost, tokenPath, post(ccForm(""), acct.ClientID, acct.ClientSecret)))
	expectUnavailable(t, "introspection", s.do(http.MethodPost, introspectPath, url.Values{"token": {tok}}, basic(acct.ClientID, acct.ClientSecret)...))
	expectUnavailable(t, "revocation", s.do(http.MethodPost, revokePath, url.Values{"token": {tok}}, basic(acct.ClientID, acct.ClientSecret)...))
	expectUnavailable(t, "a bearer call", s.do(http.MethodGet, whoamiPath, nil, bearer(tok)...))
	expectUnavailable(t, "an agent's bearer call", s.do(http.MethodGet, whoamiPath, nil, bearer(agentTok)...))
	if h := s.do(http.MethodGet, "/health", nil); h.Status != http.StatusServiceUnavailable || h.JSON(t)["checks"].(map[string]any)["database"] != "unavailable" {
		t.Fatalf("health while the database is down: %s", describe(h))
	}

	pg.start()
	s.awaitHealth(t, http.StatusOK)
	expectActive(t, s.introspect(t, tok, acct.ClientID, acct.ClientSecret), acct.ClientID)
	mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(agentTok)...))
	s.token(acct.ClientID, acct.ClientSecret, "")
	if _, n := intentAudit(t, s, super, ag.ID, "action=token_refused"); n != 0 {
		t.Fatalf("the outage put %d refusals on the agent's trail", n)
	}
}

// fullVolume is a small tmpfs for one test's SQLite database, and a file
// that fills it.
type fullVolume struct {
	t   *testing.T
	dir string
}

func mountVolume(t *testing.T, size string) *fullVolume {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small volume here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return &fullVolume{t: t, dir: dir}
}

// fill writes until the volume is full.
func (v *fullVolume) fill() {
	f, err := os.Create(filepath.Join(v.dir, "filler"))
	if err != nil {
		v.t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{0}, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			v.t.Fatal(err)
		}
	}
}

func (v *fullVolume) free() {
	if err := os.Remove(filepath.Join(v.dir, "filler")); err != nil {
		v.t.Fatal(err)
	}
}

// On a full disk: grants and writes answer 503 (never 500), /health says
// writes fail, an agent's calls are refused rather than served unaudited,
// and all is well once there is room again.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	vol := mountVolume(t, "12m")
	s := logged(t, startOn(t, "sqlite://"+filepath.Join(vol.dir, "identityd.db")))
	super := s.superToken()
	acct := s.createAccount(super, map[string]any{"name": "filler", "scopes": []string{"users:read"}})
	ag := s.createAgent(super, map[string]any{"name": "writer", "type": "service", "capabilities": []string{"read_users", "write_users"}})
	if r := s.changeTrust(super, ag.ID, "registered", "writes users"); r.Status != http.StatusOK {
		t.Fatal(describe(r))
	}
	agentTok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken
	mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(agentTok)...))

	vol.fill()
	// The write-ahead log may hold a little room: grants succeed until it
	// is used, then every one is refused as unavailable, none as an error.
	refused := false
	for i := 0; i < 5000 && !refused; i++ {
		r := s.do(http.MethodPost, tokenPath, ccForm(""), basic(acct.ClientID, acct.ClientSecret)...)
		switch r.Status {
		case http.StatusOK:
		case http.StatusServiceUnavailable:
			expectUnavailable(t, "a grant on a full disk", r)
			refused = true
		default:
			t.Fatalf("grant %d on a full disk: %s", i, describe(r))
		}
	}
	if !refused {
		t.Fatal("5000 grants on a full volume all succeeded")
	}
	if h := s.do(http.MethodGet, "/health", nil); h.Status != http.StatusServiceUnavailable || !strings.HasPrefix(h.JSON(t)["checks"].(map[string]any)["writes"].(string), "failing") {
		t.Fatalf("health on a full disk: %s", describe(h))
	}
	// A full volume fails a write that needs room, not every write: one
	// that fits in the log's free pages still commits (and is then answered
	// and audited). So each kind of call below is repeated until storage
	// refuses it, and what was served before that is counted, not assumed
	// away: the rule under test is that an answer is given only for what
	// was committed.
	adminWrites := untilRefused(t, "an admin write", func(i int) *response {
		return s.do(http.MethodPost, saPath, map[string]any{"name": fmt.Sprintf("later-%d", i)}, bearer(super)...)
	})
	// The agent's calls: refused, their effect not made.
	audited := 1 // the read before the volume filled
	audited += untilRefused(t, "an agent's read", func(int) *response {
		return s.do(http.MethodGet, whoamiPath, nil, bearer(agentTok)...)
	})
	var made []string
	audited += untilRefused(t, "an agent's write", func(i int) *response {
		email := fmt.Sprintf("unaudited-%d@example.com", i)
		r := s.do(http.MethodPost, "/api/v1/m2m/users", map[string]any{"email": email}, bearer(agentTok)...)
		if r.Status != http.StatusServiceUnavailable {
			made = append(made, email)
		}
		return r
	})
	refusedEmail := fmt.Sprintf("unaudited-%d@example.com", len(made))
	t.Logf("served on the full volume before a refusal: %d admin writes, %d agent calls", adminWrites, audited-1)

	vol.free()
	s.awaitHealth(t, http.StatusOK)
	s.token(acct.ClientID, acct.ClientSecret, "")
	mustOK(t, s.do(http.MethodGet, whoamiPath, nil, bearer(agentTok)...))
	audited++
	if m := mustOK(t, s.do(http.MethodGet, "/api/v1/m2m/users?email="+url.QueryEscape(refusedEmail), nil, bearer(super)...)); m["total"] != float64(0) {
		t.Fatalf("the refused agent write made a user: %v", m)
	}
	for _, email := range made {
		if m := mustOK(t, s.do(http.MethodGet, "/api/v1/m2m/users?email="+url.QueryEscape(email), nil, bearer(super)...)); m["total"] != float64(1) {
			t.Fatalf("an agent write answered 201 on the full disk left no user %s: %v", email, m)
		}
	}
	// The trail has the calls that were answered, and only those.
	entries, _ := intentAwaitAudit(t, s, super, ag.ID, "action=api_call", audited)
	for _, e := range entries {
		if e["status"] != float64(http.StatusOK) && e["status"] != float64(http.StatusCreated) {
			t.Fatalf("an api_call entry for a call not served: %v", e)
		}
	}
	if len(entries) != audited {
		t.Fatalf("api_call entries %d, want the %d calls served", len(entries), audited)
	}
}

// untilRefused makes call until storage refuses it (503 with Retry-After,
// temporarily_unavailable), at most 500 times, and returns how many were
// served before that; any answer but a success or that refusal fails.
func untilRefused(t *testing.T, what string, call func(i int) *response) (served int) {
	t.Helper()
	for i := range 500 {
		r := call(i)
		switch {
		case r.Status == http.StatusServiceUnavailable:
			expectUnavailable(t, what, r)
			return served
		case r.Status >= 200 && r.Status < 300:
			served++
		default:
			t.Fatalf("%s on a full disk: %s", what, describe(r))
		}
	}
	t.Fatalf("%s: 500 on a full volume all succeeded", what)
	return served
}

// SIGTERM drains: every request sent on a kept-alive connection gets its
// answer (during the grace period each answer closes its connection), and
// a client ends only on a connection the closing listener never served.
func TestShutdownDrains(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"], "IDENTITYD_SHUTDOWN_GRACE=2")
	acct := s.createAccount(s.adminToken(), map[string]any{"name": "drained", "scopes": []string{"users:read"}})
	tok := s.token(acct.ClientID, acct.ClientSecret, "")
	body := url.Values{"token": {tok}}.Encode()

	var served atomic.Int64
	var mu sync.Mutex
	var failures []string
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			// One kept-alive connection per client; POST, which net/http
			// never retries, so a reset would show.
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for ctx.Err() == nil {
				var reused bool
				trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, s.URL+introspectPath, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.SetBasicAuth(acct.ClientID, acct.ClientSecret)
				resp, err := client.Do(req)
				switch {
				case err == nil:
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("status %d", resp.StatusCode))
						mu.Unlock()
					}
					served.Add(1)
				case !reused:
					// Refused, or a connection the kernel had queued when
					// the listener closed: the server never read it.
					return
				default:
					mu.Lock()
					failures = append(failures, "on a kept-alive connection: "+err.Error())
					mu.Unlock()
					return
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := s.awaitHealth(t, http.StatusServiceUnavailable); r.JSON(t)["status"] != "draining" {
		t.Errorf("health while draining: %s", describe(r))
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed while the server stopped (%d served): %v", len(failures), served.Load(), failures[:min(len(failures), 5)])
	}
	select {
	case <-s.exited:
		if s.waitErr != nil {
			t.Fatalf("exit: %v", s.waitErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30 s after SIGTERM")
	}
}
