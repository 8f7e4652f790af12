-- +goose Up
-- Human-in-the-loop approvals (issue 15). A policy says which agent actions
-- need a person: the first match by priority (higher first), then creation
-- order (created_at, id: ids are UUIDv7), decides.
CREATE TABLE hitl_policies (
    id                   uuid PRIMARY KEY,
    name                 text NOT NULL,
    action_pattern       text NOT NULL,
    resource_pattern     text NOT NULL,
    approval_mode        text NOT NULL,
    timeout_seconds      integer NOT NULL,
    approver_type        text NOT NULL,
    approver_id          text NOT NULL,
    auto_deny_on_timeout boolean NOT NULL DEFAULT false,
    priority             double precision NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL
);
CREATE INDEX hitl_policies_order_idx ON hitl_policies (priority DESC, created_at, id);

-- A request carries a copy of what its policy said when it was made
-- (approver, mode, timeout outcome): changing or deleting the policy later
-- does not change who may decide a pending request. status is what was
-- written; a pending request past expires_at reads as timed out whatever
-- a sweeper has done (extensions/hitl). redeemed_at: its approval was
-- spent at the token endpoint (once).
CREATE TABLE hitl_requests (
    id                   uuid PRIMARY KEY,
    agent_id             uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    client_id            text NOT NULL,
    policy_id            uuid,
    policy_name          text NOT NULL,
    action               text NOT NULL,
    resource             text NOT NULL,
    context              jsonb NOT NULL DEFAULT '{}',
    approval_mode        text NOT NULL,
    approver_type        text NOT NULL,
    approver_id          text NOT NULL,
    auto_deny_on_timeout boolean NOT NULL DEFAULT false,
    status               text NOT NULL,
    created_at           timestamptz NOT NULL,
    expires_at           timestamptz NOT NULL,
    decided_at           timestamptz,
    decided_by           text NOT NULL DEFAULT '',
    reason               text NOT NULL DEFAULT '',
    redeemed_at          timestamptz
);
CREATE INDEX hitl_requests_agent_idx ON hitl_requests (agent_id, status);
CREATE INDEX hitl_requests_pending_idx ON hitl_requests (expires_at) WHERE status = 'pending_approval';

-- Just-in-time grants (issue 15): more scopes for an agent, for a bounded
-- time. A rule lets a scope be granted automatically, up to a duration,
-- to agents of a trust level or higher; grants under no rule, or whose
-- action and resource a HITL policy matches, need a person
-- (hitl_request_id links the request whose approval activates them).
CREATE TABLE jit_rules (
    id                   uuid PRIMARY KEY,
    scope                text NOT NULL,
    max_duration_seconds integer NOT NULL,
    min_trust_level      text NOT NULL,
    created_at           timestamptz NOT NULL
);

CREATE TABLE jit_grants (
    id               uuid PRIMARY KEY,
    agent_id         uuid NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    client_id        text NOT NULL,
    action           text NOT NULL,
    resource         text NOT NULL,
    scopes           jsonb NOT NULL DEFAULT '[]',
    duration_seconds integer NOT NULL,
    context          jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL,
    hitl_request_id  uuid REFERENCES hitl_requests (id) ON DELETE SET NULL,
    created_at       timestamptz NOT NULL,
    activated_at     timestamptz,
    expires_at       timestamptz,
    ended_at         timestamptz,
    ended_by         text NOT NULL DEFAULT '',
    reason           text NOT NULL DEFAULT ''
);
CREATE INDEX jit_grants_agent_idx ON jit_grants (agent_id, status);
CREATE INDEX jit_grants_request_idx ON jit_grants (hitl_request_id);

-- +goose Down
DROP TABLE jit_grants;
DROP TABLE jit_rules;
DROP TABLE hitl_requests;
DROP TABLE hitl_policies;
