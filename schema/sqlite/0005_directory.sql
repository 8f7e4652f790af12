-- +goose Up
-- The directory: users, organizations and their members, roles and their
-- holders, invites, the directory event log, and the outbox of e-mail.
-- email_key is the address folded to lower case: addresses are unique
-- whatever their case. search_key is e-mail and names folded to lower case
-- by identityd (SQLite's LOWER folds ASCII only), what q searches.
CREATE TABLE users (
    id              TEXT PRIMARY KEY,
    email           TEXT NOT NULL,
    email_key       TEXT NOT NULL UNIQUE,
    email_verified  INTEGER NOT NULL DEFAULT 0,
    name            TEXT NOT NULL DEFAULT '',
    first_name      TEXT NOT NULL DEFAULT '',
    last_name       TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL,
    metadata        TEXT NOT NULL DEFAULT '{}',
    password_hash   TEXT,
    search_key      TEXT NOT NULL DEFAULT '',
    created_at      TIMESTAMP NOT NULL,
    updated_at      TIMESTAMP NOT NULL,
    last_sign_in_at TIMESTAMP
);
CREATE INDEX users_created_idx ON users (created_at, id);

CREATE TABLE orgs (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    slug       TEXT NOT NULL UNIQUE,
    metadata   TEXT NOT NULL DEFAULT '{}',
    created_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL
);
CREATE INDEX orgs_created_idx ON orgs (created_at, id);

CREATE TABLE org_members (
    org_id    TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
    user_id   TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role      TEXT NOT NULL,
    joined_at TIMESTAMP NOT NULL,
    PRIMARY KEY (org_id, user_id)
);
CREATE INDEX org_members_user_idx ON org_members (user_id);

CREATE TABLE roles (
    name        TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    created_at  TIMESTAMP NOT NULL
);

CREATE TABLE user_roles (
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role        TEXT NOT NULL REFERENCES roles (name) ON DELETE CASCADE,
    assigned_at TIMESTAMP NOT NULL,
    PRIMARY KEY (user_id, role)
);
CREATE INDEX user_roles_role_idx ON user_roles (role);

-- token_hash is the keyed hash of the invite token; the token itself is
-- never stored. creator_principal is the service account's id: an account
-- deleted and made again under the same client id is another creator.
CREATE TABLE invites (
    id                TEXT PRIMARY KEY,
    token_hash        BLOB NOT NULL UNIQUE,
    email             TEXT NOT NULL,
    user_id           TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    user_existed      INTEGER NOT NULL,
    creator_client_id TEXT NOT NULL,
    creator_principal TEXT NOT NULL,
    redirect_uri      TEXT NOT NULL,
    accept_uri        TEXT NOT NULL,
    state             TEXT NOT NULL DEFAULT '',
    app_name          TEXT NOT NULL DEFAULT '',
    metadata          TEXT NOT NULL DEFAULT '{}',
    status            TEXT NOT NULL,
    created_at        TIMESTAMP NOT NULL,
    expires_at        TIMESTAMP NOT NULL,
    accepted_at       TIMESTAMP
);
CREATE INDEX invites_user_idx ON invites (user_id);

-- One log of every directory change, written in the change's transaction.
CREATE TABLE directory_events (
    id         TEXT PRIMARY KEY,
    type       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    user_id    TEXT,
    org_id     TEXT,
    data       TEXT NOT NULL DEFAULT '{}',
    created_at TIMESTAMP NOT NULL
);
CREATE INDEX directory_events_created_idx ON directory_events (created_at, id);

-- Mail waiting to be sent, written with what it announces. The message is
-- sealed (AES-GCM under a key derived from the system secret: invite links
-- carry tokens) and dropped once sent.
CREATE TABLE mail_outbox (
    id              TEXT PRIMARY KEY,
    recipient       TEXT NOT NULL,
    subject         TEXT NOT NULL,
    sealed          BLOB,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMP NOT NULL,
    sent_at         TIMESTAMP,
    last_error      TEXT NOT NULL DEFAULT '',
    created_at      TIMESTAMP NOT NULL
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
