package persistence

import (
	"context"
	"encoding/base64"
	"time"

	"github.com/jmoiron/sqlx"
)

// APIKey is an end-user API key of an application (issue 18). KeyHash is
// the keyed hash of the key, never the key; Hint is the key's first
// characters (its prefix and application tag), which name it in lists
// without helping anyone guess it.
type APIKey struct {
	ID            string     `db:"id"`
	ApplicationID string     `db:"application_id"`
	UserID        *string    `db:"user_id"`
	OrgID         *string    `db:"org_id"`
	Name          string     `db:"name"`
	KeyHash       []byte     `db:"key_hash"`
	Hint          string     `db:"hint"`
	Scopes        StringList `db:"scopes"`
	Metadata      JSONObject `db:"metadata"`
	IssuedBy      string     `db:"issued_by"` // the client id that issued it
	ExpiresAt     *time.Time `db:"expires_at"`
	RevokedAt     *time.Time `db:"revoked_at"`
	LastUsedAt    *time.Time `db:"last_used_at"`
	CreatedAt     time.Time  `db:"created_at"`
	// OwnerDisabled is set by APIKeyByHash: the key's person is disabled.
	OwnerDisabled bool `db:"owner_disabled"`
}

const apiKeyColumns = `id, application_id, user_id, org_id, name, key_hash, hint, scopes, metadata, issued_by,
	expires_at, revoked_at, last_used_at, created_at`

// Evictions of cached API keys: one key by its hash (a revocation), or
// all of them (an application, person or organization deleted, whose keys
// go with it).
const (
	evictAPIKey  = "apikey:"
	evictAPIKeys = "apikeys:"
)

func apiKeyEviction(hash []byte) string {
	return evictAPIKey + base64.RawURLEncoding.EncodeToString(hash)
}

// CreateAPIKey inserts a key. An application, person or organization that
// does not exist (or was deleted meanwhile) is ErrMissingReference.
func (s *Store) CreateAPIKey(ctx context.Context, k *APIKey) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if k.Metadata == nil {
			k.Metadata = JSONObject{}
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO api_keys (`+apiKeyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			k.ID, k.ApplicationID, k.UserID, k.OrgID, k.Name, k.KeyHash, k.Hint, k.Scopes, k.Metadata, k.IssuedBy,
			utcPtr(k.ExpiresAt), utcPtr(k.RevokedAt), utcPtr(k.LastUsedAt), k.CreatedAt.UTC())
		// A key nobody has seen needs no eviction: no cache can hold it
		// (unknown hashes are not cached).
		return nil, err
	})
}

// GetAPIKey reads one key of an application.
func (s *Store) GetAPIKey(ctx context.Context, appID, id string) (*APIKey, error) {
	var k APIKey
	if err := s.conn(ctx).GetContext(ctx, &k, s.q(`SELECT `+apiKeyColumns+` FROM api_keys WHERE id = ? AND application_id = ?`), id, appID); err != nil {
		return nil, mapError(err)
	}
	return &k, nil
}

// ListAPIKeys returns one page of an application's keys, oldest first, and
// the total.
func (s *Store) ListAPIKeys(ctx context.Context, appID string, p Page) ([]APIKey, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM api_keys WHERE application_id = ?`), appID); err != nil {
		return nil, 0, mapError(err)
	}
	out := []APIKey{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+apiKeyColumns+` FROM api_keys WHERE application_id = ?
		ORDER BY created_at, id LIMIT ? OFFSET ?`), appID, p.Limit, p.Offset)
	return out, total, mapError(err)
}

// RevokeAPIKey marks a key revoked at now (idempotent: a revoked key keeps
// its first revocation time) and answers it. Cached copies are evicted
// after the commit, on every replica, before this returns (see cache).
func (s *Store) RevokeAPIKey(ctx context.Context, appID, id string, now time.Time) (*APIKey, error) {
	var out *APIKey
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var k APIKey
		if err := tx.GetContext(ctx, &k, s.q(`SELECT `+apiKeyColumns+` FROM api_keys WHERE id = ? AND application_id = ?`+s.forUpdate()), id, appID); err != nil {
			return nil, err
		}
		if k.RevokedAt == nil {
			at := now.UTC()
			k.RevokedAt = &at
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE api_keys SET revoked_at = ? WHERE id = ?`), at, k.ID); err != nil {
				return nil, err
			}
		}
		out = &k
		return []string{apiKeyEviction(k.KeyHash)}, nil
	})
	return out, err
}

// APIKeyByHash finds the key whose keyed hash is hash, from the cache when
// it can: validation is on the hot path of every caller's own API. Revoked
// and expired keys are answered too (the caller says why they are not
// valid); an unknown hash is ErrNotFound and is not cached, so a key made
// after a miss is found at once.
func (s *Store) APIKeyByHash(ctx context.Context, hash []byte) (*APIKey, error) {
	c := s.cacheFor(ctx)
	if k := c.apiKey(string(hash)); k != nil {
		return k, nil
	}
	rs := c.begin()
	var k APIKey
	if err := s.conn(ctx).GetContext(ctx, &k, s.q(`SELECT `+apiKeyColumns+`,
		EXISTS (SELECT 1 FROM users WHERE users.id = api_keys.user_id AND users.status = ?) AS owner_disabled
		FROM api_keys WHERE key_hash = ?`), UserDisabled, hash); err != nil {
		return nil, mapError(err)
	}
	put(c, c.apiKeys, maxCachedAPIKeys, rs, string(hash), &k)
	return &k, nil
}

// TouchAPIKeys records when keys were last used, in one transaction: ids to
// times. A time never moves a key's lastUsedAt backwards; nothing is
// evicted (lastUsedAt is not what validation reads).
func (s *Store) TouchAPIKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		q := s.q(`UPDATE api_keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)`)
		for id, at := range used {
			at = at.UTC().Truncate(time.Microsecond)
			if _, err := tx.ExecContext(ctx, q, at, id, at); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
}

// apiKeysGo answers the eviction of the cached API keys when a record that
// owns some (column: application_id, user_id or org_id) is being deleted,
// its keys going with it (ON DELETE CASCADE), or changes what its cached
// keys carry (a person's status). A record without keys evicts nothing, and
// its change waits for no lease.
func (s *Store) apiKeysGo(ctx context.Context, tx *sqlx.Tx, column, id string) ([]string, error) {
	var any bool
	if err := tx.GetContext(ctx, &any, s.q(`SELECT EXISTS (SELECT 1 FROM api_keys WHERE `+column+` = ?)`), id); err != nil {
		return nil, err
	}
	if !any {
		return nil, nil
	}
	return []string{evictAPIKeys}, nil
}
