package persistence

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// cache keeps what the token endpoint and introspection read on every
// request, clients by id and access tokens by signature, so that the hot path
// does not touch the database. A change must still bite at once, on every
// replica:
//
//   - every change evicts the record from this process's cache after commit,
//     and bumps gen; a value read from the database is cached only if gen did
//     not move since the read began, so a read racing a change cannot put the
//     old value back;
//   - with PostgreSQL, where other replicas hold caches of their own, an
//     entry is a lease: it is used for at most lease after the read that
//     filled it began, and a change waits out one lease after its commit
//     before it is answered (a commit wait). Once a rotation, deletion,
//     revocation or kill has been answered, no replica can still hold the
//     old value: that is the guarantee;
//   - to make it take effect sooner than that, the change is also announced
//     with a NOTIFY sent inside its transaction (delivered at commit), and
//     every replica LISTENs and evicts at once: milliseconds, usually. A lost
//     message costs nothing but speed, so reconnects need no resync.
//
// SQLite is single-node: its entries never expire and changes need no wait.
// A command run beside the server (`identityd admin reset`) announces its
// change through a stored epoch that the server checks every EpochPoll.
type cache struct {
	lease time.Duration // 0: entries do not expire
	off   bool          // noCache: reads miss, puts are dropped

	mu       sync.RWMutex
	gen      uint64
	clients  map[string]cached[*Client]
	tokens   map[string]cached[*tokenRow]
	mappings map[string]cached[*WorkloadMapping] // by mappingKey
	sessions map[string]cached[*SSOSession]      // live SSO sessions, by id
	cookies  map[string]string                   // SSO session ids by their cookie's hash
	codes    map[string]cached[*codeRow]         // codes issued here and not yet asked for, by signature
	// delegations are what a delegated token needs of its delegation
	// (status, end, the person's status), by delegation id.
	delegations map[string]cached[*DelegationState]
	apiKeys     map[string]cached[*APIKey] // end-user API keys, by their keyed hash
	grants      map[string]cached[bool]    // service accounts' access to applications, by grantKey
	// Whole sets, small and read on every request of their kind; nil: not loaded.
	rar      *cached[map[string]*RARType]        // RAR types by name
	issuers  *cached[map[string]*WorkloadIssuer] // workload issuers by issuer URL
	hitl     *cached[[]HITLPolicy]               // HITL policies in evaluation order
	webhooks *cached[map[string][]string]        // endpoint ids by the webhook event types they want

	keysChanged chan struct{} // signalled when the signing keys change (SigningKeysChanged)
}

type cached[T any] struct {
	value T
	until time.Time // zero: no expiry
}

// pgLease is the lease of a cached entry when replicas share PostgreSQL, and
// so the time a change waits before it is answered.
const pgLease = 500 * time.Millisecond

// Bounds on memory: a full map loses an arbitrary entry per insert.
const (
	maxCachedClients  = 10_000
	maxCachedTokens   = 200_000
	maxCachedMappings = 10_000
	maxCachedSessions = 100_000
	maxCachedCodes    = 10_000
	maxCachedDelegs   = 100_000
	maxCachedAPIKeys  = 200_000
	maxCachedGrants   = 100_000
)

// Evictions: kind, colon, key.
const (
	evictClient  = "client:"  // a client's record, by client id
	evictToken   = "token:"   // an access token, by signature
	evictMapping = "mapping:" // a workload mapping, by mappingKey

	evictRARTypes = "rar:"           // the set of RAR types, as a whole
	evictIssuers  = "issuers:"       // the set of workload issuers, as a whole
	evictHITL     = "hitl-policies:" // the set of HITL policies, as a whole
)

// noCache is the cache of a unit of work: it reads only the database (a
// cached value may predate the unit's own writes) and caches nothing (what
// it reads may be rolled back).
var noCache = &cache{off: true}

// cacheFor is the cache a store call made with ctx may use.
func (s *Store) cacheFor(ctx context.Context) *cache {
	if unitFrom(ctx) != nil {
		return noCache
	}
	return s.cache
}

func newCache(lease time.Duration) *cache {
	return &cache{lease: lease, clients: map[string]cached[*Client]{}, tokens: map[string]cached[*tokenRow]{},
		mappings: map[string]cached[*WorkloadMapping]{}, sessions: map[string]cached[*SSOSession]{},
		cookies: map[string]string{}, codes: map[string]cached[*codeRow]{}, delegations: map[string]cached[*DelegationState]{},
		apiKeys: map[string]cached[*APIKey]{}, grants: map[string]cached[bool]{},
		keysChanged: make(chan struct{}, 1)}
}

// readStart is taken before a database read; see put.
type readStart struct {
	gen uint64
	at  time.Time
}

func (c *cache) begin() readStart {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return readStart{gen: c.gen, at: time.Now()}
}

func (c *cache) valid(until time.Time) bool { return until.IsZero() || time.Now().Before(until) }

func (c *cache) client(id string) *Client {
	c.mu.RLock()
	e, ok := c.clients[id]
	c.mu.RUnlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	return e.value
}

func (c *cache) mapping(key string) *WorkloadMapping {
	c.mu.RLock()
	e, ok := c.mappings[key]
	c.mu.RUnlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	return e.value
}

// session is a copy of a cached SSO session, by id.
func (c *cache) session(id string) *SSOSession {
	c.mu.RLock()
	e, ok := c.sessions[id]
	c.mu.RUnlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	ss := *e.value
	return &ss
}

// sessionByCookie is a copy of the cached SSO session whose cookie hashes
// to hash.
func (c *cache) sessionByCookie(hash []byte) *SSOSession {
	c.mu.RLock()
	id, ok := c.cookies[string(hash)]
	c.mu.RUnlock()
	if !ok {
		return nil
	}
	return c.session(id)
}

// putSession caches a session read since rs, and which session its cookie
// names: a pairing that never changes, so it outlives the session's entry.
func (c *cache) putSession(rs readStart, ss *SSOSession) {
	put(c, c.sessions, maxCachedSessions, rs, ss.ID, ss)
	if c.off {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cookies) >= maxCachedSessions {
		for h := range c.cookies {
			delete(c.cookies, h)
			break
		}
	}
	c.cookies[string(ss.TokenHash)] = ss.ID
}

// touchSession moves a cached session's lastSeenAt to at, as the
// database's was moved: the cached copy would otherwise ask for a touch on
// every use.
func (c *cache) touchSession(id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.sessions[id]
	if !ok {
		return
	}
	ss := *e.value
	ss.LastSeenAt = at
	e.value = &ss
	c.sessions[id] = e
}

// putCode caches a code committed since rs, for its exchange.
func (c *cache) putCode(rs readStart, r *codeRow) {
	put(c, c.codes, maxCachedCodes, rs, r.Signature, r)
}

// takeCode answers the cached code of signature and forgets it: the first
// to ask is its exchange, which changes the row, and anyone after reads
// the database.
func (c *cache) takeCode(signature string) *codeRow {
	if c.off {
		return nil
	}
	c.mu.Lock()
	e, ok := c.codes[signature]
	delete(c.codes, signature)
	c.mu.Unlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	return e.value
}

func (c *cache) token(signature string) *tokenRow {
	c.mu.RLock()
	e, ok := c.tokens[signature]
	c.mu.RUnlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	return e.value
}

// cachedSet returns the set in slot, or the zero value when it is not loaded.
func cachedSet[T any](c *cache, slot **cached[T]) T {
	c.mu.RLock()
	e := *slot
	c.mu.RUnlock()
	if e == nil || !c.valid(e.until) {
		var none T
		return none
	}
	return e.value
}

// entry makes the cache entry of a value whose read began at rs; false
// when a change happened meanwhile (the value may be old). c.mu is held.
func entry[T any](c *cache, rs readStart, v T) (cached[T], bool) {
	e := cached[T]{value: v}
	if c.lease > 0 {
		e.until = rs.at.Add(c.lease)
	}
	return e, rs.gen == c.gen
}

func put[T any](c *cache, m map[string]cached[T], max int, rs readStart, key string, v T) {
	if c.off {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := entry(c, rs, v)
	if !ok {
		return
	}
	if len(m) >= max {
		for k := range m {
			delete(m, k)
			break
		}
	}
	m[key] = e
}

func (c *cache) putClient(rs readStart, cl *Client) {
	put(c, c.clients, maxCachedClients, rs, cl.ID, cl)
}

func (c *cache) putToken(rs readStart, row *tokenRow) {
	put(c, c.tokens, maxCachedTokens, rs, row.Signature, row)
}

// putSet caches a set read since rs, unless a change happened meanwhile.
func putSet[T any](c *cache, slot **cached[T], rs readStart, v T) {
	if c.off {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := entry(c, rs, v); ok {
		*slot = &e
	}
}

// evict forgets records that changed.
func (c *cache) evict(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, evictClient):
			delete(c.clients, strings.TrimPrefix(k, evictClient))
		case strings.HasPrefix(k, evictToken):
			delete(c.tokens, strings.TrimPrefix(k, evictToken))
		case strings.HasPrefix(k, evictMapping):
			delete(c.mappings, strings.TrimPrefix(k, evictMapping))
		case strings.HasPrefix(k, evictSession):
			delete(c.sessions, strings.TrimPrefix(k, evictSession))
		case strings.HasPrefix(k, evictDelegation):
			delete(c.delegations, strings.TrimPrefix(k, evictDelegation))
		case strings.HasPrefix(k, evictAPIKey):
			if h, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, evictAPIKey)); err == nil {
				delete(c.apiKeys, string(h))
			}
		case k == evictAPIKeys:
			c.apiKeys = map[string]cached[*APIKey]{}
		case strings.HasPrefix(k, evictGrant):
			delete(c.grants, strings.TrimPrefix(k, evictGrant))
		case k == evictRARTypes:
			c.rar = nil
		case k == evictIssuers:
			c.issuers = nil
		case k == evictHITL:
			c.hitl = nil
		case k == evictWebhooks:
			c.webhooks = nil
		case k == evictSigningKeys: // not cached here: the key set reloads itself
			select {
			case c.keysChanged <- struct{}{}:
			default: // a reload is pending already
			}
		}
	}
}

// evictAll forgets every cached record.
func (c *cache) evictAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.clients, c.tokens, c.mappings = map[string]cached[*Client]{}, map[string]cached[*tokenRow]{}, map[string]cached[*WorkloadMapping]{}
	c.sessions, c.cookies = map[string]cached[*SSOSession]{}, map[string]string{}
	c.codes = map[string]cached[*codeRow]{}
	c.delegations = map[string]cached[*DelegationState]{}
	c.apiKeys, c.grants = map[string]cached[*APIKey]{}, map[string]cached[bool]{}
	c.rar, c.issuers, c.hitl, c.webhooks = nil, nil, nil, nil
}

// dropExpired removes tokens that expired before now, and lapsed leases.
func (c *cache) dropExpired(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for sig, e := range c.tokens {
		if e.value.ExpiresAt.Before(now) || !c.valid(e.until) {
			delete(c.tokens, sig)
		}
	}
	for id, e := range c.clients {
		if !c.valid(e.until) {
			delete(c.clients, id)
		}
	}
	for k, e := range c.mappings {
		if !c.valid(e.until) {
			delete(c.mappings, k)
		}
	}
	for id, e := range c.sessions {
		if e.value.ExpiresAt.Before(now) || !c.valid(e.until) {
			delete(c.sessions, id)
		}
	}
	for h, id := range c.cookies {
		if _, ok := c.sessions[id]; !ok {
			delete(c.cookies, h)
		}
	}
	for sig, e := range c.codes {
		if e.value.ExpiresAt.Before(now) || !c.valid(e.until) {
			delete(c.codes, sig)
		}
	}
	for id, e := range c.delegations {
		if e.value.ExpiresAt.Before(now) || !c.valid(e.until) {
			delete(c.delegations, id)
		}
	}
	for h, e := range c.apiKeys {
		if !c.valid(e.until) {
			delete(c.apiKeys, h)
		}
	}
	for k, e := range c.grants {
		if !c.valid(e.until) {
			delete(c.grants, k)
		}
	}
}

// apiKey is a cached API key, by its keyed hash. Callers do not change it.
func (c *cache) apiKey(hash string) *APIKey {
	c.mu.RLock()
	e, ok := c.apiKeys[hash]
	c.mu.RUnlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	return e.value
}

// delegation is a cached delegation's state, by id.
func (c *cache) delegation(id string) *DelegationState {
	c.mu.RLock()
	e, ok := c.delegations[id]
	c.mu.RUnlock()
	if !ok || !c.valid(e.until) {
		return nil
	}
	return e.value
}

// SigningKeysChanged is signalled when this process or (PostgreSQL) another
// replica changes the signing keys.
func (s *Store) SigningKeysChanged() <-chan struct{} { return s.cache.keysChanged }

// cacheEpochKey is the system setting that a command run beside a SQLite
// server changes (AnnounceToServers) and the server watches (watchEpoch).
const cacheEpochKey = "cache_epoch"

// EpochPoll is how often a SQLite server checks whether a command changed
// records behind its back, and so how long such a change takes to bite.
const EpochPoll = 5 * time.Second

// AnnounceToServers tells the servers running on this database that records
// changed outside them (`identityd admin reset`): on SQLite they drop their
// caches within EpochPoll. PostgreSQL servers heard every change already.
func (s *Store) AnnounceToServers(ctx context.Context) error {
	if s.dialect != SQLite {
		return nil
	}
	return s.SetSetting(ctx, cacheEpochKey, time.Now().UTC().Format(time.RFC3339Nano))
}

// watchEpoch drops the cache whenever the epoch moves, until the store
// closes.
func (s *Store) watchEpoch() {
	t := time.NewTicker(EpochPoll)
	defer t.Stop()
	seen := s.epoch()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			seen = s.pollEpoch(seen)
		}
	}
}

// pollEpoch drops the cache if the epoch differs from seen, and answers the
// epoch now. A failed read keeps seen: the next poll tries again.
func (s *Store) pollEpoch(seen string) string {
	now := s.epoch()
	if now != seen && now != "" {
		s.cache.evictAll()
		return now
	}
	return seen
}

func (s *Store) epoch() string {
	ctx, cancel := context.WithTimeout(context.Background(), EpochPoll)
	defer cancel()
	v, err := s.Setting(ctx, cacheEpochKey)
	if err != nil && !errors.Is(err, ErrNotFound) {
		slog.Warn("reading the cache epoch failed", "error", err.Error())
	}
	return v
}

// notifyChannel carries evictions between replicas.
const notifyChannel = "identityd_evict"

// announce tells other replicas, at commit, what the transaction changes.
func (s *Store) announce(ctx context.Context, tx *sqlx.Tx, keys []string) error {
	if s.dialect != Postgres {
		return nil
	}
	for _, k := range keys {
		if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, k); err != nil {
			return err
		}
	}
	return nil
}

// listen applies other replicas' evictions until the store closes; it
// closes listening once LISTEN has been tried.
func (s *Store) listen(dsn string, listening chan<- struct{}) {
	l := pq.NewListener(dsn, 100*time.Millisecond, 10*time.Second, func(ev pq.ListenerEventType, err error) {
		if err != nil {
			slog.Warn("eviction listener", "event", int(ev), "error", err.Error())
		}
	})
	defer l.Close()
	if err := l.Listen(notifyChannel); err != nil {
		slog.Warn("cannot listen for evictions; leases alone keep caches correct", "error", err.Error())
	}
	close(listening)
	for {
		select {
		case n := <-l.Notify:
			if n != nil { // nil: reconnected; leases cover what was missed
				s.cache.evict(n.Extra)
				s.signals.raise(n.Extra)
			}
		case <-s.done:
			return
		}
	}
}
