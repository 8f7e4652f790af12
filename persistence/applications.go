package persistence

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/ory/fosite"
)

// ApplicationClientPrefix begins every application's client id; GetClient
// reads applications by it.
const ApplicationClientPrefix = "app_"

// KindApplication is the client kind of an application.
const KindApplication = "application"

// Application types.
const (
	AppConfidential = "confidential"
	AppPublic       = "public"
)

// Application is an OpenID Connect client that people sign in through.
// SecretHash is the keyed hash of its secret (nil for a public application).
// Lifetimes are whole seconds; nil takes the server's default.
type Application struct {
	ID                     string     `db:"id"`
	ClientID               string     `db:"client_id"`
	SecretHash             []byte     `db:"secret_hash"`
	Name                   string     `db:"name"`
	Type                   string     `db:"type"`
	RedirectURIs           StringList `db:"redirect_uris"`
	PostLogoutRedirectURIs StringList `db:"post_logout_redirect_uris"`
	WebOrigins             StringList `db:"web_origins"`
	RPID                   string     `db:"rp_id"`
	SignInMethods          StringList `db:"sign_in_methods"`
	MFA                    JSONObject `db:"mfa"`
	AccessTokenFormat      string     `db:"access_token_format"`
	IDTokenSigningAlg      string     `db:"id_token_signing_alg"`
	AccessTokenTTL         *int       `db:"access_token_ttl"`
	RefreshTokenTTL        *int       `db:"refresh_token_ttl"`
	AdminConsole           bool       `db:"admin_console"`
	AllowSignUp            bool       `db:"allow_sign_up"`
	PasswordResetURI       string     `db:"password_reset_uri"`
	CreatedAt              time.Time  `db:"created_at"`
	UpdatedAt              time.Time  `db:"updated_at"`
	RotatedAt              *time.Time `db:"rotated_at"`
}

const applicationColumns = `id, client_id, secret_hash, name, type, redirect_uris, post_logout_redirect_uris, web_origins,
	rp_id, sign_in_methods, mfa, access_token_format, id_token_signing_alg, access_token_ttl, refresh_token_ttl,
	admin_console, allow_sign_up, password_reset_uri, created_at, updated_at, rotated_at`

// AppFacts are what the authorization, token and sign-in paths need to know
// of an application behind a client.
type AppFacts struct {
	Name                   string
	PostLogoutRedirectURIs []string
	WebOrigins             []string
	RPID                   string
	SignInMethods          []string
	MFA                    map[string]any
	AccessTokenFormat      string        // "opaque" or "jwt"
	IDTokenSigningAlg      string        // "RS256" or "ES256"
	AccessTokenTTL         time.Duration // 0: the server's default
	RefreshTokenTTL        time.Duration // 0: the server's default
	AdminConsole           bool
	AllowSignUp            bool   // passwordless sign-in of an unknown e-mail creates the person
	PasswordResetURI       string // the application's own reset page ("": identityd's)
}

// CreateApplication inserts a new application; a taken client id is ErrConflict.
func (s *Store) CreateApplication(ctx context.Context, a *Application) error {
	_, err := s.conn(ctx).ExecContext(ctx, s.q(`INSERT INTO applications (`+applicationColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		a.ID, a.ClientID, a.SecretHash, a.Name, a.Type, a.RedirectURIs, a.PostLogoutRedirectURIs, a.WebOrigins,
		a.RPID, a.SignInMethods, a.MFA, a.AccessTokenFormat, a.IDTokenSigningAlg, a.AccessTokenTTL, a.RefreshTokenTTL,
		a.AdminConsole, a.AllowSignUp, a.PasswordResetURI, a.CreatedAt.UTC(), a.UpdatedAt.UTC(), utcPtr(a.RotatedAt))
	return mapError(err)
}

func (s *Store) applicationClient(ctx context.Context, id string) (*Client, error) {
	var a Application
	if err := s.stmt(ctx, s.appStmt).GetContext(ctx, &a, id); err != nil {
		return nil, mapError(err)
	}
	return a.client(), nil
}

// client is the application as fosite sees it: the authorization code and
// refresh grants, the code response type, its redirect URIs; and the
// scopes a person can grant it.
func (a *Application) client() *Client {
	seconds := func(n *int) time.Duration {
		if n == nil {
			return 0
		}
		return time.Duration(*n) * time.Second
	}
	return &Client{
		ID: a.ClientID, SecretHash: a.SecretHash, Scopes: ApplicationScopes, Kind: KindApplication,
		RecordID: a.ID, PrincipalID: a.ID,
		GrantTypes: []string{GrantAuthorizationCode, GrantRefreshToken}, ResponseTypes: []string{"code"},
		RedirectURIs: a.RedirectURIs, Public: a.Type == AppPublic,
		App: &AppFacts{
			Name: a.Name, PostLogoutRedirectURIs: a.PostLogoutRedirectURIs, WebOrigins: a.WebOrigins, RPID: a.RPID,
			SignInMethods: a.SignInMethods, MFA: a.MFA, AccessTokenFormat: a.AccessTokenFormat,
			IDTokenSigningAlg: a.IDTokenSigningAlg, AccessTokenTTL: seconds(a.AccessTokenTTL),
			RefreshTokenTTL: seconds(a.RefreshTokenTTL), AdminConsole: a.AdminConsole, AllowSignUp: a.AllowSignUp,
			PasswordResetURI: a.PasswordResetURI,
		},
	}
}

// ApplicationScopes are the scopes a person may grant an application
// (OpenID Connect Core §5.4 and §11, and the directory's roles).
var ApplicationScopes = []string{"openid", "profile", "email", "offline_access", "roles"}

// GetApplication reads one application by id.
func (s *Store) GetApplication(ctx context.Context, id string) (*Application, error) {
	return s.getApplication(ctx, s.conn(ctx), `id = ?`, id, "")
}

// GetApplicationByClientID reads one application by its client id.
func (s *Store) GetApplicationByClientID(ctx context.Context, clientID string) (*Application, error) {
	return s.getApplication(ctx, s.conn(ctx), `client_id = ?`, clientID, "")
}

func (s *Store) getApplication(ctx context.Context, q querier, where, arg, suffix string) (*Application, error) {
	var a Application
	if err := q.GetContext(ctx, &a, s.q(`SELECT `+applicationColumns+` FROM applications WHERE `+where+suffix), arg); err != nil {
		return nil, mapError(err)
	}
	return &a, nil
}

// ListApplications returns one page, oldest first, and the total count.
func (s *Store) ListApplications(ctx context.Context, p Page) ([]Application, int, error) {
	if err := p.valid(); err != nil {
		return nil, 0, err
	}
	var total int
	if err := s.conn(ctx).GetContext(ctx, &total, `SELECT COUNT(*) FROM applications`); err != nil {
		return nil, 0, mapError(err)
	}
	out := []Application{}
	err := s.conn(ctx).SelectContext(ctx, &out, s.q(`SELECT `+applicationColumns+` FROM applications
		ORDER BY created_at, id LIMIT ? OFFSET ?`), p.Limit, p.Offset)
	return out, total, mapError(err)
}

// UpdateApplication reads the application, lets fn change it and writes it
// back, all in one transaction holding the row; an error from fn aborts.
// Every field but id, client id, type and createdAt is written. The cached
// client is evicted after the commit (and on every replica, see cache.go),
// so a rotated secret or a removed redirect URI stops working at once.
func (s *Store) UpdateApplication(ctx context.Context, id string, fn func(*Application) error) (*Application, error) {
	var out *Application
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		a, err := s.getApplication(ctx, tx, `id = ?`, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		if err := fn(a); err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, s.q(`UPDATE applications SET secret_hash = ?, name = ?, redirect_uris = ?,
			post_logout_redirect_uris = ?, web_origins = ?, rp_id = ?, sign_in_methods = ?, mfa = ?, access_token_format = ?,
			id_token_signing_alg = ?, access_token_ttl = ?, refresh_token_ttl = ?, admin_console = ?, allow_sign_up = ?, password_reset_uri = ?,
			updated_at = ?, rotated_at = ? WHERE id = ?`),
			a.SecretHash, a.Name, a.RedirectURIs, a.PostLogoutRedirectURIs, a.WebOrigins, a.RPID, a.SignInMethods, a.MFA,
			a.AccessTokenFormat, a.IDTokenSigningAlg, a.AccessTokenTTL, a.RefreshTokenTTL, a.AdminConsole, a.AllowSignUp, a.PasswordResetURI, a.UpdatedAt.UTC(),
			utcPtr(a.RotatedAt), a.ID)
		out = a
		return []string{evictClient + a.ClientID}, err
	})
	return out, err
}

// DeleteApplication removes the application. Its tokens stop working with
// it: a token is valid only while its client exists as the same principal
// (GetAccessTokenSession), and the sweeper removes the rows when they expire.
func (s *Store) DeleteApplication(ctx context.Context, id string) (*Application, error) {
	var out *Application
	err := s.inTx(ctx, func(tx *sqlx.Tx) ([]string, error) {
		a, err := s.getApplication(ctx, tx, `id = ?`, id, s.forUpdate())
		if err != nil {
			return nil, err
		}
		keys, err := s.apiKeysGo(ctx, tx, "application_id", a.ID)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM applications WHERE id = ?`), a.ID); err != nil {
			return nil, err
		}
		out = a
		return append([]string{evictClient + a.ClientID}, keys...), nil
	})
	return out, err
}

// MaxAccessTokenTTL bounds an application's access-token lifetime: signing
// keys stay published that long after they retire (JWT access tokens).
const MaxAccessTokenTTL = 24 * time.Hour

var (
	_ fosite.ClientWithCustomTokenLifespans = (*Client)(nil)
	_ fosite.ResponseModeClient             = (*Client)(nil)
)

// GetEffectiveLifespan implements fosite.ClientWithCustomTokenLifespans: an
// application's access and refresh tokens live as long as it says (0: the
// server's default); every other lifetime is the server's.
func (c *Client) GetEffectiveLifespan(_ fosite.GrantType, tt fosite.TokenType, fallback time.Duration) time.Duration {
	if c.App == nil {
		return fallback
	}
	switch {
	case tt == fosite.AccessToken && c.App.AccessTokenTTL > 0:
		return min(c.App.AccessTokenTTL, MaxAccessTokenTTL)
	case tt == fosite.RefreshToken && c.App.RefreshTokenTTL > 0:
		return c.App.RefreshTokenTTL
	}
	return fallback
}

// GetResponseModes implements fosite.ResponseModeClient: applications may
// ask for query (the default of the code flow) or form_post (OAuth 2.0 Form
// Post Response Mode); other clients use no authorization endpoint.
func (c *Client) GetResponseModes() []fosite.ResponseModeType {
	if c.App == nil {
		return nil
	}
	return []fosite.ResponseModeType{fosite.ResponseModeDefault, fosite.ResponseModeQuery, fosite.ResponseModeFormPost}
}

// LongestJWTAccessTTL is the longest access-token lifetime an application
// issuing JWT access tokens names (0 when none does): how long signing keys
// must stay published after they retire.
func (s *Store) LongestJWTAccessTTL(ctx context.Context) (time.Duration, error) {
	var longest *int
	if err := s.conn(ctx).GetContext(ctx, &longest, s.q(`SELECT MAX(access_token_ttl) FROM applications WHERE access_token_format = ?`), "jwt"); err != nil {
		return 0, mapError(err)
	}
	if longest == nil {
		return 0, nil
	}
	return min(time.Duration(*longest)*time.Second, MaxAccessTokenTTL), nil
}
