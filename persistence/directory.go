package persistence

import (
	"context"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// User is a person in the directory: unique by e-mail address whatever its
// case (the store keeps the folded address as the key). PasswordHash is an argon2id hash in PHC form, or nil.
type User struct {
	ID            string     `db:"id"`
	Email         string     `db:"email"`
	EmailVerified bool       `db:"email_verified"`
	Name          string     `db:"name"`
	FirstName     string     `db:"first_name"`
	LastName      string     `db:"last_name"`
	Status        string     `db:"status"`
	Metadata      JSONObject `db:"metadata"`
	PasswordHash  *string    `db:"password_hash"`
	CreatedAt     time.Time  `db:"created_at"`
	UpdatedAt     time.Time  `db:"updated_at"`
	LastSignInAt  *time.Time `db:"last_sign_in_at"`
	ConsoleAdmin  bool       `db:"console_admin"` // acts as admin through an adminConsole application; only an admin sets it
}

const userColumns = `id, email, email_verified, name, first_name, last_name, status, metadata, password_hash,
	created_at, updated_at, last_sign_in_at, console_admin`

// UserFilter narrows a user list; empty fields do not filter. Email is an
// exact (case-folded) match, Q a case-insensitive substring of e-mail or
// names (folded by Go, so any script folds, on either dialect).
type UserFilter struct {
	Email  string
	Q      string
	Status string
}

// Org is an organization.
type Org struct {
	ID        string     `db:"id"`
	Name      string     `db:"name"`
	Slug      string     `db:"slug"`
	Metadata  JSONObject `db:"metadata"`
	CreatedAt time.Time  `db:"created_at"`
	UpdatedAt time.Time  `db:"updated_at"`
}

const orgColumns = `id, name, slug, metadata, created_at, updated_at`

// Member is a user's membership of an organization, with the user's
// e-mail and name for listing.
type Member struct {
	OrgID    string    `db:"org_id"`
	UserID   string    `db:"user_id"`
	Role     string    `db:"role"`
	JoinedAt time.Time `db:"joined_at"`
	Email    string    `db:"email"`
	Name     string    `db:"name"`
}

// Role is a named role users can hold.
type Role struct {
	Name        string    `db:"name"`
	Description string    `db:"description"`
	CreatedAt   time.Time `db:"created_at"`
}

// DirectoryEvent is one entry of the directory's event log.
type DirectoryEvent struct {
	ID        string     `db:"id"`
	Type      string     `db:"type"`
	Actor     Actor      `db:"actor"`
	UserID    *string    `db:"user_id"`
	OrgID     *string    `db:"org_id"`
	Data      JSONObject `db:"data"`
	CreatedAt time.Time  `db:"created_at"`
}

const eventColumns = `id, type, actor, user_id, org_id, data, created_at`

func (s *Store) insertEvents(ctx context.Context, tx *sqlx.Tx, events []DirectoryEvent) error {
	for _, e := range events {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO directory_events (`+eventColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`),
			e.ID, e.Type, e.Actor, e.UserID, e.OrgID, e.Data, e.CreatedAt.UTC()); err != nil {
			return err
		}
	}
	return s.insertWebhooks(ctx, tx, directoryHooks(events))
}

// ListDirectoryEvents returns one page of the event log, oldest first.
func (s *Store) ListDirectoryEvents(ctx context.Context, p Page) ([]DirectoryEvent, error) {
	if err := p.valid(); err != nil {
		return nil, err
	}
	out := []DirectoryEvent{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+eventColumns+` FROM directory_events ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, mapError(err)
}

// --- users

// CreateUser inserts a user and its events; a taken e-mail is ErrConflict.
func (s *Store) CreateUser(ctx context.Context, u *User, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if err := s.insertUser(ctx, tx, u); err != nil {
			return nil, err
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

func (s *Store) insertUser(ctx context.Context, tx *sqlx.Tx, u *User) error {
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO users (`+userColumns+`, email_key, search_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		u.ID, u.Email, u.EmailVerified, u.Name, u.FirstName, u.LastName, u.Status, u.Metadata, u.PasswordHash,
		u.CreatedAt.UTC(), u.UpdatedAt.UTC(), utcPtr(u.LastSignInAt), u.ConsoleAdmin, strings.ToLower(u.Email), searchKey(u))
	if err != nil {
		return err
	}
	return s.syncPasswordIdentity(ctx, tx, u)
}

// searchKey is what a user list's q searches: e-mail and names, folded to
// lower case here (SQLite's LOWER folds ASCII only), one per line.
func searchKey(u *User) string {
	return strings.ToLower(u.Email + "\n" + u.Name + "\n" + u.FirstName + "\n" + u.LastName)
}

// GetUser reads one user by id.
func (s *Store) GetUser(ctx context.Context, id string) (*User, error) {
	var u User
	if err := s.stmt(ctx, s.userStmt).GetContext(ctx, &u, id); err != nil {
		return nil, mapError(err)
	}
	return &u, nil
}

// GetUserByEmail reads one user by e-mail address, whatever its case.
func (s *Store) GetUserByEmail(ctx context.Context, email string) (*User, error) {
	return s.getUser(ctx, s.conn(ctx), `email_key = ?`, strings.ToLower(email), "")
}

func (s *Store) getUser(ctx context.Context, q querier, where, arg, suffix string) (*User, error) {
	var u User
	if err := q.GetContext(ctx, &u, s.q(`SELECT `+userColumns+` FROM users WHERE `+where+suffix), arg); err != nil {
		return nil, mapError(err)
	}
	return &u, nil
}

// ListUsers returns one page of users matching the filter, oldest first, and
// the total.
func (s *Store) ListUsers(ctx context.Context, f UserFilter, p Page) ([]User, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var where []string
	var args []any
	if f.Email != "" {
		where, args = append(where, `email_key = ?`), append(args, strings.ToLower(f.Email))
	}
	if f.Status != "" {
		where, args = append(where, `status = ?`), append(args, f.Status)
	}
	if f.Q != "" {
		like := "%" + likeEscaper.Replace(strings.ToLower(f.Q)) + "%"
		where, args = append(where, `search_key LIKE ? ESCAPE '\'`), append(args, like)
	}
	clause := ""
	if len(where) > 0 {
		clause = ` WHERE ` + strings.Join(where, ` AND `)
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM users`+clause), args...); err != nil {
		return nil, 0, mapError(err)
	}
	out := []User{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+userColumns+` FROM users`+clause+` ORDER BY created_at, id LIMIT ? OFFSET ?`),
		append(args, p.Limit, p.Offset)...)
	return out, total, mapError(err)
}

// likeEscaper escapes LIKE's wildcards in a search term.
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// UpdateUser reads the user, lets fn change it and return the events to
// record, and writes both in one transaction holding the row.
func (s *Store) UpdateUser(ctx context.Context, id string, fn func(*User) ([]DirectoryEvent, error)) (*User, error) {
	var out *User
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		u, err := s.getUser(ctx, tx, `id = ?`, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		was := u.Status
		events, err := fn(u)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE users SET email = ?, email_key = ?, email_verified = ?, name = ?, first_name = ?,
			last_name = ?, status = ?, metadata = ?, password_hash = ?, updated_at = ?, last_sign_in_at = ?, console_admin = ?, search_key = ? WHERE id = ?`),
			u.Email, strings.ToLower(u.Email), u.EmailVerified, u.Name, u.FirstName, u.LastName, u.Status, u.Metadata, u.PasswordHash,
			u.UpdatedAt.UTC(), utcPtr(u.LastSignInAt), u.ConsoleAdmin, searchKey(u), u.ID); err != nil {
			return nil, err
		}
		if err := s.syncPasswordIdentity(ctx, tx, u); err != nil {
			return nil, err
		}
		out = u
		var evict []string
		if u.Status != was {
			if evict, err = s.statusChanged(ctx, tx, u); err != nil {
				return nil, err
			}
		}
		return evict, s.insertEvents(ctx, tx, events)
	})
	return out, err
}

// UserDisabled is the directory's status of a person who may not sign in.
const UserDisabled = "disabled"

// statusChanged does in tx what a person's new status brings, and answers
// the evictions: their delegations and cached API keys, which carry the
// status, are read again; a person disabled is also signed out everywhere
// (sessions ended, reason user_disabled, and token families revoked), so
// that enabling them again brings none of it back.
func (s *Store) statusChanged(ctx context.Context, tx *sqlx.Tx, u *User) ([]string, error) {
	evict, err := s.userDelegationEvictions(ctx, tx, u.ID)
	if err != nil {
		return nil, err
	}
	keys, err := s.apiKeysGo(ctx, tx, "user_id", u.ID)
	if err != nil {
		return nil, err
	}
	evict = append(evict, keys...)
	if u.Status != UserDisabled {
		return evict, nil
	}
	ended, err := s.endUserSessions(ctx, tx, u.ID, AuthEvent{Reason: SessionEndUserDisabled})
	if err != nil {
		return nil, err
	}
	_, revoked, err := s.revokeUserFamilies(ctx, tx, u.ID)
	return append(append(evict, ended...), revoked...), err
}

// DeleteUser removes a user with everything that is theirs (credentials in
// the row; memberships, roles and invites by cascade) and records events.
// Their SSO sessions end with session_ended events (reason user_deleted)
// and evictions, so that what hangs on a session dies at once.
func (s *Store) DeleteUser(ctx context.Context, id string, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		evictions, err := s.endUserSessions(ctx, tx, id, AuthEvent{Reason: SessionEndUserDeleted})
		if err != nil {
			return nil, err
		}
		delegations, err := s.userDelegationEvictions(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		evictions = append(evictions, delegations...)
		keys, err := s.apiKeysGo(ctx, tx, "user_id", id)
		if err != nil {
			return nil, err
		}
		evictions = append(evictions, keys...)
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM users WHERE id = ?`), id)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		return evictions, s.insertEvents(ctx, tx, events)
	})
}

// --- organizations

// CreateOrg inserts an organization; a taken slug is ErrConflict.
func (s *Store) CreateOrg(ctx context.Context, o *Org, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO orgs (`+orgColumns+`) VALUES (?, ?, ?, ?, ?, ?)`),
			o.ID, o.Name, o.Slug, o.Metadata, o.CreatedAt.UTC(), o.UpdatedAt.UTC()); err != nil {
			return nil, err
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

// GetOrg reads one organization.
func (s *Store) GetOrg(ctx context.Context, id string) (*Org, error) {
	return s.getOrg(ctx, s.conn(ctx), id, "")
}

func (s *Store) getOrg(ctx context.Context, q querier, id, suffix string) (*Org, error) {
	var o Org
	if err := q.GetContext(ctx, &o, s.q(`SELECT `+orgColumns+` FROM orgs WHERE id = ?`+suffix), id); err != nil {
		return nil, mapError(err)
	}
	return &o, nil
}

// ListOrgs returns one page of organizations, oldest first, and the total.
func (s *Store) ListOrgs(ctx context.Context, p Page) ([]Org, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM orgs`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []Org{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+orgColumns+` FROM orgs ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// UpdateOrg reads the organization, lets fn change it and return events,
// and writes both in one transaction.
func (s *Store) UpdateOrg(ctx context.Context, id string, fn func(*Org) ([]DirectoryEvent, error)) (*Org, error) {
	var out *Org
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		o, err := s.getOrg(ctx, tx, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		events, err := fn(o)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE orgs SET name = ?, slug = ?, metadata = ?, updated_at = ? WHERE id = ?`),
			o.Name, o.Slug, o.Metadata, o.UpdatedAt.UTC(), o.ID); err != nil {
			return nil, err
		}
		out = o
		return nil, s.insertEvents(ctx, tx, events)
	})
	return out, err
}

// DeleteOrg removes an organization and its memberships.
func (s *Store) DeleteOrg(ctx context.Context, id string, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		keys, err := s.apiKeysGo(ctx, tx, "org_id", id)
		if err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM orgs WHERE id = ?`), id)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		return keys, s.insertEvents(ctx, tx, events)
	})
}

// AddMember makes a user a member with a role; already a member is
// ErrConflict, an unknown organization or user ErrConflict too (a foreign key).
func (s *Store) AddMember(ctx context.Context, m *Member, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO org_members (org_id, user_id, role, joined_at) VALUES (?, ?, ?, ?)`),
			m.OrgID, m.UserID, m.Role, m.JoinedAt.UTC()); err != nil {
			return nil, err
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

// RemoveMember ends a membership; none is ErrNotFound.
func (s *Store) RemoveMember(ctx context.Context, orgID, userID string, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM org_members WHERE org_id = ? AND user_id = ?`), orgID, userID)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

// ListMembers returns one page of an organization's members, earliest
// first, and the total.
func (s *Store) ListMembers(ctx context.Context, orgID string, p Page) ([]Member, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM org_members WHERE org_id = ?`), orgID); err != nil {
		return nil, 0, mapError(err)
	}
	out := []Member{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT m.org_id, m.user_id, m.role, m.joined_at, u.email, u.name
		FROM org_members m JOIN users u ON u.id = m.user_id WHERE m.org_id = ? ORDER BY m.joined_at, m.user_id LIMIT ? OFFSET ?`),
		orgID, p.Limit, p.Offset)
	return out, total, mapError(err)
}

// --- roles

// CreateRole adds a role; a taken name is ErrConflict.
func (s *Store) CreateRole(ctx context.Context, r *Role, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO roles (name, description, created_at) VALUES (?, ?, ?)`),
			r.Name, r.Description, r.CreatedAt.UTC()); err != nil {
			return nil, err
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

// GetRole reads one role.
func (s *Store) GetRole(ctx context.Context, name string) (*Role, error) {
	var r Role
	if err := s.conn(ctx).GetContext(ctx, &r, s.q(`SELECT name, description, created_at FROM roles WHERE name = ?`), name); err != nil {
		return nil, mapError(err)
	}
	return &r, nil
}

// ListRoles returns one page of roles by name, and the total.
func (s *Store) ListRoles(ctx context.Context, p Page) ([]Role, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM roles`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []Role{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT name, description, created_at FROM roles ORDER BY `+s.byteOrder("name")+` LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// DeleteRole removes a role and every assignment of it.
func (s *Store) DeleteRole(ctx context.Context, name string, events ...DirectoryEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM roles WHERE name = ?`), name)
		if err != nil {
			return nil, err
		}
		if err := affectedOne(res); err != nil {
			return nil, err
		}
		return nil, s.insertEvents(ctx, tx, events)
	})
}

// AssignRole gives a user a role, once: it reports whether the assignment
// is new, and records the events only then.
func (s *Store) AssignRole(ctx context.Context, userID, role string, at time.Time, events ...DirectoryEvent) (bool, error) {
	var added bool
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`INSERT INTO user_roles (user_id, role, assigned_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`),
			userID, role, at.UTC())
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, err
		}
		added = true
		return nil, s.insertEvents(ctx, tx, events)
	})
	return added, err
}

// RemoveRole takes a role from a user: it reports whether the user held it,
// and records the events only then.
func (s *Store) RemoveRole(ctx context.Context, userID, role string, events ...DirectoryEvent) (bool, error) {
	var removed bool
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM user_roles WHERE user_id = ? AND role = ?`), userID, role)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return nil, err
		}
		removed = true
		return nil, s.insertEvents(ctx, tx, events)
	})
	return removed, err
}

// UserRoles lists the roles a user holds, by name.
func (s *Store) UserRoles(ctx context.Context, userID string) ([]Role, error) {
	out := []Role{}
	err := s.stmt(ctx, s.rolesStmt).SelectContext(ctx, &out, userID)
	return out, mapError(err)
}

// userRolesQuery reads a user's roles (prepared: rolesStmt).
func (s *Store) userRolesQuery() string {
	return `SELECT r.name, r.description, r.created_at FROM user_roles ur
		JOIN roles r ON r.name = ur.role WHERE ur.user_id = ? ORDER BY ` + s.byteOrder("r.name")
}

// ApproverRole tells whether a HITL policy names role as its approver, or
// a pending request does (a request keeps the approver its policy named
// when it was made): holding such a role decides agents' actions.
func (s *Store) ApproverRole(ctx context.Context, role string) (bool, error) {
	var n int
	err := s.conn(ctx).GetContext(ctx, &n, s.q(`SELECT
		(SELECT COUNT(*) FROM hitl_policies WHERE approver_type = 'role' AND approver_id = ?) +
		(SELECT COUNT(*) FROM hitl_requests WHERE approver_type = 'role' AND approver_id = ? AND status = ?)`), role, role, HITLPending)
	return n > 0, mapError(err)
}
