package persistence

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jmoiron/sqlx"
)

// ServiceAccount is a machine principal that authenticates with client
// credentials. SecretHash is the keyed hash of its secret, never the secret.
type ServiceAccount struct {
	ID           string     `db:"id"`
	ClientID     string     `db:"client_id"`
	SecretHash   []byte     `db:"secret_hash"`
	Name         string     `db:"name"`
	Description  string     `db:"description"`
	Scopes       StringList `db:"scopes"`
	RedirectURIs StringList `db:"redirect_uris"`
	CreatedAt    time.Time  `db:"created_at"`
	UpdatedAt    time.Time  `db:"updated_at"`
	RotatedAt    *time.Time `db:"rotated_at"`
	Tier         string     `db:"tier"` // usage tier: free, startup or enterprise (extensions/usage)
}

const serviceAccountColumns = `id, client_id, secret_hash, name, description, scopes, redirect_uris, created_at, updated_at, rotated_at, tier`

// CreateServiceAccount inserts a new account; a taken client id is ErrConflict.
func (s *Store) CreateServiceAccount(ctx context.Context, sa *ServiceAccount) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO service_accounts (`+serviceAccountColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		sa.ID, sa.ClientID, sa.SecretHash, sa.Name, sa.Description, sa.Scopes, sa.RedirectURIs,
		sa.CreatedAt.UTC(), sa.UpdatedAt.UTC(), utcPtr(sa.RotatedAt), sa.tier())
	return mapError(err)
}

// GetServiceAccount reads one account by id.
func (s *Store) GetServiceAccount(ctx context.Context, id string) (*ServiceAccount, error) {
	return s.getServiceAccount(ctx, s.conn(ctx), `id = ?`, id, "")
}

// GetServiceAccountByClientID reads one account by its client id.
func (s *Store) GetServiceAccountByClientID(ctx context.Context, clientID string) (*ServiceAccount, error) {
	return s.getServiceAccount(ctx, s.conn(ctx), `client_id = ?`, clientID, "")
}

func (s *Store) getServiceAccount(ctx context.Context, q querier, where, arg, suffix string) (*ServiceAccount, error) {
	var sa ServiceAccount
	err := q.GetContext(ctx, &sa, s.q(`SELECT `+serviceAccountColumns+` FROM service_accounts WHERE `+where+suffix), arg)
	if err != nil {
		return nil, mapError(err)
	}
	return &sa, nil
}

// ListServiceAccounts returns one page, oldest first, and the total count.
func (s *Store) ListServiceAccounts(ctx context.Context, p Page) ([]ServiceAccount, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM service_accounts`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []ServiceAccount{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+serviceAccountColumns+` FROM service_accounts
		ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// UpdateServiceAccount reads the account, lets fn change it and writes it
// back, all in one transaction holding the row. An error from fn aborts.
func (s *Store) UpdateServiceAccount(ctx context.Context, id string, fn func(*ServiceAccount) error) (*ServiceAccount, error) {
	var out *ServiceAccount
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		sa, err := s.getServiceAccount(ctx, tx, `id = ?`, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		if err := fn(sa); err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE service_accounts SET secret_hash = ?, name = ?, description = ?,
			scopes = ?, redirect_uris = ?, updated_at = ?, rotated_at = ?, tier = ? WHERE id = ?`),
			sa.SecretHash, sa.Name, sa.Description, sa.Scopes, sa.RedirectURIs, sa.UpdatedAt.UTC(), utcPtr(sa.RotatedAt), sa.tier(), sa.ID)
		out = sa
		return []string{evictClient + sa.ClientID}, err
	})
	return out, err
}

// DeleteServiceAccount removes the account. Its tokens stop working with it:
// a token is valid only while its client exists (GetAccessTokenSession), and
// the sweeper removes the rows when they expire.
func (s *Store) DeleteServiceAccount(ctx context.Context, id string) (*ServiceAccount, error) {
	var out *ServiceAccount
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		sa, err := s.getServiceAccount(ctx, tx, `id = ?`, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM service_accounts WHERE id = ?`), sa.ID); err != nil {
			return nil, err
		}
		out = sa
		return []string{evictClient + sa.ClientID}, nil
	})
	return out, err
}

// DefaultTier is the tier of an account created without one.
const DefaultTier = "free"

func (sa *ServiceAccount) tier() string {
	if sa.Tier == "" {
		return DefaultTier
	}
	return sa.Tier
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// AnyServiceAccountWithScope tells whether some account holds scope. The JSON
// test is the one query that differs by dialect.
func (s *Store) AnyServiceAccountWithScope(ctx context.Context, scope string) (bool, error) {
	query := `SELECT EXISTS (SELECT 1 FROM service_accounts, json_each(service_accounts.scopes) WHERE json_each.value = ?)`
	arg := scope
	if s.dialect == Postgres {
		query = `SELECT EXISTS (SELECT 1 FROM service_accounts WHERE scopes @> CAST(? AS jsonb))`
		b, _ := json.Marshal([]string{scope})
		arg = string(b)
	}
	var exists bool
	err := s.conn(ctx).GetContext(ctx, &exists, s.q(query), arg)
	return exists, mapError(err)
}
