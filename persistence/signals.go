package persistence

import (
	"strings"
	"sync"
)

// Signals let a request wait for a change committed by another (a HITL
// decision releasing an agent's sync wait). They ride the evictions: a
// change names evictSignal+key among the records it makes stale; after its
// commit this process raises it, and with PostgreSQL every other replica
// hears it through the same NOTIFY that carries evictions (cache.go), so
// a wait on any replica ends within milliseconds. A lost message costs
// only speed: waiters read the record again when their bound runs out.
// Signals need no commit wait (no replica caches what they announce).
const evictSignal = "signal:"

type signals struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// Await returns a channel closed when key is next raised, and a function
// to stop waiting. Call it before reading the state waited on: a change
// committed between the read and the wait is then not missed.
func (s *Store) Await(key string) (<-chan struct{}, func()) {
	g := &s.signals
	ch := make(chan struct{})
	g.mu.Lock()
	if g.waiters == nil {
		g.waiters = map[string]map[chan struct{}]struct{}{}
	}
	if g.waiters[key] == nil {
		g.waiters[key] = map[chan struct{}]struct{}{}
	}
	g.waiters[key][ch] = struct{}{}
	g.mu.Unlock()
	return ch, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if w, ok := g.waiters[key]; ok {
			delete(w, ch)
			if len(w) == 0 {
				delete(g.waiters, key)
			}
		}
	}
}

// raise wakes the waiters of the signals among evictions.
func (g *signals) raise(evictions ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range evictions {
		key, ok := strings.CutPrefix(k, evictSignal)
		if !ok {
			continue
		}
		for ch := range g.waiters[key] {
			close(ch)
		}
		delete(g.waiters, key)
	}
}

// needsLease tells whether an eviction is of a record other replicas may
// cache (so the commit waits out their lease), not a signal.
func needsLease(evictions []string) bool {
	for _, k := range evictions {
		if !strings.HasPrefix(k, evictSignal) {
			return true
		}
	}
	return false
}
