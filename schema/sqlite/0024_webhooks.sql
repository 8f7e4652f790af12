-- +goose Up
-- Webhooks (issue 18). An endpoint names the event types it wants; its
-- signing secret is sealed (AES-GCM under a key derived from the system
-- secret), since signing needs it in the clear, and during a rotation the
-- previous one signs too until old_secret_until. failing_since: the first
-- failure since the last success; lease_until: the replica delivering to it
-- now, so that one endpoint's messages go out one at a time, in order.
CREATE TABLE webhook_endpoints (
    id               TEXT PRIMARY KEY,
    url              TEXT NOT NULL,
    description      TEXT NOT NULL DEFAULT '',
    event_types      TEXT NOT NULL DEFAULT '[]',
    enabled          INTEGER NOT NULL DEFAULT 1,
    disabled_reason  TEXT NOT NULL DEFAULT '',
    secret           BLOB NOT NULL,
    old_secret       BLOB,
    old_secret_until TIMESTAMP,
    failing_since    TIMESTAMP,
    lease_until      TIMESTAMP NOT NULL,
    created_at       TIMESTAMP NOT NULL,
    updated_at       TIMESTAMP NOT NULL
);

-- The outbox of webhook messages: one row per message and endpoint, written
-- in the transaction of the event it announces. payload is the exact body
-- that is signed and sent (text, never re-encoded). message_id is the
-- event's, the same for every endpoint and every attempt (webhook-id).
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    endpoint_id     TEXT NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    message_id      TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    payload         TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMP NOT NULL,
    last_attempt_at TIMESTAMP,
    last_status     INTEGER,
    last_error      TEXT NOT NULL DEFAULT '',
    delivered_at    TIMESTAMP,
    created_at      TIMESTAMP NOT NULL
);
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
