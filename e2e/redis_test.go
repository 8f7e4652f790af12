package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// startRedis runs a private redis-server on a free loopback port.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (.ci/run installs it)")
	}
	port := freePort(t)
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "redis://" + addr + "/0"
		}
	}
	t.Fatal("redis-server did not start")
	return ""
}

// Two replicas sharing Redis share one token-endpoint budget per client:
// 30 requests spread over both pass, the 31st is refused by either.
func TestRateLimitsSharedThroughRedis(t *testing.T) {
	redisURL := startRedis(t)
	secret := randomString()
	common := []string{"IDENTITYD_RATE_LIMITS=on", "IDENTITYD_REDIS_URL=" + redisURL,
		"IDENTITYD_ADMIN_CLIENT_ID=shared-admin", "IDENTITYD_ADMIN_CLIENT_SECRET=" + secret}
	a := start(t, dbtest.URLs(t)["sqlite"], common...)
	b := start(t, dbtest.URLs(t)["sqlite"], common...)

	grant := func(s *server) *response {
		return s.do(http.MethodPost, "/api/v1/oauth/token", url.Values{
			"grant_type": {"client_credentials"}, "client_id": {"shared-admin"}, "client_secret": {secret}})
	}
	for i := range 30 {
		s := a
		if i%2 == 1 {
			s = b
		}
		if r := grant(s); r.Status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i+1, r.Status, r.Body)
		}
	}
	for _, s := range []*server{a, b} {
		r := grant(s)
		expectRateLimited(t, r)
		if r.Header.Get("Retry-After") == "" || r.Header.Get("X-RateLimit-Remaining") != "0" || r.Header.Get("X-RateLimit-Limit") != "30" {
			t.Fatalf("headers %v", r.Header)
		}
	}
}
