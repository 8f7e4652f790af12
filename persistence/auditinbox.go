package persistence

import (
	"context"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
)

// The audit inbox: entries recorded on the request path are committed to
// agent_audit_inbox (append-only, durable with the request's own write) and
// moved into agent_audit, where they are indexed by agent and intent, in
// batches. A move is one transaction: an entry is in one table or the other,
// never in both or neither. Every audit read moves first, so a reader sees
// every entry committed before it asked.

// moveEvery is how often the background mover runs.
const moveEvery = 100 * time.Millisecond

// moveAudit moves every entry waiting in the inbox into agent_audit.
func (s *Store) moveAudit(ctx context.Context) error {
	s.moveMu.Lock()
	defer s.moveMu.Unlock()
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if s.dialect == Postgres {
			// Rows another replica is moving stay locked until it commits;
			// this DELETE waits for them rather than skipping them, so a read
			// after it sees them either way.
			_, err := tx.ExecContext(ctx, `WITH moved AS (DELETE FROM agent_audit_inbox RETURNING `+auditColumns+`)
				INSERT INTO agent_audit (`+auditColumns+`) SELECT `+auditColumns+` FROM moved ORDER BY agent_id, created_at`)
			return nil, err
		}
		var last int64
		if err := tx.GetContext(ctx, &last, `SELECT COALESCE(MAX(rowid), 0) FROM agent_audit_inbox`); err != nil || last == 0 {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO agent_audit (`+auditColumns+`) SELECT `+auditColumns+`
			FROM agent_audit_inbox WHERE rowid <= ? ORDER BY agent_id, created_at, id`, last); err != nil {
			return nil, err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM agent_audit_inbox WHERE rowid <= ?`, last)
		return nil, err
	})
}

// moveAuditLoop runs the mover until the store closes, and once more then.
func (s *Store) moveAuditLoop() {
	t := time.NewTicker(moveEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			if err := s.moveAudit(context.Background()); err != nil {
				slog.Warn("moving audit entries failed", "error", err.Error())
			}
			return
		case <-t.C:
			if err := s.moveAudit(context.Background()); err != nil {
				slog.Warn("moving audit entries failed; they stay in the inbox", "error", err.Error())
			}
		}
	}
}
