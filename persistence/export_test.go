package persistence

// MapError is mapError, for the tests of the persistence_test package.
var MapError = mapError

// LeaseWaits counts the commits that waited out a lease.
func (s *Store) LeaseWaits() int64 { return s.leaseWaits.Load() }

// PollEpoch is one check of the cache epoch (watchEpoch runs it every
// EpochPoll).
func (s *Store) PollEpoch(seen string) string { return s.pollEpoch(seen) }
