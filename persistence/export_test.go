package persistence

import "context"

// MapError is mapError, for the tests of the persistence_test package.
var MapError = mapError

// LeaseWaits counts the commits that waited out a lease.
func (s *Store) LeaseWaits() int64 { return s.leaseWaits.Load() }

// PollEpoch is one check of the cache epoch (watchEpoch runs it every
// EpochPoll).
func (s *Store) PollEpoch(seen string) string { return s.pollEpoch(seen) }

// MaxStmts bounds the pool's prepared statements.
const MaxStmts = maxStmts

// Select runs a query on the pool, as the store's reads do.
func (s *Store) Select(ctx context.Context, dest any, query string, args ...any) error {
	return s.conn(ctx).SelectContext(ctx, dest, s.q(query), args...)
}

// PreparedStatements counts the pool's prepared statements.
func (s *Store) PreparedStatements() int {
	s.stmts.mu.RLock()
	defer s.stmts.mu.RUnlock()
	return len(s.stmts.m)
}

// MaxCeremonies bounds the passkey ceremonies a SQLite server holds.
const MaxCeremonies = maxCeremonies

// DelegationLiveForTest exposes the delegated token's check of its delegation.
func DelegationLiveForTest(ctx context.Context, s *Store, id string) (bool, error) {
	return s.delegationLive(ctx, id)
}
