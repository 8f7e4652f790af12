-- +goose Up
-- SQLite runs one node: its passkey ceremonies live in the server's memory
-- (persistence.PutPasskeyChallenge), and are taken by their finish before
-- they are verified, so their use needs no mark. Both tables go.
DROP TABLE passkey_used_challenges;
DROP TABLE passkey_challenges;

-- +goose Down
CREATE TABLE passkey_challenges (
    challenge  TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    user_id    TEXT REFERENCES users (id) ON DELETE CASCADE,
    client_id  TEXT NOT NULL,
    session    TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    expires_at TIMESTAMP NOT NULL
);
CREATE INDEX passkey_challenges_expires_idx ON passkey_challenges (expires_at);
CREATE TABLE passkey_used_challenges (
    challenge  TEXT PRIMARY KEY,
    expires_at TIMESTAMP NOT NULL
);
CREATE INDEX passkey_used_challenges_expires_idx ON passkey_used_challenges (expires_at);
