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
-- written), hence text on both dialects.
CREATE TABLE delegations (
    id                    uuid PRIMARY KEY,
    agent_id              uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    client_id             text NOT NULL,
    user_id               uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    scopes                jsonb NOT NULL DEFAULT '[]',
    authorization_details text,
    binding_message       text NOT NULL DEFAULT '',
    status                text NOT NULL,
    auth_req_hash         bytea NOT NULL UNIQUE,
    poll_interval         integer NOT NULL,
    last_poll_at          timestamptz,
    lifetime_seconds      integer NOT NULL,
    created_at            timestamptz NOT NULL,
    decided_at            timestamptz,
    decided_by            text NOT NULL DEFAULT '',
    expires_at            timestamptz NOT NULL,
    redeemed_at           timestamptz,
    reason                text NOT NULL DEFAULT ''
);
CREATE INDEX delegations_user_idx ON delegations (user_id, status);
CREATE INDEX delegations_agent_idx ON delegations (agent_id, status);
CREATE INDEX delegations_created_idx ON delegations (created_at, id);

-- +goose Down
DROP TABLE delegations;
