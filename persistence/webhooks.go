package persistence

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
)

// WebhookEndpoint is a receiver of webhook messages.
type WebhookEndpoint struct {
	ID             string     `db:"id"`
	URL            string     `db:"url"`
	Description    string     `db:"description"`
	EventTypes     StringList `db:"event_types"`
	Enabled        bool       `db:"enabled"`
	DisabledReason string     `db:"disabled_reason"`
	Secret         []byte     `db:"secret"`     // sealed by extensions/webhooks
	OldSecret      []byte     `db:"old_secret"` // the previous secret during a rotation's grace
	OldSecretUntil *time.Time `db:"old_secret_until"`
	FailingSince   *time.Time `db:"failing_since"`
	LeaseUntil     time.Time  `db:"lease_until"`
	CreatedAt      time.Time  `db:"created_at"`
	UpdatedAt      time.Time  `db:"updated_at"`
}

const webhookEndpointColumns = `id, url, description, event_types, enabled, disabled_reason, secret, old_secret, old_secret_until,
	failing_since, lease_until, created_at, updated_at`

// WebhookDelivery is one message for one endpoint, and how its delivery went.
type WebhookDelivery struct {
	ID            string     `db:"id"`
	EndpointID    string     `db:"endpoint_id"`
	MessageID     string     `db:"message_id"`
	EventType     string     `db:"event_type"`
	Payload       string     `db:"payload"`
	Status        string     `db:"status"`
	Attempts      int        `db:"attempts"`
	NextAttemptAt time.Time  `db:"next_attempt_at"`
	LastAttemptAt *time.Time `db:"last_attempt_at"`
	LastStatus    *int       `db:"last_status"`
	LastError     string     `db:"last_error"`
	DeliveredAt   *time.Time `db:"delivered_at"`
	CreatedAt     time.Time  `db:"created_at"`
}

const webhookDeliveryColumns = `id, endpoint_id, message_id, event_type, payload, status, attempts, next_attempt_at, last_attempt_at,
	last_status, last_error, delivered_at, created_at`

// Delivery statuses: pending until the endpoint takes it (delivered) or
// every attempt of the schedule failed (failed; a redelivery makes it
// pending again).
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// evictWebhooks: the subscriptions (event type → endpoints), as a whole.
const evictWebhooks = "webhooks:"

// webhookRoutes maps an event log's entry type, "source:type", to the
// webhook event type it is published as; nil or missing: not published.
type webhookRoutes map[string]string

// Event sources, the logs an entry comes from.
const (
	sourceAuth      = "auth"
	sourceDirectory = "directory"
	sourceAgent     = "agent"
)

// RouteWebhooks says which entries of the event logs are webhook events,
// and as which type: keys are "auth:<auth event type>", "directory:<type>"
// or "agent:<audit action>". Set once, before the store serves; until then
// no entry is published.
func (s *Store) RouteWebhooks(routes map[string]string) {
	r := webhookRoutes(routes)
	s.hookRoutes.Store(&r)
}

// hookEvent is an event log's entry as a webhook message announces it.
type hookEvent struct {
	id, source, typ string
	at              time.Time
	data            map[string]any
}

// webhookPayload is a message's body (Standard Webhooks: type, timestamp,
// data).
type webhookPayload struct {
	Type      string         `json:"type"`
	Timestamp string         `json:"timestamp"`
	Data      map[string]any `json:"data"`
}

// WebhookPayload encodes a message body.
func WebhookPayload(typ string, at time.Time, data map[string]any) (string, error) {
	b, err := json.Marshal(webhookPayload{Type: typ, Timestamp: at.UTC().Format("2006-01-02T15:04:05.000Z"), Data: data})
	return string(b), err
}

// webhookRows are the outbox rows announcing events to the endpoints that
// want them: none (and no work) unless an endpoint does. The subscriptions
// are read through q on a cache miss (in the caller's transaction).
func (s *Store) webhookRows(ctx context.Context, q querier, events []hookEvent) ([]row, error) {
	routes := s.hookRoutes.Load()
	if routes == nil || len(events) == 0 {
		return nil, nil
	}
	var subs map[string][]string
	var out []row
	for _, e := range events {
		typ, ok := (*routes)[e.source+":"+e.typ]
		if !ok {
			continue
		}
		if subs == nil {
			var err error
			if subs, err = s.webhookSubscriptions(ctx, q); err != nil {
				return nil, err
			}
		}
		endpoints := subs[typ]
		if len(endpoints) == 0 {
			continue
		}
		payload, err := WebhookPayload(typ, e.at, e.data)
		if err != nil {
			return nil, err
		}
		for _, id := range endpoints {
			out = append(out, webhookRow(&WebhookDelivery{ID: uuid.Must(uuid.NewV7()).String(), EndpointID: id, MessageID: "msg_" + e.id,
				EventType: typ, Payload: payload, Status: DeliveryPending, NextAttemptAt: e.at, CreatedAt: e.at}))
		}
	}
	return out, nil
}

func webhookRow(d *WebhookDelivery) row {
	return row{table: "webhook_deliveries", columns: webhookDeliveryColumns, args: []any{d.ID, d.EndpointID, d.MessageID, d.EventType,
		d.Payload, d.Status, d.Attempts, d.NextAttemptAt.UTC(), d.LastAttemptAt, d.LastStatus, d.LastError, d.DeliveredAt, d.CreatedAt.UTC()}}
}

// insertWebhooks writes the outbox rows of events through q.
func (s *Store) insertWebhooks(ctx context.Context, q querier, events []hookEvent) error {
	rows, err := s.webhookRows(ctx, q, events)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if _, err := q.ExecContext(ctx, s.q(`INSERT INTO webhook_deliveries (`+r.columns+`) VALUES (?`+strings.Repeat(`, ?`, len(r.args)-1)+`)`), r.args...); err != nil {
			return err
		}
	}
	return nil
}

// webhookSubscriptions maps each webhook event type to the endpoints that
// want it, from the cache when it can (every event asks). Disabled
// endpoints are included: their messages wait for them (see Store
// UpdateWebhookEndpoint).
func (s *Store) webhookSubscriptions(ctx context.Context, q querier) (map[string][]string, error) {
	c := s.cache // the set is never changed in the caller's unit: no need for noCache
	if subs := cachedSet(c, &c.webhooks); subs != nil {
		return subs, nil
	}
	rs := c.begin()
	var rows []struct {
		ID    string     `db:"id"`
		Types StringList `db:"event_types"`
	}
	if err := q.SelectContext(ctx, &rows, `SELECT id, event_types FROM webhook_endpoints ORDER BY created_at, id`); err != nil {
		return nil, err
	}
	subs := map[string][]string{}
	for _, r := range rows {
		for _, t := range r.Types {
			subs[t] = append(subs[t], r.ID)
		}
	}
	putSet(c, &c.webhooks, rs, subs)
	return subs, nil
}

// The entries of each log, as webhook events.

func (e AuthEvent) hook() hookEvent {
	data := map[string]any{"eventId": e.ID}
	for k, v := range map[string]*string{"userId": e.UserID, "applicationId": e.ApplicationID, "sessionId": e.SessionID} {
		if v != nil {
			data[k] = *v
		}
	}
	for k, v := range map[string]string{"clientId": e.ClientID, "reason": e.Reason, "ip": e.IP, "userAgent": e.UserAgent} {
		if v != "" {
			data[k] = v
		}
	}
	if len(e.Data) > 0 {
		data["details"] = map[string]any(e.Data)
	}
	return hookEvent{id: e.ID, source: sourceAuth, typ: e.Type, at: e.CreatedAt, data: data}
}

func authHooks(events []AuthEvent) []hookEvent {
	out := make([]hookEvent, len(events))
	for i, e := range events {
		out[i] = e.hook()
	}
	return out
}

func directoryHooks(events []DirectoryEvent) []hookEvent {
	out := make([]hookEvent, len(events))
	for i, e := range events {
		data := map[string]any{"eventId": e.ID, "actor": e.Actor}
		if e.UserID != nil {
			data["userId"] = *e.UserID
		}
		if e.OrgID != nil {
			data["orgId"] = *e.OrgID
		}
		if len(e.Data) > 0 {
			data["details"] = map[string]any(e.Data)
		}
		out[i] = hookEvent{id: e.ID, source: sourceDirectory, typ: e.Type, at: e.CreatedAt, data: data}
	}
	return out
}

func auditHooks(entries []AuditEntry) []hookEvent {
	out := make([]hookEvent, len(entries))
	for i, e := range entries {
		data := map[string]any{"eventId": e.ID, "agentId": e.AgentID, "clientId": e.ClientID, "actor": e.Actor}
		if len(e.Details) > 0 {
			data["details"] = map[string]any(e.Details)
		}
		out[i] = hookEvent{id: e.ID, source: sourceAgent, typ: e.Action, at: e.CreatedAt, data: data}
	}
	return out
}

// The endpoints.

// CreateWebhookEndpoint inserts an endpoint.
func (s *Store) CreateWebhookEndpoint(ctx context.Context, e *WebhookEndpoint) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO webhook_endpoints (`+webhookEndpointColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			e.ID, e.URL, e.Description, e.EventTypes, e.Enabled, e.DisabledReason, e.Secret, e.OldSecret, utcPtr(e.OldSecretUntil),
			utcPtr(e.FailingSince), e.LeaseUntil.UTC(), e.CreatedAt.UTC(), e.UpdatedAt.UTC())
		return []string{evictWebhooks}, err
	})
}

// GetWebhookEndpoint reads one endpoint.
func (s *Store) GetWebhookEndpoint(ctx context.Context, id string) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	if err := s.conn(ctx).GetContext(ctx, &e, s.q(`SELECT `+webhookEndpointColumns+` FROM webhook_endpoints WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &e, nil
}

// ListWebhookEndpoints returns one page of endpoints, oldest first, and
// the total.
func (s *Store) ListWebhookEndpoints(ctx context.Context, p Page) ([]WebhookEndpoint, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM webhook_endpoints`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []WebhookEndpoint{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+webhookEndpointColumns+` FROM webhook_endpoints ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// UpdateWebhookEndpoint reads the endpoint under a row lock, lets fn change
// it and writes it back in one transaction. An endpoint enabled again has
// its waiting messages tried at once, from where they stopped.
func (s *Store) UpdateWebhookEndpoint(ctx context.Context, id string, now time.Time, fn func(*WebhookEndpoint) error) (*WebhookEndpoint, error) {
	var out *WebhookEndpoint
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var e WebhookEndpoint
		if err := tx.GetContext(ctx, &e, s.q(`SELECT `+webhookEndpointColumns+` FROM webhook_endpoints WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		wasEnabled := e.Enabled
		if err := fn(&e); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_endpoints SET url = ?, description = ?, event_types = ?, enabled = ?, disabled_reason = ?,
			secret = ?, old_secret = ?, old_secret_until = ?, failing_since = ?, updated_at = ? WHERE id = ?`),
			e.URL, e.Description, e.EventTypes, e.Enabled, e.DisabledReason, e.Secret, e.OldSecret, utcPtr(e.OldSecretUntil),
			utcPtr(e.FailingSince), e.UpdatedAt.UTC(), e.ID); err != nil {
			return nil, err
		}
		if e.Enabled && !wasEnabled {
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_deliveries SET next_attempt_at = ? WHERE endpoint_id = ? AND status = ?`),
				now.UTC(), e.ID, DeliveryPending); err != nil {
				return nil, err
			}
		}
		out = &e
		return []string{evictWebhooks}, nil
	})
	return out, err
}

// DeleteWebhookEndpoint removes an endpoint and its messages.
func (s *Store) DeleteWebhookEndpoint(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM webhook_endpoints WHERE id = ?`), id)
		if err != nil {
			return nil, err
		}
		return []string{evictWebhooks}, affectedOne(res)
	})
}

// The outbox.

// QueueWebhook adds one message for one endpoint (a test message).
func (s *Store) QueueWebhook(ctx context.Context, d *WebhookDelivery) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		r := webhookRow(d)
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO webhook_deliveries (`+r.columns+`) VALUES (?`+strings.Repeat(`, ?`, len(r.args)-1)+`)`), r.args...)
		return nil, err
	})
}

// DueWebhookEndpoints returns enabled endpoints with messages due at now
// that no replica is delivering to.
func (s *Store) DueWebhookEndpoints(ctx context.Context, now time.Time, limit int) ([]string, error) {
	out := []string{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT e.id FROM webhook_endpoints e WHERE e.enabled = ? AND e.lease_until < ?
		AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.status = ? AND d.next_attempt_at <= ?) LIMIT ?`),
		true, now.UTC(), DeliveryPending, now.UTC(), limit)
	return out, mapError(err)
}

// ClaimWebhookEndpoint makes this replica the one delivering to the
// endpoint until until, unless another one is; false when it is.
func (s *Store) ClaimWebhookEndpoint(ctx context.Context, id string, now, until time.Time) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE webhook_endpoints SET lease_until = ? WHERE id = ? AND enabled = ? AND lease_until < ?`),
		until.UTC(), id, true, now.UTC())
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	return n == 1, mapError(err)
}

// ReleaseWebhookEndpoint ends this replica's claim.
func (s *Store) ReleaseWebhookEndpoint(ctx context.Context, id string) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE webhook_endpoints SET lease_until = ? WHERE id = ?`), time.Unix(0, 0).UTC(), id)
	return mapError(err)
}

// DueWebhooks returns an endpoint's messages due at now, in the order of
// their events.
func (s *Store) DueWebhooks(ctx context.Context, endpointID string, now time.Time, limit int) ([]WebhookDelivery, error) {
	out := []WebhookDelivery{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+webhookDeliveryColumns+` FROM webhook_deliveries
		WHERE endpoint_id = ? AND status = ? AND next_attempt_at <= ? ORDER BY created_at, id LIMIT ?`),
		endpointID, DeliveryPending, now.UTC(), limit)
	return out, mapError(err)
}

// Attempt is how one delivery attempt went.
type Attempt struct {
	At     time.Time
	Status *int   // the endpoint's HTTP status, if it answered
	Error  string // empty: delivered
	Next   *time.Time
	// DisableAfter: the endpoint is disabled when it has failed without a
	// success since before this time.
	DisableAfter time.Time
}

// RecordWebhookAttempt writes an attempt's outcome, with the endpoint's
// health, in one transaction: a success clears the endpoint's failure; a
// failure schedules the next attempt (a.Next; nil: the message has failed
// for good) and disables an endpoint failing since before a.DisableAfter.
// It answers whether the endpoint was disabled.
func (s *Store) RecordWebhookAttempt(ctx context.Context, d *WebhookDelivery, a Attempt) (disabled bool, err error) {
	err = s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		at := a.At.UTC()
		if a.Error == "" {
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, last_attempt_at = ?,
				last_status = ?, last_error = '', delivered_at = ? WHERE id = ?`), DeliveryDelivered, at, a.Status, at, d.ID); err != nil {
				return nil, err
			}
			_, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_endpoints SET failing_since = NULL WHERE id = ?`), d.EndpointID)
			return nil, err
		}
		status, next := DeliveryPending, at
		if a.Next != nil {
			next = a.Next.UTC()
		} else {
			status = DeliveryFailed
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, next_attempt_at = ?,
			last_attempt_at = ?, last_status = ?, last_error = ? WHERE id = ?`), status, next, at, a.Status, a.Error, d.ID); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_endpoints SET failing_since = COALESCE(failing_since, ?) WHERE id = ?`), at, d.EndpointID); err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_endpoints SET enabled = ?, disabled_reason = ?, updated_at = ?
			WHERE id = ? AND enabled = ? AND failing_since < ?`), false, "failing", at, d.EndpointID, true, a.DisableAfter.UTC())
		if err != nil {
			return nil, err
		}
		n, err := res.RowsAffected()
		disabled = n == 1
		return nil, err
	})
	return disabled, err
}

// WebhookFilter narrows a list of deliveries.
type WebhookFilter struct {
	EndpointID string
	Status     string // empty: any
}

// ListWebhookDeliveries returns one page of an endpoint's messages, newest
// first, and the total.
func (s *Store) ListWebhookDeliveries(ctx context.Context, f WebhookFilter, p Page) ([]WebhookDelivery, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	where, args := ` WHERE endpoint_id = ?`, []any{f.EndpointID}
	if f.Status != "" {
		where += ` AND status = ?`
		args = append(args, f.Status)
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM webhook_deliveries`+where), args...); err != nil {
		return nil, 0, mapError(err)
	}
	out := []WebhookDelivery{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+webhookDeliveryColumns+` FROM webhook_deliveries`+where+
		` ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?`), append(args, p.Limit, p.Offset)...)
	return out, total, mapError(err)
}

// GetWebhookDelivery reads one of an endpoint's messages.
func (s *Store) GetWebhookDelivery(ctx context.Context, endpointID, id string) (*WebhookDelivery, error) {
	var d WebhookDelivery
	if err := s.conn(ctx).GetContext(ctx, &d, s.q(`SELECT `+webhookDeliveryColumns+` FROM webhook_deliveries WHERE id = ? AND endpoint_id = ?`),
		id, endpointID); err != nil {
		return nil, mapError(err)
	}
	return &d, nil
}

// RedeliverWebhook makes a message pending again, due at now, with a new
// schedule: sent again under its own webhook-id, whatever became of it.
func (s *Store) RedeliverWebhook(ctx context.Context, endpointID, id string, now time.Time) (*WebhookDelivery, error) {
	var out *WebhookDelivery
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE webhook_deliveries SET status = ?, attempts = 0, next_attempt_at = ?, delivered_at = NULL
			WHERE id = ? AND endpoint_id = ?`), DeliveryPending, now.UTC(), id, endpointID)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		var d WebhookDelivery
		err = tx.GetContext(ctx, &d, s.q(`SELECT `+webhookDeliveryColumns+` FROM webhook_deliveries WHERE id = ?`), id)
		out = &d
		return nil, err
	})
	return out, err
}

// DeleteDeliveredWebhooks drops messages delivered before before.
func (s *Store) DeleteDeliveredWebhooks(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM webhook_deliveries WHERE status = ? AND delivered_at < ?`), DeliveryDelivered, before.UTC())
	if err != nil {
		return 0, mapError(err)
	}
	return res.RowsAffected()
}
