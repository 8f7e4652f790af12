-- +goose Up
-- Console administration is a flag on the person that only an admin gives
-- or takes (issue 39), no longer the directory role named admin, which a
-- roles:manage token could create and assign. The people who hold that
-- role today keep console administration; the role itself stays an
-- ordinary role (applications may read it in the roles claim).
ALTER TABLE users ADD COLUMN console_admin boolean NOT NULL DEFAULT false;
UPDATE users SET console_admin = true WHERE id IN (SELECT user_id FROM user_roles WHERE role = 'admin');

-- Scopes never granted just in time any more: their rules go, and open
-- grants carrying them end (pending ones denied, active ones revoked).
DELETE FROM jit_rules WHERE scope IN ('roles:manage', 'users:admin');
UPDATE jit_grants SET status = CASE status WHEN 'active' THEN 'revoked' ELSE 'denied' END,
    ended_at = now(), reason = 'scope no longer granted just in time (migration 0028)'
    WHERE status IN ('active', 'pending_approval') AND scopes ?| array['roles:manage', 'users:admin'];

-- +goose Down
ALTER TABLE users DROP COLUMN console_admin;
