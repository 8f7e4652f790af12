-- +goose Up
-- Rich authorization request types (RFC 9396): the kinds of
-- authorization_details entries the server accepts. schema is the JSON
-- Schema an entry must satisfy, kept as the admin wrote it (compiled in
-- memory by extensions/rar). read_only_actions and required_capabilities
-- are our additions: they set the ceiling agents meet (docs/decisions.md).
CREATE TABLE rar_types (
    type                  TEXT PRIMARY KEY,
    display_name          TEXT NOT NULL DEFAULT '',
    description           TEXT NOT NULL DEFAULT '',
    allowed_actions       TEXT NOT NULL DEFAULT '[]',
    allowed_locations     TEXT NOT NULL DEFAULT '[]',
    read_only_actions     TEXT NOT NULL DEFAULT '[]',
    required_capabilities TEXT NOT NULL DEFAULT '[]',
    schema                TEXT NOT NULL,
    created_at            TIMESTAMP NOT NULL,
    updated_at            TIMESTAMP NOT NULL
);

-- +goose Down
DROP TABLE rar_types;
