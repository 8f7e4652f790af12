-- +goose Up
-- Password reset by e-mailed token (spec: Password reset). Only a keyed
-- hash of the token is kept (token_hash); the token itself is only in the
-- e-mail. A token lives an hour, is used once (used_at) and takes at most
-- three failed attempts (attempts). email is the address the link was sent
-- to: a person whose address changed since cannot be reset through it.
CREATE TABLE password_resets (
    id             TEXT PRIMARY KEY,
    token_hash     BLOB NOT NULL UNIQUE,
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    email          TEXT NOT NULL,
    application_id TEXT,
    client_id      TEXT NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 0,
    created_at     TIMESTAMP NOT NULL,
    expires_at     TIMESTAMP NOT NULL,
    used_at        TIMESTAMP
);
CREATE INDEX password_resets_user_idx ON password_resets (user_id);
CREATE INDEX password_resets_expires_idx ON password_resets (expires_at);

-- An application may host its own reset page: the e-mailed link then leads
-- there (with ?token=), instead of identityd's hosted page.
ALTER TABLE applications ADD COLUMN password_reset_uri TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE applications DROP COLUMN password_reset_uri;
DROP TABLE password_resets;
