-- +goose Up
CREATE TABLE system_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE signing_keys (
    kid         TEXT PRIMARY KEY,
    alg         TEXT NOT NULL,
    private_der BLOB NOT NULL,
    created_at  TIMESTAMP NOT NULL
);

CREATE TABLE service_accounts (
    id            TEXT PRIMARY KEY,
    client_id     TEXT NOT NULL UNIQUE,
    secret_hash   BLOB NOT NULL,
    name          TEXT NOT NULL,
    description   TEXT NOT NULL DEFAULT '',
    scopes        TEXT NOT NULL DEFAULT '[]',
    redirect_uris TEXT NOT NULL DEFAULT '[]',
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL,
    rotated_at    TIMESTAMP
);
CREATE INDEX service_accounts_created_idx ON service_accounts (created_at, id);

-- One row per opaque access token; the token itself is never stored, only its
-- signature, which begins with the time of issue (persistence.TokenKeyPrefix):
-- rows arrive in key order, and the sweeper finds expired ones by a range of
-- the primary key, so the table needs no other index and an insert touches
-- few pages. A token is valid only while its client exists with the same
-- principal id, so deleting a client needs no scan of this table.
CREATE TABLE access_tokens (
    signature    TEXT PRIMARY KEY,
    request_id   TEXT NOT NULL,
    client_id    TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    scopes       TEXT NOT NULL DEFAULT '[]',
    audience     TEXT NOT NULL DEFAULT '[]',
    session      TEXT NOT NULL,
    requested_at TIMESTAMP NOT NULL,
    expires_at   TIMESTAMP NOT NULL
);

-- +goose Down
DROP TABLE access_tokens;
DROP TABLE service_accounts;
DROP TABLE signing_keys;
DROP TABLE system_settings;
