-- +goose Up
-- An agent is a client of its own kind. scopes is derived from capabilities
-- and trust_level (extensions/agents) and stored with them, so the token
-- endpoint reads one row. epoch counts recoveries: tokens carry it, and a
-- recovered agent's older tokens never match again.
CREATE TABLE agents (
    id           uuid PRIMARY KEY,
    client_id    text NOT NULL UNIQUE,
    secret_hash  bytea NOT NULL,
    name         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    type         text NOT NULL,
    capabilities jsonb NOT NULL DEFAULT '[]',
    scopes       jsonb NOT NULL DEFAULT '[]',
    trust_level  text NOT NULL,
    status       text NOT NULL,
    epoch        integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    killed_at    timestamptz
);
CREATE INDEX agents_created_idx ON agents (created_at, id);

-- The audit trail of agents. Entries outlive the agent they describe, so
-- they keep its client id too. Intent indexes are partial: only entries that
-- carry intent headers enter them.
CREATE TABLE agent_audit (
    id               uuid PRIMARY KEY,
    agent_id         uuid NOT NULL,
    client_id        text NOT NULL,
    created_at       timestamptz NOT NULL,
    action           text NOT NULL,
    actor            text NOT NULL DEFAULT '',
    ip               text NOT NULL DEFAULT '',
    endpoint         text NOT NULL DEFAULT '',
    status           integer,
    details          jsonb NOT NULL DEFAULT '{}',
    task_id          text,
    chain_id         text,
    parent_task_id   text,
    intent_action    text,
    intent_reason    text,
    intent_initiator text,
    intent_depth     integer
);
CREATE INDEX agent_audit_agent_idx ON agent_audit (agent_id, created_at, id);
CREATE INDEX agent_audit_task_idx ON agent_audit (task_id, created_at) WHERE task_id IS NOT NULL;
CREATE INDEX agent_audit_chain_idx ON agent_audit (chain_id, intent_depth, created_at) WHERE chain_id IS NOT NULL;
CREATE INDEX agent_audit_client_idx ON agent_audit (client_id, created_at) WHERE task_id IS NOT NULL OR chain_id IS NOT NULL OR parent_task_id IS NOT NULL
    OR intent_action IS NOT NULL OR intent_reason IS NOT NULL OR intent_initiator IS NOT NULL OR intent_depth IS NOT NULL;
CREATE INDEX agent_audit_intent_action_idx ON agent_audit (intent_action, created_at) WHERE intent_action IS NOT NULL;
CREATE INDEX agent_audit_intent_initiator_idx ON agent_audit (intent_initiator, created_at) WHERE intent_initiator IS NOT NULL;

-- +goose Down
DROP TABLE agent_audit;
DROP TABLE agents;
