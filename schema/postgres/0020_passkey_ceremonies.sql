-- +goose Up
-- A ceremony is taken (deleted) by its finish before it is verified, so
-- its use needs no mark: the used marks go.
DROP TABLE passkey_used_challenges;

-- +goose Down
CREATE TABLE passkey_used_challenges (
    challenge  text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX passkey_used_challenges_expires_idx ON passkey_used_challenges (expires_at);
