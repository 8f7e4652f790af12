package persistence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// tokenWriter groups concurrent access-token inserts, and the audit entries
// that go with them, into shared commits (group commit). Each caller still
// waits until its own rows are committed, so a token is never answered
// before it is durable, and its audit entry is never lost; but one commit
// (one WAL fsync in SQLite, one round trip in PostgreSQL) now serves every
// request that arrived while the previous commit was running.
type tokenWriter struct {
	s    *Store
	db   *sql.DB // where it commits: the pool, or on SQLite a connection of its own
	reqs chan tokenWrite
	wg   sync.WaitGroup
	once sync.Once

	// SQLite: the write-ahead log; the callers of a commit to sync it for
	// (syncLog), a token when the sync begins and one when it is done;
	// whether a sync is under way (the writer's own).
	logPath string
	log     *os.File
	syncs   chan []chan error
	started chan struct{}
	synced  chan struct{}
	syncing bool
	syncers sync.WaitGroup

	mu    sync.Mutex
	stmts map[string]*sql.Stmt // multi-row INSERTs, by table and rows
	// later are statements a transaction used before the pool had them:
	// prepared on the pool once it has committed (inTx).
	later map[string]func() string
}

// tokenWrite is one caller's rows: a token, audit entries, or both; or a
// task to run on the writer's goroutine. SQLite has one writer at a time, and
// a second one (moving audit entries, restarting the log) would make the
// token writer wait on the database lock, whose busy handler sleeps in
// milliseconds; run by the writer itself, such work just takes its turn.
type tokenWrite struct {
	token *tokenRow
	audit []AuditEntry
	flow  *flowWrite // a code's or a refresh's (Grouped), with token
	task  func(ctx context.Context) error
	done  chan error
}

// rows counts the rows a write adds.
func (t tokenWrite) rows() int {
	n := len(t.audit)
	if t.token != nil {
		n++
	}
	if f := t.flow; f != nil {
		for _, row := range [][]any{f.code, f.refresh, f.event} {
			if row != nil {
				n++
			}
		}
		n += len(f.rows)
	}
	return n
}

// maxTokenBatch bounds the rows of one commit (a write of up to as many more
// may complete it): under 9,000 bound parameters at 17 columns a row, far
// below both dialects' limits. AppendAudit splits larger writes.
const maxTokenBatch = 256

// newTokenWriter starts the writer. On SQLite it commits on a connection of
// its own that does not sync the write-ahead log at each commit
// (synchronous=NORMAL; the pool's connections keep FULL), and syncs the log
// itself before it answers a commit's callers (syncLog): a caller never
// hears of rows that are not durable. A batch holding flows (sign-ins,
// codes, refreshes) is synced by a second goroutine (syncer) while the
// writer runs the next batch's statements, instead of waiting out the
// fsync (half of its time under a passkey sign-in load); it commits that
// batch once the sync is done, so that the commits stay as large as before.
func newTokenWriter(ctx context.Context, s *Store) (*tokenWriter, error) {
	w := &tokenWriter{s: s, db: s.db.DB, reqs: make(chan tokenWrite, 4*maxTokenBatch), stmts: map[string]*sql.Stmt{}, later: map[string]func() string{}}
	// SQLite has one writer at a time anyway; PostgreSQL gains from a few
	// commits in flight at once.
	workers := 1
	if s.dialect == Postgres {
		workers = 4
	} else {
		var path string
		if err := s.db.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&path); err != nil {
			return nil, mapError(err)
		}
		db, err := sql.Open("sqlite", sqliteDSN(path, true, "NORMAL"))
		if err != nil {
			return nil, err
		}
		// One connection, kept: it also keeps the log file in place, which
		// SQLite removes when the last connection closes.
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		db.SetConnMaxLifetime(0)
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			return nil, mapError(err)
		}
		w.db, w.logPath = db, path+"-wal"
		w.syncs, w.started, w.synced = make(chan []chan error, 1), make(chan struct{}), make(chan struct{}, 1)
		w.syncers.Add(1)
		go w.syncer()
	}
	for range workers {
		w.wg.Add(1)
		go w.run()
	}
	return w, nil
}

func (w *tokenWriter) write(ctx context.Context, wr tokenWrite) error {
	wr.done = make(chan error, 1)
	select {
	case w.reqs <- wr:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-wr.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queue hands wr to the writer without waiting for its commit, whose
// outcome the answered channel gets.
func (w *tokenWriter) queue(ctx context.Context, wr tokenWrite) (<-chan error, error) {
	wr.done = make(chan error, 1)
	select {
	case w.reqs <- wr:
		return wr.done, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (w *tokenWriter) close() {
	w.once.Do(func() { close(w.reqs) })
	w.wg.Wait()
	if w.syncs != nil {
		close(w.syncs)
		w.syncers.Wait()
		if w.log != nil {
			w.log.Close()
		}
	}
	for _, st := range w.stmts {
		st.Close()
	}
	if w.db != w.s.db.DB {
		w.db.Close()
	}
}

func (w *tokenWriter) run() {
	defer w.wg.Done()
	batch := make([]tokenWrite, 0, maxTokenBatch)
	for first := range w.reqs {
		batch = append(batch[:0], first)
		rows := first.rows()
	fill:
		for rows < maxTokenBatch {
			select {
			case next, ok := <-w.reqs:
				if !ok {
					break fill
				}
				batch = append(batch, next)
				rows += next.rows()
			default:
				break fill
			}
		}
		w.flushAndRun(batch)
	}
}

// flushAndRun commits the batch's rows, then runs its tasks in order.
func (w *tokenWriter) flushAndRun(batch []tokenWrite) {
	rows, tasks := batch[:0:0], batch[:0:0]
	for _, b := range batch {
		if b.task != nil {
			tasks = append(tasks, b)
		} else {
			rows = append(rows, b)
		}
	}
	if len(rows) > 0 {
		w.flush(rows)
	}
	for _, t := range tasks {
		t.done <- t.task(context.Background())
	}
}

// flush commits a batch at once; if that fails, each caller's rows are tried
// alone so that one bad row cannot fail the requests of the others.
func (w *tokenWriter) flush(batch []tokenWrite) {
	// Writes outlive the requests that asked for them: a request that gave up
	// waiting does not roll back the rows of the others.
	ctx := context.Background()
	if len(batch) > 1 {
		err := w.commit(ctx, batch)
		w.s.writes.observe(err)
		if err == nil {
			w.committed(batch)
			return
		}
	}
	for i := range batch {
		err := w.commit(ctx, batch[i:i+1])
		w.s.writes.observe(err)
		if err == nil {
			w.committed(batch[i : i+1])
			continue
		}
		batch[i].done <- err
	}
}

// committed answers the callers of writes just committed: at once when the
// commit was durable by itself (PostgreSQL), else once the log is synced.
func (w *tokenWriter) committed(writes []tokenWrite) {
	if w.syncs == nil {
		for _, wr := range writes {
			wr.done <- nil
		}
		return
	}
	if !hasFlow(writes) {
		// Tokens and audit entries alone are a statement or two: the next
		// batch's would not cover the sync, and the hand-offs to and from
		// the syncing goroutine would cost more than they save (measured:
		// agent grants up to 15% slower). Synced here, as a FULL commit
		// would be.
		err := w.syncLog()
		for _, wr := range writes {
			wr.done <- err
		}
		return
	}
	dones := make([]chan error, len(writes))
	for i, wr := range writes {
		dones[i] = wr.done
	}
	w.syncs <- dones
	// Wait for the syncer to begin. Readied onto this goroutine's own
	// processor, it would otherwise start the fsync only once the writer
	// had run the next batch's statements and blocked (measured: a delay
	// of 0.35-0.4 ms in a 2.7 ms commit cycle).
	<-w.started
	w.syncing = true
}

// beforeCommit waits, on SQLite, for the sync of the writer's last commit:
// the next one is then written while the log is idle, and holds everything
// that came meanwhile.
func (w *tokenWriter) beforeCommit() {
	if w.syncing {
		<-w.synced
		w.syncing = false
	}
}

// syncer syncs SQLite's write-ahead log after each of the writer's
// commits of flows (committed), then answers their callers.
func (w *tokenWriter) syncer() {
	defer w.syncers.Done()
	for dones := range w.syncs {
		w.started <- struct{}{}
		err := w.syncLog()
		for _, done := range dones {
			done <- err
		}
		w.synced <- struct{}{}
	}
}

// syncLog syncs the write-ahead log, on the writer's goroutine or the
// syncer's, never both at once (beforeCommit). The file stays open: the
// writer's connection keeps the log in place (SQLite removes it when the
// last connection closes), and a restarted log is the same file written
// again.
func (w *tokenWriter) syncLog() error {
	var err error
	if w.log == nil {
		w.log, err = os.OpenFile(w.logPath, os.O_RDWR, 0)
	}
	if err == nil {
		if err = w.log.Sync(); err != nil {
			w.log.Close()
			w.log = nil // opened anew for the next sync
		}
	}
	if err != nil {
		err = errors.Join(ErrUnavailable, fmt.Errorf("sync the write-ahead log: %w", err))
	}
	w.s.writes.observe(err)
	return err
}

// rowSet is the rows of a batch by table, as INSERT arguments.
type rowSet struct {
	table, columns, suffix string
	n                      int
	args                   []any
}

// rowSets gathers a batch's tokens and audit entries.
func (w *tokenWriter) rowSets(batch []tokenWrite) (tokens, audit rowSet) {
	tokens = rowSet{table: "access_tokens", columns: tokenColumns}
	audit = rowSet{table: w.s.auditTable(), columns: auditColumns}
	for _, b := range batch {
		if r := b.token; r != nil {
			tokens.args = append(tokens.args, r.Signature, r.RequestID, r.ClientID, r.PrincipalID, r.Scopes, r.Audience, r.Session, r.RequestedAt, r.ExpiresAt)
			tokens.n++
		}
		for i := range b.audit {
			audit.args = append(audit.args, b.audit[i].args()...)
			audit.n++
		}
	}
	return tokens, audit
}

// insert writes row sets in a transaction, with the prepared INSERTs.
func (w *tokenWriter) insert(ctx context.Context, tx *sql.Tx, sets ...rowSet) error {
	for _, set := range sets {
		if set.n == 0 {
			continue
		}
		st, err := w.inTx(ctx, tx, set.key(), set.insert)
		if err != nil {
			return err
		}
		if _, err := st.ExecContext(ctx, set.args...); err != nil {
			return err
		}
	}
	return nil
}

// commit writes a batch's tokens and audit entries atomically: a lone
// multi-row INSERT when there is one kind of row, a transaction otherwise.
func (w *tokenWriter) commit(ctx context.Context, batch []tokenWrite) error {
	if hasFlow(batch) {
		return w.commitFlows(ctx, batch)
	}
	tokens, audit := w.rowSets(batch)
	if audit.n == 0 || tokens.n == 0 {
		set := tokens
		if tokens.n == 0 {
			set = audit
		}
		st, err := w.statement(ctx, set)
		if err == nil {
			w.beforeCommit() // the statement commits itself
			_, err = st.ExecContext(ctx, set.args...)
		}
		return mapError(err)
	}
	if w.s.dialect == Postgres {
		// One statement, one round trip, atomic: a data-modifying WITH.
		st, err := w.prepared(ctx, fmt.Sprintf("tokens+audit/%d/%d", tokens.n, audit.n), func() string {
			return `WITH tokens AS (INSERT INTO access_tokens (` + tokenColumns + `) VALUES ` + valueRows(tokenColumns, tokens.n) + `)
			INSERT INTO ` + w.s.auditTable() + ` (` + auditColumns + `) VALUES ` + valueRows(auditColumns, audit.n)
		})
		if err == nil {
			_, err = st.ExecContext(ctx, append(tokens.args, audit.args...)...)
		}
		return mapError(err)
	}
	defer w.prepareLater(ctx)
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return mapError(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := w.insert(ctx, tx, tokens, audit); err != nil {
		return mapError(err)
	}
	w.beforeCommit()
	return mapError(tx.Commit())
}

// write commits a token and audit entries: in the context's unit of work
// when there is one (they commit with it), else through the group commit.
func (s *Store) write(ctx context.Context, wr tokenWrite) error {
	if u := unitFrom(ctx); u != nil {
		tx, err := u.txn()
		if err != nil {
			return err
		}
		// On the unit's own connection: the writer's statements are
		// prepared on the pool, whose connections may all be waiting for
		// this unit's lock.
		tokens, audit := s.tokens.rowSets([]tokenWrite{wr})
		for _, set := range []rowSet{tokens, audit} {
			if set.n == 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, s.q(set.insert()), set.args...); err != nil {
				return mapError(err)
			}
		}
		return nil
	}
	return s.tokens.write(ctx, wr)
}

// statement prepares, once, the INSERT of the set's rows: SQL parsing
// was a large part of the writer's time.
func (w *tokenWriter) statement(ctx context.Context, set rowSet) (*sql.Stmt, error) {
	return w.prepared(ctx, set.key(), set.insert)
}

// key names the set's INSERT among the prepared statements.
func (set rowSet) key() string {
	return fmt.Sprintf("%s/%s/%s/%d", set.table, set.columns, set.suffix, set.n)
}

// insert is the INSERT of the set's rows, in ? form.
func (set rowSet) insert() string {
	return `INSERT INTO ` + set.table + ` (` + set.columns + `) VALUES ` + valueRows(set.columns, set.n) + set.suffix
}

// prepared returns the statement stored under key, preparing query() the
// first time. Batches come in few shapes, so the set stays small.
func (w *tokenWriter) prepared(ctx context.Context, key string, query func() string) (*sql.Stmt, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.stmts[key]; st != nil {
		return st, nil
	}
	st, err := w.db.PrepareContext(ctx, w.s.q(query()))
	if err != nil {
		return nil, err
	}
	w.stmts[key] = st
	return st, nil
}

// inTx is the statement stored under key, for tx: the pool's, or, the
// first time, one prepared on tx's own connection, the pool's to be
// prepared once tx has ended (prepareLater). A write transaction must not
// wait for a second connection: on SQLite every other one may be waiting
// for its lock.
func (w *tokenWriter) inTx(ctx context.Context, tx *sql.Tx, key string, query func() string) (*sql.Stmt, error) {
	w.mu.Lock()
	st := w.stmts[key]
	if st == nil {
		w.later[key] = query
	}
	w.mu.Unlock()
	if st != nil {
		return tx.StmtContext(ctx, st), nil
	}
	return tx.PrepareContext(ctx, w.s.q(query()))
}

// prepareLater prepares on the pool what transactions used first: call it
// with no transaction open.
func (w *tokenWriter) prepareLater(ctx context.Context) {
	w.mu.Lock()
	later := w.later
	w.later = map[string]func() string{}
	w.mu.Unlock()
	for key, query := range later {
		_, _ = w.prepared(ctx, key, query) // a failure leaves it for the next transaction
	}
}

// valueRows is the VALUES list for rows rows of these columns, in `?` form.
func valueRows(columns string, rows int) string {
	one := "(?" + strings.Repeat(", ?", strings.Count(columns, ",")) + ")"
	return one + strings.Repeat(","+one, rows-1)
}
