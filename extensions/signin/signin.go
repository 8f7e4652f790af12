// Package signin holds the rules of people's sign-in on the hosted page: the
// sign-in flow (a small state machine: e-mail first, then a method step the
// later methods join), password checks against the directory, SSO sessions
// and their liveness, and the auth events all of it records. No HTTP here.
package signin

import (
	"context"
	"crypto/hmac"
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/risk"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is what sign-in needs from storage.
type Store interface {
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	UserRoles(ctx context.Context, userID string) ([]persistence.Role, error)

	OpenSession(ctx context.Context, o persistence.Opening) error
	SSOSessionByTokenHash(ctx context.Context, hash []byte) (*persistence.SSOSession, error)
	TouchSSOSession(ctx context.Context, id string, at time.Time) (bool, error)
	ListUserSSOSessions(ctx context.Context, userID string) ([]persistence.SSOSession, error)
	ListApplicationSessions(ctx context.Context, appID string, now, idleSince time.Time, p persistence.Page) ([]persistence.SSOSession, int, error)
	EndSSOSession(ctx context.Context, id string, ended persistence.AuthEvent, events ...persistence.AuthEvent) error
	EndUserSSOSessions(ctx context.Context, userID string, ended persistence.AuthEvent) (int, error)
	AppendAuthEvents(ctx context.Context, events ...persistence.AuthEvent) error

	CreateUser(ctx context.Context, u *persistence.User, events ...persistence.DirectoryEvent) error
	UpdateUser(ctx context.Context, id string, fn func(*persistence.User) ([]persistence.DirectoryEvent, error)) (*persistence.User, error)
	UserIdentities(ctx context.Context, userID string) ([]persistence.Identity, error)
	CreateEmailChallenge(ctx context.Context, c *persistence.EmailChallenge, mail *persistence.Mail, events ...persistence.AuthEvent) error
	PendingOTP(ctx context.Context, kind, email, clientID, flowID string) (*persistence.EmailChallenge, error)
	MagicLinkByHash(ctx context.Context, hash []byte) (*persistence.EmailChallenge, error)
	FailEmailChallenge(ctx context.Context, id string) (int, error)
	SpendChallenge(ctx context.Context, sp persistence.Spend, at time.Time) error
	QueueMail(ctx context.Context, m *persistence.Mail) error
	CreateLinkingToken(ctx context.Context, t *persistence.LinkingToken, mail *persistence.Mail, events ...persistence.AuthEvent) error
	LinkingTokenByHash(ctx context.Context, hash []byte) (*persistence.LinkingToken, error)
	FailLinkingToken(ctx context.Context, id string, events ...persistence.AuthEvent) (int, error)
	CompleteLink(ctx context.Context, t *persistence.LinkingToken, maxAttempts int, at time.Time, id persistence.Identity, notice *persistence.Mail, events ...persistence.AuthEvent) error
	Unlink(ctx context.Context, userID, provider string, at time.Time, events ...persistence.AuthEvent) ([]string, error)
	OriginRegistered(ctx context.Context, origin string) (bool, error)
	CreateMFAPending(ctx context.Context, p *persistence.MFAPending) error
	MFAPendingByHandle(ctx context.Context, hash []byte) (*persistence.MFAPending, error)
	MFAPendingOfFlow(ctx context.Context, flowID string) (*persistence.MFAPending, error)
	UseMFAPending(ctx context.Context, id string, now time.Time) (bool, error)
	HasPasskey(ctx context.Context, userID string) (bool, error)
	UsePasskey(ctx context.Context, u persistence.PasskeyUse, at time.Time) error
	AfterCommit(ctx context.Context, fn func())

	CreateSignInFlow(ctx context.Context, f *persistence.SignInFlow) error
	GetSignInFlow(ctx context.Context, id string) (*persistence.SignInFlow, error)
	UpdateSignInFlow(ctx context.Context, id string, fn func(*persistence.SignInFlow) error) (*persistence.SignInFlow, error)
	ConsumeSignInFlow(ctx context.Context, id string) (bool, error)

	GetClient(ctx context.Context, id string) (fosite.Client, error)
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// Steps of a sign-in flow. A flow begins at StepEmail; the e-mail leads to
// the first method step the application allows; a method that succeeds
// leads to StepDone, from which the authorization resumes. Later methods
// (one-time codes, magic links, passkeys) and MFA are further steps.
const (
	StepEmail    = "email"
	StepPassword = "password"
	StepOTP      = "otp"       // enter the e-mailed code
	StepLinkSent = "link_sent" // open the e-mailed link
	StepDone     = "done"
)

// Sign-in methods an application may allow (Application.signInMethods),
// and the step each one is, where this server offers it.
const (
	MethodPassword  = "password"
	MethodOTP       = "otp"
	MethodMagicLink = "magic-link"
)

var methodSteps = map[string]string{MethodPassword: StepPassword, MethodOTP: StepOTP, MethodMagicLink: StepLinkSent}

// Reason codes of sign_in_failed events: internal, for the log and its
// readers; the person is shown one message for all credential failures.
const (
	ReasonUnknownEmail   = "unknown_email"
	ReasonWrongPassword  = "wrong_password"
	ReasonNoPassword     = "no_password"
	ReasonDisabled       = "user_disabled"
	ReasonRateLimited    = "rate_limited"
	ReasonNoCode         = "no_code"         // no e-mailed code is pending
	ReasonCodeExpired    = "code_expired"    //
	ReasonTooManyCodes   = "too_many_codes"  // the code took MaxOTPAttempts wrong tries
	ReasonWrongCode      = "wrong_code"      //
	ReasonMFAUnavailable = "mfa_unavailable" // required MFA, and no second factor the application accepts
)

// FlowTTL is how long a person has to finish signing in.
const FlowTTL = 15 * time.Minute

// Config holds the sessions' lifetimes and what e-mailed sign-in needs.
type Config struct {
	Idle   time.Duration // a session ends after this long unused
	Max    time.Duration // and this long after sign-in
	Outbox *mail.Outbox  // sends codes and links
	Issuer string        // the base of the links e-mailed
	// SecondFactor is the people's own second factor; nil: none has one.
	SecondFactor SecondFactor
	// Risk assesses sign-ins (a triggered rule steps one up); nil: none.
	Risk *risk.Service
	// PasskeyFactor tells whether app accepts a passkey as the second
	// factor on the hosted page (hosted) or the embedded API
	// (passkeys.Service.AsFactor); nil: passkeys are no factor.
	PasskeyFactor func(app *persistence.Client, hosted bool) bool
}

// Service applies the rules.
type Service struct {
	store     Store
	cfg       Config
	cookies   *oauth.SecretHasher // session cookie secrets
	browser   *oauth.SecretHasher // flow cookie secrets (a flow's browser binding)
	codes     *oauth.SecretHasher // e-mailed one-time codes
	links     *oauth.SecretHasher // magic-link tokens
	outbox    *mail.Outbox
	issuer    string
	second    SecondFactor
	risk      *risk.Service
	handles   *oauth.SecretHasher // embedded step-ups' mfaSessionId
	linking   *oauth.SecretHasher // linking tokens
	linkCodes *oauth.SecretHasher // codes e-mailed to prove an account for linking
	dummy     string              // a hash verified for unknown e-mails: the same work
	now       func() time.Time
}

// Purposes of the keys sign-in derives from the system secret.
const (
	PurposeSessionCookie = "sso session"
	PurposeFlowBinding   = "sign-in flow binding"
	PurposeEmailCode     = "e-mailed sign-in code"
	PurposeMagicLink     = "magic link"
	PurposeStepUpHandle  = "mfa session handle"
)

// New makes the service; it hashes one random password (the work a wrong
// e-mail must cost as much as a wrong password).
func New(store Store, systemSecret []byte, cfg Config) (*Service, error) {
	dummy, err := directory.HashPassword(oauth.NewSecret())
	if err != nil {
		return nil, err
	}
	return &Service{
		store: store, cfg: cfg, dummy: dummy, now: extensions.Now,
		cookies: oauth.NewHasher(systemSecret, PurposeSessionCookie), browser: oauth.NewHasher(systemSecret, PurposeFlowBinding),
		codes: oauth.NewHasher(systemSecret, PurposeEmailCode), links: oauth.NewHasher(systemSecret, PurposeMagicLink),
		outbox: cfg.Outbox, issuer: strings.TrimSuffix(cfg.Issuer, "/"), second: cfg.SecondFactor, risk: cfg.Risk,
		handles: oauth.NewHasher(systemSecret, PurposeStepUpHandle),
		linking: oauth.NewHasher(systemSecret, PurposeLinkingToken), linkCodes: oauth.NewHasher(systemSecret, PurposeLinkingCode),
	}, nil
}

// Client is what a request tells of the browser behind it, for sessions,
// events and risk.
type Client struct {
	IP        string
	UserAgent string
	Device    string // the device cookie's secret ("" without one)
	NoDevice  bool   // a channel without a device cookie (the embedded API)
}

// Refusals the pages show. Credentials failures share one message whatever
// failed, so that no answer tells whether an e-mail is registered.
var (
	ErrInvalidCredentials = extensions.NewError(http.StatusUnauthorized, "invalid_credentials", "The e-mail address or password is not right.", nil)
	ErrDisabled           = extensions.NewError(http.StatusForbidden, "user_disabled", "This account cannot sign in. Ask your administrator.", nil)
	ErrFlowExpired        = extensions.NewError(http.StatusBadRequest, "expired_token", "This sign-in has expired or belongs to another browser. Go back to the application and start again.", nil)
	ErrWrongStep          = extensions.NewError(http.StatusBadRequest, "invalid_request", "This step of the sign-in is not the current one. Start again from the e-mail address.", nil)
	ErrNoMethod           = extensions.NewError(http.StatusForbidden, "no_method", "This application offers no sign-in method this server supports yet.", nil)
)

// invalidEmail refuses what is not one e-mail address.
func invalidEmail() error {
	return extensions.NewError(http.StatusBadRequest, "invalid_request", "Enter an e-mail address, like name@example.com.", nil)
}

// Methods are the methods an application's people may use after the
// e-mail: the application's that this server offers, in the application's
// order (the first is the step the e-mail leads to).
func Methods(app *persistence.AppFacts) []string {
	var out []string
	if app == nil {
		return out
	}
	for _, m := range app.SignInMethods {
		if _, ok := methodSteps[m]; ok && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// --- flows

// BeginFlow starts a sign-in for an authorization request (its parameters,
// resumed once the person is signed in), bound to the browser holding
// browserSecret. hint pre-fills the e-mail (login_hint).
func (s *Service) BeginFlow(ctx context.Context, browserSecret, clientID string, request url.Values, hint string) (*persistence.SignInFlow, error) {
	now := s.now()
	f := &persistence.SignInFlow{
		ID: uuid.NewString(), BrowserHash: s.browserHash(browserSecret), ClientID: clientID, Request: request.Encode(),
		Step: StepEmail, Email: hint, CreatedAt: now, ExpiresAt: now.Add(FlowTTL),
	}
	return f, s.store.CreateSignInFlow(ctx, f)
}

func (s *Service) browserHash(secret string) []byte {
	h, _ := s.browser.Hash(context.Background(), []byte(secret))
	return h
}

// Flow reads a flow for the browser holding browserSecret: an unknown or
// expired flow, or one begun in another browser, is ErrFlowExpired.
func (s *Service) Flow(ctx context.Context, id, browserSecret string) (*persistence.SignInFlow, error) {
	if uuid.Validate(id) != nil || browserSecret == "" {
		return nil, ErrFlowExpired
	}
	f, err := s.store.GetSignInFlow(ctx, id)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrFlowExpired
	}
	if err != nil {
		return nil, err
	}
	if !hmac.Equal(f.BrowserHash, s.browserHash(browserSecret)) || !s.now().Before(f.ExpiresAt) {
		return nil, ErrFlowExpired
	}
	return f, nil
}

// SubmitEmail takes the e-mail address and moves the flow to the first
// method step the application allows. Whether the address is registered
// changes nothing here: the next step is the application's, not the
// person's, so the page after the e-mail tells nothing.
//
// When the application's first method is an e-mailed code or link, it is
// sent now.
func (s *Service) SubmitEmail(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, email string, c Client) (*persistence.SignInFlow, error) {
	if f.Step == StepDone {
		return nil, ErrWrongStep
	}
	email = strings.TrimSpace(email)
	var v extensions.ValidationError
	directory.CheckEmail(&v, "email", email)
	if v.Err() != nil {
		return nil, invalidEmail()
	}
	methods := Methods(app.App)
	if len(methods) == 0 {
		return nil, ErrNoMethod
	}
	if s.risk != nil { // the rules' events; the step-up comes after the first factor
		userID := ""
		if u, err := s.store.GetUserByEmail(ctx, email); err == nil {
			userID = u.ID
		}
		if _, err := s.assess(ctx, app, userID, email, "check_email", c); err != nil {
			return nil, err
		}
	}
	next, err := s.store.UpdateSignInFlow(ctx, f.ID, func(stored *persistence.SignInFlow) error {
		if stored.Step == StepDone {
			return ErrWrongStep
		}
		stored.Email, stored.Step = email, methodSteps[methods[0]]
		return nil
	})
	if err != nil {
		return nil, err
	}
	return next, s.sendFor(ctx, next, app, c)
}

// Restart takes the flow back to the e-mail step ("use another e-mail").
func (s *Service) Restart(ctx context.Context, f *persistence.SignInFlow) (*persistence.SignInFlow, error) {
	return s.store.UpdateSignInFlow(ctx, f.ID, func(stored *persistence.SignInFlow) error {
		if stored.Step == StepDone {
			return ErrWrongStep
		}
		stored.Step = StepEmail
		return nil
	})
}

// Failed records a sign-in refused before any check (rate limits), for
// the flow's e-mail.
func (s *Service) Failed(ctx context.Context, f *persistence.SignInFlow, appID string, c Client, reason string) error {
	return s.store.AppendAuthEvents(ctx, s.event(persistence.EventSignInFailed, nil, appID, f.ClientID, nil, reason, c,
		map[string]any{"email": f.Email}))
}

// Result is a successful sign-in: the new session, the secret its cookie
// carries (never stored), and the person; or, with StepUp set and no
// session yet, a first factor that must be followed by a second.
type Result struct {
	Session *persistence.SSOSession
	Secret  string
	User    *persistence.User
	StepUp  *StepUp
}

// SubmitPassword checks the password of the flow's e-mail. Every failure
// of the credentials costs one argon2id verification and answers
// ErrInvalidCredentials, unknown e-mail included; a disabled person who
// gave the right password is told the account cannot sign in (what only
// the password's holder learns). On success it starts an SSO session,
// records sign_in (naming the session), sets lastSignInAt and moves the flow
// to StepDone, all in one unit of work.
func (s *Service) SubmitPassword(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, password string, c Client) (*Result, error) {
	if f.Step != StepPassword || app == nil || app.App == nil || app.ID != f.ClientID {
		return nil, ErrWrongStep
	}
	if !slices.Contains(Methods(app.App), MethodPassword) {
		return nil, ErrWrongStep
	}
	user, err := s.passwordUser(ctx, app, f.Email, password, c)
	if err != nil {
		return nil, err
	}
	return s.finish(ctx, f, app, user, []string{"pwd"}, "", c)
}

// passwordUser is the person whose e-mail and password these are, or the
// refusal (recorded): ErrInvalidCredentials, ErrDisabled.
func (s *Service) passwordUser(ctx context.Context, app *persistence.Client, email, password string, c Client) (*persistence.User, error) {
	user, reason, err := s.checkPassword(ctx, email, password)
	if err != nil {
		return nil, err
	}
	if reason != "" {
		s.riskFailure(ctx, email, c)
		var userID *string
		if user != nil {
			userID = &user.ID
		}
		if err := s.store.AppendAuthEvents(ctx, s.event(persistence.EventSignInFailed, userID, app.RecordID, app.ID, nil, reason, c,
			map[string]any{"email": email, "method": MethodPassword})); err != nil {
			return nil, err
		}
		if reason == ReasonDisabled {
			return nil, ErrDisabled
		}
		return nil, ErrInvalidCredentials
	}
	return user, nil
}

// checkPassword verifies email's password; reason is "" on success, else
// the failure's code (and user the person, when the e-mail is theirs).
func (s *Service) checkPassword(ctx context.Context, email, password string) (*persistence.User, string, error) {
	user, err := s.store.GetUserByEmail(ctx, email)
	if err != nil && !errors.Is(err, persistence.ErrNotFound) {
		return nil, "", err
	}
	hash := s.dummy
	if user != nil && user.PasswordHash != nil {
		hash = *user.PasswordHash
	}
	ok, verr := directory.VerifyPassword(hash, password)
	switch {
	case user == nil:
		return nil, ReasonUnknownEmail, nil
	case user.PasswordHash == nil:
		return user, ReasonNoPassword, nil
	case verr != nil || !ok:
		return user, ReasonWrongPassword, nil
	case user.Status != directory.StatusActive:
		// Invited people have set no password through an invite yet;
		// disabled people may not sign in.
		return user, ReasonDisabled, nil
	}
	return user, "", nil
}

// start opens the session of a person who has just proved who they are,
// with what else o writes (Spend, Events), and finishes the hosted flow f
// (nil for the embedded API). Without a unit of work or a flow to move,
// the opening joins the group commit (persistence.OpenSession).
func (s *Service) start(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User, amr []string,
	o persistence.Opening, c Client) (*Result, error) {
	now := s.now()
	secret := persistence.TokenKeyPrefix(now) + oauth.NewSecret()
	ss := &persistence.SSOSession{
		ID: uuid.Must(uuid.NewV7()).String(), TokenHash: s.sessionKey(secret), UserID: user.ID, ApplicationID: &app.RecordID, AMR: amr, AuthTime: now,
		IP: c.IP, UserAgent: c.UserAgent, CreatedAt: now, LastSeenAt: now, ExpiresAt: now.Add(s.cfg.Max),
	}
	if slices.Contains(amr, "mfa") {
		ss.ACR = ACRMultiFactor
	}
	o.Session = ss
	// mfa marks a sign-in a second factor completed: analytics count them
	// (persistence/analytics.go) without reading the session.
	data := map[string]any{"method": amr[0]}
	if ss.ACR == ACRMultiFactor {
		data["mfa"] = true
	}
	// One event: the sign_in names the session it starts (decisions: "A
	// sign-in is one event").
	o.Events = append(o.Events, s.event(persistence.EventSignIn, &user.ID, app.RecordID, app.ID, &ss.ID, "", c, data))
	if s.risk != nil {
		r := s.risk.SignIn(user.ID, c.addr(), c.Device, now)
		o.Risk = &r
	}
	var err error
	if f == nil {
		err = s.store.OpenSession(ctx, o)
	} else {
		err = s.store.InTx(ctx, func(ctx context.Context) error {
			if err := s.store.OpenSession(ctx, o); err != nil {
				return err
			}
			_, err := s.store.UpdateSignInFlow(ctx, f.ID, func(stored *persistence.SignInFlow) error {
				if stored.Step != f.Step {
					return ErrWrongStep // another request moved it meanwhile
				}
				stored.Step, stored.SessionID = StepDone, &ss.ID
				return nil
			})
			return err
		})
	}
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrFlowExpired
	}
	if err != nil {
		return nil, err
	}
	updated := *user
	updated.LastSignInAt = &now
	return &Result{Session: ss, Secret: secret, User: &updated}, nil
}

// Resume consumes a finished flow for the browser holding browserSecret
// and signed in with sessionID: the flow is used once, and only by the
// browser and session that finished it.
func (s *Service) Resume(ctx context.Context, id, browserSecret, sessionID string) (*persistence.SignInFlow, error) {
	f, err := s.Flow(ctx, id, browserSecret)
	if err != nil {
		return nil, err
	}
	if f.Step != StepDone || f.SessionID == nil || *f.SessionID != sessionID {
		return nil, ErrFlowExpired
	}
	ok, err := s.store.ConsumeSignInFlow(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrFlowExpired
	}
	return f, nil
}

// --- sessions

// sessionKey is what a session cookie's secret is stored and found as: the
// time the secret was made (its first 12 characters, TokenKeyPrefix) and
// its HMAC. New sessions then land at the right edge of the sessions' key
// instead of on a random page of it, like access tokens. A secret made
// before the prefix (43 characters, still in browsers after an upgrade)
// is found by its HMAC alone.
func (s *Service) sessionKey(secret string) []byte {
	hash, _ := s.cookies.Hash(context.Background(), []byte(secret))
	if len(secret) <= unprefixedSecretLen {
		return hash
	}
	return append([]byte(secret[:persistence.TokenKeyPrefixLen]), hash...)
}

// unprefixedSecretLen is the length of oauth.NewSecret's secrets.
const unprefixedSecretLen = 43

// Live is the session and person behind a session cookie's secret, if the
// session is live (not idle too long, not past its end) and the person may
// still sign in; otherwise (nil, nil, nil). Using it moves lastSeenAt (at
// most once a minute).
func (s *Service) Live(ctx context.Context, secret string) (*persistence.SSOSession, *persistence.User, error) {
	if secret == "" {
		return nil, nil, nil
	}
	ss, err := s.store.SSOSessionByTokenHash(ctx, s.sessionKey(secret))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	now := s.now()
	if !s.alive(ss, now) {
		return nil, nil, nil
	}
	user, err := s.store.GetUser(ctx, ss.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if user.Status != directory.StatusActive {
		return nil, nil, nil
	}
	if now.Sub(ss.LastSeenAt) >= persistence.TouchInterval { // no write statement at all on the hot path
		if _, err := s.store.TouchSSOSession(ctx, ss.ID, now); err != nil {
			return nil, nil, err
		}
	}
	return ss, user, nil
}

// alive tells whether a session is within both its lifetimes at now.
func (s *Service) alive(ss *persistence.SSOSession, now time.Time) bool {
	return now.Before(ss.ExpiresAt) && now.Before(ss.LastSeenAt.Add(s.cfg.Idle))
}

// FreshEnough tells whether a session's sign-in is within maxAge (OpenID
// Connect max_age); a negative maxAge asks nothing.
func (s *Service) FreshEnough(ss *persistence.SSOSession, maxAge time.Duration) bool {
	return maxAge < 0 || !s.now().After(ss.AuthTime.Add(maxAge))
}

// SignedIn is what an authorization answered for the person carries.
func (s *Service) SignedIn(ctx context.Context, ss *persistence.SSOSession, user *persistence.User) (oauth.SignedIn, error) {
	roles, err := s.store.UserRoles(ctx, user.ID)
	if err != nil {
		return oauth.SignedIn{}, err
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = r.Name
	}
	return oauth.SignedIn{
		UserID: user.ID, Email: user.Email, EmailVerified: user.EmailVerified, Name: user.Name, Roles: names,
		SessionID: ss.ID, AuthTime: ss.AuthTime, AMR: ss.AMR, ACR: ss.ACR,
	}, nil
}

// End ends one session with a reason; logout also records a logout event
// for the application that asked (appID, clientID; may be empty). A session
// already ended is not an error.
func (s *Service) End(ctx context.Context, ss *persistence.SSOSession, reason, appID, clientID string, c Client) error {
	ended := s.event(persistence.EventSessionEnded, nil, appID, clientID, nil, reason, c, nil)
	var events []persistence.AuthEvent
	if reason == persistence.SessionEndLogout {
		events = append(events, s.event(persistence.EventLogout, &ss.UserID, appID, clientID, &ss.ID, "", c, nil))
	}
	err := s.store.EndSSOSession(ctx, ss.ID, ended, events...)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil
	}
	return err
}

// Sessions lists a person's live sessions; an unknown person is
// ErrNotFound.
func (s *Service) Sessions(ctx context.Context, userID string) ([]persistence.SSOSession, error) {
	if err := s.userExists(ctx, userID); err != nil {
		return nil, err
	}
	list, err := s.store.ListUserSSOSessions(ctx, userID)
	if err != nil {
		return nil, err
	}
	now := s.now()
	return slices.DeleteFunc(list, func(ss persistence.SSOSession) bool { return !s.alive(&ss, now) }), nil
}

// EndAll ends every session of a person (an admin's call); an unknown
// person is ErrNotFound.
func (s *Service) EndAll(ctx context.Context, userID string, c Client) (int, error) {
	if err := s.userExists(ctx, userID); err != nil {
		return 0, err
	}
	return s.store.EndUserSSOSessions(ctx, userID, s.event(persistence.EventSessionEnded, nil, "", "", nil, persistence.SessionEndAdmin, c, nil))
}

// userExists is nil for a person in the directory, else ErrNotFound (an id
// that is no UUID included).
func (s *Service) userExists(ctx context.Context, id string) error {
	if uuid.Validate(id) != nil {
		return persistence.ErrNotFound
	}
	_, err := s.store.GetUser(ctx, id)
	return err
}

// event makes one auth event.
func (s *Service) event(typ string, userID *string, appID, clientID string, sessionID *string, reason string, c Client, data map[string]any) persistence.AuthEvent {
	var app *string
	if appID != "" {
		app = &appID
	}
	return persistence.AuthEvent{
		ID: uuid.Must(uuid.NewV7()).String(), Type: typ, UserID: userID, ApplicationID: app, ClientID: clientID, SessionID: sessionID,
		Reason: reason, IP: c.IP, UserAgent: c.UserAgent, Data: data, CreatedAt: s.now(),
	}
}

// addr is the client's address (invalid when it is none).
func (c Client) addr() netip.Addr {
	a, _ := netip.ParseAddr(c.IP)
	return a.Unmap()
}

// ApplicationSessions lists one page of the live sessions begun through an
// application (per-application M2M reads, issue 17), and how many there are.
func (s *Service) ApplicationSessions(ctx context.Context, appID string, p persistence.Page) ([]persistence.SSOSession, int, error) {
	now := s.now()
	return s.store.ListApplicationSessions(ctx, appID, now, now.Add(-s.cfg.Idle), p)
}
