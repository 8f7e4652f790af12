-- +goose Up
-- The directory: users, organizations and their members, roles and their
-- holders, invites, the directory event log, and the outbox of e-mail.
-- email_key is the address folded to lower case: addresses are unique
-- whatever their case. search_key is e-mail and names folded to lower case
-- by identityd (SQLite's LOWER folds ASCII only), what q searches.
CREATE TABLE users (
    id              uuid PRIMARY KEY,
    email           text NOT NULL,
    email_key       text NOT NULL UNIQUE,
    email_verified  boolean NOT NULL DEFAULT false,
    name            text NOT NULL DEFAULT '',
    first_name      text NOT NULL DEFAULT '',
    last_name       text NOT NULL DEFAULT '',
    status          text NOT NULL,
    metadata        jsonb NOT NULL DEFAULT '{}',
    password_hash   text,
    search_key      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    last_sign_in_at timestamptz
);
CREATE INDEX users_created_idx ON users (created_at, id);

CREATE TABLE orgs (
    id         uuid PRIMARY KEY,
    name       text NOT NULL,
    slug       text NOT NULL UNIQUE,
    metadata   jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX orgs_created_idx ON orgs (created_at, id);

CREATE TABLE org_members (
    org_id    uuid NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    user_id   uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role      text NOT NULL,
    joined_at timestamptz NOT NULL,
    PRIMARY KEY (org_id, user_id)
);
CREATE INDEX org_members_user_idx ON org_members (user_id);

CREATE TABLE roles (
    name        text PRIMARY KEY,
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL
);

CREATE TABLE user_roles (
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role        text NOT NULL REFERENCES roles (name) ON DELETE CASCADE,
    assigned_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, role)
);
CREATE INDEX user_roles_role_idx ON user_roles (role);

-- token_hash is the keyed hash of the invite token; the token itself is
-- never stored. creator_principal is the service account's id: an account
-- deleted and made again under the same client id is another creator.
CREATE TABLE invites (
    id                uuid PRIMARY KEY,
    token_hash        bytea NOT NULL UNIQUE,
    email             text NOT NULL,
    user_id           uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    user_existed      boolean NOT NULL,
    creator_client_id text NOT NULL,
    creator_principal text NOT NULL,
    redirect_uri      text NOT NULL,
    accept_uri        text NOT NULL,
    state             text NOT NULL DEFAULT '',
    app_name          text NOT NULL DEFAULT '',
    metadata          jsonb NOT NULL DEFAULT '{}',
    status            text NOT NULL,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    accepted_at       timestamptz
);
CREATE INDEX invites_user_idx ON invites (user_id);

-- One log of every directory change, written in the change's transaction.
CREATE TABLE directory_events (
    id         uuid PRIMARY KEY,
    type       text NOT NULL,
    actor      text NOT NULL,
    user_id    uuid,
    org_id     uuid,
    data       jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL
);
CREATE INDEX directory_events_created_idx ON directory_events (created_at, id);

-- Mail waiting to be sent, written with what it announces. The message is
-- sealed (AES-GCM under a key derived from the system secret: invite links
-- carry tokens) and dropped once sent.
CREATE TABLE mail_outbox (
    id              uuid PRIMARY KEY,
    recipient       text NOT NULL,
    subject         text NOT NULL,
    sealed          bytea,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    sent_at         timestamptz,
    last_error      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL
);
CREATE INDEX mail_outbox_due_idx ON mail_outbox (next_attempt_at) WHERE sent_at IS NULL;

-- +goose Down
DROP TABLE mail_outbox;
DROP TABLE directory_events;
DROP TABLE invites;
DROP TABLE user_roles;
DROP TABLE roles;
DROP TABLE org_members;
DROP TABLE orgs;
DROP TABLE users;
