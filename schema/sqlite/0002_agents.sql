-- +goose Up
-- An agent is a client of its own kind. scopes is derived from capabilities
-- and trust_level (extensions/agents) and stored with them, so the token
-- endpoint reads one row. epoch counts recoveries: tokens carry it, and a
-- recovered agent's older tokens never match again.
CREATE TABLE agents (
    id           TEXT PRIMARY KEY,
    client_id    TEXT NOT NULL UNIQUE,
    secret_hash  BLOB NOT NULL,
    name         TEXT NOT NULL,
    description  TEXT NOT NULL DEFAULT '',
    type         TEXT NOT NULL,
    capabilities TEXT NOT NULL DEFAULT '[]',
    scopes       TEXT NOT NULL DEFAULT '[]',
    trust_level  TEXT NOT NULL,
    status       TEXT NOT NULL,
    epoch        INTEGER NOT NULL DEFAULT 0,
    created_at   TIMESTAMP NOT NULL,
    updated_at   TIMESTAMP NOT NULL,
    killed_at    TIMESTAMP
);
CREATE INDEX agents_created_idx ON agents (created_at, id);

-- The audit trail of agents. Entries outlive the agent they describe.
CREATE TABLE agent_audit (
    id         TEXT PRIMARY KEY,
    agent_id   TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    action     TEXT NOT NULL,
    actor      TEXT NOT NULL DEFAULT '',
    ip         TEXT NOT NULL DEFAULT '',
    endpoint   TEXT NOT NULL DEFAULT '',
    status     INTEGER,
    details    TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX agent_audit_agent_idx ON agent_audit (agent_id, created_at, id);

-- +goose Down
DROP TABLE agent_audit;
DROP TABLE agents;
