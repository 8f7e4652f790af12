-- +goose Up
-- Authorization codes (RFC 6749 §4.1) and what rides on them: the PKCE
-- challenge (RFC 7636) and the OpenID Connect request (nonce, max_age,
-- prompt). A row is keyed by the code's signature (an HMAC of the code, by
-- fosite's strategy): the code itself is never stored. A used code stays,
-- inactive, until it expires, so that a replay is recognised and what it
-- issued (access_signature, and the refresh family of request_id) revoked.
-- session_id is the person's SSO session; forms are JSON objects of arrays.
CREATE TABLE authorization_codes (
    signature         text PRIMARY KEY,
    request_id        text NOT NULL,
    client_id         text NOT NULL,
    principal_id      text NOT NULL,
    session_id        text,
    scopes            jsonb NOT NULL DEFAULT '[]',
    granted_scopes    jsonb NOT NULL DEFAULT '[]',
    audience          jsonb NOT NULL DEFAULT '[]',
    granted_audience  jsonb NOT NULL DEFAULT '[]',
    form              jsonb NOT NULL DEFAULT '{}',
    pkce              jsonb,
    oidc              jsonb,
    session           jsonb NOT NULL,
    active            boolean NOT NULL,
    access_signature  text,
    requested_at      timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL
);
CREATE INDEX authorization_codes_request_idx ON authorization_codes (request_id);
CREATE INDEX authorization_codes_expires_idx ON authorization_codes (expires_at);

-- Refresh tokens, keyed by signature (never the token). request_id is the
-- token family: every refresh token and access token descending from one
-- authorization. A rotated token stays, inactive, until it expires: its
-- reuse revokes the family. access_signature is the access token issued
-- with it.
CREATE TABLE refresh_tokens (
    signature         text PRIMARY KEY,
    request_id        text NOT NULL,
    access_signature  text NOT NULL,
    client_id         text NOT NULL,
    principal_id      text NOT NULL,
    subject           text NOT NULL,
    session_id        text,
    scopes            jsonb NOT NULL DEFAULT '[]',
    granted_scopes    jsonb NOT NULL DEFAULT '[]',
    audience          jsonb NOT NULL DEFAULT '[]',
    granted_audience  jsonb NOT NULL DEFAULT '[]',
    session           jsonb NOT NULL,
    active            boolean NOT NULL,
    requested_at      timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL
);
CREATE INDEX refresh_tokens_request_idx ON refresh_tokens (request_id);
CREATE INDEX refresh_tokens_expires_idx ON refresh_tokens (expires_at);

-- +goose Down
DROP TABLE refresh_tokens;
DROP TABLE authorization_codes;
