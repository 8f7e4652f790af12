-- +goose Up
-- Account linking: a token (only its keyed hash kept) that lets the person
-- who proves an account is theirs (its password, or a code e-mailed to it:
-- code_hash) add a sign-in method (provider) to it. For an upstream
-- provider, the link adds the upstream identity (issuer, subject) of a
-- sign-in through it (upstream_link_id, spent with the token).
-- Single use (used_at), attempts counts wrong proofs, 10 minutes.
CREATE TABLE linking_tokens (
    id               TEXT PRIMARY KEY,
    token_hash       BLOB NOT NULL UNIQUE,
    user_id          TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id        TEXT NOT NULL,
    provider         TEXT NOT NULL,
    verification     TEXT NOT NULL,
    code_hash        BLOB,
    upstream_link_id TEXT REFERENCES upstream_links (id) ON DELETE CASCADE,
    issuer           TEXT NOT NULL DEFAULT '',
    subject          TEXT NOT NULL DEFAULT '',
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       TIMESTAMP NOT NULL,
    expires_at       TIMESTAMP NOT NULL,
    used_at          TIMESTAMP
);
CREATE INDEX linking_tokens_expires_idx ON linking_tokens (expires_at);

-- +goose Down
DROP TABLE linking_tokens;
