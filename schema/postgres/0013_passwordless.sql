-- +goose Up
-- Passwordless sign-in. An application may let an unknown e-mail sign up
-- through an e-mailed code or link (allow_sign_up).
ALTER TABLE applications ADD COLUMN allow_sign_up boolean NOT NULL DEFAULT false;

-- The ways a person signs in (identities): password, otp, magic_link now;
-- passkey and upstream providers later, whose subject is the provider's.
CREATE TABLE user_identities (
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    provider   text NOT NULL,
    subject    text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, provider, subject)
);
INSERT INTO user_identities (user_id, provider, subject, created_at)
    SELECT id, 'password', '', created_at FROM users WHERE password_hash IS NOT NULL;

-- E-mailed one-time codes and magic links: only a keyed hash of the secret
-- is kept. A challenge is for one application and either a hosted sign-in
-- flow (flow_id) or the embedded API (redirect_uri, code_challenge). user_id
-- is empty for a sign-up. used_at ends it; attempts counts wrong codes.
CREATE TABLE email_challenges (
    id             uuid PRIMARY KEY,
    kind           text NOT NULL,
    secret_hash    bytea NOT NULL,
    email          text NOT NULL,
    email_key      text NOT NULL,
    user_id        uuid REFERENCES users (id) ON DELETE CASCADE,
    client_id      text NOT NULL,
    flow_id        uuid,
    redirect_uri   text NOT NULL DEFAULT '',
    code_challenge text NOT NULL DEFAULT '',
    attempts       integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    used_at        timestamptz
);
CREATE INDEX email_challenges_email_idx ON email_challenges (email_key, client_id, kind, created_at);
CREATE UNIQUE INDEX email_challenges_link_idx ON email_challenges (secret_hash) WHERE kind = 'magic_link';
CREATE INDEX email_challenges_expires_idx ON email_challenges (expires_at);

-- +goose Down
DROP TABLE email_challenges;
DROP TABLE user_identities;
ALTER TABLE applications DROP COLUMN allow_sign_up;
