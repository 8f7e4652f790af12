-- +goose Up
-- A sign-in whose first factor succeeded and that must be stepped up: the
-- person, the application, the hosted flow (flow_id) or the embedded API
-- (the handle's keyed hash, the PKCE challenge of the step that began it),
-- the first factor's amr, the second factors offered, and the risk rules
-- that asked for it. Used once, within its lifetime.
CREATE TABLE mfa_pending (
    id             uuid PRIMARY KEY,
    handle_hash    bytea,
    user_id        uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id      text NOT NULL,
    flow_id        uuid,
    amr            jsonb NOT NULL,
    factors        jsonb NOT NULL,
    risk           jsonb NOT NULL DEFAULT '[]',
    code_challenge text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    used_at        timestamptz
);
CREATE UNIQUE INDEX mfa_pending_handle_idx ON mfa_pending (handle_hash);
CREATE INDEX mfa_pending_flow_idx ON mfa_pending (flow_id);
CREATE INDEX mfa_pending_expires_idx ON mfa_pending (expires_at);

-- +goose Down
DROP TABLE mfa_pending;
