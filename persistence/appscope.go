package persistence

import (
	"context"
	"time"
)

// Application-scoped reads (issue 17): what a service account granted an
// application may read of it over the M2M API.

// ListApplicationUsers lists one page of the people who have signed in
// through the application, oldest account first, and how many there are.
func (s *Store) ListApplicationUsers(ctx context.Context, appID string, p Page) ([]User, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	// application_users holds each person once, written by a trigger with
	// their first sign_in event through the application.
	const in = ` FROM users WHERE id IN (SELECT user_id FROM application_users WHERE application_id = ?)`
	var total int
	if err := s.db.GetContext(ctx, &total, s.q(`SELECT COUNT(*)`+in), appID); err != nil {
		return nil, 0, mapError(err)
	}
	out := []User{}
	err := s.db.SelectContext(ctx, &out, s.q(`SELECT `+userColumns+in+` ORDER BY created_at, id LIMIT ? OFFSET ?`), appID, p.Limit, p.Offset)
	return out, total, mapError(err)
}

// ListApplicationSessions lists one page of the live sessions begun
// through the application (not past their end, used since idleSince),
// oldest first, and how many there are.
func (s *Store) ListApplicationSessions(ctx context.Context, appID string, now, idleSince time.Time, p Page) ([]SSOSession, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	const where = ` FROM sso_sessions WHERE application_id = ? AND expires_at > ? AND last_seen_at > ?`
	var total int
	if err := s.db.GetContext(ctx, &total, s.q(`SELECT COUNT(*)`+where), appID, now.UTC(), idleSince.UTC()); err != nil {
		return nil, 0, mapError(err)
	}
	out := []SSOSession{}
	err := s.db.SelectContext(ctx, &out, s.q(`SELECT `+ssoSessionColumns+where+` ORDER BY created_at, id LIMIT ? OFFSET ?`),
		appID, now.UTC(), idleSince.UTC(), p.Limit, p.Offset)
	return out, total, mapError(err)
}
