package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// Setting reads a system setting; ErrNotFound when it was never set.
func (s *Store) Setting(ctx context.Context, key string) (string, error) {
	var v string
	err := s.conn(ctx).GetContext(ctx, &v, s.q(`SELECT value FROM system_settings WHERE key = ?`), key)
	return v, mapError(err)
}

// SetSettingOnce stores value under key unless the key holds a value already,
// and returns the value that is stored: the first writer wins, also across
// replicas starting together.
func (s *Store) SetSettingOnce(ctx context.Context, key, value string) (string, error) {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO system_settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`), key, value)
	if err != nil {
		return "", mapError(err)
	}
	return s.Setting(ctx, key)
}

// SetSetting stores value under key, replacing what was there.
func (s *Store) SetSetting(ctx context.Context, key, value string) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO system_settings (key, value) VALUES (?, ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`), key, value)
	return mapError(err)
}

// SigningKey is a private signing key in PKCS #8 DER form. A key with no
// RetiredAt is active: it signs (one per algorithm). A retired key no longer
// signs and stays published until what it signed has expired.
type SigningKey struct {
	KID        string     `db:"kid"`
	Alg        string     `db:"alg"`
	PrivateDER []byte     `db:"private_der"` // PKCS #8, sealed by the key set (oauth.KeySet)
	CreatedAt  time.Time  `db:"created_at"`
	RetiredAt  *time.Time `db:"retired_at"`
}

// evictSigningKeys announces a change of the stored signing keys; every
// replica reloads its key set when it hears it (see cache.evict).
const evictSigningKeys = "signing-keys:"

// SigningKeys lists every stored signing key, oldest first.
func (s *Store) SigningKeys(ctx context.Context) ([]SigningKey, error) {
	out := []SigningKey{}
	err := s.conn(ctx).SelectContext(ctx, &out, `SELECT kid, alg, private_der, created_at, retired_at FROM signing_keys ORDER BY created_at, kid`)
	return out, mapError(err)
}

// lockSigningKeys serializes changes of the key set until the transaction
// ends, so that every algorithm keeps exactly one active key however many
// replicas or commands change it at once; reads go on. SQLite needs no
// lock: its write transactions hold the database.
func (s *Store) lockSigningKeys(ctx context.Context, tx *sqlx.Tx) error {
	if s.dialect != Postgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, `LOCK TABLE signing_keys IN SHARE ROW EXCLUSIVE MODE`)
	return err
}

func (s *Store) insertSigningKey(ctx context.Context, tx *sqlx.Tx, k SigningKey) error {
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO signing_keys (kid, alg, private_der, created_at, retired_at) VALUES (?, ?, ?, ?, ?)`),
		k.KID, k.Alg, k.PrivateDER, k.CreatedAt.UTC(), utcPtr(k.RetiredAt))
	return err
}

// EnsureSigningKeys stores each of keys whose algorithm has no active key
// (a first start; replicas starting together store one each way, the
// first wins), and reports the kids it stored.
func (s *Store) EnsureSigningKeys(ctx context.Context, keys []SigningKey) ([]string, error) {
	var stored []string
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		stored = nil
		if err := s.lockSigningKeys(ctx, tx); err != nil {
			return nil, err
		}
		for _, k := range keys {
			var active int
			if err := tx.GetContext(ctx, &active, s.q(`SELECT COUNT(*) FROM signing_keys WHERE alg = ? AND retired_at IS NULL`), k.Alg); err != nil {
				return nil, err
			}
			if active > 0 {
				continue
			}
			if err := s.insertSigningKey(ctx, tx, k); err != nil {
				return nil, err
			}
			stored = append(stored, k.KID)
		}
		if len(stored) == 0 {
			return nil, nil
		}
		return []string{evictSigningKeys}, nil
	})
	return stored, err
}

// RotateSigningKeys stores keys as the active keys of their algorithms and
// retires, at at, the keys that were active for them. It reports the kids
// it retired. A taken kid is ErrDuplicate.
func (s *Store) RotateSigningKeys(ctx context.Context, keys []SigningKey, at time.Time) ([]string, error) {
	var retired []string
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		retired = nil
		if err := s.lockSigningKeys(ctx, tx); err != nil {
			return nil, err
		}
		for _, k := range keys {
			var kids []string
			if err := tx.SelectContext(ctx, &kids, s.q(`SELECT kid FROM signing_keys WHERE alg = ? AND retired_at IS NULL ORDER BY created_at, kid`), k.Alg); err != nil {
				return nil, err
			}
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE signing_keys SET retired_at = ? WHERE alg = ? AND retired_at IS NULL`), at.UTC(), k.Alg); err != nil {
				return nil, err
			}
			if err := s.insertSigningKey(ctx, tx, k); err != nil {
				return nil, err
			}
			retired = append(retired, kids...)
		}
		return []string{evictSigningKeys}, nil
	})
	return retired, err
}

// ReplaceSigningKeyPrivate stores sealed as a key's private half if old is
// still stored there, and tells whether it did. The public half is the
// same, so no replica need reload.
func (s *Store) ReplaceSigningKeyPrivate(ctx context.Context, kid string, old, sealed []byte) (bool, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE signing_keys SET private_der = ? WHERE kid = ? AND private_der = ?`), sealed, kid, old)
		if err != nil {
			return nil, err
		}
		n, err = res.RowsAffected()
		return nil, err
	})
	return n == 1, err
}

// DeleteRetiredSigningKeys deletes the keys retired before a time (what
// they signed has expired), and reports how many.
func (s *Store) DeleteRetiredSigningKeys(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM signing_keys WHERE retired_at IS NOT NULL AND retired_at < ?`), before.UTC())
		if err != nil {
			return nil, err
		}
		if n, err = res.RowsAffected(); err != nil || n == 0 {
			return nil, err
		}
		return []string{evictSigningKeys}, nil
	})
	return n, err
}
