package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// Usage counts (issue 18): requests per subject per minute and per UTC day.

// Subjects and granularities of usage counts.
const (
	UsageServiceAccount = "service_account" // every API request of the account
	UsageApplication    = "application"     // API-key validations of the application's keys
	UsageMinute         = "minute"
	UsageDay            = "day"
)

// UsageCount is n requests of one subject in one bucket (the minute or the
// UTC day it starts).
type UsageCount struct {
	SubjectKind string    `db:"subject_kind"`
	SubjectID   string    `db:"subject_id"`
	Granularity string    `db:"granularity"`
	Bucket      time.Time `db:"bucket"`
	Count       int64     `db:"count"`
}

// AddUsage adds counts to the stored ones in one transaction: each row is
// an upsert adding n, so replicas flushing the same bucket sum, whatever
// their order.
func (s *Store) AddUsage(ctx context.Context, counts []UsageCount) error {
	if len(counts) == 0 {
		return nil
	}
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		q := s.q(`INSERT INTO usage_counts (subject_kind, subject_id, granularity, bucket, count) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (subject_kind, subject_id, granularity, bucket) DO UPDATE SET count = usage_counts.count + excluded.count`)
		for _, c := range counts {
			if _, err := tx.ExecContext(ctx, q, c.SubjectKind, c.SubjectID, c.Granularity, c.Bucket.UTC(), c.Count); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
}

// UsageSeries reads a subject's counts of one granularity with buckets in
// [from, to), oldest first; buckets without requests have no row.
func (s *Store) UsageSeries(ctx context.Context, kind, id, granularity string, from, to time.Time) ([]UsageCount, error) {
	out := []UsageCount{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT subject_kind, subject_id, granularity, bucket, count FROM usage_counts
		WHERE subject_kind = ? AND subject_id = ? AND granularity = ? AND bucket >= ? AND bucket < ? ORDER BY bucket`),
		kind, id, granularity, from.UTC(), to.UTC())
	return out, mapError(err)
}

// DeleteUsageBefore removes the counts of one granularity whose buckets
// began before t.
func (s *Store) DeleteUsageBefore(ctx context.Context, granularity string, t time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM usage_counts WHERE granularity = ? AND bucket < ?`), granularity, t.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	return res.RowsAffected()
}
