package persistence

import (
	"context"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
)

// The audit inbox (SQLite): entries recorded on the request path are
// committed to agent_audit_inbox (append-only, durable with the request's own
// write) and moved into agent_audit, where they are indexed by agent and
// intent, in batches. A move is one transaction: an entry is in one table or
// the other, never in both or neither. Every audit read moves first, so a
// reader sees every entry committed before it asked. PostgreSQL writes the
// entries straight into agent_audit (see auditTable).

// auditTable is where request-path entries are written: the inbox on
// SQLite; on PostgreSQL straight into agent_audit, whose heap appends: the
// inbox measured no faster there, and costs a second write of every entry.
func (s *Store) auditTable() string {
	if s.dialect == Postgres {
		return "agent_audit"
	}
	return "agent_audit_inbox"
}

// moveEvery is how often the background mover runs.
const moveEvery = time.Second

// moveChunk bounds one move's transaction, so that token commits wait
// briefly behind it.
const moveChunk = 2000

// moveAudit moves every entry waiting in the inbox into agent_audit, on the
// token writer's goroutine (see tokenWrite), a chunk per transaction.
func (s *Store) moveAudit(ctx context.Context) error {
	switch {
	case s.dialect == Postgres:
		return nil
	case unitFrom(ctx) != nil:
		return s.moveAll(ctx) // the unit holds the write lock: move in it
	}
	return s.tokens.write(ctx, tokenWrite{task: s.moveAll})
}

func (s *Store) moveAll(ctx context.Context) error {
	for {
		var moved int64
		err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
			var err error
			moved, err = s.moveChunk(ctx, tx)
			return nil, err
		})
		if err != nil || moved < moveChunk {
			return err
		}
	}
}

func (s *Store) moveChunk(ctx context.Context, tx *sqlx.Tx) (int64, error) {
	var first, last int64
	if err := tx.QueryRowxContext(ctx, `SELECT COALESCE(MIN(rowid), 0), COALESCE(MAX(rowid), 0) FROM agent_audit_inbox`).Scan(&first, &last); err != nil || last == 0 {
		return 0, err
	}
	last = min(last, first+moveChunk-1)
	if _, err := tx.ExecContext(ctx, `INSERT INTO agent_audit (`+auditColumns+`) SELECT `+auditColumns+`
		FROM agent_audit_inbox WHERE rowid <= ? ORDER BY agent_id, created_at, id`, last); err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM agent_audit_inbox WHERE rowid <= ?`, last)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// moveAuditLoop has the mover run every moveEvery until the store closes;
// the writer moves once more as it closes.
func (s *Store) moveAuditLoop() {
	t := time.NewTicker(moveEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			if err := s.moveAudit(context.Background()); err != nil {
				slog.Warn("moving audit entries failed; they stay in the inbox", "error", err.Error())
			}
		}
	}
}
