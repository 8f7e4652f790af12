package persistence

import (
	"context"
	"errors"
	"sync"
	"time"
)

// writeHealth remembers whether writes succeed: once a commit fails for
// want of storage (full disk, read-only volume, lost connection), writes
// count as failing until one succeeds again. Reads alone (a ping) would
// not tell: a full disk still reads.
type writeHealth struct {
	mu      sync.Mutex
	failing bool
	since   time.Time
}

// observe records a commit's outcome; errors that are no storage failure
// (a duplicate key, say) say nothing about storage.
func (h *writeHealth) observe(err error) {
	if err != nil && (!Unavailable(err) || errors.Is(err, ErrConflict)) {
		return // a verdict, or a conflict between transactions: the storage is fine
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.failing = false
	case !h.failing:
		h.failing, h.since = true, time.Now()
	}
}

func (h *writeHealth) state() (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failing, h.since
}

// Health is the state of the storage, part by part.
type Health struct {
	Database error     // nil when the database answers
	Writes   error     // nil when writes succeed
	Since    time.Time // when writes began to fail
}

// Health checks the database: that it answers, and that writes succeed.
// While writes are failing it tries one (a single small row), so that a
// node nobody writes to, as a load balancer keeps traffic away from it,
// still finds out when storage is back.
func (s *Store) Health(ctx context.Context) Health {
	var h Health
	if err := s.db.PingContext(ctx); err != nil {
		h.Database = mapError(err)
	}
	failing, since := s.writes.state()
	if !failing {
		return h
	}
	err := s.SetSetting(ctx, "health_probe", time.Now().UTC().Format(time.RFC3339Nano))
	s.writes.observe(err)
	if err != nil {
		h.Writes, h.Since = err, since
	}
	return h
}
