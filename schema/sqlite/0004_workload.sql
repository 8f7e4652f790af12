-- +goose Up
-- Workload identity federation: issuers whose identity tokens (JWTs) the
-- token endpoint accepts in a token exchange, and mappings from a token's
-- subject to the agent it stands for. A mapping goes with its agent; an
-- issuer cannot be deleted while mappings use it (extensions/workload).
CREATE TABLE workload_issuers (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    issuer_url            TEXT NOT NULL UNIQUE,
    jwks_uri              TEXT NOT NULL,
    platform              TEXT NOT NULL,
    allowed_audiences     TEXT NOT NULL DEFAULT '[]',
    allowed_subjects      TEXT NOT NULL DEFAULT '[]',
    max_token_age_seconds INTEGER NOT NULL,
    created_at            TIMESTAMP NOT NULL,
    updated_at            TIMESTAMP NOT NULL
);

CREATE TABLE workload_mappings (
    id                 TEXT PRIMARY KEY,
    issuer_id          TEXT NOT NULL REFERENCES workload_issuers (id),
    agent_client_id    TEXT NOT NULL REFERENCES agents (client_id) ON DELETE CASCADE,
    subject_pattern    TEXT NOT NULL,
    subject_match_type TEXT NOT NULL,
    scopes             TEXT NOT NULL DEFAULT '[]',
    created_at         TIMESTAMP NOT NULL,
    UNIQUE (issuer_id, subject_pattern)
);
CREATE INDEX workload_mappings_agent_idx ON workload_mappings (agent_client_id);

-- +goose Down
DROP TABLE workload_mappings;
DROP TABLE workload_issuers;
