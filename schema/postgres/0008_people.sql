-- +goose Up
-- Applications: the OpenID Connect clients people sign in through. Their
-- client ids begin with app_; a public application has no secret. Lifetimes
-- are whole seconds (NULL: the server's default).
CREATE TABLE applications (
    id                        uuid PRIMARY KEY,
    client_id                 text NOT NULL UNIQUE,
    secret_hash               bytea,
    name                      text NOT NULL,
    type                      text NOT NULL,
    redirect_uris             jsonb NOT NULL DEFAULT '[]',
    post_logout_redirect_uris jsonb NOT NULL DEFAULT '[]',
    web_origins               jsonb NOT NULL DEFAULT '[]',
    rp_id                     text NOT NULL DEFAULT '',
    sign_in_methods           jsonb NOT NULL DEFAULT '[]',
    mfa                       jsonb NOT NULL DEFAULT '{}',
    access_token_format       text NOT NULL,
    id_token_signing_alg      text NOT NULL,
    access_token_ttl          integer,
    refresh_token_ttl         integer,
    admin_console             boolean NOT NULL DEFAULT false,
    created_at                timestamptz NOT NULL,
    updated_at                timestamptz NOT NULL,
    rotated_at                timestamptz
);
CREATE INDEX applications_created_idx ON applications (created_at, id);

-- Single sign-on sessions: one per browser sign-in, shared by every
-- application the person then signs in to. The cookie carries a secret whose
-- keyed hash is token_hash; id is the public session id (the ID token's sid).
-- expires_at is the absolute end; idle expiry counts from last_seen_at.
CREATE TABLE sso_sessions (
    id             uuid PRIMARY KEY,
    token_hash     bytea NOT NULL UNIQUE,
    user_id        uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    application_id uuid,
    amr            jsonb NOT NULL DEFAULT '[]',
    acr            text NOT NULL DEFAULT '',
    auth_time      timestamptz NOT NULL,
    ip             text NOT NULL DEFAULT '',
    user_agent     text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL,
    last_seen_at   timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL
);
CREATE INDEX sso_sessions_user_idx ON sso_sessions (user_id, created_at);

-- The authentication event log, append-only: sign-ins and their failures
-- (reason, never the secret), sessions started and ended, refreshes, refresh
-- reuse, logouts. Analytics and webhooks read it.
CREATE TABLE auth_events (
    id             uuid PRIMARY KEY,
    type           text NOT NULL,
    user_id        uuid,
    application_id uuid,
    client_id      text NOT NULL DEFAULT '',
    session_id     uuid,
    reason         text NOT NULL DEFAULT '',
    ip             text NOT NULL DEFAULT '',
    user_agent     text NOT NULL DEFAULT '',
    data           jsonb NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL
);
CREATE INDEX auth_events_created_idx ON auth_events (created_at, id);
CREATE INDEX auth_events_user_idx ON auth_events (user_id, created_at);

-- +goose Down
DROP TABLE auth_events;
DROP TABLE sso_sessions;
DROP TABLE applications;
