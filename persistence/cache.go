package persistence

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// cache keeps what the token endpoint and introspection read on every
// request, clients by id and access tokens by signature, so that the hot path
// does not touch the database. Correctness rests on invalidation:
//
//   - every change to a cached record evicts it, in this process at once after
//     commit, and in other replicas through a PostgreSQL NOTIFY sent inside
//     the changing transaction (so it is delivered exactly when it commits);
//   - every eviction bumps gen; a value read from the database is cached only
//     if gen did not move since the read began, so a read racing a change can
//     never put the old value back;
//   - while the notification connection is down (PostgreSQL), the cache is
//     emptied and bypassed, since a missed eviction would go unnoticed.
//
// SQLite is single-node: its cache is always live and needs no messages.
type cache struct {
	mu      sync.RWMutex
	gen     uint64
	live    bool
	clients map[string]*Client
	tokens  map[string]*tokenRow
}

// Bounds on memory: a full map loses an arbitrary entry per insert.
const (
	maxCachedClients = 10_000
	maxCachedTokens  = 200_000
)

// notifyChannel carries evictions between replicas.
const notifyChannel = "identityd_cache"

// Eviction messages: kind, colon, key.
const (
	evictClient = "client:" // a client's record, by client id
	evictToken  = "token:"  // an access token, by signature
)

func newCache(live bool) *cache {
	c := &cache{live: live}
	c.reset()
	return c
}

func (c *cache) reset() {
	c.clients = map[string]*Client{}
	c.tokens = map[string]*tokenRow{}
	c.gen++
}

// snapshot is taken before a database read; see put*.
func (c *cache) snapshot() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

func (c *cache) client(id string) *Client {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.clients[id]
}

func (c *cache) putClient(gen uint64, cl *Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if len(c.clients) >= maxCachedClients {
		for k := range c.clients {
			delete(c.clients, k)
			break
		}
	}
	c.clients[cl.ID] = cl
}

func (c *cache) token(signature string) *tokenRow {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.tokens[signature]
}

func (c *cache) putToken(gen uint64, row *tokenRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if len(c.tokens) >= maxCachedTokens {
		for k := range c.tokens {
			delete(c.tokens, k)
			break
		}
	}
	c.tokens[row.Signature] = row
}

// evict applies eviction messages.
func (c *cache) evict(msgs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, m := range msgs {
		switch {
		case strings.HasPrefix(m, evictClient):
			delete(c.clients, strings.TrimPrefix(m, evictClient))
		case strings.HasPrefix(m, evictToken):
			delete(c.tokens, strings.TrimPrefix(m, evictToken))
		default: // unknown message (a newer replica?): forget everything
			c.reset()
		}
	}
}

// dropExpired removes tokens that expired before now.
func (c *cache) dropExpired(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for sig, row := range c.tokens {
		if row.ExpiresAt.Before(now) {
			delete(c.tokens, sig)
		}
	}
}

func (c *cache) setLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = live
	c.reset()
}

// announce sends eviction messages to the other replicas from inside tx;
// PostgreSQL delivers them when tx commits. SQLite has no other replicas.
func (s *Store) announce(ctx context.Context, tx *sqlx.Tx, msgs ...string) error {
	if s.dialect != Postgres {
		return nil
	}
	for _, m := range msgs {
		if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, m); err != nil {
			return err
		}
	}
	return nil
}

// listen receives other replicas' evictions until the store closes.
func (s *Store) listen(dsn string) {
	l := pq.NewListener(dsn, 100*time.Millisecond, 10*time.Second, func(ev pq.ListenerEventType, err error) {
		switch ev {
		case pq.ListenerEventReconnected: // pq has listened again by now
			s.cache.setLive(true)
		case pq.ListenerEventDisconnected, pq.ListenerEventConnectionAttemptFailed:
			s.cache.setLive(false)
			if err != nil {
				slog.Warn("cache invalidation channel down; caching off until it is back", "error", err.Error())
			}
		}
	})
	// Live only once LISTEN is in place: an eviction sent before would be lost.
	if err := l.Listen(notifyChannel); err != nil {
		slog.Warn("cannot listen for cache invalidations; caching stays off until reconnected", "error", err.Error())
	} else {
		s.cache.setLive(true)
	}
	defer l.Close()
	for {
		select {
		case n := <-l.Notify:
			if n == nil { // reconnected: anything may have been missed
				s.cache.setLive(true)
				continue
			}
			s.cache.evict(n.Extra)
		case <-s.done:
			return
		}
	}
}
