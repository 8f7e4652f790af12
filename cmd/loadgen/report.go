package main

import (
	"bufio"
	"debug/buildinfo"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

type machine struct {
	cpu               string
	nproc, gomaxprocs int
	goVersion         string
}

// machineInfo describes where the figures were measured. The Go version is
// the server binary's (what was measured), falling back to loadgen's own.
func machineInfo(serverBin string) machine {
	m := machine{cpu: "unknown", nproc: runtime.NumCPU(), gomaxprocs: runtime.GOMAXPROCS(0), goVersion: runtime.Version()}
	if bi, err := buildinfo.ReadFile(serverBin); err == nil {
		m.goVersion = bi.GoVersion
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

type report struct {
	cfg config
	db  string
	machineResults
	people   peopleResults
	hitl     hitlResults
	webhooks webhookResults
	authz    authzResults
	apiKeys  apiKeyResults
	kill     []time.Duration // kill propagation between replicas (PostgreSQL)
	rssMB    float64
	machine  machine
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func (r report) print(w io.Writer) {
	m := r.machine
	fmt.Fprintf(w, "identityd benchmark: %s, %d clients, %d service accounts and as many agents, %s per phase after %s warm-up\n",
		r.db, r.cfg.concurrency, r.cfg.accounts, r.cfg.duration, r.cfg.warmup)
	// The server sets its own GOMAXPROCS (one more than the CPUs on SQLite)
	// and logs it at start; this one is the load generator's.
	fmt.Fprintf(w, "machine: %s, nproc %d, %s; loadgen's GOMAXPROCS %d\n", m.cpu, m.nproc, m.goVersion, m.gomaxprocs)
	pp := r.people
	em := pp.embedded
	for _, p := range []phaseResult{r.grants, r.detailGrants, r.agentGrants, r.exchanges, r.intro, pp.codeRS256, pp.codeES256, pp.refresh, pp.refreshID, pp.jwtTokens, pp.signIns, em.verify, em.exchange, pp.passkeys.embedded, pp.passkeys.tokens, r.hitl.requests, r.hitl.decisions, r.authz.direct, r.authz.threeHop, r.apiKeys.validations} {
		if p.name == "" { // not run (-phases)
			continue
		}
		short := ""
		if p.window > 0 && p.window < r.cfg.duration {
			short = fmt.Sprintf("  (pool empty: measured %.1fs)", p.window.Seconds())
		}
		fmt.Fprintf(w, "  %-23s %9.0f req/s  p50 %s  p99 %s  max %s  errors %d of %d  CPU server %.0f%%, loadgen %.0f%%%s\n",
			p.name, p.rate, ms(p.p50), ms(p.p99), ms(p.peak), p.errs, p.ok+p.errs, p.serverCPU, p.selfCPU, short)
	}
	if em.verify.name != "" {
		em.print(w)
	}
	if pp.argonRate > 0 {
		fmt.Fprintf(w, "  raw argon2id on this machine: %.1f hashes/s; password sign-ins reach %.0f%% of it\n", pp.argonRate, 100*pp.signIns.rate/pp.argonRate)
	}
	if len(r.hitl.release) > 0 {
		k := slices.Clone(r.hitl.release)
		slices.Sort(k)
		fmt.Fprintf(w, "  HITL sync wait released on another replica over %d decisions: p50 %s  p99 %s  max %s\n",
			len(k), ms(k[len(k)/2]), ms(k[(len(k)*99)/100]), ms(k[len(k)-1]))
	}
	if len(r.webhooks.latencies) > 0 {
		k := slices.Clone(r.webhooks.latencies)
		slices.Sort(k)
		fmt.Fprintf(w, "  webhooks, event to delivery at %d events/s over %d events: p50 %s  p99 %s  max %s\n",
			r.webhooks.rate, r.webhooks.sent, ms(k[len(k)/2]), ms(k[(len(k)*99)/100]), ms(k[len(k)-1]))
	}
	if len(r.kill) > 0 {
		k := slices.Clone(r.kill)
		slices.Sort(k)
		fmt.Fprintf(w, "  kill propagation between replicas over %d kills: p50 %s  p99 %s  max %s\n",
			len(k), ms(k[len(k)/2]), ms(k[(len(k)*99)/100]), ms(k[len(k)-1]))
	}
	fmt.Fprintf(w, "  server peak RSS %.1f MB\n", r.rssMB)
}

const tableHeader = "| date | db | grants/s | grants p50 | grants p99 | grants with details/s | details p99 | agent grants/s | agent p99 | exchanges/s | exchange p99 | introspections/s | intro p50 | intro p99 | peak RSS MB |\n" +
	"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"

// appendRow appends one Markdown table row, writing the header first if the
// file is new or empty.
func (r report) appendRow(path string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		_, _ = io.WriteString(f, tableHeader)
	}
	_, err = fmt.Fprintf(f, "| %s | %s | %.0f | %s | %s | %.0f | %s | %.0f | %s | %.0f | %s | %.0f | %s | %s | %.0f |\n",
		time.Now().UTC().Format("2006-01-02"), r.db,
		r.grants.rate, ms(r.grants.p50), ms(r.grants.p99), r.detailGrants.rate, ms(r.detailGrants.p99), r.agentGrants.rate, ms(r.agentGrants.p99),
		r.exchanges.rate, ms(r.exchanges.p99), r.intro.rate, ms(r.intro.p50), ms(r.intro.p99), r.rssMB)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
