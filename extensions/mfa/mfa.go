// Package mfa holds the rules of people's second factor: TOTP (RFC 6238)
// enrolment, confirmation and removal, recovery codes, and the one check
// every sign-in path asks (Verify), with its replay guard and
// its bound on wrong codes. No HTTP here.
package mfa

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"
	"github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/store/memory"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is what the second factor needs from storage.
type Store interface {
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetTOTP(ctx context.Context, userID string) (*persistence.TOTP, error)
	PutPendingTOTP(ctx context.Context, t *persistence.TOTP) error
	EnableTOTP(ctx context.Context, userID, enrolmentID string, step int64, at time.Time, codeHashes [][]byte, events ...persistence.AuthEvent) error
	UseTOTPStep(ctx context.Context, userID string, step int64) (bool, error)
	UseRecoveryCode(ctx context.Context, userID string, codeHash []byte, at time.Time, events func(remaining int) []persistence.AuthEvent) (bool, error)
	DeleteTOTP(ctx context.Context, userID string, events ...persistence.AuthEvent) error
	AppendAuthEvents(ctx context.Context, events ...persistence.AuthEvent) error
	QueueMail(ctx context.Context, m *persistence.Mail) error
	AfterCommit(ctx context.Context, fn func())
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// The TOTP parameters: what every authenticator app supports (the
// otpauth defaults), checked one step either side of now for clock drift.
const (
	Period = 30 * time.Second
	Digits = otp.DigitsSix
	Skew   = 1
)

// Methods that can pass Verify.
const (
	MethodTOTP         = "totp"
	MethodRecoveryCode = "recovery_code"
)

// RecoveryCodes is how many recovery codes turning TOTP on gives.
const RecoveryCodes = 10

// Default bound on wrong codes: per person, shared by every caller.
const (
	DefaultMaxTries  = 5
	DefaultTryWindow = 15 * time.Minute
)

// Purposes of the keys the second factor derives from the system secret.
const (
	PurposeTOTPSecret   = "totp secret"
	PurposeRecoveryCode = "mfa recovery code"
)

// Reason codes of mfa_verify_failed events; never the code itself.
const (
	ReasonWrongCode         = "wrong_code"
	ReasonReplayedCode      = "replayed_code"
	ReasonWrongRecoveryCode = "wrong_recovery_code"
)

// Refusals. A wrong, replayed or malformed code is one answer: which it
// was is the event log's to know, not the caller's.
var (
	ErrInvalidCode = extensions.NewError(http.StatusBadRequest, "invalid_code",
		"The code is not right. Enter the current code from your authenticator app, or an unused recovery code.", nil)
	ErrAlreadyEnabled = extensions.Conflict("mfa_already_enabled",
		"Two-factor authentication is on already. Turn it off first to enrol another authenticator.", nil)
	ErrNotEnrolled = extensions.NewError(http.StatusNotFound, "mfa_not_enrolled",
		"No authenticator is waiting to be confirmed. Enrol first.", nil)
	ErrNotEnabled = extensions.NewError(http.StatusNotFound, "mfa_not_enabled",
		"Two-factor authentication is not on for this account.", nil)
	ErrEnrolmentChanged = extensions.Conflict("mfa_enrollment_changed",
		"The enrolment changed while it was being confirmed. Enrol again.", nil)
	ErrTooManyTries = extensions.NewError(http.StatusTooManyRequests, "rate_limited",
		"Too many wrong codes. Wait and try again.", nil)
)

// Config holds what the service is built with.
type Config struct {
	// Issuer is the server's issuer URL; its host names the account in
	// authenticator apps ("identityd" when it has none).
	Issuer string
	// Tries counts wrong codes: the server's rate-limit store, so that
	// replicas sharing Redis share the count. nil: counted in this
	// process; the bound holds even when the server's rate limits are off.
	Tries limiter.Store
	// MaxTries codes per person per TryWindow, the window beginning with
	// the first; 0: DefaultMaxTries and DefaultTryWindow.
	MaxTries  int64
	TryWindow time.Duration
	// Outbox sends the notices of TOTP turned on and off; nil: none is sent.
	Outbox *mail.Outbox
}

// Service applies the rules.
type Service struct {
	store  Store
	seal   *oauth.Sealer       // TOTP secrets at rest
	codes  *oauth.SecretHasher // recovery codes at rest
	tries  *limiter.Limiter
	outbox *mail.Outbox
	issuer string
	now    func() time.Time
}

// New makes the service.
func New(store Store, systemSecret []byte, cfg Config) *Service {
	if cfg.MaxTries <= 0 {
		cfg.MaxTries = DefaultMaxTries
	}
	if cfg.TryWindow <= 0 {
		cfg.TryWindow = DefaultTryWindow
	}
	if cfg.Tries == nil {
		cfg.Tries = memory.NewStoreWithOptions(limiter.StoreOptions{Prefix: "identityd", CleanUpInterval: time.Minute})
	}
	issuer := "identityd"
	if u, err := url.Parse(cfg.Issuer); err == nil && u.Hostname() != "" {
		issuer = u.Hostname() // no port: a colon would split the otpauth label
	}
	return &Service{
		store: store, seal: oauth.NewSealer(systemSecret, PurposeTOTPSecret), codes: oauth.NewHasher(systemSecret, PurposeRecoveryCode),
		tries: limiter.New(cfg.Tries, limiter.Rate{Period: cfg.TryWindow, Limit: cfg.MaxTries}), outbox: cfg.Outbox, issuer: issuer, now: extensions.Now,
	}
}

// Origin is who asked and from where, for the event log: the client and
// application of the token or sign-in, the SSO session, the browser. Empty
// fields are left out. AppName names the application in notices.
type Origin struct {
	ClientID      string
	ApplicationID string
	AppName       string
	SessionID     string
	IP            string
	UserAgent     string
}

// Enrolment is what an authenticator app needs: the secret (base32), the
// otpauth URI holding it, and that URI as a QR code (a PNG data URI).
type Enrolment struct {
	Secret string
	URI    string
	QRCode string
}

// qrSize is the QR code's side in pixels: readable by a phone from a screen.
const qrSize = 256

// Enroll makes a new TOTP secret for a person and keeps it, sealed, until
// a code confirms it; enrolling again before that replaces it. A person
// whose TOTP is on is ErrAlreadyEnabled; an unknown one ErrNotFound.
func (s *Service) Enroll(ctx context.Context, userID string) (*Enrolment, error) {
	userID, ok := canonical(userID)
	if !ok {
		return nil, persistence.ErrNotFound
	}
	u, err := s.store.GetUser(ctx, userID)
	if err != nil {
		return nil, err
	}
	key, err := totp.Generate(totp.GenerateOpts{Issuer: s.issuer, AccountName: u.Email, Period: uint(Period / time.Second), Digits: Digits, Algorithm: otp.AlgorithmSHA1})
	if err != nil {
		return nil, err
	}
	t := &persistence.TOTP{UserID: userID, EnrolmentID: uuid.NewString(), CreatedAt: s.now()}
	t.SecretSealed = s.seal.Seal([]byte(key.Secret()), binding(t))
	err = s.store.PutPendingTOTP(ctx, t)
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, ErrAlreadyEnabled
	} else if errors.Is(err, persistence.ErrMissingReference) {
		return nil, persistence.ErrNotFound // deleted meanwhile
	} else if err != nil {
		return nil, err
	}
	img, err := key.Image(qrSize, qrSize)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return nil, err
	}
	return &Enrolment{Secret: key.Secret(), URI: key.URL(), QRCode: "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())}, nil
}

// Confirm turns TOTP on with a current code of the pending enrolment and
// answers the person's recovery codes, shown this once (stored hashed).
// It records USER_MFA_ENABLED and queues the notice to the person
// (mail.TOTPEnabled) with the change; a wrong code is
// ErrInvalidCode, and counts against the person's tries.
func (s *Service) Confirm(ctx context.Context, userID, code string, o Origin) ([]string, error) {
	userID, ok := canonical(userID)
	if !ok {
		return nil, ErrNotEnrolled
	}
	t, err := s.store.GetTOTP(ctx, userID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrNotEnrolled
	} else if err != nil {
		return nil, err
	}
	if t.EnabledAt != nil {
		return nil, ErrAlreadyEnabled
	}
	if err := s.spend(ctx, userID); err != nil {
		return nil, err
	}
	secret, err := s.secret(t)
	if err != nil {
		return nil, err
	}
	now := s.now()
	kind, normal := parseCode(code)
	step, ok := match(secret, normal, now)
	if kind != MethodTOTP || !ok {
		return nil, s.failed(ctx, userID, MethodTOTP, ReasonWrongCode, "confirm", o)
	}
	codes, hashes := s.newRecoveryCodes()
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		if err := s.store.EnableTOTP(ctx, userID, t.EnrolmentID, step, now, hashes,
			s.event(persistence.EventMFAEnabled, userID, "", o, map[string]any{"method": MethodTOTP})); err != nil {
			return err
		}
		return s.notify(ctx, userID, mail.TOTPEnabled, o)
	})
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrEnrolmentChanged
	} else if err != nil {
		return nil, err
	}
	s.forgive(ctx, userID)
	return codes, nil
}

// Disable turns TOTP off, proved by a current code or an unused recovery
// code (spent, though the codes go with the factor): the factor and the
// recovery codes are deleted, USER_MFA_DISABLED recorded and the notice to
// the person queued (mail.TOTPDisabled), all or nothing. It answers the method that proved it.
func (s *Service) Disable(ctx context.Context, userID, code string, o Origin) (string, error) {
	userID, t, err := s.enabled(ctx, userID)
	if err != nil {
		return "", err
	}
	if err := s.spend(ctx, userID); err != nil {
		return "", err
	}
	var method, reason string
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		var err error
		if method, reason, err = s.check(ctx, t, code, o); err != nil {
			return err
		}
		if reason != "" {
			return ErrInvalidCode // nothing was taken; the failure is recorded below, after the transaction
		}
		if err := s.store.DeleteTOTP(ctx, userID, s.event(persistence.EventMFADisabled, userID, "", o, map[string]any{"method": method})); err != nil {
			return err
		}
		return s.notify(ctx, userID, mail.TOTPDisabled, o)
	})
	if reason != "" {
		return "", s.failed(ctx, userID, method, reason, "disable", o)
	}
	if errors.Is(err, persistence.ErrNotFound) {
		return "", ErrNotEnabled // turned off meanwhile
	} else if err != nil {
		return "", err
	}
	s.forgive(ctx, userID)
	return method, nil
}

// notify queues the notice of a change to a person's TOTP in the unit of
// work of ctx.
func (s *Service) notify(ctx context.Context, userID string, c mail.Change, o Origin) error {
	if s.outbox == nil {
		return nil
	}
	u, err := s.store.GetUser(ctx, userID)
	if err != nil {
		return err
	}
	return s.outbox.Notify(ctx, s.store, u.Email, mail.Notice{Change: c, AppName: o.AppName, At: s.now(), IP: o.IP})
}

// Enabled tells whether a person's TOTP is on (a pending enrolment is not).
func (s *Service) Enabled(ctx context.Context, userID string) (bool, error) {
	_, _, err := s.enabled(ctx, userID)
	if errors.Is(err, ErrNotEnabled) {
		return false, nil
	}
	return err == nil, err
}

// Verify checks a person's second factor for a sign-in: a current TOTP
// code (method "totp") whose time step was not used before, or an unused
// recovery code (method "recovery_code", spent). Wrong codes are
// ErrInvalidCode and recorded (mfa_verify_failed, with where the code came
// from); past the person's tries it is ErrTooManyTries, whatever the code;
// without TOTP on it is ErrNotEnabled. Its writes (the step or recovery
// code taken, the failure event) are made in the context's unit of work
// when there is one: a caller that rolls its unit back on a refusal must
// call it outside the unit, or the failure goes unrecorded (the count of
// tries does not: it is not in the database).
func (s *Service) Verify(ctx context.Context, userID, code string, o Origin) (string, error) {
	userID, t, err := s.enabled(ctx, userID)
	if err != nil {
		return "", err
	}
	if err := s.spend(ctx, userID); err != nil {
		return "", err
	}
	method, reason, err := s.check(ctx, t, code, o)
	if err != nil {
		return "", err
	}
	if reason != "" {
		return "", s.failed(ctx, userID, method, reason, "verify", o)
	}
	s.forgive(ctx, userID)
	return method, nil
}

// enabled reads a person's enabled factor, under the id's canonical form.
func (s *Service) enabled(ctx context.Context, userID string) (string, *persistence.TOTP, error) {
	userID, ok := canonical(userID)
	if !ok {
		return "", nil, ErrNotEnabled
	}
	t, err := s.store.GetTOTP(ctx, userID)
	if errors.Is(err, persistence.ErrNotFound) || err == nil && t.EnabledAt == nil {
		return "", nil, ErrNotEnabled
	} else if err != nil {
		return "", nil, err
	}
	return userID, t, nil
}

// check verifies code against an enabled factor: a TOTP code of a step
// newer than the last one used (taking it), or an unused recovery code
// (spending it, with its event). reason is "" when it passed, else why not.
func (s *Service) check(ctx context.Context, t *persistence.TOTP, code string, o Origin) (method, reason string, err error) {
	kind, normal := parseCode(code)
	if kind == MethodRecoveryCode {
		hash, _ := s.codes.Hash(ctx, []byte(normal))
		used, err := s.store.UseRecoveryCode(ctx, t.UserID, hash, s.now(), func(remaining int) []persistence.AuthEvent {
			return []persistence.AuthEvent{s.event(persistence.EventMFARecoveryCodeUsed, t.UserID, "", o, map[string]any{"remaining": remaining})}
		})
		if err != nil {
			return kind, "", err
		}
		if !used {
			return kind, ReasonWrongRecoveryCode, nil
		}
		return kind, "", nil
	}
	secret, err := s.secret(t)
	if err != nil {
		return MethodTOTP, "", err
	}
	step, ok := match(secret, normal, s.now())
	switch {
	case kind != MethodTOTP || !ok:
		return MethodTOTP, ReasonWrongCode, nil
	case step <= t.LastStep:
		return MethodTOTP, ReasonReplayedCode, nil
	}
	taken, err := s.store.UseTOTPStep(ctx, t.UserID, step)
	if err != nil {
		return MethodTOTP, "", err
	}
	if !taken { // the same code, or a newer one, was accepted meanwhile
		return MethodTOTP, ReasonReplayedCode, nil
	}
	return MethodTOTP, "", nil
}

// failed records a refused code and answers ErrInvalidCode.
func (s *Service) failed(ctx context.Context, userID, method, reason, stage string, o Origin) error {
	if err := s.store.AppendAuthEvents(ctx, s.event(persistence.EventMFAVerifyFailed, userID, reason, o,
		map[string]any{"method": method, "stage": stage})); err != nil {
		return err
	}
	return ErrInvalidCode
}

// spend counts one try of a person's codes, before the code is checked:
// requests racing with guesses cannot outrun the count. Past MaxTries it
// is ErrTooManyTries until the window that began with the first try ends;
// refused tries do not move that end, so a guesser cannot lock the person
// out for longer than one window at a time. A count that cannot be made
// (Redis down) refuses: a code guessed without limit is worse than a
// sign-in put off.
func (s *Service) spend(ctx context.Context, userID string) error {
	c, err := s.tries.Get(ctx, triesKey(userID))
	if err != nil {
		return errors.Join(persistence.ErrUnavailable, fmt.Errorf("counting second-factor tries: %w", err))
	}
	if c.Reached {
		return ErrTooManyTries.With(map[string]any{"limit": c.Limit, "retryAfter": max(c.Reset-time.Now().Unix(), 1)})
	}
	return nil
}

// forgive clears a person's count once a code passes: their own typos
// should not shorten their next sign-in's tries. A failure to clear leaves
// the window to run out.
func (s *Service) forgive(ctx context.Context, userID string) {
	_, _ = s.tries.Reset(ctx, triesKey(userID))
}

func triesKey(userID string) string { return "mfa-tries:user:" + userID }

// secret opens a factor's sealed secret.
func (s *Service) secret(t *persistence.TOTP) (string, error) {
	plain, err := s.seal.Open(t.SecretSealed, binding(t))
	if err != nil {
		return "", fmt.Errorf("the TOTP secret of %s: %w", t.UserID, err)
	}
	return string(plain), nil
}

// binding ties a sealed secret to its person and enrolment: copied to
// another row, it does not open.
func binding(t *persistence.TOTP) []byte { return []byte("totp:" + t.UserID + ":" + t.EnrolmentID) }

// canonical is a user id in the one form the stores hold ("" and false
// for what is no UUID), so that one person has one count of tries.
func canonical(userID string) (string, bool) {
	id, err := uuid.Parse(userID)
	if err != nil {
		return "", false
	}
	return id.String(), true
}

var validateOpts = totp.ValidateOpts{Period: uint(Period / time.Second), Skew: 0, Digits: Digits, Algorithm: otp.AlgorithmSHA1}

// match is the newest time step within Skew steps of now whose code is
// code. Each step is checked on its own (pquerna/otp's skew does not say
// which step matched, and replay needs it); all are checked, in constant
// time each.
func match(secret, code string, now time.Time) (int64, bool) {
	var step int64
	ok := false
	for k := -Skew; k <= Skew; k++ {
		at := now.Add(time.Duration(k) * Period)
		if valid, err := totp.ValidateCustom(code, secret, at, validateOpts); err == nil && valid {
			step, ok = at.Unix()/int64(Period/time.Second), true
		}
	}
	return step, ok
}

// parseCode tells what a code is: six digits a TOTP code, ten base32
// characters a recovery code (either case), spaces and dashes aside (apps
// show "123 456", recovery codes are shown "abcde-fghij"). Anything else
// is kind "" (a wrong code). normal is the code in its checked form.
func parseCode(code string) (kind, normal string) {
	if len(code) > 64 {
		return "", ""
	}
	normal = strings.Map(func(r rune) rune {
		if r == ' ' || r == '-' {
			return -1
		}
		return r
	}, code)
	switch {
	case len(normal) == Digits.Length() && strings.Trim(normal, "0123456789") == "":
		return MethodTOTP, normal
	case len(normal) == recoveryLength && strings.Trim(strings.ToLower(normal), recoveryAlphabet) == "":
		return MethodRecoveryCode, strings.ToLower(normal)
	}
	return "", normal
}

// Recovery codes: ten characters of base32 (50 bits from crypto/rand),
// shown in two groups of five. Guessing is bounded by the tries; a stolen
// table holds only keyed hashes.
const (
	recoveryLength   = 10
	recoveryAlphabet = "abcdefghijklmnopqrstuvwxyz234567"
)

// newRecoveryCodes makes RecoveryCodes distinct codes and their keyed
// hashes.
func (s *Service) newRecoveryCodes() ([]string, [][]byte) {
	codes, hashes, seen := make([]string, 0, RecoveryCodes), make([][]byte, 0, RecoveryCodes), map[string]bool{}
	for len(codes) < RecoveryCodes {
		c := strings.ToLower(rand.Text()[:recoveryLength]) // each character uniform over base32
		if seen[c] {
			continue
		}
		seen[c] = true
		h, _ := s.codes.Hash(context.Background(), []byte(c))
		codes, hashes = append(codes, c[:5]+"-"+c[5:]), append(hashes, h)
	}
	return codes, hashes
}

// event makes one auth event of a person's second factor.
func (s *Service) event(typ, userID, reason string, o Origin, data map[string]any) persistence.AuthEvent {
	e := persistence.AuthEvent{
		ID: uuid.Must(uuid.NewV7()).String(), Type: typ, UserID: &userID, ClientID: o.ClientID, Reason: reason, IP: o.IP, UserAgent: o.UserAgent,
		Data: data, CreatedAt: s.now(),
	}
	if o.ApplicationID != "" {
		e.ApplicationID = &o.ApplicationID
	}
	if o.SessionID != "" {
		e.SessionID = &o.SessionID
	}
	return e
}
