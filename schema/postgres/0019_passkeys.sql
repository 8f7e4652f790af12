-- +goose Up
-- Passkeys (WebAuthn credentials): the credential id (unique across every
-- person: one authenticator credential belongs to one account), its public
-- key (COSE), the signature counter last seen, what the authenticator said
-- of itself (AAGUID, transports, attachment, backup flags), the kind of
-- device it is (mobile, desktop, security-key, told at registration), a name the
-- person chose, and its state: active, or revoked when a counter that went
-- backwards marked it as a clone.
CREATE TABLE passkeys (
    id              uuid PRIMARY KEY,
    credential_id   bytea NOT NULL UNIQUE,
    user_id         uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name            text NOT NULL,
    public_key      bytea NOT NULL,
    sign_count      bigint NOT NULL DEFAULT 0,
    aaguid          bytea NOT NULL,
    transports      text NOT NULL DEFAULT '[]',
    attachment      text NOT NULL DEFAULT '',
    device_type     text NOT NULL DEFAULT 'desktop',
    backup_eligible boolean NOT NULL DEFAULT false,
    backed_up       boolean NOT NULL DEFAULT false,
    status          text NOT NULL DEFAULT 'active',
    created_at      timestamptz NOT NULL,
    last_used_at    timestamptz
);
CREATE INDEX passkeys_user_idx ON passkeys (user_id, created_at);

-- A WebAuthn ceremony begun and not finished, found by its challenge (the
-- one the browser signs into clientDataJSON; public, so kept as is): for
-- whom (user_id; empty for a usernameless sign-in), which application, and
-- the library's session data. Single use: finish takes it, whatever its
-- outcome; 5 minutes.
CREATE TABLE passkey_challenges (
    challenge  text PRIMARY KEY,
    kind       text NOT NULL,
    user_id    uuid REFERENCES users (id) ON DELETE CASCADE,
    client_id  text NOT NULL,
    session    text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX passkey_challenges_expires_idx ON passkey_challenges (expires_at);

-- Authentication ceremonies used (whatever their outcome), kept until
-- they expire: a ceremony's use is checked against this table, so that it
-- needs no committed row of passkey_challenges (which other replicas read
-- to find a ceremony).
CREATE TABLE passkey_used_challenges (
    challenge  text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX passkey_used_challenges_expires_idx ON passkey_used_challenges (expires_at);

-- +goose Down
DROP TABLE passkey_used_challenges;
DROP TABLE passkey_challenges;
DROP TABLE passkeys;
