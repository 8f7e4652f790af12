-- +goose Up
CREATE TABLE system_settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE signing_keys (
    kid         text PRIMARY KEY,
    alg         text NOT NULL,
    private_der bytea NOT NULL,
    created_at  timestamptz NOT NULL
);

CREATE TABLE service_accounts (
    id            uuid PRIMARY KEY,
    client_id     text NOT NULL UNIQUE,
    secret_hash   bytea NOT NULL,
    name          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    scopes        jsonb NOT NULL DEFAULT '[]',
    redirect_uris jsonb NOT NULL DEFAULT '[]',
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    rotated_at    timestamptz
);
CREATE INDEX service_accounts_created_idx ON service_accounts (created_at, id);

-- One row per opaque access token; the token itself is never stored, only its
-- HMAC signature. A token is valid only while its client exists with the same
-- principal id, so deleting a client needs no scan of this table: the sweeper
-- removes expired rows. Few indexes keep each insert to few pages.
CREATE TABLE access_tokens (
    signature    text PRIMARY KEY,
    request_id   text NOT NULL,
    client_id    text NOT NULL,
    principal_id text NOT NULL,
    scopes       jsonb NOT NULL DEFAULT '[]',
    audience     jsonb NOT NULL DEFAULT '[]',
    session      jsonb NOT NULL,
    requested_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX access_tokens_expires_idx ON access_tokens (expires_at);

-- +goose Down
DROP TABLE access_tokens;
DROP TABLE service_accounts;
DROP TABLE signing_keys;
DROP TABLE system_settings;
