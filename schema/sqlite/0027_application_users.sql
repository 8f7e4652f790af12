-- +goose Up
-- The people who have signed in through an application, once per person,
-- for the application's list of users. It replaces a partial index of the
-- event log on (application_id, user_id), which took an entry (a B-tree
-- page of its own, at a random place) at every sign-in: here only a
-- person's first sign-in through an application writes, and the list reads
-- one row per person rather than one per sign-in. The trigger keeps it in
-- the transaction of the event, whichever path writes the event.
CREATE TABLE application_users (
    application_id TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    PRIMARY KEY (application_id, user_id)
) WITHOUT ROWID;

INSERT INTO application_users (application_id, user_id)
    SELECT DISTINCT application_id, user_id FROM auth_events
    WHERE type = 'sign_in' AND application_id IS NOT NULL AND user_id IS NOT NULL;

-- +goose StatementBegin
CREATE TRIGGER auth_events_application_user AFTER INSERT ON auth_events
WHEN NEW.type = 'sign_in' AND NEW.application_id IS NOT NULL AND NEW.user_id IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO application_users (application_id, user_id) VALUES (NEW.application_id, NEW.user_id);
END;
-- +goose StatementEnd

DROP INDEX auth_events_app_user_idx;

-- +goose Down
CREATE INDEX auth_events_app_user_idx ON auth_events (application_id, user_id) WHERE type = 'sign_in';
DROP TRIGGER auth_events_application_user;
DROP TABLE application_users;
