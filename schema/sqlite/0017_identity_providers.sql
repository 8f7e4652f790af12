-- +goose Up
-- Upstream sign-in providers: OpenID Connect providers people may sign in
-- through ("Continue with …"). name is the provider key identities use;
-- the client secret is sealed (AES-GCM under a key of its own), never
-- stored in clear; applications lists the client ids of the applications
-- that offer the provider.
CREATE TABLE identity_providers (
    id                   TEXT PRIMARY KEY,
    name                 TEXT NOT NULL UNIQUE,
    display_name         TEXT NOT NULL,
    issuer               TEXT NOT NULL,
    client_id            TEXT NOT NULL,
    client_secret_sealed BLOB NOT NULL,
    scopes               TEXT NOT NULL DEFAULT '[]',
    applications         TEXT NOT NULL DEFAULT '[]',
    created_at           TIMESTAMP NOT NULL,
    updated_at           TIMESTAMP NOT NULL
);

-- An upstream identity is the provider's issuer and subject: one person
-- per (provider, issuer, subject). The local methods keep issuer ''.
ALTER TABLE user_identities ADD COLUMN issuer TEXT NOT NULL DEFAULT '';
CREATE UNIQUE INDEX user_identities_upstream_idx ON user_identities (provider, issuer, subject) WHERE issuer <> '';

-- A sign-in sent to an upstream provider, waiting for its callback: the
-- state's keyed hash (the lookup), the nonce's keyed hash, the PKCE
-- verifier sealed, the browser it is bound to, and where it continues: a
-- hosted flow (flow_id) or the embedded API (redirect_uri, code_challenge).
-- Used once (used_at), within its lifetime.
CREATE TABLE upstream_states (
    id              TEXT PRIMARY KEY,
    state_hash      BLOB NOT NULL UNIQUE,
    nonce_hash      BLOB NOT NULL,
    verifier_sealed BLOB NOT NULL,
    provider_id     TEXT NOT NULL REFERENCES identity_providers (id) ON DELETE CASCADE,
    browser_hash    BLOB NOT NULL,
    client_id       TEXT NOT NULL,
    flow_id         TEXT,
    redirect_uri    TEXT NOT NULL DEFAULT '',
    code_challenge  TEXT NOT NULL DEFAULT '',
    created_at      TIMESTAMP NOT NULL,
    expires_at      TIMESTAMP NOT NULL,
    used_at         TIMESTAMP
);
CREATE INDEX upstream_states_expires_idx ON upstream_states (expires_at);

-- An upstream identity whose e-mail is an existing account's, waiting to
-- be linked to it (the linking step proves the account is the person's):
-- the handle's keyed hash, the account, the upstream identity and the
-- application. Used once, within its lifetime (10 minutes).
CREATE TABLE upstream_links (
    id             TEXT PRIMARY KEY,
    handle_hash    BLOB NOT NULL UNIQUE,
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    provider       TEXT NOT NULL,
    provider_id    TEXT NOT NULL,
    issuer         TEXT NOT NULL,
    subject        TEXT NOT NULL,
    email          TEXT NOT NULL,
    email_verified INTEGER NOT NULL,
    client_id      TEXT NOT NULL,
    created_at     TIMESTAMP NOT NULL,
    expires_at     TIMESTAMP NOT NULL,
    used_at        TIMESTAMP
);
CREATE INDEX upstream_links_expires_idx ON upstream_links (expires_at);

-- +goose Down
DROP TABLE upstream_links;
DROP TABLE upstream_states;
DROP INDEX user_identities_upstream_idx;
ALTER TABLE user_identities DROP COLUMN issuer;
DROP TABLE identity_providers;
