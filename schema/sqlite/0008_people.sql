-- +goose Up
-- Applications: the OpenID Connect clients people sign in through. Their
-- client ids begin with app_; a public application has no secret. Lists are
-- JSON arrays, mfa a JSON object, lifetimes whole seconds (NULL: the
-- server's default).
CREATE TABLE applications (
    id                        TEXT PRIMARY KEY,
    client_id                 TEXT NOT NULL UNIQUE,
    secret_hash               BLOB,
    name                      TEXT NOT NULL,
    type                      TEXT NOT NULL,
    redirect_uris             TEXT NOT NULL DEFAULT '[]',
    post_logout_redirect_uris TEXT NOT NULL DEFAULT '[]',
    web_origins               TEXT NOT NULL DEFAULT '[]',
    rp_id                     TEXT NOT NULL DEFAULT '',
    sign_in_methods           TEXT NOT NULL DEFAULT '[]',
    mfa                       TEXT NOT NULL DEFAULT '{}',
    access_token_format       TEXT NOT NULL,
    id_token_signing_alg      TEXT NOT NULL,
    access_token_ttl          INTEGER,
    refresh_token_ttl         INTEGER,
    admin_console             INTEGER NOT NULL DEFAULT 0,
    created_at                TIMESTAMP NOT NULL,
    updated_at                TIMESTAMP NOT NULL,
    rotated_at                TIMESTAMP
);
CREATE INDEX applications_created_idx ON applications (created_at, id);

-- Single sign-on sessions: one per browser sign-in, shared by every
-- application the person then signs in to. The cookie carries a secret whose
-- keyed hash is token_hash; id is the public session id (the ID token's sid).
-- expires_at is the absolute end; idle expiry counts from last_seen_at.
CREATE TABLE sso_sessions (
    id             TEXT PRIMARY KEY,
    token_hash     BLOB NOT NULL UNIQUE,
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    application_id TEXT,
    amr            TEXT NOT NULL DEFAULT '[]',
    acr            TEXT NOT NULL DEFAULT '',
    auth_time      TIMESTAMP NOT NULL,
    ip             TEXT NOT NULL DEFAULT '',
    user_agent     TEXT NOT NULL DEFAULT '',
    created_at     TIMESTAMP NOT NULL,
    last_seen_at   TIMESTAMP NOT NULL,
    expires_at     TIMESTAMP NOT NULL
);
CREATE INDEX sso_sessions_user_idx ON sso_sessions (user_id, created_at);

-- The authentication event log, append-only: sign-ins and their failures
-- (reason, never the secret), sessions started and ended, refreshes, refresh
-- reuse, logouts. Analytics and webhooks read it.
CREATE TABLE auth_events (
    id             TEXT PRIMARY KEY,
    type           TEXT NOT NULL,
    user_id        TEXT,
    application_id TEXT,
    client_id      TEXT NOT NULL DEFAULT '',
    session_id     TEXT,
    reason         TEXT NOT NULL DEFAULT '',
    ip             TEXT NOT NULL DEFAULT '',
    user_agent     TEXT NOT NULL DEFAULT '',
    data           TEXT NOT NULL DEFAULT '{}',
    created_at     TIMESTAMP NOT NULL
);
CREATE INDEX auth_events_created_idx ON auth_events (created_at, id);
CREATE INDEX auth_events_user_idx ON auth_events (user_id, created_at);

-- +goose Down
DROP TABLE auth_events;
DROP TABLE sso_sessions;
DROP TABLE applications;
