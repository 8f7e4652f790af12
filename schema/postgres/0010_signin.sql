-- +goose Up
-- Sign-in flows: one per authorization that needs a person to sign in on the
-- hosted page. The flow is bound to the browser that began it (browser_hash:
-- the keyed hash of that browser's flow cookie secret), keeps the original
-- authorization request (its parameters, form-encoded) to resume once the
-- person has signed in, and is used once. step is the flow's state (email,
-- password, ..., done); session_id the SSO session it ended in.
CREATE TABLE signin_flows (
    id           uuid PRIMARY KEY,
    browser_hash bytea NOT NULL,
    client_id    text NOT NULL,
    request      text NOT NULL,
    step         text NOT NULL,
    email        text NOT NULL DEFAULT '',
    session_id   uuid,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX signin_flows_expires_idx ON signin_flows (expires_at);

-- +goose Down
DROP TABLE signin_flows;
