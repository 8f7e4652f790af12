package persistence

import (
	"context"
	"time"
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

// SigningKey is a private signing key in PKCS #8 DER form.
type SigningKey struct {
	KID        string    `db:"kid"`
	Alg        string    `db:"alg"`
	PrivateDER []byte    `db:"private_der"`
	CreatedAt  time.Time `db:"created_at"`
}

// SigningKeys lists every stored signing key, oldest first.
func (s *Store) SigningKeys(ctx context.Context) ([]SigningKey, error) {
	out := []SigningKey{}
	err := s.conn(ctx).SelectContext(ctx, &out, `SELECT kid, alg, private_der, created_at FROM signing_keys ORDER BY created_at, kid`)
	return out, mapError(err)
}

// CreateSigningKey stores a new key; a taken kid is ErrConflict.
func (s *Store) CreateSigningKey(ctx context.Context, k SigningKey) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO signing_keys (kid, alg, private_der, created_at) VALUES (?, ?, ?, ?)`),
		k.KID, k.Alg, k.PrivateDER, k.CreatedAt.UTC())
	return mapError(err)
}
