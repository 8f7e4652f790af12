package signin

import (
	"context"
	"crypto/hmac"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
)

// Account linking (spec, Account linking): a person adds a sign-in method
// to their account by proving it is theirs, with its password or, without
// one, a code e-mailed to it. Every method of an account then signs in the
// same person (one sub).

// LinkingTTL is a linking token's lifetime (spec: 10 minutes, single use).
const LinkingTTL = 10 * time.Minute

// MaxLinkAttempts bounds the wrong passwords or codes a linking token
// takes; then it dies.
const MaxLinkAttempts = 5

// Purposes of the linking keys (see oauth.DeriveKey).
const (
	PurposeLinkingToken = "linking token"
	PurposeLinkingCode  = "linking code"
)

// Refusals of linking.
var (
	ErrLinkExpired       = extensions.NewError(http.StatusBadRequest, "expired_token", "The linking token has expired, was used, or took too many wrong tries. Start again.", nil)
	ErrAlreadyLinked     = extensions.NewError(http.StatusConflict, "already_linked", "This sign-in method is already linked to the account.", nil)
	ErrNotLinked         = extensions.NewError(http.StatusNotFound, "not_found", "This sign-in method is not linked to the account.", nil)
	ErrLastMethod        = extensions.NewError(http.StatusConflict, "last_method", "This is the account's last way to sign in; link another before removing it.", nil)
	ErrIdentityTaken     = extensions.NewError(http.StatusConflict, "identity_taken", "This identity already signs in another account.", nil)
	errLinkPassword      = extensions.NewError(http.StatusBadRequest, "invalid_request", "A password is added through password reset, not linked.", nil)
	errLinkUpstream      = extensions.NewError(http.StatusBadRequest, "invalid_request", "An upstream provider is linked from a sign-in through it, with the pendingLink that sign-in answered, for the same account and application, within 10 minutes.", nil)
	errLinkProof         = extensions.NewError(http.StatusBadRequest, "invalid_request", "verification holds the password or the code the token asks for.", nil)
	errLinkWrongCode     = extensions.NewError(http.StatusBadRequest, "invalid_code", "The code is not right. Check the latest e-mail and try again.", nil)
	errLinkTooManyWrong  = extensions.NewError(http.StatusBadRequest, "expired_token", "Too many wrong tries: the linking token is spent. Start again.", nil)
	errLinkWrongPassword = extensions.NewError(http.StatusUnauthorized, "invalid_credentials", "The password is not right.", nil)
)

// LinkStart is what starting a link answers: the token (only its hash is
// kept), the proof it needs (persistence.VerifyPassword or VerifyEmailCode,
// whose code is e-mailed at once) and the account's identities.
type LinkStart struct {
	Token        string
	Verification string
	Existing     []string
}

// Linked is a finished link.
type Linked struct {
	UserID   string
	Provider string
}

// linkable are the methods a link adds by identity name, with the
// application method that must be offered.
var linkable = map[string]string{persistence.IdentityOTP: MethodOTP, persistence.IdentityMagicLink: MethodMagicLink}

// InitiateLink starts linking provider to email's account in app. An
// unknown address is ErrUserNotFound: whether an address has an account is
// what check-email already answers (spec), under the same limits; the
// identities it answers are the ones the spec's 409 account_exists names.
// An upstream provider is linked from a sign-in through it: pending is
// the upstream identity that sign-in left waiting for this account (nil
// for otp and magic_link).
func (s *Service) InitiateLink(ctx context.Context, app *persistence.Client, email, provider string, pending *persistence.UpstreamLink, c Client) (*LinkStart, error) {
	email, err := checkedEmail(email)
	if err != nil {
		return nil, err
	}
	now := s.now()
	switch method, ok := linkable[provider]; {
	case provider == persistence.IdentityPassword:
		return nil, errLinkPassword
	case ok && !slices.Contains(Methods(app.App), method):
		return nil, ErrMethodNotAllowed
	case ok && pending != nil:
		return nil, errLinkUpstream
	case !ok && (pending == nil || pending.Provider != provider || pending.ClientID != app.ID || pending.UsedAt != nil || !now.Before(pending.ExpiresAt)):
		return nil, errLinkUpstream
	}
	user, err := s.store.GetUserByEmail(ctx, email)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		return nil, ErrUserNotFound
	case err != nil:
		return nil, err
	case user.Status == directory.StatusDisabled:
		return nil, ErrDisabled
	case pending != nil && pending.UserID != user.ID:
		return nil, errLinkUpstream // the sign-in found another account
	}
	ids, err := s.identityNames(ctx, user.ID)
	if err != nil {
		return nil, err
	}
	if slices.Contains(ids, provider) {
		return nil, ErrAlreadyLinked
	}
	token := newLinkToken()
	t := &persistence.LinkingToken{
		ID: uuid.NewString(), TokenHash: s.linkingHash(token), UserID: user.ID, ClientID: app.ID, Provider: provider,
		Verification: persistence.VerifyPassword, CreatedAt: now, ExpiresAt: now.Add(LinkingTTL),
	}
	if pending != nil {
		t.UpstreamLinkID, t.Issuer, t.Subject = &pending.ID, pending.Issuer, pending.Subject
	}
	var record *persistence.Mail
	if user.PasswordHash == nil {
		code := newOTP()
		t.Verification, t.CodeHash = persistence.VerifyEmailCode, s.linkCodeHash(t.ID, code)
		if record, err = s.record(s.message("linkcode", user.Email, app.App.Name, map[string]any{"Code": code, "Provider": provider})); err != nil {
			return nil, err
		}
	}
	if err := s.store.CreateLinkingToken(ctx, t, record,
		s.event(persistence.EventLinkStarted, &user.ID, app.RecordID, app.ID, nil, "", c, map[string]any{"provider": provider, "verification": t.Verification})); err != nil {
		return nil, err
	}
	if record != nil {
		s.store.AfterCommit(ctx, s.outbox.Kick)
	}
	if ids == nil {
		ids = []string{}
	}
	return &LinkStart{Token: token, Verification: t.Verification, Existing: ids}, nil
}

// VerifyLink finishes a link with its proof: the account's password or the
// e-mailed code, as the token asks. A wrong one counts against the token
// (MaxLinkAttempts). The identity is recorded, the token spent and, by
// default, the account told by e-mail, in one transaction.
func (s *Service) VerifyLink(ctx context.Context, token, password, code string, c Client) (*Linked, error) {
	if token == "" || len(token) > maxCodeLength {
		return nil, ErrLinkExpired
	}
	t, err := s.store.LinkingTokenByHash(ctx, s.linkingHash(token))
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		return nil, ErrLinkExpired
	case err != nil:
		return nil, err
	case t.UsedAt != nil || !s.now().Before(t.ExpiresAt) || t.Attempts >= MaxLinkAttempts:
		return nil, ErrLinkExpired
	}
	user, err := s.store.GetUser(ctx, t.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrLinkExpired
	}
	if err != nil {
		return nil, err
	}
	app, err := s.application(ctx, t.ClientID)
	if err != nil {
		return nil, err
	}
	var right bool
	var refusal error
	switch t.Verification {
	case persistence.VerifyPassword:
		if password == "" || code != "" {
			return nil, errLinkProof
		}
		hash := s.dummy
		if user.PasswordHash != nil {
			hash = *user.PasswordHash
		}
		ok, verr := directory.VerifyPassword(hash, password)
		right, refusal = ok && verr == nil && user.PasswordHash != nil, errLinkWrongPassword
	default:
		if code == "" || password != "" {
			return nil, errLinkProof
		}
		code = strings.TrimSpace(code)
		right, refusal = len(code) == otpDigits && hmac.Equal(s.linkCodeHash(t.ID, code), t.CodeHash), errLinkWrongCode
	}
	if !right {
		n, err := s.store.FailLinkingToken(ctx, t.ID,
			s.event(persistence.EventLinkFailed, &user.ID, app.RecordID, app.ID, nil, "wrong_"+t.Verification, c, map[string]any{"provider": t.Provider}))
		if err != nil {
			return nil, err
		}
		if n >= MaxLinkAttempts {
			return nil, errLinkTooManyWrong
		}
		return nil, refusal
	}
	now := s.now()
	// The notice is always sent: a credential added unseen is what the
	// notice exists to prevent (docs/decisions.md, issue 39).
	notice, err := s.record(s.message("linked", user.Email, app.App.Name, map[string]any{"Provider": t.Provider}))
	if err != nil {
		return nil, err
	}
	err = s.store.CompleteLink(ctx, t, MaxLinkAttempts, now, persistence.Identity{UserID: user.ID, Provider: t.Provider, Issuer: t.Issuer, Subject: t.Subject, CreatedAt: now}, notice,
		s.event(persistence.EventIdentityLinked, &user.ID, app.RecordID, app.ID, nil, "", c, map[string]any{"provider": t.Provider}))
	switch {
	case errors.Is(err, persistence.ErrChallengeUsed):
		return nil, ErrLinkExpired
	case errors.Is(err, persistence.ErrDuplicate):
		return nil, ErrIdentityTaken
	case err != nil:
		return nil, err
	}
	s.outbox.Kick()
	return &Linked{UserID: user.ID, Provider: t.Provider}, nil
}

// Identities lists the providers a person signs in with.
func (s *Service) Identities(ctx context.Context, userID string) ([]string, error) {
	ids, err := s.identityNames(ctx, userID)
	if ids == nil {
		ids = []string{}
	}
	return ids, err
}

// Unlink removes a sign-in method from a person's account (the password's
// removes the password), unless it is the last (ErrLastMethod); it answers
// the methods that remain. The event and the notice to the person
// (mail.IdentityUnlinked) are written with the change. app is the
// application the person's token is for.
func (s *Service) Unlink(ctx context.Context, app *persistence.Client, userID, provider string, c Client) ([]string, error) {
	var remaining []string
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		var err error
		remaining, err = s.store.Unlink(ctx, userID, provider, s.now(),
			s.event(persistence.EventIdentityUnlinked, &userID, app.RecordID, app.ID, nil, "", c, map[string]any{"provider": provider}))
		if err != nil {
			return err
		}
		user, err := s.store.GetUser(ctx, userID)
		if err != nil {
			return err
		}
		return s.outbox.Notify(ctx, s.store, user.Email, mail.Notice{Change: mail.IdentityUnlinked, AppName: app.App.Name, Detail: provider, At: s.now(), IP: c.IP})
	})
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		return nil, ErrNotLinked
	case errors.Is(err, persistence.ErrLastIdentity):
		return nil, ErrLastMethod
	}
	return remaining, err
}

// application is the application of a client id.
func (s *Service) application(ctx context.Context, clientID string) (*persistence.Client, error) {
	c, err := s.store.GetClient(ctx, clientID)
	if err != nil {
		return nil, err
	}
	app, ok := c.(*persistence.Client)
	if !ok || app.App == nil {
		return nil, persistence.ErrNotFound
	}
	return app, nil
}

func (s *Service) linkingHash(token string) []byte {
	h, _ := s.linking.Hash(context.Background(), []byte(token))
	return h
}

// linkCodeHash binds a code to its token, as otpHash does.
func (s *Service) linkCodeHash(id, code string) []byte {
	h, _ := s.linkCodes.Hash(context.Background(), []byte(id+":"+code))
	return h
}
