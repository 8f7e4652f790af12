-- +goose Up
-- Human-in-the-loop approvals (issue 15). A policy says which agent actions
-- need a person: the first match by priority (higher first), then creation
-- order (created_at, id: ids are UUIDv7), decides.
CREATE TABLE hitl_policies (
    id                   TEXT PRIMARY KEY,
    name                 TEXT NOT NULL,
    action_pattern       TEXT NOT NULL,
    resource_pattern     TEXT NOT NULL,
    approval_mode        TEXT NOT NULL,
    timeout_seconds      INTEGER NOT NULL,
    approver_type        TEXT NOT NULL,
    approver_id          TEXT NOT NULL,
    auto_deny_on_timeout INTEGER NOT NULL DEFAULT 0,
    priority             REAL NOT NULL DEFAULT 0,
    created_at           TIMESTAMP NOT NULL,
    updated_at           TIMESTAMP NOT NULL
);
CREATE INDEX hitl_policies_order_idx ON hitl_policies (priority DESC, created_at, id);

-- A request carries a copy of what its policy said when it was made
-- (approver, mode, timeout outcome): changing or deleting the policy later
-- does not change who may decide a pending request. status is what was
-- written; a pending request past expires_at reads as timed out whatever
-- a sweeper has done (extensions/hitl). redeemed_at: its approval was
-- spent at the token endpoint (once).
CREATE TABLE hitl_requests (
    id                   TEXT PRIMARY KEY,
    agent_id             TEXT NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    client_id            TEXT NOT NULL,
    policy_id            TEXT,
    policy_name          TEXT NOT NULL,
    action               TEXT NOT NULL,
    resource             TEXT NOT NULL,
    context              TEXT NOT NULL DEFAULT '{}',
    approval_mode        TEXT NOT NULL,
    approver_type        TEXT NOT NULL,
    approver_id          TEXT NOT NULL,
    auto_deny_on_timeout INTEGER NOT NULL DEFAULT 0,
    status               TEXT NOT NULL,
    created_at           TIMESTAMP NOT NULL,
    expires_at           TIMESTAMP NOT NULL,
    decided_at           TIMESTAMP,
    decided_by           TEXT NOT NULL DEFAULT '',
    reason               TEXT NOT NULL DEFAULT '',
    redeemed_at          TIMESTAMP
);
CREATE INDEX hitl_requests_agent_idx ON hitl_requests (agent_id, status);
CREATE INDEX hitl_requests_pending_idx ON hitl_requests (expires_at) WHERE status = 'pending_approval';

-- Just-in-time grants (issue 15): more scopes for an agent, for a bounded
-- time. A rule lets a scope be granted automatically, up to a duration,
-- to agents of a trust level or higher; grants under no rule, or whose
-- action and resource a HITL policy matches, need a person
-- (hitl_request_id links the request whose approval activates them).
CREATE TABLE jit_rules (
    id                   TEXT PRIMARY KEY,
    scope                TEXT NOT NULL,
    max_duration_seconds INTEGER NOT NULL,
    min_trust_level      TEXT NOT NULL,
    created_at           TIMESTAMP NOT NULL
);

CREATE TABLE jit_grants (
    id               TEXT PRIMARY KEY,
    agent_id         TEXT NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    client_id        TEXT NOT NULL,
    action           TEXT NOT NULL,
    resource         TEXT NOT NULL,
    scopes           TEXT NOT NULL DEFAULT '[]',
    duration_seconds INTEGER NOT NULL,
    context          TEXT NOT NULL DEFAULT '{}',
    status           TEXT NOT NULL,
    hitl_request_id  TEXT REFERENCES hitl_requests (id) ON DELETE SET NULL,
    created_at       TIMESTAMP NOT NULL,
    activated_at     TIMESTAMP,
    expires_at       TIMESTAMP,
    ended_at         TIMESTAMP,
    ended_by         TEXT NOT NULL DEFAULT '',
    reason           TEXT NOT NULL DEFAULT ''
);
CREATE INDEX jit_grants_agent_idx ON jit_grants (agent_id, status);
CREATE INDEX jit_grants_request_idx ON jit_grants (hitl_request_id);

-- +goose Down
DROP TABLE jit_grants;
DROP TABLE jit_rules;
DROP TABLE hitl_requests;
DROP TABLE hitl_policies;
