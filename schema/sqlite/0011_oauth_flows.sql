-- +goose Up
-- Authorization codes (RFC 6749 §4.1) and what rides on them: the PKCE
-- challenge (RFC 7636) and the OpenID Connect request (nonce, max_age,
-- prompt). A row is keyed by the code's signature (an HMAC of the code, by
-- fosite's strategy): the code itself is never stored. A used code stays,
-- inactive, until it expires, so that a replay is recognised and what it
-- issued (access_signature, and the refresh family of request_id) revoked.
-- session_id is the person's SSO session; forms are JSON objects of arrays.
CREATE TABLE authorization_codes (
    signature         TEXT PRIMARY KEY,
    request_id        TEXT NOT NULL,
    client_id         TEXT NOT NULL,
    principal_id      TEXT NOT NULL,
    session_id        TEXT,
    scopes            TEXT NOT NULL DEFAULT '[]',
    granted_scopes    TEXT NOT NULL DEFAULT '[]',
    audience          TEXT NOT NULL DEFAULT '[]',
    granted_audience  TEXT NOT NULL DEFAULT '[]',
    form              TEXT NOT NULL DEFAULT '{}',
    pkce              TEXT,
    oidc              TEXT,
    session           TEXT NOT NULL,
    active            INTEGER NOT NULL,
    access_signature  TEXT,
    requested_at      TIMESTAMP NOT NULL,
    expires_at        TIMESTAMP NOT NULL
);
CREATE INDEX authorization_codes_request_idx ON authorization_codes (request_id);
CREATE INDEX authorization_codes_expires_idx ON authorization_codes (expires_at);

-- Refresh tokens, keyed by signature (never the token). request_id is the
-- token family: every refresh token and access token descending from one
-- authorization. A rotated token stays, inactive, until it expires: its
-- reuse revokes the family. access_signature is the access token issued
-- with it.
CREATE TABLE refresh_tokens (
    signature         TEXT PRIMARY KEY,
    request_id        TEXT NOT NULL,
    access_signature  TEXT NOT NULL,
    client_id         TEXT NOT NULL,
    principal_id      TEXT NOT NULL,
    subject           TEXT NOT NULL,
    session_id        TEXT,
    scopes            TEXT NOT NULL DEFAULT '[]',
    granted_scopes    TEXT NOT NULL DEFAULT '[]',
    audience          TEXT NOT NULL DEFAULT '[]',
    granted_audience  TEXT NOT NULL DEFAULT '[]',
    session           TEXT NOT NULL,
    active            INTEGER NOT NULL,
    requested_at      TIMESTAMP NOT NULL,
    expires_at        TIMESTAMP NOT NULL
);
CREATE INDEX refresh_tokens_request_idx ON refresh_tokens (request_id);
CREATE INDEX refresh_tokens_expires_idx ON refresh_tokens (expires_at);

-- +goose Down
DROP TABLE refresh_tokens;
DROP TABLE authorization_codes;
