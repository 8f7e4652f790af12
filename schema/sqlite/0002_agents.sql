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

-- The audit trail of agents. Entries outlive the agent they describe, so
-- they keep its client id too. The table is clustered by agent and time
-- (WITHOUT ROWID): an agent's trail is one range, and an insert updates one
-- B-tree for the trail plus the partial intent indexes, which only entries
-- that carry intent headers enter.
CREATE TABLE agent_audit (
    id               TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    client_id        TEXT NOT NULL,
    created_at       TIMESTAMP NOT NULL,
    action           TEXT NOT NULL,
    actor            TEXT NOT NULL DEFAULT '',
    ip               TEXT NOT NULL DEFAULT '',
    endpoint         TEXT NOT NULL DEFAULT '',
    status           INTEGER,
    details          TEXT NOT NULL DEFAULT '{}',
    task_id          TEXT,
    chain_id         TEXT,
    parent_task_id   TEXT,
    intent_action    TEXT,
    intent_reason    TEXT,
    intent_initiator TEXT,
    intent_depth     INTEGER,
    PRIMARY KEY (agent_id, created_at, id)
) WITHOUT ROWID;
CREATE INDEX agent_audit_task_idx ON agent_audit (task_id, created_at) WHERE task_id IS NOT NULL;
CREATE INDEX agent_audit_chain_idx ON agent_audit (chain_id, intent_depth, created_at) WHERE chain_id IS NOT NULL;
CREATE INDEX agent_audit_client_idx ON agent_audit (client_id, created_at) WHERE task_id IS NOT NULL OR chain_id IS NOT NULL OR parent_task_id IS NOT NULL
    OR intent_action IS NOT NULL OR intent_reason IS NOT NULL OR intent_initiator IS NOT NULL OR intent_depth IS NOT NULL;
CREATE INDEX agent_audit_intent_action_idx ON agent_audit (intent_action, created_at) WHERE intent_action IS NOT NULL;
CREATE INDEX agent_audit_intent_initiator_idx ON agent_audit (intent_initiator, created_at) WHERE intent_initiator IS NOT NULL;

-- Entries recorded on the request path (token_issued, token_refused,
-- api_call) are committed here first, in arrival order, with no index to
-- update: an insert appends. The store moves them into agent_audit in
-- batches sorted by agent, a fraction of the page writes, and every audit
-- read moves what is waiting first.
CREATE TABLE agent_audit_inbox (
    id               TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    client_id        TEXT NOT NULL,
    created_at       TIMESTAMP NOT NULL,
    action           TEXT NOT NULL,
    actor            TEXT NOT NULL DEFAULT '',
    ip               TEXT NOT NULL DEFAULT '',
    endpoint         TEXT NOT NULL DEFAULT '',
    status           INTEGER,
    details          TEXT NOT NULL DEFAULT '{}',
    task_id          TEXT,
    chain_id         TEXT,
    parent_task_id   TEXT,
    intent_action    TEXT,
    intent_reason    TEXT,
    intent_initiator TEXT,
    intent_depth     INTEGER
);

-- +goose Down
DROP TABLE agent_audit_inbox;
DROP TABLE agent_audit;
DROP TABLE agents;
