package risk

import (
	"container/list"
	"hash/maphash"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// Velocity is counted in this process's memory, not in the database: a
// failed sign-in is what an attacker makes as many of as they like, and a
// write for each would hand them the database's writer (SQLite has one).
// The count is a signal that asks for a second factor, not a lock-out, so
// what memory loses is cheap: a restart forgets it, and replicas each count
// their own (behind a balancer spreading one address over n replicas, a
// spray is seen after about n times the failures). The per-address rate
// limits (handlers/ratelimit.go), shared through Redis, stay the hard bound.
//
// Memory is bounded twice: at most maxAddresses addresses, the least
// recently failing forgotten first, and for each its last ringSize
// failures (some 10 MB when full). An address failing faster than ringSize
// per window is counted among its last ringSize failures, which is all
// velocity needs.
const (
	maxAddresses = 16384
	ringSize     = 16
)

// failures are the recent sign-in failures of each address.
type failures struct {
	mu     sync.Mutex
	max    int
	byAddr map[netip.Addr]*list.Element // of *addrFailures
	order  *list.List                   // most recently failing first
	seed   maphash.Seed
}

type addrFailures struct {
	addr   netip.Addr
	recent [ringSize]failure
	next   int // where the next failure goes in recent
}

// failure keeps a 64-bit hash of the e-mail, not the address itself: all
// velocity asks is whether two are the same.
type failure struct {
	at    time.Time
	email uint64
}

func newFailures(maxAddrs int) *failures {
	return &failures{max: maxAddrs, byAddr: map[netip.Addr]*list.Element{}, order: list.New(), seed: maphash.MakeSeed()}
}

// addrKey is what failures are counted by: an IPv4 address, or an IPv6
// address's /64 (one host or home is given a /64 and can use all of it);
// as the per-address rate limits count.
func addrKey(ip netip.Addr) (netip.Addr, bool) {
	if !ip.IsValid() {
		return netip.Addr{}, false
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return ip, true
}

func (f *failures) emailHash(email string) uint64 {
	return maphash.String(f.seed, strings.ToLower(strings.TrimSpace(email)))
}

func (f *failures) add(ip netip.Addr, email string, at time.Time) {
	key, ok := addrKey(ip)
	if !ok {
		return
	}
	h := f.emailHash(email)
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.byAddr[key]
	if ok {
		f.order.MoveToFront(e)
	} else {
		if f.order.Len() >= f.max {
			oldest := f.order.Back()
			delete(f.byAddr, oldest.Value.(*addrFailures).addr)
			f.order.Remove(oldest)
		}
		e = f.order.PushFront(&addrFailures{addr: key})
		f.byAddr[key] = e
	}
	a := e.Value.(*addrFailures)
	a.recent[a.next] = failure{at: at, email: h}
	a.next = (a.next + 1) % ringSize
}

// suspicious tells whether ip has failed at least VelocityFailures times in
// the window before at, over at least VelocityEmails e-mail addresses,
// counting email, the one being tried now.
func (f *failures) suspicious(ip netip.Addr, email string, at time.Time) bool {
	key, ok := addrKey(ip)
	if !ok {
		return false
	}
	h := f.emailHash(email)
	since := at.Add(-VelocityWindow)
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.byAddr[key]
	if !ok {
		return false
	}
	count, emails := 0, []uint64{h}
	for _, r := range e.Value.(*addrFailures).recent {
		if r.at.IsZero() || !r.at.After(since) {
			continue
		}
		count++
		if !slices.Contains(emails, r.email) {
			emails = append(emails, r.email)
		}
	}
	return count >= VelocityFailures && len(emails) >= VelocityEmails
}
