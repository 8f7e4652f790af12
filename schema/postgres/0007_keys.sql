-- +goose Up
-- Signing-key rotation: a retired key no longer signs; it stays published
-- until everything it signed has expired, then it is deleted.
ALTER TABLE signing_keys ADD COLUMN retired_at timestamptz;
-- One active key per algorithm from now on. Replicas starting together may
-- have stored two; the oldest is the one that signed (and nothing was signed
-- yet): the others retire.
UPDATE signing_keys SET retired_at = now()
WHERE EXISTS (SELECT 1 FROM signing_keys AS older WHERE older.alg = signing_keys.alg
    AND (older.created_at < signing_keys.created_at OR (older.created_at = signing_keys.created_at AND older.kid < signing_keys.kid)));

-- Which key hashed an invite's token: its own derived key from now on; rows
-- from before were hashed with the client-secret key and keep working with it
-- until they expire.
ALTER TABLE invites ADD COLUMN token_key text NOT NULL DEFAULT 'client_secret';

-- +goose Down
ALTER TABLE invites DROP COLUMN token_key;
ALTER TABLE signing_keys DROP COLUMN retired_at;
