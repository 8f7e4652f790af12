-- +goose Up
-- Authentication analytics (issue 17) read the auth event log. The indexes
-- serve the event search's filters, newest first, and the per-application
-- reads of users; the rollups keep a window's overview from counting every
-- event again.
CREATE INDEX auth_events_type_idx ON auth_events (type, created_at, id);
CREATE INDEX auth_events_app_idx ON auth_events (application_id, created_at, id);
CREATE INDEX auth_events_app_user_idx ON auth_events (application_id, user_id) WHERE type = 'sign_in';

-- A UTC day (days since 1970-01-01) whose events were rolled up: it is
-- over (with a grace for late writers), so its counts never change again.
CREATE TABLE auth_rolled_days (
    day       integer PRIMARY KEY,
    rolled_at timestamptz NOT NULL
);

-- Sign-ins and failed sign-ins of a rolled day, counted by application
-- ('' for none), method ('' when the event names none) and whether a second
-- factor was used.
CREATE TABLE auth_event_days (
    day            integer NOT NULL,
    type           text NOT NULL,
    application_id text NOT NULL,
    method         text NOT NULL,
    mfa            boolean NOT NULL,
    n              bigint NOT NULL,
    PRIMARY KEY (day, type, application_id, method, mfa)
);

-- The people who signed in on a rolled day, once each: active users over a
-- window are the distinct people of its days.
CREATE TABLE auth_active_days (
    day     integer NOT NULL,
    user_id uuid NOT NULL,
    PRIMARY KEY (day, user_id)
);
CREATE INDEX auth_active_days_user_idx ON auth_active_days (user_id, day);

-- The same, by UTC hour (hours since 1970-01-01), for the days not yet over:
-- a window that ends today reads today's closed hours here and only the
-- current hour from the log. Hours older than two days are swept.
CREATE TABLE auth_rolled_hours (
    hour      bigint PRIMARY KEY,
    rolled_at timestamptz NOT NULL
);
CREATE TABLE auth_event_hours (
    hour           bigint NOT NULL,
    type           text NOT NULL,
    application_id text NOT NULL,
    method         text NOT NULL,
    mfa            boolean NOT NULL,
    n              bigint NOT NULL,
    PRIMARY KEY (hour, type, application_id, method, mfa)
);
CREATE TABLE auth_active_hours (
    hour    bigint NOT NULL,
    user_id uuid NOT NULL,
    PRIMARY KEY (hour, user_id)
);
CREATE INDEX auth_active_hours_user_idx ON auth_active_hours (user_id, hour);

-- +goose Down
DROP TABLE auth_active_hours;
DROP TABLE auth_event_hours;
DROP TABLE auth_rolled_hours;
DROP TABLE auth_active_days;
DROP TABLE auth_event_days;
DROP TABLE auth_rolled_days;
DROP INDEX auth_events_app_user_idx;
DROP INDEX auth_events_app_idx;
DROP INDEX auth_events_type_idx;
