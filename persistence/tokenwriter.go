package persistence

import (
	"context"
	"database/sql"
	"strings"
	"sync"
)

// tokenWriter groups concurrent access-token inserts into shared
// transactions (group commit). Each caller still waits until its own row is
// committed, so a token is never answered before it is durable; but one
// commit (one WAL fsync in SQLite, one round trip in PostgreSQL) now serves
// every request that arrived while the previous commit was running.
type tokenWriter struct {
	s    *Store
	reqs chan tokenWrite
	wg   sync.WaitGroup
	once sync.Once

	mu    sync.Mutex
	stmts map[int]*sql.Stmt // by rows per INSERT
}

type tokenWrite struct {
	row  tokenRow
	done chan error
}

// maxTokenBatch bounds one transaction; 9 columns × 256 rows stays far below
// both dialects' limits on bound parameters.
const maxTokenBatch = 256

func newTokenWriter(s *Store) *tokenWriter {
	w := &tokenWriter{s: s, reqs: make(chan tokenWrite, 4*maxTokenBatch), stmts: map[int]*sql.Stmt{}}
	// SQLite has one writer at a time anyway; PostgreSQL gains from a few
	// commits in flight at once.
	workers := 1
	if s.dialect == Postgres {
		workers = 4
	}
	for range workers {
		w.wg.Add(1)
		go w.run()
	}
	return w
}

func (w *tokenWriter) write(ctx context.Context, row tokenRow) error {
	done := make(chan error, 1)
	select {
	case w.reqs <- tokenWrite{row: row, done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *tokenWriter) close() {
	w.once.Do(func() { close(w.reqs) })
	w.wg.Wait()
	for _, st := range w.stmts {
		st.Close()
	}
}

func (w *tokenWriter) run() {
	defer w.wg.Done()
	batch := make([]tokenWrite, 0, maxTokenBatch)
	for first := range w.reqs {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxTokenBatch {
			select {
			case next, ok := <-w.reqs:
				if !ok {
					break fill
				}
				batch = append(batch, next)
			default:
				break fill
			}
		}
		w.flush(batch)
	}
}

// flush commits a batch in one statement; if that fails, each row is tried
// alone so that one bad row cannot fail the requests of the others.
func (w *tokenWriter) flush(batch []tokenWrite) {
	// Writes outlive the requests that asked for them: a request that gave up
	// waiting does not roll back the rows of the others.
	ctx := context.Background()
	if len(batch) > 1 {
		if err := w.insert(ctx, batch); err == nil {
			for _, b := range batch {
				b.done <- nil
			}
			return
		}
	}
	for i := range batch {
		batch[i].done <- w.insert(ctx, batch[i:i+1])
	}
}

// insert writes rows with one multi-row INSERT, which commits atomically.
// The statement for each batch size is prepared once: SQL parsing was a
// large part of the writer's time.
func (w *tokenWriter) insert(ctx context.Context, batch []tokenWrite) error {
	stmt, err := w.statement(ctx, len(batch))
	if err != nil {
		return mapError(err)
	}
	args := make([]any, 0, 9*len(batch))
	for _, b := range batch {
		r := b.row
		args = append(args, r.Signature, r.RequestID, r.ClientID, r.PrincipalID, r.Scopes, r.Audience, r.Session, r.RequestedAt, r.ExpiresAt)
	}
	_, err = stmt.ExecContext(ctx, args...)
	return mapError(err)
}

func (w *tokenWriter) statement(ctx context.Context, rows int) (*sql.Stmt, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.stmts[rows]; st != nil {
		return st, nil
	}
	var sb strings.Builder
	sb.WriteString(`INSERT INTO access_tokens (` + tokenColumns + `) VALUES `)
	for i := range rows {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`(?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	}
	st, err := w.s.db.PrepareContext(ctx, w.s.q(sb.String()))
	if err != nil {
		return nil, err
	}
	w.stmts[rows] = st
	return st, nil
}
