package persistence

import (
	"context"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// RARType is a rich authorization request type (RFC 9396): the kind of
// authorization_details entry the server accepts. Schema is the JSON text
// of the JSON Schema entries must satisfy.
type RARType struct {
	Type                 string     `db:"type"`
	DisplayName          string     `db:"display_name"`
	Description          string     `db:"description"`
	AllowedActions       StringList `db:"allowed_actions"`
	AllowedLocations     StringList `db:"allowed_locations"`
	ReadOnlyActions      StringList `db:"read_only_actions"`
	RequiredCapabilities StringList `db:"required_capabilities"`
	Schema               string     `db:"schema"`
	CreatedAt            time.Time  `db:"created_at"`
	UpdatedAt            time.Time  `db:"updated_at"`
}

const rarTypeColumns = `type, display_name, description, allowed_actions, allowed_locations, read_only_actions,
	required_capabilities, schema, created_at, updated_at`

// MaxRARTypes bounds how many types can be registered: the token endpoint
// keeps all of them, compiled, in memory.
const MaxRARTypes = 1000

// ErrTooMany refuses a record past a documented bound.
var ErrTooMany = errors.New("too many records")

// CreateRARType registers a type; a taken name is ErrConflict, the
// MaxRARTypes+1st type ErrTooMany.
func (s *Store) CreateRARType(ctx context.Context, t *RARType) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var n int
		if err := tx.GetContext(ctx, &n, `SELECT COUNT(*) FROM rar_types`); err != nil {
			return nil, err
		}
		if n >= MaxRARTypes {
			return nil, ErrTooMany
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO rar_types (`+rarTypeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			t.Type, t.DisplayName, t.Description, t.AllowedActions, t.AllowedLocations, t.ReadOnlyActions,
			t.RequiredCapabilities, t.Schema, t.CreatedAt.UTC(), t.UpdatedAt.UTC())
		return []string{evictRARTypes}, err
	})
}

// GetRARType reads one type by name.
func (s *Store) GetRARType(ctx context.Context, name string) (*RARType, error) {
	var t RARType
	if err := s.conn(ctx).GetContext(ctx, &t, s.q(`SELECT `+rarTypeColumns+` FROM rar_types WHERE type = ?`), name); err != nil {
		return nil, mapError(err)
	}
	return &t, nil
}

// ListRARTypes returns one page of types by name, and the total count.
func (s *Store) ListRARTypes(ctx context.Context, p Page) ([]RARType, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM rar_types`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []RARType{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+rarTypeColumns+` FROM rar_types ORDER BY `+s.byteOrder("type")+` LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// ReplaceRARType writes every field of an existing type but its name and
// creation time; an unknown name is ErrNotFound.
func (s *Store) ReplaceRARType(ctx context.Context, t *RARType) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE rar_types SET display_name = ?, description = ?, allowed_actions = ?,
			allowed_locations = ?, read_only_actions = ?, required_capabilities = ?, schema = ?, updated_at = ? WHERE type = ?`),
			t.DisplayName, t.Description, t.AllowedActions, t.AllowedLocations, t.ReadOnlyActions,
			t.RequiredCapabilities, t.Schema, t.UpdatedAt.UTC(), t.Type)
		if err != nil {
			return nil, err
		}
		return []string{evictRARTypes}, affectedOne(res)
	})
}

// DeleteRARType removes a type. Tokens already issued keep the details they
// were granted.
func (s *Store) DeleteRARType(ctx context.Context, name string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM rar_types WHERE type = ?`), name)
		if err != nil {
			return nil, err
		}
		return []string{evictRARTypes}, affectedOne(res)
	})
}

// RARTypes returns every registered type by name, from the cache when it
// can (the token endpoint reads it on every request with details). The map
// and its records are shared: read-only.
func (s *Store) RARTypes(ctx context.Context) (map[string]*RARType, error) {
	if m := cachedSet(s.cache, &s.cache.rar); m != nil {
		return m, nil
	}
	rs := s.cache.begin()
	var list []RARType
	if err := s.conn(ctx).SelectContext(ctx, &list, `SELECT `+rarTypeColumns+` FROM rar_types`); err != nil {
		return nil, mapError(err)
	}
	m := make(map[string]*RARType, len(list))
	for i := range list {
		m[list[i].Type] = &list[i]
	}
	putSet(s.cache, &s.cache.rar, rs, m)
	return m, nil
}
