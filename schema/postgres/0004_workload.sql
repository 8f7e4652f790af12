-- +goose Up
-- Workload identity federation: issuers whose identity tokens (JWTs) the
-- token endpoint accepts in a token exchange, and mappings from a token's
-- subject to the agent it stands for. A mapping goes with its agent; an
-- issuer cannot be deleted while mappings use it (extensions/workload).
CREATE TABLE workload_issuers (
    id                    uuid PRIMARY KEY,
    name                  text NOT NULL,
    issuer_url            text NOT NULL UNIQUE,
    jwks_uri              text NOT NULL,
    platform              text NOT NULL,
    allowed_audiences     jsonb NOT NULL DEFAULT '[]',
    allowed_subjects      jsonb NOT NULL DEFAULT '[]',
    max_token_age_seconds integer NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL
);

CREATE TABLE workload_mappings (
    id                 uuid PRIMARY KEY,
    issuer_id          uuid NOT NULL REFERENCES workload_issuers (id),
    agent_client_id    text NOT NULL REFERENCES agents (client_id) ON DELETE CASCADE,
    subject_pattern    text NOT NULL,
    subject_match_type text NOT NULL,
    scopes             jsonb NOT NULL DEFAULT '[]',
    created_at         timestamptz NOT NULL,
    UNIQUE (issuer_id, subject_pattern)
);
CREATE INDEX workload_mappings_agent_idx ON workload_mappings (agent_client_id);

-- +goose Down
DROP TABLE workload_mappings;
DROP TABLE workload_issuers;
