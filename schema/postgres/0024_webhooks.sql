-- +goose Up
-- Webhooks (issue 18). An endpoint names the event types it wants; its
-- signing secret is sealed (AES-GCM under a key derived from the system
-- secret), since signing needs it in the clear, and during a rotation the
-- previous one signs too until old_secret_until. failing_since: the first
-- failure since the last success; lease_until: the replica delivering to it
-- now, so that one endpoint's messages go out one at a time, in order.
CREATE TABLE webhook_endpoints (
    id               uuid PRIMARY KEY,
    url              text NOT NULL,
    description      text NOT NULL DEFAULT '',
    event_types      jsonb NOT NULL DEFAULT '[]',
    enabled          boolean NOT NULL DEFAULT true,
    disabled_reason  text NOT NULL DEFAULT '',
    secret           bytea NOT NULL,
    old_secret       bytea,
    old_secret_until timestamptz,
    failing_since    timestamptz,
    lease_until      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);

-- The outbox of webhook messages: one row per message and endpoint, written
-- in the transaction of the event it announces. payload is the exact body
-- that is signed and sent (text, never re-encoded). message_id is the
-- event's, the same for every endpoint and every attempt (webhook-id).
CREATE TABLE webhook_deliveries (
    id              uuid PRIMARY KEY,
    endpoint_id     uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    message_id      text NOT NULL,
    event_type      text NOT NULL,
    payload         text NOT NULL,
    status          text NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_attempt_at timestamptz,
    last_status     integer,
    last_error      text NOT NULL DEFAULT '',
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
