-- +goose Up
-- When an agent was last recovered: a workload identity token issued before
-- it never mints again (it may have been stolen before the kill).
ALTER TABLE agents ADD COLUMN recovered_at TIMESTAMP;

-- +goose Down
ALTER TABLE agents DROP COLUMN recovered_at;
