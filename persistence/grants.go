package persistence

import (
	"context"
)

// The access of service accounts to applications is decided by the
// embedded OpenFGA engine (extensions/authz), which keeps it in tables of
// its own. Every API-key validation asks it, so its answers are cached here
// like any other record on a hot path: a lease on PostgreSQL, evicted by
// NOTIFY, and a grant or withdrawal waits out the lease before it is
// answered (GrantChanged).

// evictGrant: one service account's access to one application, by grantKey.
const evictGrant = "grant:"

func grantKey(appID, serviceAccountID string) string { return appID + "|" + serviceAccountID }

// CachedGrant answers whether the service account may use the application,
// from the cache when it can, else from read (the engine), caching its
// answer unless a grant changed meanwhile.
func (s *Store) CachedGrant(ctx context.Context, appID, serviceAccountID string, read func(context.Context) (bool, error)) (bool, error) {
	c, key := s.cache, grantKey(appID, serviceAccountID)
	c.mu.RLock()
	e, ok := c.grants[key]
	c.mu.RUnlock()
	if ok && c.valid(e.until) {
		return e.value, nil
	}
	rs := c.begin()
	granted, err := read(ctx)
	if err != nil {
		return false, err
	}
	put(c, c.grants, maxCachedGrants, rs, key, granted)
	return granted, nil
}

// GrantChanged is called once the engine has written a grant or a
// withdrawal: it evicts the cached answer here, tells the other replicas
// (PostgreSQL NOTIFY, outside any transaction, so at once), and waits out
// the lease they may hold, so that once the change is answered no replica
// answers the old one.
func (s *Store) GrantChanged(ctx context.Context, appID, serviceAccountID string) error {
	key := evictGrant + grantKey(appID, serviceAccountID)
	if s.dialect == Postgres {
		if _, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, key); err != nil {
			return mapError(err)
		}
	}
	s.afterCommit([]string{key})
	return nil
}
