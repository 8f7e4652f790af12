-- +goose Up
-- Rich authorization request types (RFC 9396): the kinds of
-- authorization_details entries the server accepts. schema is the JSON
-- Schema an entry must satisfy (compiled in memory by extensions/rar).
-- read_only_actions and required_capabilities are our additions: they set
-- the ceiling agents meet (docs/decisions.md).
CREATE TABLE rar_types (
    type                  text PRIMARY KEY,
    display_name          text NOT NULL DEFAULT '',
    description           text NOT NULL DEFAULT '',
    allowed_actions       jsonb NOT NULL DEFAULT '[]',
    allowed_locations     jsonb NOT NULL DEFAULT '[]',
    read_only_actions     jsonb NOT NULL DEFAULT '[]',
    required_capabilities jsonb NOT NULL DEFAULT '[]',
    schema                jsonb NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL
);

-- +goose Down
DROP TABLE rar_types;
