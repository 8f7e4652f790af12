-- +goose Up
-- Delegations (issue 16): a person lets a user-delegated agent act for
-- them, asked through OpenID Connect CIBA (poll mode). A row is the
-- backchannel request while pending and the delegation once decided.
-- auth_req_hash is the keyed hash of the auth_req_id the agent polls with
-- (never the id itself). expires_at is when the request lapses while
-- pending, and when the delegation ends once active. status is what was
-- written: a pending or active row past expires_at reads as expired
-- (extensions/ciba). redeemed_at: the auth_req_id was spent for a token
-- (once). authorization_details keeps its JSON text as asked (numbers as
-- written), hence TEXT on both dialects.
CREATE TABLE delegations (
    id                    TEXT PRIMARY KEY,
    agent_id              TEXT NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    client_id             TEXT NOT NULL,
    user_id               TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    scopes                TEXT NOT NULL DEFAULT '[]',
    authorization_details TEXT,
    binding_message       TEXT NOT NULL DEFAULT '',
    status                TEXT NOT NULL,
    auth_req_hash         BLOB NOT NULL UNIQUE,
    poll_interval         INTEGER NOT NULL,
    last_poll_at          TIMESTAMP,
    lifetime_seconds      INTEGER NOT NULL,
    created_at            TIMESTAMP NOT NULL,
    decided_at            TIMESTAMP,
    decided_by            TEXT NOT NULL DEFAULT '',
    expires_at            TIMESTAMP NOT NULL,
    redeemed_at           TIMESTAMP,
    reason                TEXT NOT NULL DEFAULT ''
);
CREATE INDEX delegations_user_idx ON delegations (user_id, status);
CREATE INDEX delegations_agent_idx ON delegations (agent_id, status);
CREATE INDEX delegations_created_idx ON delegations (created_at, id);

-- +goose Down
DROP TABLE delegations;
