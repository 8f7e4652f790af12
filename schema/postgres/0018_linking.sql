-- +goose Up
-- Account linking: a token (only its keyed hash kept) that lets the person
-- who proves an account is theirs (its password, or a code e-mailed to it:
-- code_hash) add a sign-in method (provider) to it. For an upstream
-- provider, the link adds the upstream identity (issuer, subject) of a
-- sign-in through it (upstream_link_id, spent with the token).
-- Single use (used_at), attempts counts wrong proofs, 10 minutes.
CREATE TABLE linking_tokens (
    id               uuid PRIMARY KEY,
    token_hash       bytea NOT NULL UNIQUE,
    user_id          uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id        text NOT NULL,
    provider         text NOT NULL,
    verification     text NOT NULL,
    code_hash        bytea,
    upstream_link_id uuid REFERENCES upstream_links (id) ON DELETE CASCADE,
    issuer           text NOT NULL DEFAULT '',
    subject          text NOT NULL DEFAULT '',
    attempts         integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    used_at          timestamptz
);
CREATE INDEX linking_tokens_expires_idx ON linking_tokens (expires_at);

-- +goose Down
DROP TABLE linking_tokens;
