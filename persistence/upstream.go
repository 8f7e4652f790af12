package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// IdentityProvider is an upstream OpenID Connect provider people may sign
// in through. Name is the provider key of the identities it makes; the
// client secret is kept sealed (extensions/upstream seals and opens it);
// Applications are the client ids of the applications that offer it.
type IdentityProvider struct {
	ID                 string     `db:"id"`
	Name               string     `db:"name"`
	DisplayName        string     `db:"display_name"`
	Issuer             string     `db:"issuer"`
	ClientID           string     `db:"client_id"`
	ClientSecretSealed []byte     `db:"client_secret_sealed"`
	Scopes             StringList `db:"scopes"`
	Applications       StringList `db:"applications"`
	CreatedAt          time.Time  `db:"created_at"`
	UpdatedAt          time.Time  `db:"updated_at"`
}

const identityProviderColumns = `id, name, display_name, issuer, client_id, client_secret_sealed, scopes, applications, created_at, updated_at`

// CreateIdentityProvider stores a provider; a taken name is ErrDuplicate.
func (s *Store) CreateIdentityProvider(ctx context.Context, p *IdentityProvider) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO identity_providers (`+identityProviderColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		p.ID, p.Name, p.DisplayName, p.Issuer, p.ClientID, p.ClientSecretSealed, p.Scopes, p.Applications,
		p.CreatedAt.UTC(), p.UpdatedAt.UTC())
	return mapError(err)
}

// GetIdentityProvider reads a provider by id.
func (s *Store) GetIdentityProvider(ctx context.Context, id string) (*IdentityProvider, error) {
	return s.getIdentityProvider(ctx, s.conn(ctx), `id = ?`, id, "")
}

// GetIdentityProviderByName reads a provider by name.
func (s *Store) GetIdentityProviderByName(ctx context.Context, name string) (*IdentityProvider, error) {
	return s.getIdentityProvider(ctx, s.conn(ctx), `name = ?`, name, "")
}

func (s *Store) getIdentityProvider(ctx context.Context, q querier, where, arg, suffix string) (*IdentityProvider, error) {
	var p IdentityProvider
	if err := q.GetContext(ctx, &p, s.q(`SELECT `+identityProviderColumns+` FROM identity_providers WHERE `+where+suffix), arg); err != nil {
		return nil, mapError(err)
	}
	return &p, nil
}

// ListIdentityProviders returns one page of providers, oldest first, and
// the total.
func (s *Store) ListIdentityProviders(ctx context.Context, p Page) ([]IdentityProvider, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM identity_providers`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []IdentityProvider{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+identityProviderColumns+` FROM identity_providers
		ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// IdentityProvidersOf lists the providers an application offers (its
// client id among their applications), by display name.
func (s *Store) IdentityProvidersOf(ctx context.Context, clientID string) ([]IdentityProvider, error) {
	query := `SELECT ` + identityProviderColumns + ` FROM identity_providers
		WHERE EXISTS (SELECT 1 FROM json_each(identity_providers.applications) WHERE json_each.value = ?)
		ORDER BY display_name, name`
	if s.dialect == Postgres {
		query = `SELECT ` + identityProviderColumns + ` FROM identity_providers WHERE applications @> jsonb_build_array(?::text)
			ORDER BY display_name, name`
	}
	out := []IdentityProvider{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(query), clientID)
	return out, mapError(err)
}

// UpdateIdentityProvider reads the provider, lets fn change it and writes
// it back in one transaction holding the row; an error from fn aborts. A
// name taken by another provider is ErrDuplicate.
func (s *Store) UpdateIdentityProvider(ctx context.Context, id string, fn func(*IdentityProvider) error) (*IdentityProvider, error) {
	var out *IdentityProvider
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		p, err := s.getIdentityProvider(ctx, tx, `id = ?`, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		if err := fn(p); err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE identity_providers SET name = ?, display_name = ?, issuer = ?, client_id = ?,
			client_secret_sealed = ?, scopes = ?, applications = ?, updated_at = ? WHERE id = ?`),
			p.Name, p.DisplayName, p.Issuer, p.ClientID, p.ClientSecretSealed, p.Scopes, p.Applications, p.UpdatedAt.UTC(), p.ID)
		out = p
		return nil, err
	})
	return out, err
}

// DeleteIdentityProvider removes a provider and its pending sign-ins. The
// identities it made stay (they name the provider and its issuer): a
// provider registered again under the same name and issuer signs the same
// people in.
func (s *Store) DeleteIdentityProvider(ctx context.Context, id string) error {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`DELETE FROM identity_providers WHERE id = ?`), id)
	if err != nil {
		return mapError(err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return mapError(err)
	} else if n == 0 {
		return ErrNotFound
	}
	return nil
}

// UpstreamIdentity is the identity a provider's issuer and subject are
// bound to; none is ErrNotFound.
func (s *Store) UpstreamIdentity(ctx context.Context, provider, issuer, subject string) (*Identity, error) {
	var id Identity
	err := s.conn(ctx).GetContext(ctx, &id, s.q(`SELECT user_id, provider, subject, issuer, created_at FROM user_identities
		WHERE provider = ? AND issuer = ? AND subject = ?`), provider, issuer, subject)
	if err != nil {
		return nil, mapError(err)
	}
	return &id, nil
}

// AddIdentity records an identity of a person (with its issuer, for an
// upstream one); the same identity again is ErrDuplicate, and so is an
// upstream issuer and subject another person holds.
func (s *Store) AddIdentity(ctx context.Context, id Identity) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO user_identities (user_id, provider, subject, issuer, created_at)
		VALUES (?, ?, ?, ?, ?)`), id.UserID, id.Provider, id.Subject, id.Issuer, id.CreatedAt.UTC())
	return mapError(err)
}

// UpstreamState is a sign-in sent to an upstream provider, waiting for its
// callback. Only keyed hashes of the state and nonce are kept, and the
// PKCE verifier sealed. It continues a hosted flow (FlowID) or the
// embedded API (RedirectURI, CodeChallenge), in the browser whose binding
// hash it holds.
type UpstreamState struct {
	ID             string     `db:"id"`
	StateHash      []byte     `db:"state_hash"`
	NonceHash      []byte     `db:"nonce_hash"`
	VerifierSealed []byte     `db:"verifier_sealed"`
	ProviderID     string     `db:"provider_id"`
	BrowserHash    []byte     `db:"browser_hash"`
	ClientID       string     `db:"client_id"`
	FlowID         *string    `db:"flow_id"`
	RedirectURI    string     `db:"redirect_uri"`
	CodeChallenge  string     `db:"code_challenge"`
	CreatedAt      time.Time  `db:"created_at"`
	ExpiresAt      time.Time  `db:"expires_at"`
	UsedAt         *time.Time `db:"used_at"`
}

const upstreamStateColumns = `id, state_hash, nonce_hash, verifier_sealed, provider_id, browser_hash, client_id, flow_id,
	redirect_uri, code_challenge, created_at, expires_at, used_at`

// CreateUpstreamState stores a pending upstream sign-in.
func (s *Store) CreateUpstreamState(ctx context.Context, st *UpstreamState) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO upstream_states (`+upstreamStateColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		st.ID, st.StateHash, st.NonceHash, st.VerifierSealed, st.ProviderID, st.BrowserHash, st.ClientID, st.FlowID,
		st.RedirectURI, st.CodeChallenge, st.CreatedAt.UTC(), st.ExpiresAt.UTC(), utcPtr(st.UsedAt))
	return mapError(err)
}

// TakeUpstreamState spends the pending sign-in whose state hashes to hash,
// if it is unused and alive at now, and answers it: of two callbacks with
// one state, one gets it. Unknown, used or expired is ErrNotFound.
func (s *Store) TakeUpstreamState(ctx context.Context, hash []byte, now time.Time) (*UpstreamState, error) {
	var out *UpstreamState
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE upstream_states SET used_at = ? WHERE state_hash = ? AND used_at IS NULL AND expires_at > ?`),
			now.UTC(), hash, now.UTC())
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return nil, err
		} else if n == 0 {
			return nil, ErrNotFound
		}
		var st UpstreamState
		if err := tx.GetContext(ctx, &st, s.q(`SELECT `+upstreamStateColumns+` FROM upstream_states WHERE state_hash = ?`), hash); err != nil {
			return nil, err
		}
		out = &st
		return nil, nil
	})
	return out, err
}

// UpstreamLink is an upstream identity whose verified e-mail is an
// existing account's (UserID), recorded so that the linking step, once it
// has proved the account is the person's, can bind exactly this identity:
// Provider (the name), ProviderID, Issuer and Subject, the upstream's
// Email and EmailVerified, and the application (ClientID) signed in
// through. Only the handle's keyed hash is kept; it is used once
// (UseUpstreamLink), within its lifetime.
type UpstreamLink struct {
	ID            string     `db:"id"`
	HandleHash    []byte     `db:"handle_hash"`
	UserID        string     `db:"user_id"`
	Provider      string     `db:"provider"`
	ProviderID    string     `db:"provider_id"`
	Issuer        string     `db:"issuer"`
	Subject       string     `db:"subject"`
	Email         string     `db:"email"`
	EmailVerified bool       `db:"email_verified"`
	ClientID      string     `db:"client_id"`
	CreatedAt     time.Time  `db:"created_at"`
	ExpiresAt     time.Time  `db:"expires_at"`
	UsedAt        *time.Time `db:"used_at"`
}

const upstreamLinkColumns = `id, handle_hash, user_id, provider, provider_id, issuer, subject, email, email_verified, client_id,
	created_at, expires_at, used_at`

// CreateUpstreamLink stores a pending link with its events.
func (s *Store) CreateUpstreamLink(ctx context.Context, l *UpstreamLink, events ...AuthEvent) error {
	return s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO upstream_links (`+upstreamLinkColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			l.ID, l.HandleHash, l.UserID, l.Provider, l.ProviderID, l.Issuer, l.Subject, l.Email, l.EmailVerified, l.ClientID,
			l.CreatedAt.UTC(), l.ExpiresAt.UTC(), utcPtr(l.UsedAt)); err != nil {
			return nil, err
		}
		return nil, s.insertAuthEvents(ctx, tx, events)
	})
}

// UpstreamLinkByHash reads a pending link by its handle's hash, used or
// not (the caller checks UsedAt and ExpiresAt); unknown is ErrNotFound.
func (s *Store) UpstreamLinkByHash(ctx context.Context, hash []byte) (*UpstreamLink, error) {
	var l UpstreamLink
	if err := s.conn(ctx).GetContext(ctx, &l, s.q(`SELECT `+upstreamLinkColumns+` FROM upstream_links WHERE handle_hash = ?`), hash); err != nil {
		return nil, mapError(err)
	}
	return &l, nil
}

// UseUpstreamLink spends a pending link if it is unused and alive at now;
// false when another request spent it first or it expired. Run it in the
// unit of work that binds the identity, so both happen or neither.
func (s *Store) UseUpstreamLink(ctx context.Context, id string, now time.Time) (bool, error) {
	res, err := s.conn(ctx).ExecContext(ctx, s.q(`UPDATE upstream_links SET used_at = ? WHERE id = ? AND used_at IS NULL AND expires_at > ?`),
		now.UTC(), id, now.UTC())
	if err != nil {
		return false, mapError(err)
	}
	n, err := res.RowsAffected()
	return n == 1, mapError(err)
}

// DeleteExpiredUpstream removes pending upstream sign-ins and links that
// expired before now.
func (s *Store) DeleteExpiredUpstream(ctx context.Context, now time.Time) (int64, error) {
	return s.deleteExpired(ctx, now, "upstream_states", "upstream_links")
}
