package persistence

import (
	"context"
	"database/sql/driver"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Agent is an AI agent: a client with a type, capabilities, a trust level
// and a status. Scopes is derived from capabilities and trust level by the
// agents extension and stored with them. Epoch counts recoveries.
type Agent struct {
	ID           string     `db:"id"`
	ClientID     string     `db:"client_id"`
	SecretHash   []byte     `db:"secret_hash"`
	Name         string     `db:"name"`
	Description  string     `db:"description"`
	Type         string     `db:"type"`
	Capabilities StringList `db:"capabilities"`
	Scopes       StringList `db:"scopes"`
	TrustLevel   string     `db:"trust_level"`
	Status       string     `db:"status"`
	Epoch        int        `db:"epoch"`
	CreatedAt    time.Time  `db:"created_at"`
	UpdatedAt    time.Time  `db:"updated_at"`
	KilledAt     *time.Time `db:"killed_at"`
	RecoveredAt  *time.Time `db:"recovered_at"` // the last recovery
}

// Agent statuses.
const (
	AgentActive = "active"
	AgentKilled = "killed"
)

// AgentUserDelegated is the agent type that acts for people (spec: Agent
// types); only it may ask them for a delegation (CIBA).
const AgentUserDelegated = "user-delegated"

// AgentClientPrefix begins every agent's client id; GetClient reads agents
// for these ids and service accounts for the others.
const AgentClientPrefix = "agt_"

const agentColumns = `id, client_id, secret_hash, name, description, type, capabilities, scopes, trust_level, status, epoch, created_at, updated_at, killed_at, recovered_at`

// AuditEntry is one line of an agent's audit trail.
type AuditEntry struct {
	ID        string     `db:"id"`
	AgentID   string     `db:"agent_id"`
	ClientID  string     `db:"client_id"`
	CreatedAt time.Time  `db:"created_at"`
	Action    string     `db:"action"`
	Actor     Actor      `db:"actor"`
	IP        string     `db:"ip"`
	Endpoint  string     `db:"endpoint"`
	Status    *int       `db:"status"`
	Details   JSONObject `db:"details"`
	Intent
}

// Intent is the intent metadata an agent sent with a request (the
// X-Service-* headers); nil fields were not sent.
type Intent struct {
	TaskID       *string `db:"task_id"`
	ChainID      *string `db:"chain_id"`
	ParentTaskID *string `db:"parent_task_id"`
	Action       *string `db:"intent_action"`
	Reason       *string `db:"intent_reason"`
	Initiator    *string `db:"intent_initiator"`
	Depth        *int    `db:"intent_depth"`
}

const auditColumns = `id, agent_id, client_id, created_at, action, actor, ip, endpoint, status, details,
	task_id, chain_id, parent_task_id, intent_action, intent_reason, intent_initiator, intent_depth`

// args are the entry's values in auditColumns order.
func (e *AuditEntry) args() []any {
	return []any{e.ID, e.AgentID, e.ClientID, e.CreatedAt.UTC(), e.Action, e.Actor, e.IP, e.Endpoint, e.Status, e.Details,
		e.TaskID, e.ChainID, e.ParentTaskID, e.Intent.Action, e.Reason, e.Initiator, e.Depth}
}

// JSONObject is a JSON object column (jsonb in PostgreSQL, TEXT in SQLite).
type JSONObject map[string]any

// Value implements driver.Valuer.
func (o JSONObject) Value() (driver.Value, error) {
	if o == nil {
		return "{}", nil
	}
	return jsonValue(map[string]any(o))
}

// Scan implements sql.Scanner.
func (o *JSONObject) Scan(src any) error {
	out := JSONObject{}
	if err := scanJSON(src, &out); err != nil {
		return err
	}
	if out == nil { // a JSON null
		out = JSONObject{}
	}
	*o = out
	return nil
}

// CreateAgent inserts an agent and its first audit entries in one transaction.
func (s *Store) CreateAgent(ctx context.Context, a *Agent, audit ...AuditEntry) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO agents (`+agentColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			a.ID, a.ClientID, a.SecretHash, a.Name, a.Description, a.Type, a.Capabilities, a.Scopes, a.TrustLevel, a.Status, a.Epoch,
			a.CreatedAt.UTC(), a.UpdatedAt.UTC(), utcPtr(a.KilledAt), utcPtr(a.RecoveredAt))
		if err != nil {
			return nil, err
		}
		return nil, s.insertAudit(ctx, tx, audit)
	})
}

// GetAgent reads one agent by id.
func (s *Store) GetAgent(ctx context.Context, id string) (*Agent, error) {
	var a Agent
	if err := s.conn(ctx).GetContext(ctx, &a, s.q(`SELECT `+agentColumns+` FROM agents WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &a, nil
}

// GetAgentByClientID reads one agent by its client id, killed or not.
func (s *Store) GetAgentByClientID(ctx context.Context, clientID string) (*Agent, error) {
	var a Agent
	if err := s.conn(ctx).GetContext(ctx, &a, s.q(`SELECT `+agentColumns+` FROM agents WHERE client_id = ?`), clientID); err != nil {
		return nil, mapError(err)
	}
	return &a, nil
}

// AgentFilter narrows ListAgents; empty fields match everything.
type AgentFilter struct {
	Status     string
	TrustLevel string
	Type       string
}

// ListAgents returns one page of agents, oldest first, and the total.
func (s *Store) ListAgents(ctx context.Context, f AgentFilter, p Page) ([]Agent, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var where []string
	var args []any
	for _, c := range []struct{ col, v string }{{"status", f.Status}, {"trust_level", f.TrustLevel}, {"type", f.Type}} {
		if c.v != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	clause := ""
	if len(where) > 0 {
		clause = " WHERE " + strings.Join(where, " AND ")
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM agents`+clause), args...); err != nil {
		return nil, 0, mapError(err)
	}
	out := []Agent{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+agentColumns+` FROM agents`+clause+` ORDER BY created_at, id LIMIT ? OFFSET ?`),
		append(args, p.Limit, p.Offset)...)
	return out, total, mapError(err)
}

// UpdateAgent reads the agent under a row lock, lets fn change it and name
// the audit entries the change makes, and writes both in one transaction.
// The agent's cached client is evicted (and, with PostgreSQL, the commit
// waits out other replicas' leases: see cache).
func (s *Store) UpdateAgent(ctx context.Context, id string, fn func(*Agent) ([]AuditEntry, error)) (*Agent, error) {
	var out *Agent
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var a Agent
		if err := tx.GetContext(ctx, &a, s.q(`SELECT `+agentColumns+` FROM agents WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		audit, err := fn(&a)
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE agents SET secret_hash = ?, name = ?, description = ?, capabilities = ?, scopes = ?,
			trust_level = ?, status = ?, epoch = ?, updated_at = ?, killed_at = ?, recovered_at = ? WHERE id = ?`),
			a.SecretHash, a.Name, a.Description, a.Capabilities, a.Scopes, a.TrustLevel, a.Status, a.Epoch,
			a.UpdatedAt.UTC(), utcPtr(a.KilledAt), utcPtr(a.RecoveredAt), a.ID)
		if err != nil {
			return nil, err
		}
		out = &a
		return []string{evictClient + a.ClientID}, s.insertAudit(ctx, tx, audit)
	})
	return out, err
}

// DeleteAgent removes an agent; its audit trail stays. Its tokens stop
// working with it (GetAccessTokenSession checks the client).
func (s *Store) DeleteAgent(ctx context.Context, id string, audit ...AuditEntry) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var clientID string
		if err := tx.GetContext(ctx, &clientID, s.q(`SELECT client_id FROM agents WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM agents WHERE id = ?`), id); err != nil {
			return nil, err
		}
		return []string{evictClient + clientID}, s.insertAudit(ctx, tx, audit)
	})
}

func (s *Store) insertAudit(ctx context.Context, tx *sqlx.Tx, entries []AuditEntry) error {
	for _, e := range entries {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO agent_audit (`+auditColumns+`) VALUES (?`+strings.Repeat(`, ?`, 16)+`)`), e.args()...)
		if err != nil {
			return err
		}
	}
	// Entries written by AppendAudit (tokens issued and refused, API calls)
	// are no webhook events and take no such step.
	return s.insertWebhooks(ctx, tx, auditHooks(entries))
}

// AppendAudit writes audit entries through the token writer's group commit
// into the audit inbox: durable when it returns, at the cost of one shared
// commit; readers find them (see auditinbox.go).
func (s *Store) AppendAudit(ctx context.Context, entries ...AuditEntry) error {
	for len(entries) > 0 {
		n := min(len(entries), maxTokenBatch)
		if err := s.write(ctx, tokenWrite{audit: entries[:n]}); err != nil {
			return err
		}
		entries = entries[n:]
	}
	return nil
}

// AuditFilter narrows an agent's audit trail; zero fields match everything.
type AuditFilter struct {
	Actions []string
	From    time.Time // inclusive
	To      time.Time // exclusive
}

// ListAgentAudit returns one page of an agent's audit trail, newest first,
// and the total.
func (s *Store) ListAgentAudit(ctx context.Context, agentID string, f AuditFilter, p Page) ([]AuditEntry, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	if err := s.moveAudit(ctx); err != nil {
		return nil, 0, err
	}
	where := []string{"agent_id = ?"}
	args := []any{agentID}
	if len(f.Actions) > 0 {
		where = append(where, "action IN (?"+strings.Repeat(", ?", len(f.Actions)-1)+")")
		for _, a := range f.Actions {
			args = append(args, a)
		}
	}
	return s.auditPage(ctx, where, args, f.From, f.To, p)
}

// auditPage runs an audit query: the conditions, a time window (zero ends
// are open; to is exclusive), one page newest first, and the total.
func (s *Store) auditPage(ctx context.Context, where []string, args []any, from, to time.Time, p Page) ([]AuditEntry, int, error) {
	if !from.IsZero() {
		where = append(where, "created_at >= ?")
		args = append(args, from.UTC())
	}
	if !to.IsZero() {
		where = append(where, "created_at < ?")
		args = append(args, to.UTC())
	}
	clause := " WHERE " + strings.Join(where, " AND ")
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM agent_audit`+clause), args...); err != nil {
		return nil, 0, mapError(err)
	}
	out := []AuditEntry{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+auditColumns+` FROM agent_audit`+clause+` ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?`),
		append(args, p.Limit, p.Offset)...)
	return out, total, mapError(err)
}

// intentEntry is what makes an audit entry part of the intent trail: any
// intent header; the partial client index of the schema carries the same
// condition, word for word.
const intentEntry = `(task_id IS NOT NULL OR chain_id IS NOT NULL OR parent_task_id IS NOT NULL
    OR intent_action IS NOT NULL OR intent_reason IS NOT NULL OR intent_initiator IS NOT NULL OR intent_depth IS NOT NULL)`

// IntentByTask returns the entries of one task, oldest first.
func (s *Store) IntentByTask(ctx context.Context, taskID string, limit int) ([]AuditEntry, error) {
	if err := s.moveAudit(ctx); err != nil {
		return nil, err
	}
	out := []AuditEntry{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+auditColumns+` FROM agent_audit WHERE task_id = ? ORDER BY created_at, id LIMIT ?`), taskID, limit)
	return out, mapError(err)
}

// IntentByChain returns the entries of one chain, by hop depth and then
// time: the trace of the chain, hop by hop.
func (s *Store) IntentByChain(ctx context.Context, chainID string, limit int) ([]AuditEntry, error) {
	if err := s.moveAudit(ctx); err != nil {
		return nil, err
	}
	out := []AuditEntry{}
	// Hops without a depth come last, on both dialects (they sort NULL
	// differently).
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+auditColumns+` FROM agent_audit WHERE chain_id = ?
		ORDER BY (intent_depth IS NULL), intent_depth, created_at, id LIMIT ?`), chainID, limit)
	return out, mapError(err)
}

// IntentFilter narrows an intent search; zero fields match everything.
type IntentFilter struct {
	ClientID  string
	Action    string
	Initiator string
	From, To  time.Time // To exclusive
}

// SearchIntent returns one page of intent entries, newest first, and the total.
func (s *Store) SearchIntent(ctx context.Context, f IntentFilter, p Page) ([]AuditEntry, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	if err := s.moveAudit(ctx); err != nil {
		return nil, 0, err
	}
	// An action or initiator filter already implies an intent entry; saying
	// so again would make the database visit every row it counts.
	where := []string{}
	if f.Action == "" && f.Initiator == "" {
		where = append(where, intentEntry)
	}
	var args []any
	for _, c := range []struct{ col, v string }{{"client_id", f.ClientID}, {"intent_action", f.Action}, {"intent_initiator", f.Initiator}} {
		if c.v != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	return s.auditPage(ctx, where, args, f.From, f.To, p)
}
