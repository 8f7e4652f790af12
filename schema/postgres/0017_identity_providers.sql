-- +goose Up
-- Upstream sign-in providers: OpenID Connect providers people may sign in
-- through ("Continue with …"). name is the provider key identities use;
-- the client secret is sealed (AES-GCM under a key of its own), never
-- stored in clear; applications lists the client ids of the applications
-- that offer the provider.
CREATE TABLE identity_providers (
    id                   uuid PRIMARY KEY,
    name                 text NOT NULL UNIQUE,
    display_name         text NOT NULL,
    issuer               text NOT NULL,
    client_id            text NOT NULL,
    client_secret_sealed bytea NOT NULL,
    scopes               jsonb NOT NULL DEFAULT '[]',
    applications         jsonb NOT NULL DEFAULT '[]',
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL
);

-- An upstream identity is the provider's issuer and subject: one person
-- per (provider, issuer, subject). The local methods keep issuer ''.
ALTER TABLE user_identities ADD COLUMN issuer text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX user_identities_upstream_idx ON user_identities (provider, issuer, subject) WHERE issuer <> '';

-- A sign-in sent to an upstream provider, waiting for its callback: the
-- state's keyed hash (the lookup), the nonce's keyed hash, the PKCE
-- verifier sealed, the browser it is bound to, and where it continues: a
-- hosted flow (flow_id) or the embedded API (redirect_uri, code_challenge).
-- Used once (used_at), within its lifetime.
CREATE TABLE upstream_states (
    id              uuid PRIMARY KEY,
    state_hash      bytea NOT NULL UNIQUE,
    nonce_hash      bytea NOT NULL,
    verifier_sealed bytea NOT NULL,
    provider_id     uuid NOT NULL REFERENCES identity_providers (id) ON DELETE CASCADE,
    browser_hash    bytea NOT NULL,
    client_id       text NOT NULL,
    flow_id         uuid,
    redirect_uri    text NOT NULL DEFAULT '',
    code_challenge  text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz
);
CREATE INDEX upstream_states_expires_idx ON upstream_states (expires_at);

-- An upstream identity whose e-mail is an existing account's, waiting to
-- be linked to it (the linking step proves the account is the person's):
-- the handle's keyed hash, the account, the upstream identity and the
-- application. Used once, within its lifetime (10 minutes).
CREATE TABLE upstream_links (
    id             uuid PRIMARY KEY,
    handle_hash    bytea NOT NULL UNIQUE,
    user_id        uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    provider       text NOT NULL,
    provider_id    uuid NOT NULL,
    issuer         text NOT NULL,
    subject        text NOT NULL,
    email          text NOT NULL,
    email_verified boolean NOT NULL,
    client_id      text NOT NULL,
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    used_at        timestamptz
);
CREATE INDEX upstream_links_expires_idx ON upstream_links (expires_at);

-- +goose Down
DROP TABLE upstream_links;
DROP TABLE upstream_states;
DROP INDEX user_identities_upstream_idx;
ALTER TABLE user_identities DROP COLUMN issuer;
DROP TABLE identity_providers;
