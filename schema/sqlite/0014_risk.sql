-- +goose Up
-- Sign-in risk (extensions/risk): what is remembered of a person's recent
-- successful sign-ins, so that an unusual one can be told and stepped up.
-- Both tables keep only the few most recent rows per person (the risk
-- engine's bound, trimmed at every write), and go with the person.
--
-- user_devices: the browsers a person signed in from, each known by the
-- keyed hash of its device cookie's secret (never the secret).
CREATE TABLE user_devices (
    user_id       TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    device_hash   BLOB NOT NULL,
    first_seen_at TIMESTAMP NOT NULL,
    last_seen_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (user_id, device_hash)
);

-- sign_in_locations: one row per successful sign-in, with where its address
-- was located: country (ISO 3166-1 alpha-2) and coordinates in degrees.
-- country is '' (and the coordinates 0) when the address was not located:
-- the row still tells that the person has signed in before.
CREATE TABLE sign_in_locations (
    id      TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    at      TIMESTAMP NOT NULL,
    country TEXT NOT NULL DEFAULT '',
    lat     REAL NOT NULL DEFAULT 0,
    lon     REAL NOT NULL DEFAULT 0
);
CREATE INDEX sign_in_locations_user_idx ON sign_in_locations (user_id, at);

-- +goose Down
DROP TABLE sign_in_locations;
DROP TABLE user_devices;
