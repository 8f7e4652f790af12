-- +goose Up
-- End-user API keys and usage tiers (issue 18, parts 2 and 3).
--
-- An API key belongs to one application and one owner, a person or an
-- organization (exactly one of user_id, org_id); it goes with them. Only
-- its keyed hash is stored (HMAC-SHA-256 under a key derived from the
-- system secret for this purpose), looked up by that hash. revoked_at set:
-- revoked, kept so that reads show it. last_used_at is written in batches,
-- at most once a minute per key.
CREATE TABLE api_keys (
    id             TEXT PRIMARY KEY,
    application_id TEXT NOT NULL REFERENCES applications (id) ON DELETE CASCADE,
    user_id        TEXT REFERENCES users (id) ON DELETE CASCADE,
    org_id         TEXT REFERENCES orgs (id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    key_hash       BLOB NOT NULL UNIQUE,
    hint           TEXT NOT NULL,
    scopes         TEXT NOT NULL DEFAULT '[]',
    metadata       TEXT NOT NULL DEFAULT '{}',
    issued_by      TEXT NOT NULL,
    expires_at     TIMESTAMP,
    revoked_at     TIMESTAMP,
    last_used_at   TIMESTAMP,
    created_at     TIMESTAMP NOT NULL,
    CHECK ((user_id IS NULL) <> (org_id IS NULL))
);
CREATE INDEX api_keys_application_idx ON api_keys (application_id, created_at, id);
CREATE INDEX api_keys_user_idx ON api_keys (user_id) WHERE user_id IS NOT NULL;
CREATE INDEX api_keys_org_idx ON api_keys (org_id) WHERE org_id IS NOT NULL;

-- Requests counted per subject (a service account, or an application for
-- its API-key validations) per minute and per UTC day. Every replica adds
-- its in-memory counts with an upsert (count = count + n), so the rows are
-- the sum over replicas. Minute rows are swept after a few days.
CREATE TABLE usage_counts (
    subject_kind TEXT NOT NULL,
    subject_id   TEXT NOT NULL,
    granularity  TEXT NOT NULL,
    bucket       TIMESTAMP NOT NULL,
    count        INTEGER NOT NULL,
    PRIMARY KEY (subject_kind, subject_id, granularity, bucket)
);

-- A service account's tier: free, startup or enterprise.
ALTER TABLE service_accounts ADD COLUMN tier TEXT NOT NULL DEFAULT 'free';

-- +goose Down
ALTER TABLE service_accounts DROP COLUMN tier;
DROP TABLE usage_counts;
DROP TABLE api_keys;
