-- +goose Up
-- When a refresh token was first used (rotated). A rotated token presented
-- again within the reuse grace window (IDENTITYD_REFRESH_REUSE_GRACE) is an
-- honest retry, a lost answer or a concurrent refresh, and gets tokens;
-- after it, reuse revokes the family. NULL: unused, or rotated before this
-- column existed (reuse as before).
ALTER TABLE refresh_tokens ADD COLUMN used_at TIMESTAMP;

-- +goose Down
ALTER TABLE refresh_tokens DROP COLUMN used_at;
