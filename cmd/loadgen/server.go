package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is the identityd child process under test.
type server struct {
	cmd      *exec.Cmd
	base     string
	done     chan struct{} // closed once the process has been reaped
	waitErr  error         // cmd.Wait's result, valid after done
	stopOnce sync.Once
}

// startServer runs `bin serve` on a free loopback port with a fresh
// configuration and returns once GET /health answers 200.
// Replicas of one database must share systemSecret. env is added last.
func startServer(ctx context.Context, bin, dbURL, adminID, adminSecret, systemSecret string, env ...string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	// Not exec.CommandContext: on cancellation we want a graceful SIGTERM, not SIGKILL.
	cmd := exec.Command(bin, "serve")
	// Appended values win over any IDENTITYD_* the caller has exported.
	cmd.Env = append(os.Environ(),
		"IDENTITYD_ADDR="+addr,
		"IDENTITYD_ISSUER=http://"+addr,
		"IDENTITYD_DATABASE_URL="+dbURL,
		"IDENTITYD_ADMIN_CLIENT_ID="+adminID,
		"IDENTITYD_ADMIN_CLIENT_SECRET="+adminSecret,
		"IDENTITYD_RATE_LIMITS=off",
		// Every benchmark sign-in is a new browser, and so a new device
		// (a step-up); a person's own device stays known.
		"IDENTITYD_RISK_DISABLED=new_device",
		"IDENTITYD_LOG_LEVEL=error",
		"IDENTITYD_SYSTEM_SECRET="+systemSecret,
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	s := &server{cmd: cmd, base: "http://" + addr, done: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.done) }()
	if err := s.waitHealthy(ctx, 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *server) waitHealthy(ctx context.Context, timeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	deadline := time.After(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return fmt.Errorf("server exited before becoming healthy: %v", s.waitErr)
		case <-deadline:
			return fmt.Errorf("server not healthy at %s/health after %s", s.base, timeout)
		case <-tick.C:
			if resp, err := hc.Get(s.base + "/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
	}
}

// stop asks the server to shut down gracefully and kills it if it has not
// exited after 15s. Safe to call more than once.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		select {
		case <-s.done:
			return
		default:
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			fmt.Fprintln(os.Stderr, "loadgen: server ignored SIGTERM for 15s; killing it")
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// freeAddr asks the kernel for an unused loopback port. The port is released
// before the server binds it; the race is harmless on a benchmark machine.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// peakRSSMB reads the process's high-water resident set size (VmHWM).
func peakRSSMB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// procCPU returns the user+system CPU time of a process ("self" or a pid)
// from /proc/<pid>/stat, assuming the near-universal USER_HZ of 100.
func procCPU(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name start at field 3 (state);
	// utime and stime are fields 14 and 15.
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * (time.Second / 100), nil
}
