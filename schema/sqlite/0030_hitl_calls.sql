-- +goose Up
-- An approval is bound to one call (issue 39): the method, the path (with
-- its query, canonical) and the canonical JSON body the agent asked for,
-- and their digest (SHA-256, hex), which a gated call must match. A request
-- made before this migration, or an explicit one naming no call, has an
-- empty digest and passes no gated call. used_at: the redeemed token has
-- been spent on that call (once).
ALTER TABLE hitl_requests ADD COLUMN call_method TEXT NOT NULL DEFAULT '';
ALTER TABLE hitl_requests ADD COLUMN call_path TEXT NOT NULL DEFAULT '';
ALTER TABLE hitl_requests ADD COLUMN call_body TEXT NOT NULL DEFAULT '';
ALTER TABLE hitl_requests ADD COLUMN call_digest TEXT NOT NULL DEFAULT '';
ALTER TABLE hitl_requests ADD COLUMN used_at TIMESTAMP;

-- +goose Down
ALTER TABLE hitl_requests DROP COLUMN used_at;
ALTER TABLE hitl_requests DROP COLUMN call_digest;
ALTER TABLE hitl_requests DROP COLUMN call_body;
ALTER TABLE hitl_requests DROP COLUMN call_path;
ALTER TABLE hitl_requests DROP COLUMN call_method;
