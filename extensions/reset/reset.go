// Package reset holds the rules of password reset by e-mailed token (spec:
// Password reset): a forgot-password request that answers the same, and
// does the same work, whether or not the address has an account; a token
// of 256 random bits kept only as a keyed hash, living an hour, used once,
// taking at most three failed attempts; the new password's rules; and the
// reset itself, which changes the password, ends every session of the
// person and revokes their tokens in one unit of work. No HTTP here.
package reset

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"net/http"
	"net/url"
	"strings"
	texttemplate "text/template"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is what password reset needs from storage.
type Store interface {
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	UpdateUser(ctx context.Context, id string, fn func(*persistence.User) ([]persistence.DirectoryEvent, error)) (*persistence.User, error)
	CreatePasswordReset(ctx context.Context, r *persistence.PasswordReset, mail *persistence.Mail, events ...persistence.AuthEvent) error
	RecordResetRequest(ctx context.Context, events ...persistence.AuthEvent) error
	PasswordResetByHash(ctx context.Context, hash []byte) (*persistence.PasswordReset, error)
	FailPasswordReset(ctx context.Context, id string, events ...persistence.AuthEvent) (int, error)
	SpendPasswordReset(ctx context.Context, id string, maxAttempts int, at time.Time) error
	EndUserSSOSessions(ctx context.Context, userID string, ended persistence.AuthEvent) (int, error)
	RevokeUserTokens(ctx context.Context, userID string) (int, error)
	AppendAuthEvents(ctx context.Context, events ...persistence.AuthEvent) error
	QueueMail(ctx context.Context, m *persistence.Mail) error
	AfterCommit(ctx context.Context, fn func())
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
	GetClient(ctx context.Context, id string) (fosite.Client, error)
}

// The spec's numbers.
const (
	TTL         = time.Hour // a token's lifetime
	MaxAttempts = 3         // failed resets a token takes; then it is dead
)

// PagePath is identityd's hosted reset page, where the e-mailed link leads
// unless the application registered its own (passwordResetUri).
const PagePath = "/signin/reset-password"

// PurposeResetToken is the HKDF label of the key reset tokens are hashed
// under.
const PurposeResetToken = "password reset token"

// maxToken bounds what is read of a submitted token (a real one has 43
// characters).
const maxToken = 128

// The spec's codes (Errors, specific case 8), and the message each shows.
var (
	ErrInvalidToken    = extensions.NewError(http.StatusBadRequest, "invalid_token", "This reset link is not valid. Ask for a new one.", nil)
	ErrTokenExpired    = extensions.NewError(http.StatusBadRequest, "token_expired", "This reset link has expired. Ask for a new one.", nil)
	ErrTokenUsed       = extensions.NewError(http.StatusBadRequest, "token_used", "This reset link was already used. Ask for a new one if you need to.", nil)
	ErrTooManyAttempts = extensions.NewError(http.StatusBadRequest, "too_many_attempts", "This reset link took too many attempts and no longer works. Ask for a new one.", nil)
)

// Neutral is the one answer of every forgot-password request.
const Neutral = "If an account uses this e-mail address, we have sent it a link to reset the password. The link works for one hour."

// ResponseFloor is how long a forgot-password request takes at least,
// from its start to its answer, whether or not the address has an account:
// the work is the same on both paths but for the rows an account's request
// writes (its token and e-mail) and the outbox's delivery it wakes; held to
// this floor, what remains cannot be measured. It is well above the work
// (about a millisecond) and costs no processor time.
const ResponseFloor = 200 * time.Millisecond

// Config is what the service needs beside its store.
type Config struct {
	Outbox  *mail.Outbox // sends the links
	Issuer  string       // the base of the hosted page's link
	Captcha *Captcha     // nil: no captcha is asked
}

// Service applies the rules.
type Service struct {
	store   Store
	outbox  *mail.Outbox
	issuer  string
	captcha *Captcha
	tokens  *oauth.SecretHasher
	now     func() time.Time
	floor   time.Duration // ResponseFloor
}

// New makes the service; reset tokens are hashed under a key derived from
// the system secret for them alone.
func New(store Store, systemSecret []byte, cfg Config) *Service {
	return &Service{
		store: store, outbox: cfg.Outbox, issuer: strings.TrimSuffix(cfg.Issuer, "/"), captcha: cfg.Captcha,
		tokens: oauth.NewHasher(systemSecret, PurposeResetToken), now: extensions.Now, floor: ResponseFloor,
	}
}

// SetCaptcha turns the captcha on (nil: off); for tests, before requests.
func (s *Service) SetCaptcha(c *Captcha) { s.captcha = c }

// SetFloor changes ResponseFloor; for tests that send many requests and
// do not measure them (fuzzing), before requests.
func (s *Service) SetFloor(d time.Duration) { s.floor = d }

// CaptchaRequired tells whether requests must carry a captcha token.
func (s *Service) CaptchaRequired() bool { return s.captcha != nil }

// CaptchaWidget is the widget the hosted forgot page shows (nil: none).
func (s *Service) CaptchaWidget() *Widget {
	if s.captcha == nil {
		return nil
	}
	return s.captcha.Widget
}

// Client is what a request tells of who sent it, for events and captcha.
type Client struct {
	IP        string
	UserAgent string
}

// Request handles a forgot-password request for email in app: when the
// address belongs to a person who may sign in, it stores a new token and
// e-mails its link; otherwise it sends nothing. Both paths do the same
// work (a lookup, a token made and hashed, an e-mail rendered and sealed,
// one commit) and answer the same, no sooner than ResponseFloor after the
// start, so neither the answer nor its time tells whether the address has
// an account. Only a malformed address, an application that is none, or a
// captcha refusal is an error (none depends on the account).
func (s *Service) Request(ctx context.Context, app *persistence.Client, email, captchaToken string, c Client) error {
	start := time.Now()
	if app == nil || app.App == nil {
		return extensions.NewError(http.StatusBadRequest, "invalid_request", "clientId is not an application.", map[string]any{"field": "clientId"})
	}
	email = strings.TrimSpace(email)
	var v extensions.ValidationError
	directory.CheckEmail(&v, "email", email)
	if err := v.Err(); err != nil {
		return err
	}
	if s.captcha != nil {
		if err := s.captcha.Verify(ctx, captchaToken, c.IP); err != nil {
			return err
		}
	}
	defer s.hold(ctx, start)
	user, err := s.store.GetUserByEmail(ctx, email)
	reason := ""
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		user, reason = nil, "unknown_email"
	case err != nil:
		return err
	case user.Status == directory.StatusDisabled:
		reason = "user_disabled"
	}
	now := s.now()
	token := newToken()
	r := &persistence.PasswordReset{
		ID: uuid.NewString(), TokenHash: s.hash(token), Email: email, ClientID: app.ID,
		CreatedAt: now, ExpiresAt: now.Add(TTL),
	}
	if app.RecordID != "" {
		r.ApplicationID = &app.RecordID
	}
	msg := s.message(email, app.App.Name, s.link(app, token))
	if msg.To == "" {
		return errors.New("rendering the reset e-mail failed")
	}
	record, err := s.outbox.Record(msg) // sealed for both: the same work
	if err != nil {
		return err
	}
	event := s.event(persistence.EventResetRequested, nil, app.RecordID, app.ID, reason, c, map[string]any{"email": email})
	if reason != "" {
		return s.store.RecordResetRequest(ctx, event)
	}
	r.UserID, event.UserID = user.ID, &user.ID
	if err := s.store.CreatePasswordReset(ctx, r, record, event); err != nil {
		return err
	}
	s.store.AfterCommit(ctx, s.outbox.Kick)
	return nil
}

// hold waits until the floor has passed since start (or ctx ends).
func (s *Service) hold(ctx context.Context, start time.Time) {
	wait := time.Until(start.Add(s.floor))
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// link is where the e-mail leads: the application's own reset page when it
// registered one, else identityd's hosted page; the token in the query.
func (s *Service) link(app *persistence.Client, token string) string {
	target := s.issuer + PagePath
	if app.App.PasswordResetURI != "" {
		target = app.App.PasswordResetURI
	}
	u, err := url.Parse(target)
	if err != nil {
		return s.issuer + PagePath + "?token=" + token
	}
	q := u.Query()
	q.Set("token", token)
	u.RawQuery = q.Encode()
	return u.String()
}

// Status is what a live token tells: the masked address and the seconds
// left.
type Status struct {
	Email     string
	ExpiresIn int
	ClientID  string // the application the reset was asked for
	reset     *persistence.PasswordReset
	user      *persistence.User
}

// Verify reads a token without spending it or counting an attempt: a live
// one answers its status, else the spec's refusal.
func (s *Service) Verify(ctx context.Context, token string) (*Status, error) {
	st, err := s.live(ctx, token)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// live finds the token and checks it can be used: known, unused, below
// MaxAttempts failures, alive, and its person still at the address it was
// sent to.
func (s *Service) live(ctx context.Context, token string) (*Status, error) {
	token = strings.TrimSpace(token)
	if token == "" || len(token) > maxToken {
		return nil, ErrInvalidToken
	}
	r, err := s.store.PasswordResetByHash(ctx, s.hash(token))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrInvalidToken
	}
	if err != nil {
		return nil, err
	}
	if err := s.state(r); err != nil {
		return nil, err
	}
	user, err := s.store.GetUser(ctx, r.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrInvalidToken
	}
	if err != nil {
		return nil, err
	}
	if !strings.EqualFold(user.Email, r.Email) || user.Status == directory.StatusDisabled {
		return nil, ErrInvalidToken // the address changed, or the person may no longer sign in
	}
	left := int(r.ExpiresAt.Sub(s.now()) / time.Second)
	return &Status{Email: MaskEmail(r.Email), ExpiresIn: max(left, 1), ClientID: r.ClientID, reset: r, user: user}, nil
}

// state is the refusal a stored token's state calls for, if any: used
// first (a used token says so whatever else), then out of attempts, then
// expired.
func (s *Service) state(r *persistence.PasswordReset) error {
	switch {
	case r.UsedAt != nil && r.Attempts >= MaxAttempts:
		return ErrTooManyAttempts
	case r.UsedAt != nil:
		return ErrTokenUsed
	case r.Attempts >= MaxAttempts:
		return ErrTooManyAttempts
	case !s.now().Before(r.ExpiresAt):
		return ErrTokenExpired
	}
	return nil
}

// Reset sets a new password through a token. A password the rules refuse
// counts as a failed attempt (the third ends the token). A good one is
// hashed (argon2id) before any lock is taken; then, in one unit of work:
// the token is spent (of two resets with one token, one wins) with every
// other token of the person, the password is stored (the password identity
// with it, for a person who had none) and the address marked verified (the
// link proved the mailbox), every SSO session of the person ends (what was
// issued under them dies with them), every refresh token family of theirs
// is revoked, the events are recorded and the person is told
// (mail.PasswordChanged). Passkeys and TOTP stay (docs/decisions.md): the
// link proves the mailbox, not the second factor, which the next sign-in
// still asks for.
func (s *Service) Reset(ctx context.Context, token, newPassword string, c Client) error {
	st, err := s.live(ctx, token)
	if err != nil {
		return err
	}
	r, user := st.reset, st.user
	if err := CheckPassword(newPassword, r.Email); err != nil {
		var refusal *extensions.Error
		if !errors.As(err, &refusal) || refusal.Code != "weak_password" {
			return err
		}
		n, ferr := s.store.FailPasswordReset(ctx, r.ID, s.resetEvent(persistence.EventResetFailed, r, "weak_password", c, nil))
		if ferr != nil {
			return ferr
		}
		if n == 0 { // used meanwhile
			return ErrTokenUsed
		}
		return refusal.With(map[string]any{"field": "newPassword", "attemptsRemaining": max(MaxAttempts-n, 0)})
	}
	hash, err := directory.HashPassword(newPassword)
	if err != nil {
		return err
	}
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		now := s.now()
		if err := s.store.SpendPasswordReset(ctx, r.ID, MaxAttempts, now); err != nil {
			return err
		}
		if _, err := s.store.UpdateUser(ctx, user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			if !strings.EqualFold(u.Email, r.Email) || u.Status == directory.StatusDisabled {
				return nil, ErrInvalidToken // changed since it was read: the unit rolls back
			}
			u.PasswordHash, u.EmailVerified, u.UpdatedAt = &hash, true, now
			return []persistence.DirectoryEvent{directory.Event(directory.UserUpdated, persistence.Actor{Subject: u.ID, ClientID: r.ClientID}, now, u.ID, "",
				map[string]any{"fields": []string{"password", "emailVerified"}, "via": "password_reset"})}, nil
		}); err != nil {
			return err
		}
		ended, err := s.store.EndUserSSOSessions(ctx, user.ID, s.event(persistence.EventSessionEnded, nil, "", "", persistence.SessionEndPasswordReset, c, nil))
		if err != nil {
			return err
		}
		revoked, err := s.store.RevokeUserTokens(ctx, user.ID)
		if err != nil {
			return err
		}
		if err := s.store.AppendAuthEvents(ctx, s.resetEvent(persistence.EventResetCompleted, r, "", c,
			map[string]any{"sessionsEnded": ended, "tokenFamiliesRevoked": revoked})); err != nil {
			return err
		}
		return s.outbox.Notify(ctx, s.store, user.Email, mail.Notice{Change: mail.PasswordChanged, AppName: s.appName(ctx, r.ClientID), At: now, IP: c.IP,
			Extra: "Every session of the account was signed out. Its passkeys and two-step verification stay as they were: a passkey still signs in, and two-step verification is still asked for."})
	})
	if errors.Is(err, persistence.ErrResetSpent) {
		return s.lost(ctx, token)
	}
	return err
}

// appName is the name of the application a reset was asked through, for
// its notice ("" when it is gone).
func (s *Service) appName(ctx context.Context, clientID string) string {
	if c, err := s.store.GetClient(ctx, clientID); err == nil {
		if app, ok := c.(*persistence.Client); ok && app.App != nil {
			return app.App.Name
		}
	}
	return ""
}

// lost is the refusal of a token another request spent (or that expired)
// between the read and the write.
func (s *Service) lost(ctx context.Context, token string) error {
	if _, err := s.live(ctx, token); err != nil {
		return err
	}
	return ErrTokenUsed
}

// event makes one auth event about the application recordID (its
// client clientID).
func (s *Service) event(typ string, userID *string, recordID, clientID, reason string, c Client, data map[string]any) persistence.AuthEvent {
	e := persistence.AuthEvent{
		ID: uuid.Must(uuid.NewV7()).String(), Type: typ, UserID: userID, ClientID: clientID, Reason: reason, IP: c.IP, UserAgent: c.UserAgent,
		Data: data, CreatedAt: s.now(),
	}
	if recordID != "" {
		e.ApplicationID = &recordID
	}
	return e
}

// resetEvent is an event about a token's person and application.
func (s *Service) resetEvent(typ string, r *persistence.PasswordReset, reason string, c Client, data map[string]any) persistence.AuthEvent {
	recordID := ""
	if r.ApplicationID != nil {
		recordID = *r.ApplicationID
	}
	return s.event(typ, &r.UserID, recordID, r.ClientID, reason, c, data)
}

// newToken is 256 random bits from crypto/rand, base64url.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails: crypto/rand crashes rather than return short
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *Service) hash(token string) []byte {
	h, _ := s.tokens.Hash(context.Background(), []byte(token))
	return h
}

// MaskEmail shows an address's first character and domain:
// ada@example.com is a***@example.com.
func MaskEmail(email string) string {
	local, domain, ok := strings.Cut(email, "@")
	if !ok || local == "" {
		return "***"
	}
	first := []rune(local)[0]
	return string(first) + "***@" + domain
}

//go:embed templates
var templates embed.FS

var (
	textTemplates = texttemplate.Must(texttemplate.ParseFS(templates, "templates/*.txt"))
	htmlTemplates = htmltemplate.Must(htmltemplate.ParseFS(templates, "templates/*.html"))
)

// message renders the reset e-mail; a zero Message if it cannot be
// rendered (the templates are the binary's own).
func (s *Service) message(to, appName, link string) mail.Message {
	data := map[string]any{"AppName": appName, "Email": to, "Link": link}
	var text, html bytes.Buffer
	if textTemplates.ExecuteTemplate(&text, "reset.txt", data) != nil || htmlTemplates.ExecuteTemplate(&html, "reset.html", data) != nil {
		return mail.Message{}
	}
	return mail.Message{To: to, Subject: fmt.Sprintf("Reset your %s password", appName), Text: text.String(), HTML: html.String()}
}
