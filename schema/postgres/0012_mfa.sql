-- +goose Up
-- TOTP second factors (RFC 6238), one per person. secret_sealed is the
-- authenticator's shared secret, sealed (AES-256-GCM under a key derived
-- from the system secret, bound to the person and the enrolment), never in
-- clear. A row with enabled_at NULL is an enrolment awaiting its first code;
-- enrolling again replaces it (enrolment_id changes). last_step is the
-- newest 30-second step whose code was accepted: a code of that step or an
-- older one is a replay.
CREATE TABLE mfa_totp (
    user_id       uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    enrolment_id  uuid NOT NULL,
    secret_sealed bytea NOT NULL,
    last_step     bigint NOT NULL DEFAULT 0,
    enabled_at    timestamptz,
    created_at    timestamptz NOT NULL
);

-- Recovery codes: ten per person, made when TOTP is turned on, each usable
-- once. code_hash is a keyed hash of the code (never the code); used_at is
-- set when it is spent.
CREATE TABLE mfa_recovery_codes (
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    code_hash  bytea NOT NULL,
    used_at    timestamptz,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, code_hash)
);

-- +goose Down
DROP TABLE mfa_recovery_codes;
DROP TABLE mfa_totp;
