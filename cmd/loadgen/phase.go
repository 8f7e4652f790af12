package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// maxSamples bounds the latency samples kept per phase (32 MB); requests
// beyond it are still counted, and percentiles come from the first ones.
const maxSamples = 4 << 20

type phaseResult struct {
	name           string
	ok, errs       uint64
	rate           float64 // successful requests per second
	p50, p99, peak time.Duration
	// CPU used during the measured window, in % of one core (-1: unknown).
	// On a shared machine this shows whether loadgen competes with the server.
	serverCPU, selfCPU float64
	// window is the time measured: cfg.duration, or less when the phase's
	// pool ran out (errPoolEmpty).
	window time.Duration
}

// errPoolEmpty, answered by an op, ends its worker cleanly: the phase uses
// single-use things made before it (e-mailed codes, authorization codes)
// and has none left. The measured window then ends when the last worker has
// stopped, and the rate is over that shorter window. A pool that runs out
// during the warm-up fails the phase.
var errPoolEmpty = errors.New("pool empty")

// runPhase runs op from cfg.concurrency workers for cfg.warmup (not counted)
// and then cfg.duration. A request counts if it completes inside the measured
// window. n is a phase-wide sequence number for round-robin selection. The
// phase fails if more than 1% of measured requests fail. serverPID is
// sampled for CPU use.
func runPhase(parent context.Context, name string, cfg config, serverPID int, op func(ctx context.Context, n uint64) error) (phaseResult, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	start := time.Now().Add(cfg.warmup)
	end := start.Add(cfg.duration)
	var (
		seq, okN, errN atomic.Uint64
		drained        atomic.Bool // some op answered errPoolEmpty
		firstErr       error
		errOnce        sync.Once
		wg             sync.WaitGroup
	)
	cpu, stopped := make(chan [2]float64, 1), make(chan struct{})
	go func() { cpu <- sampleCPU(ctx, serverPID, start, end, stopped) }()
	lat := make([][]time.Duration, cfg.concurrency)
	perWorker := maxSamples / cfg.concurrency
	for w := range cfg.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				err := op(ctx, seq.Add(1)-1)
				t1 := time.Now()
				if errors.Is(err, errPoolEmpty) {
					drained.Store(true)
					return
				}
				switch {
				case t1.After(end):
					return
				case ctx.Err() != nil:
					return // interrupted or aborted: not the server's failure
				case t1.Before(start):
					continue // warm-up
				case err != nil:
					errOnce.Do(func() { firstErr = err })
					// Give up early rather than hammer a failing server for the whole phase.
					if e := errN.Add(1); e > 100 && e*100 > e+okN.Load() {
						cancel()
					}
				default:
					okN.Add(1)
					if len(lat[w]) < perWorker {
						lat[w] = append(lat[w], t1.Sub(t0))
					}
				}
			}
		})
	}
	wg.Wait()
	finished := time.Now()
	close(stopped)
	if err := parent.Err(); err != nil {
		return phaseResult{}, fmt.Errorf("%s phase interrupted: %w", name, err)
	}
	r := phaseResult{name: name, ok: okN.Load(), errs: errN.Load(), window: cfg.duration}
	if drained.Load() && finished.Before(end) {
		if !finished.After(start) {
			return r, fmt.Errorf("%s: the pool ran out during the warm-up", name)
		}
		r.window = finished.Sub(start)
	}
	if total := r.ok + r.errs; r.errs*100 > total || r.ok == 0 {
		return r, fmt.Errorf("%s: %d of %d requests failed (more than 1%%); first error: %v", name, r.errs, total, firstErr)
	}
	c := <-cpu
	r.serverCPU, r.selfCPU = c[0], c[1]
	all := slices.Concat(lat...)
	slices.Sort(all)
	r.rate = float64(r.ok) / r.window.Seconds()
	r.p50, r.p99, r.peak = percentile(all, 0.50), percentile(all, 0.99), all[len(all)-1]
	return r, nil
}

// percentile uses the nearest-rank method on sorted samples.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// sampleCPU measures the server's and loadgen's CPU use between start and
// end, or until stopped is closed if that comes first.
func sampleCPU(ctx context.Context, pid int, start, end time.Time, stopped <-chan struct{}) [2]float64 {
	sample := func() (s, l time.Duration, err error) {
		s, err1 := procCPU(strconv.Itoa(pid))
		l, err2 := procCPU("self")
		return s, l, errors.Join(err1, err2)
	}
	unknown := [2]float64{-1, -1}
	select {
	case <-ctx.Done():
		return unknown
	case <-time.After(time.Until(start)):
	}
	s0, l0, err := sample()
	if err != nil {
		return unknown
	}
	select {
	case <-ctx.Done():
		return unknown
	case <-time.After(time.Until(end)):
	case <-stopped:
	}
	s1, l1, err := sample()
	if err != nil {
		return unknown
	}
	window := end.Sub(start)
	if at := time.Now(); at.Before(end) {
		window = at.Sub(start) // stopped early
	}
	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / window.Seconds() }
	return [2]float64{pct(s1 - s0), pct(l1 - l0)}
}
