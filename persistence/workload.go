package persistence

import (
	"context"
	"errors"
	"time"

	"github.com/jmoiron/sqlx"
)

// WorkloadIssuer is a platform whose identity tokens (JWTs) the token
// endpoint accepts in a workload identity federation exchange.
type WorkloadIssuer struct {
	ID                 string     `db:"id"`
	Name               string     `db:"name"`
	IssuerURL          string     `db:"issuer_url"`
	JWKSURI            string     `db:"jwks_uri"`
	Platform           string     `db:"platform"`
	AllowedAudiences   StringList `db:"allowed_audiences"`
	AllowedSubjects    StringList `db:"allowed_subjects"`
	MaxTokenAgeSeconds int        `db:"max_token_age_seconds"`
	CreatedAt          time.Time  `db:"created_at"`
	UpdatedAt          time.Time  `db:"updated_at"`
}

// WorkloadMapping maps the subject of an issuer's tokens to an agent.
type WorkloadMapping struct {
	ID               string     `db:"id"`
	IssuerID         string     `db:"issuer_id"`
	AgentClientID    string     `db:"agent_client_id"`
	SubjectPattern   string     `db:"subject_pattern"`
	SubjectMatchType string     `db:"subject_match_type"`
	Scopes           StringList `db:"scopes"`
	CreatedAt        time.Time  `db:"created_at"`
}

const (
	issuerColumns  = `id, name, issuer_url, jwks_uri, platform, allowed_audiences, allowed_subjects, max_token_age_seconds, created_at, updated_at`
	mappingColumns = `id, issuer_id, agent_client_id, subject_pattern, subject_match_type, scopes, created_at`
)

// ErrInUse refuses to delete a record others still refer to.
var ErrInUse = errors.New("in use")

// CreateWorkloadIssuer registers an issuer; a registered issuer URL is ErrConflict.
func (s *Store) CreateWorkloadIssuer(ctx context.Context, is *WorkloadIssuer) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO workload_issuers (`+issuerColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			is.ID, is.Name, is.IssuerURL, is.JWKSURI, is.Platform, is.AllowedAudiences, is.AllowedSubjects,
			is.MaxTokenAgeSeconds, is.CreatedAt.UTC(), is.UpdatedAt.UTC())
		return []string{evictIssuers}, err
	})
}

// GetWorkloadIssuer reads one issuer by id.
func (s *Store) GetWorkloadIssuer(ctx context.Context, id string) (*WorkloadIssuer, error) {
	return s.getIssuer(ctx, s.conn(ctx), id, "")
}

func (s *Store) getIssuer(ctx context.Context, q querier, id, suffix string) (*WorkloadIssuer, error) {
	var is WorkloadIssuer
	if err := q.GetContext(ctx, &is, s.q(`SELECT `+issuerColumns+` FROM workload_issuers WHERE id = ?`+suffix), id); err != nil {
		return nil, mapError(err)
	}
	return &is, nil
}

// ListWorkloadIssuers returns one page of issuers, oldest first, and the total.
func (s *Store) ListWorkloadIssuers(ctx context.Context, p Page) ([]WorkloadIssuer, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM workload_issuers`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []WorkloadIssuer{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+issuerColumns+` FROM workload_issuers ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// UpdateWorkloadIssuer reads the issuer, lets fn change it and writes it
// back in one transaction holding the row; an error from fn aborts.
func (s *Store) UpdateWorkloadIssuer(ctx context.Context, id string, fn func(*WorkloadIssuer) error) (*WorkloadIssuer, error) {
	var out *WorkloadIssuer
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		is, err := s.getIssuer(ctx, tx, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		if err := fn(is); err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE workload_issuers SET name = ?, issuer_url = ?, jwks_uri = ?, platform = ?,
			allowed_audiences = ?, allowed_subjects = ?, max_token_age_seconds = ?, updated_at = ? WHERE id = ?`),
			is.Name, is.IssuerURL, is.JWKSURI, is.Platform, is.AllowedAudiences, is.AllowedSubjects, is.MaxTokenAgeSeconds, is.UpdatedAt.UTC(), is.ID)
		out = is
		return []string{evictIssuers}, err
	})
	return out, err
}

// DeleteWorkloadIssuer removes an issuer no mapping uses; otherwise ErrInUse.
func (s *Store) DeleteWorkloadIssuer(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := s.getIssuer(ctx, tx, id, s.forUpdate()); err != nil {
			return nil, err
		}
		var n int
		if err := tx.GetContext(ctx, &n, s.q(`SELECT COUNT(*) FROM workload_mappings WHERE issuer_id = ?`), id); err != nil {
			return nil, err
		}
		if n > 0 {
			return nil, ErrInUse
		}
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM workload_issuers WHERE id = ?`), id)
		return []string{evictIssuers}, err
	})
}

// WorkloadIssuers returns every issuer by issuer URL, from the cache when it
// can (every federation exchange reads it). Shared: read-only.
func (s *Store) WorkloadIssuers(ctx context.Context) (map[string]*WorkloadIssuer, error) {
	if m := cachedSet(s.cache, &s.cache.issuers); m != nil {
		return m, nil
	}
	rs := s.cache.begin()
	var list []WorkloadIssuer
	if err := s.conn(ctx).SelectContext(ctx, &list, `SELECT `+issuerColumns+` FROM workload_issuers`); err != nil {
		return nil, mapError(err)
	}
	m := make(map[string]*WorkloadIssuer, len(list))
	for i := range list {
		m[list[i].IssuerURL] = &list[i]
	}
	putSet(s.cache, &s.cache.issuers, rs, m)
	return m, nil
}

// CreateWorkloadMapping adds a mapping; one for the same issuer and subject
// is ErrConflict, and so is a missing issuer or agent (a foreign key).
func (s *Store) CreateWorkloadMapping(ctx context.Context, m *WorkloadMapping) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO workload_mappings (`+mappingColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`),
			m.ID, m.IssuerID, m.AgentClientID, m.SubjectPattern, m.SubjectMatchType, m.Scopes, m.CreatedAt.UTC())
		// A cached mapping of this subject to a deleted agent (mappings go
		// with their agent, and the cache does not hear of it) is replaced.
		return []string{evictMapping + mappingKey(m.IssuerID, m.SubjectPattern)}, err
	})
}

// mappingKey names a mapping in the cache: the issuer id is a UUID, so the
// colon after it is unambiguous.
func mappingKey(issuerID, subject string) string { return issuerID + ":" + subject }

// GetWorkloadMapping reads one mapping by id.
func (s *Store) GetWorkloadMapping(ctx context.Context, id string) (*WorkloadMapping, error) {
	var m WorkloadMapping
	if err := s.conn(ctx).GetContext(ctx, &m, s.q(`SELECT `+mappingColumns+` FROM workload_mappings WHERE id = ?`), id); err != nil {
		return nil, mapError(err)
	}
	return &m, nil
}

// WorkloadMappingFor returns the mapping of an issuer's subject (exact
// match), from the cache when it can: every exchange asks. A cached mapping
// whose agent has since been deleted is harmless: the agent is not found.
func (s *Store) WorkloadMappingFor(ctx context.Context, issuerID, subject string) (*WorkloadMapping, error) {
	key := mappingKey(issuerID, subject)
	if m := s.cache.mapping(key); m != nil {
		return m, nil
	}
	rs := s.cache.begin()
	var m WorkloadMapping
	if err := s.mappingStmt.GetContext(ctx, &m, issuerID, subject); err != nil {
		return nil, mapError(err)
	}
	put(s.cache, s.cache.mappings, maxCachedMappings, rs, key, &m)
	return &m, nil
}

// ListWorkloadMappings returns one page of mappings, oldest first, of one
// issuer when issuerID is not empty, and the total.
func (s *Store) ListWorkloadMappings(ctx context.Context, issuerID string, p Page) ([]WorkloadMapping, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	where, args := ``, []any{}
	if issuerID != "" {
		where, args = ` WHERE issuer_id = ?`, append(args, issuerID)
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, s.q(`SELECT COUNT(*) FROM workload_mappings`+where), args...); err != nil {
		return nil, 0, mapError(err)
	}
	out := []WorkloadMapping{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+mappingColumns+` FROM workload_mappings`+where+` ORDER BY created_at, id LIMIT ? OFFSET ?`),
		append(args, p.Limit, p.Offset)...)
	return out, total, mapError(err)
}

// DeleteWorkloadMapping removes a mapping: the next exchange of its
// subject is refused.
func (s *Store) DeleteWorkloadMapping(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		var m WorkloadMapping
		if err := tx.GetContext(ctx, &m, s.q(`SELECT `+mappingColumns+` FROM workload_mappings WHERE id = ?`+s.forUpdate()), id); err != nil {
			return nil, err
		}
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM workload_mappings WHERE id = ?`), id)
		return []string{evictMapping + mappingKey(m.IssuerID, m.SubjectPattern)}, err
	})
}
