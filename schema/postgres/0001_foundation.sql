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
-- signature, which begins with the time of issue (persistence.TokenKeyPrefix):
-- rows arrive in key order, and the sweeper finds expired ones by a range of
-- the primary key, so the table needs no other index and an insert touches
-- few pages. A token is valid only while its client exists with the same
-- principal id, so deleting a client needs no scan of this table.
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

-- +goose Down
DROP TABLE access_tokens;
DROP TABLE service_accounts;
DROP TABLE signing_keys;
DROP TABLE system_settings;
