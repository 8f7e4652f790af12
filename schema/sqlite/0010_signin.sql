-- +goose Up
-- Sign-in flows: one per authorization that needs a person to sign in on the
-- hosted page. The flow is bound to the browser that began it (browser_hash:
-- the keyed hash of that browser's flow cookie secret), keeps the original
-- authorization request (its parameters, form-encoded) to resume once the
-- person has signed in, and is used once. step is the flow's state (email,
-- password, ..., done); session_id the SSO session it ended in.
CREATE TABLE signin_flows (
    id           TEXT PRIMARY KEY,
    browser_hash BLOB NOT NULL,
    client_id    TEXT NOT NULL,
    request      TEXT NOT NULL,
    step         TEXT NOT NULL,
    email        TEXT NOT NULL DEFAULT '',
    session_id   TEXT,
    created_at   TIMESTAMP NOT NULL,
    expires_at   TIMESTAMP NOT NULL
);
CREATE INDEX signin_flows_expires_idx ON signin_flows (expires_at);

-- +goose Down
DROP TABLE signin_flows;
