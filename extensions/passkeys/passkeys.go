// Package passkeys is identityd's WebAuthn relying party: a person's
// passkeys registered, listed, renamed and deleted, and the assertions that
// sign them in (alone, or as the second factor after another method).
// github.com/go-webauthn/webauthn does every ceremony; this package keeps
// what the library leaves to its caller: the ceremonies begun (single use,
// 5 minutes), the credentials, their counters, and the rules of the spec
// ("Passkeys (WebAuthn)" 1-5). No HTTP here.
package passkeys

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	texttemplate "text/template"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/persistence"
)

// Rules of the spec and of this server.
const (
	DefaultTimeout = 5 * time.Minute  // spec: a challenge lives 5 minutes
	MaxTimeout     = 10 * time.Minute // WebAuthn suggests at most ten where user verification is required
	MaxNameLength  = 64               // a passkey's name, in characters
	MaxPerPerson   = 20               // passkeys one person may hold
)

// Device types of a passkey (spec, "Passkey credential").
const (
	DeviceMobile      = "mobile"
	DeviceDesktop     = "desktop"
	DeviceSecurityKey = "security-key"
)

// Method is the sign-in method and the mfa factor a passkey is.
const Method = "passkey"

// Store is what passkeys need from storage.
type Store interface {
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	CreatePasskey(ctx context.Context, p *persistence.Passkey, events ...persistence.AuthEvent) error
	PasskeyAndOwner(ctx context.Context, credentialID []byte) (*persistence.Passkey, *persistence.User, error)
	UserPasskeys(ctx context.Context, userID string) ([]persistence.Passkey, error)
	RevokePasskey(ctx context.Context, id string, notice *persistence.Mail, events ...persistence.AuthEvent) error
	RenamePasskey(ctx context.Context, userID, id, name string) (*persistence.Passkey, error)
	DeletePasskey(ctx context.Context, userID, id string, events ...persistence.AuthEvent) error
	PutPasskeyChallenge(ctx context.Context, c *persistence.PasskeyChallenge) error
	TakePasskeyChallenge(ctx context.Context, challenge, kind string) (*persistence.PasskeyChallenge, error)
	AppendAuthEvents(ctx context.Context, events ...persistence.AuthEvent) error
	QueueMail(ctx context.Context, m *persistence.Mail) error
	AfterCommit(ctx context.Context, fn func())
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// Config is what the service needs besides storage.
type Config struct {
	// Issuer is identityd's own URL: the hosted sign-in page's ceremonies
	// run on its origin.
	Issuer string
	// Outbox sends the notices of a passkey added, removed or cloned; nil:
	// none is sent.
	Outbox *mail.Outbox
	// Timeout is how long a ceremony lives: its challenge, and the timeout
	// the browser is given (0: DefaultTimeout; at most MaxTimeout).
	Timeout time.Duration
	// Now is the clock (nil: the wall clock); tests move it.
	Now func() time.Time
}

// Service applies the rules.
type Service struct {
	store   Store
	outbox  *mail.Outbox
	hosted  string // the origin of identityd's own pages
	timeout time.Duration
	now     func() time.Time
}

// New makes the service.
func New(store Store, cfg Config) (*Service, error) {
	u, err := url.Parse(cfg.Issuer)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("passkeys: the issuer %q is not a URL", cfg.Issuer)
	}
	if cfg.Timeout < 0 || cfg.Timeout > MaxTimeout {
		return nil, fmt.Errorf("passkeys: a ceremony's timeout %s is outside (0, %s]", cfg.Timeout, MaxTimeout)
	}
	s := &Service{store: store, outbox: cfg.Outbox, hosted: strings.ToLower(u.Scheme + "://" + u.Host),
		timeout: cmp.Or(cfg.Timeout, DefaultTimeout), now: cfg.Now}
	if s.now == nil {
		s.now = extensions.Now
	}
	return s, nil
}

// Refusals. Every failed verification is ErrFailed, whatever failed
// (spec, Errors 9): the reason goes to the log and the event log only.
var (
	ErrFailed = extensions.NewError(http.StatusBadRequest, "passkey_failed", "The passkey could not be verified.", nil)

	ErrUnavailable = extensions.NewError(http.StatusBadRequest, "passkeys_unavailable",
		"This application does not offer passkeys here: it needs an rpId, a web origin on it served over HTTPS (or localhost), and passkey among its sign-in methods or second factors.", nil)
	ErrTooMany = extensions.NewError(http.StatusConflict, "too_many_passkeys",
		fmt.Sprintf("An account holds at most %d passkeys; delete one first.", MaxPerPerson), nil)
	ErrLastMethod = extensions.NewError(http.StatusConflict, "last_identity",
		"This passkey is the account's only way to sign in; add another method before deleting it.", nil)
	ErrNotFound = extensions.NewError(http.StatusNotFound, "not_found", "No such passkey.", nil)
)

// Failure is a failed verification: ErrFailed to the caller, with the
// reason (a stable code) for the log.
type Failure struct {
	Reason string
	Detail string
	UserID string // the person the credential belongs to, when known
}

func (f *Failure) Error() string { return "passkey_failed: " + f.Reason + ": " + f.Detail }
func (f *Failure) Unwrap() error { return ErrFailed }

func failure(reason string, err error) *Failure {
	detail := ""
	if err != nil {
		detail = err.Error()
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.DevInfo != "" {
			detail += " (" + pe.DevInfo + ")"
		}
	}
	return &Failure{Reason: reason, Detail: detail}
}

// Origin is what the event log records of a request: the one a person's
// own second-factor calls record.
type Origin = mfa.Origin

// ceremony is what a begun ceremony keeps beside the library's session
// data.
type ceremony struct {
	Session webauthn.SessionData `json:"session"`
	Name    string               `json:"name,omitempty"`   // register: the passkey's name
	Hosted  bool                 `json:"hosted,omitempty"` // on identityd's own page
	StepUp  string               `json:"stepUp,omitempty"` // the step-up it answers ("": a first factor)
	Device  string               `json:"device,omitempty"` // register: the device type the browser's user agent suggests
}

// Where a ceremony runs: the application's own pages (its webOrigins), or
// identityd's hosted page, which may use the application's rpId when
// identityd's origin is on it.
type Where struct {
	Hosted bool
	StepUp string // the step-up (persistence.MFAPending id) an assertion answers
	// Admit, when set, is asked before an assertion's signature is checked,
	// once its owner is known: an error (a spent failure budget) ends the
	// ceremony with it.
	Admit func(user *persistence.User) error
}

// secureOrigin tells whether a browser origin may run a ceremony: https, or
// http on localhost (spec rule 5; WebAuthn clients treat localhost as a
// secure context, and an IP address cannot be an rpId).
func secureOrigin(origin string) (host string, ok bool) {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return "", false
	}
	host = u.Hostname()
	switch {
	case u.Scheme == "https":
		return host, true
	case u.Scheme == "http" && (host == "localhost" || strings.HasSuffix(host, ".localhost")):
		return host, true
	}
	return "", false
}

// onRP tells whether host may use rpID: the rpId itself or a subdomain.
func onRP(host, rpID string) bool {
	return host == rpID || strings.HasSuffix(host, "."+rpID)
}

// origins are the origins a ceremony of app accepts.
func (s *Service) origins(app *persistence.Client, hosted bool) []string {
	rpID := app.App.RPID
	if rpID == "" {
		return nil
	}
	if hosted {
		if host, ok := secureOrigin(s.hosted); ok && onRP(host, rpID) {
			return []string{s.hosted}
		}
		return nil
	}
	var out []string
	for _, o := range app.App.WebOrigins {
		if host, ok := secureOrigin(o); ok && onRP(host, rpID) {
			out = append(out, o)
		}
	}
	return out
}

// Offered tells whether app's people may sign in with a passkey (first
// factor) on the hosted page (hosted) or the application's own pages.
func (s *Service) Offered(app *persistence.Client, hosted bool) bool {
	return app != nil && app.App != nil && slices.Contains(app.App.SignInMethods, Method) && len(s.origins(app, hosted)) > 0
}

// AsFactor tells whether app accepts a passkey as the second factor (its
// mfa factors name passkey, or none: any) on the hosted page (hosted) or
// the application's own pages.
func (s *Service) AsFactor(app *persistence.Client, hosted bool) bool {
	if app == nil || app.App == nil || len(s.origins(app, hosted)) == 0 {
		return false
	}
	list, _ := app.App.MFA["factors"].([]any)
	return len(list) == 0 || slices.ContainsFunc(list, func(v any) bool { return v == Method })
}

// relyingParty is the library's relying party for app, on the hosted page
// (hosted) or the application's own pages.
func (s *Service) relyingParty(app *persistence.Client, hosted bool) (*webauthn.WebAuthn, error) {
	if app == nil || app.App == nil {
		return nil, ErrUnavailable
	}
	origins := s.origins(app, hosted)
	if len(origins) == 0 {
		return nil, ErrUnavailable
	}
	timeout := webauthn.TimeoutConfig{Enforce: true, Timeout: s.timeout, TimeoutUVD: s.timeout}
	return webauthn.New(&webauthn.Config{
		RPID: app.App.RPID, RPDisplayName: app.App.Name, RPOrigins: origins,
		Timeouts: webauthn.TimeoutsConfig{Login: timeout, Registration: timeout},
	})
}

// person is a person as the library sees them: the user handle is their
// id (no personal data: it is stored on the authenticator).
type person struct {
	user  *persistence.User
	creds []webauthn.Credential
}

func (p *person) WebAuthnID() []byte                         { return []byte(p.user.ID) }
func (p *person) WebAuthnName() string                       { return p.user.Email }
func (p *person) WebAuthnDisplayName() string                { return cmp.Or(p.user.Name, p.user.Email) }
func (p *person) WebAuthnCredentials() []webauthn.Credential { return p.creds }

// credential is a stored passkey as the library verifies it.
func credential(p *persistence.Passkey) webauthn.Credential {
	var transports []protocol.AuthenticatorTransport
	for _, t := range p.Transports {
		transports = append(transports, protocol.AuthenticatorTransport(t))
	}
	return webauthn.Credential{
		ID: p.CredentialID, PublicKey: p.PublicKey, Transport: transports,
		Flags: webauthn.CredentialFlags{UserPresent: true, UserVerified: true, BackupEligible: p.BackupEligible, BackupState: p.BackedUp},
		Authenticator: webauthn.Authenticator{
			AAGUID: p.AAGUID, SignCount: uint32(p.SignCount), Attachment: protocol.AuthenticatorAttachment(p.Attachment),
		},
	}
}

// begin stores a ceremony, for take.
func (s *Service) begin(ctx context.Context, kind string, userID *string, app *persistence.Client, c ceremony) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	now := s.now()
	ch := &persistence.PasskeyChallenge{
		Challenge: c.Session.Challenge, Kind: kind, UserID: userID, ClientID: app.ID, Session: string(raw),
		CreatedAt: now, ExpiresAt: now.Add(s.timeout),
	}
	return s.store.PutPasskeyChallenge(ctx, ch)
}

// take finds and consumes the ceremony of kind a response answers,
// whatever comes of it: an unknown, used or expired one, or another
// application's, is a failure.
func (s *Service) take(ctx context.Context, kind, challenge string, app *persistence.Client) (*persistence.PasskeyChallenge, *ceremony, error) {
	// Ours are base64url: anything else (a NUL PostgreSQL cannot hold, say)
	// is unknown before it reaches the store.
	if challenge == "" || len(challenge) > 256 || strings.ContainsFunc(challenge, notBase64URL) {
		return nil, nil, failure("unknown_challenge", nil)
	}
	ch, err := s.store.TakePasskeyChallenge(ctx, challenge, kind)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil, failure("unknown_challenge", errors.New("no such ceremony, or it was used"))
	}
	if err != nil {
		return nil, nil, err
	}
	if !s.now().Before(ch.ExpiresAt) {
		return ch, nil, failure("expired_challenge", nil)
	}
	if ch.ClientID != app.ID {
		return ch, nil, failure("wrong_application", fmt.Errorf("begun for %s", ch.ClientID))
	}
	var c ceremony
	if err := json.Unmarshal([]byte(ch.Session), &c); err != nil {
		return ch, nil, err
	}
	return ch, &c, nil
}

// notBase64URL tells whether r is outside the base64url alphabet.
func notBase64URL(r rune) bool {
	return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_')
}

// deviceType names the kind of device a credential lives on: a security
// key when the authenticator is roaming and speaks no hybrid (phone)
// transport; a phone when it is reached over hybrid or lives in a phone's
// browser (mobile: the registering browser said so); else a computer.
func deviceType(attachment string, transports []string, mobile bool) string {
	hybrid := slices.Contains(transports, string(protocol.Hybrid))
	switch {
	case attachment == string(protocol.CrossPlatform) && !hybrid && !slices.Contains(transports, string(protocol.Internal)):
		return DeviceSecurityKey
	case hybrid && attachment == string(protocol.CrossPlatform), mobile:
		return DeviceMobile
	}
	return DeviceDesktop
}

// mobile tells whether a user agent is a phone's or tablet's browser.
func mobile(userAgent string) bool {
	for _, s := range []string{"Mobile", "Android", "iPhone", "iPad"} {
		if strings.Contains(userAgent, s) {
			return true
		}
	}
	return false
}

// --- registration

// BeginRegistration starts adding a passkey to user's account, from app's
// own pages: the options for navigator.credentials.create (a discoverable
// credential, user verification required, the person's passkeys
// excluded). name is the passkey's name ("": one made from the device).
func (s *Service) BeginRegistration(ctx context.Context, app *persistence.Client, user *persistence.User, name string, o Origin) (*protocol.CredentialCreation, error) {
	name = strings.TrimSpace(name)
	var v extensions.ValidationError
	v.CheckText("name", name, false, MaxNameLength)
	if err := v.Err(); err != nil {
		return nil, err
	}
	rp, err := s.relyingParty(app, false)
	if err != nil {
		return nil, err
	}
	mine, err := s.store.UserPasskeys(ctx, user.ID)
	if err != nil {
		return nil, err
	}
	if len(mine) >= MaxPerPerson {
		return nil, ErrTooMany
	}
	exclude := make([]protocol.CredentialDescriptor, 0, len(mine))
	for i := range mine {
		c := credential(&mine[i])
		exclude = append(exclude, c.Descriptor())
	}
	required := true
	creation, session, err := rp.BeginRegistration(&person{user: user},
		webauthn.WithAuthenticatorSelection(protocol.AuthenticatorSelection{
			RequireResidentKey: &required, ResidentKey: protocol.ResidentKeyRequirementRequired,
			UserVerification: protocol.VerificationRequired,
		}),
		webauthn.WithExclusions(exclude),
		webauthn.WithConveyancePreference(protocol.PreferNoAttestation))
	if err != nil {
		return nil, err
	}
	device := DeviceDesktop
	if mobile(o.UserAgent) {
		device = DeviceMobile
	}
	if err := s.begin(ctx, persistence.PasskeyRegister, &user.ID, app, ceremony{Session: *session, Name: name, Device: device}); err != nil {
		return nil, err
	}
	return creation, nil
}

// FinishRegistration verifies the authenticator's answer (the
// PublicKeyCredential's JSON) and stores the passkey, with the event
// USER_MFA_ENABLED and the notice to the person (mail.PasskeyAdded), in
// one transaction. A failure is recorded and is ErrFailed.
func (s *Service) FinishRegistration(ctx context.Context, app *persistence.Client, user *persistence.User, raw []byte, o Origin) (*persistence.Passkey, error) {
	p, err := s.finishRegistration(ctx, app, user, raw, o)
	var f *Failure
	if errors.As(err, &f) {
		f.UserID = user.ID
		if e := s.store.AppendAuthEvents(ctx, s.event(persistence.EventPasskeyRegisterFailed, user.ID, f.Reason, o, nil)); e != nil {
			return nil, e
		}
	}
	return p, err
}

func (s *Service) finishRegistration(ctx context.Context, app *persistence.Client, user *persistence.User, raw []byte, o Origin) (*persistence.Passkey, error) {
	parsed, err := protocol.ParseCredentialCreationResponseBytes(raw)
	if err != nil {
		return nil, failure("malformed", err)
	}
	ch, c, err := s.take(ctx, persistence.PasskeyRegister, parsed.Response.CollectedClientData.Challenge, app)
	if err != nil {
		return nil, err
	}
	if ch.UserID == nil || *ch.UserID != user.ID {
		return nil, failure("wrong_user", nil)
	}
	rp, err := s.relyingParty(app, c.Hosted)
	if err != nil {
		return nil, failure("unavailable", err)
	}
	cred, err := rp.CreateCredential(&person{user: user}, c.Session, parsed)
	if err != nil {
		return nil, failure("verification", err)
	}
	if !cred.Flags.UserVerified {
		return nil, failure("no_user_verification", nil) // the library checks it too (userVerification required)
	}
	transports := persistence.StringList{}
	for _, t := range cred.Transport {
		transports = append(transports, string(t))
	}
	attachment := string(cred.Authenticator.Attachment)
	now := s.now()
	p := &persistence.Passkey{
		ID: uuid.NewString(), CredentialID: cred.ID, UserID: user.ID, PublicKey: cred.PublicKey,
		SignCount: int64(cred.Authenticator.SignCount), AAGUID: cred.Authenticator.AAGUID, Transports: transports, Attachment: attachment,
		DeviceType: deviceType(attachment, transports, c.Device == DeviceMobile), BackupEligible: cred.Flags.BackupEligible,
		BackedUp: cred.Flags.BackupState, Status: persistence.PasskeyActive, CreatedAt: now,
	}
	if p.AAGUID == nil {
		p.AAGUID = make([]byte, 16)
	}
	p.Name = c.Name
	if p.Name == "" {
		p.Name = map[string]string{DeviceMobile: "Passkey on a phone", DeviceDesktop: "Passkey on a computer", DeviceSecurityKey: "Security key"}[p.DeviceType]
	}
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		if err := s.store.CreatePasskey(ctx, p, s.event(persistence.EventMFAEnabled, user.ID, "", o,
			map[string]any{"method": Method, "passkeyId": p.ID, "deviceType": p.DeviceType})); err != nil {
			return err
		}
		return s.outbox.Notify(ctx, s.store, user.Email, s.notice(mail.PasskeyAdded, app, p.Name, o))
	})
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, failure("duplicate_credential", errors.New("the credential id is registered already"))
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// --- authentication

// BeginAuthentication starts a passkey sign-in of app where w says: with
// email, for that person's passkeys; without, for any passkey the
// authenticator holds for the rpId (discoverable, usernameless). An
// unknown e-mail, or a person without passkeys, gets the usernameless
// options: the answer does not tell them apart. stepUser, for a step-up,
// is the person signing in (email is then not read).
func (s *Service) BeginAuthentication(ctx context.Context, app *persistence.Client, email string, w Where, stepUser string) (*protocol.CredentialAssertion, error) {
	if w.StepUp == "" && !s.Offered(app, w.Hosted) {
		return nil, ErrUnavailable
	}
	rp, err := s.relyingParty(app, w.Hosted)
	if err != nil {
		return nil, err
	}
	var user *persistence.User
	switch {
	case stepUser != "":
		if user, err = s.store.GetUser(ctx, stepUser); err != nil {
			return nil, err
		}
	case strings.TrimSpace(email) != "":
		user, err = s.store.GetUserByEmail(ctx, strings.TrimSpace(email))
		if errors.Is(err, persistence.ErrNotFound) {
			user, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	var allowed []webauthn.Credential
	if user != nil {
		mine, err := s.store.UserPasskeys(ctx, user.ID)
		if err != nil {
			return nil, err
		}
		for i := range mine {
			if mine[i].Status == persistence.PasskeyActive {
				allowed = append(allowed, credential(&mine[i]))
			}
		}
	}
	var (
		assertion *protocol.CredentialAssertion
		session   *webauthn.SessionData
		userID    *string
	)
	if len(allowed) > 0 {
		// The library lists the person's credentials as allowCredentials
		// (and refuses a person without any).
		assertion, session, err = rp.BeginLogin(&person{user: user, creds: allowed}, webauthn.WithUserVerification(protocol.VerificationRequired))
		userID = &user.ID
	} else {
		if stepUser != "" {
			return nil, ErrUnavailable // a step-up with no passkey to ask
		}
		assertion, session, err = rp.BeginDiscoverableLogin(webauthn.WithUserVerification(protocol.VerificationRequired))
	}
	if err != nil {
		return nil, err
	}
	if err := s.begin(ctx, persistence.PasskeyAuthenticate, userID, app, ceremony{Session: *session, Hosted: w.Hosted, StepUp: w.StepUp}); err != nil {
		return nil, err
	}
	return assertion, nil
}

// Verified is a passkey assertion that proved who signs in; the sign-in
// counts Use with what it opens (signin.PasskeySignIn, PasskeyStepUp).
type Verified struct {
	User *persistence.User
	AMR  []string // hwk or swk, user, mfa
	Use  persistence.PasskeyUse
}

// FinishAuthentication verifies an assertion (the PublicKeyCredential's
// JSON) for app where w says. A failure drops the ceremony, is recorded
// (sign_in_failed, reason passkey_*) and is ErrFailed; a counter that did
// not advance revokes the passkey and tells its owner too. A success
// has taken the ceremony; its use counts with Verified.Use.
func (s *Service) FinishAuthentication(ctx context.Context, app *persistence.Client, raw []byte, w Where, o Origin) (*Verified, error) {
	v, err := s.finishAuthentication(ctx, app, raw, w, o)
	var f *Failure
	if errors.As(err, &f) {
		e := s.event(persistence.EventSignInFailed, f.UserID, "passkey_"+f.Reason, o, map[string]any{"method": Method})
		if err2 := s.store.AppendAuthEvents(ctx, e); err2 != nil {
			return nil, err2
		}
	}
	return v, err
}

// finishAuthentication takes the ceremony and verifies.
func (s *Service) finishAuthentication(ctx context.Context, app *persistence.Client, raw []byte, w Where, o Origin) (*Verified, error) {
	parsed, err := protocol.ParseCredentialRequestResponseBytes(raw)
	if err != nil {
		return nil, failure("malformed", err)
	}
	ch, c, err := s.take(ctx, persistence.PasskeyAuthenticate, parsed.Response.CollectedClientData.Challenge, app)
	if err != nil {
		return nil, err
	}
	if c.Hosted != w.Hosted || c.StepUp != w.StepUp {
		return nil, failure("wrong_ceremony", nil)
	}
	stored, user, err := s.store.PasskeyAndOwner(ctx, parsed.RawID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, failure("unknown_credential", nil)
	}
	if err != nil {
		return nil, err
	}
	fail := func(reason string, err error) error {
		f := failure(reason, err)
		f.UserID = stored.UserID
		return f
	}
	if stored.Status != persistence.PasskeyActive {
		return nil, fail("revoked_credential", nil)
	}
	if ch.UserID != nil && *ch.UserID != stored.UserID {
		return nil, fail("wrong_user", nil)
	}
	if w.Admit != nil {
		if err := w.Admit(user); err != nil {
			return nil, err
		}
	}
	rp, err := s.relyingParty(app, c.Hosted)
	if err != nil {
		return nil, fail("unavailable", err)
	}
	who := &person{user: user, creds: []webauthn.Credential{credential(stored)}}
	var cred *webauthn.Credential
	if len(c.Session.UserID) > 0 {
		// The library wants every credential the ceremony allowed among
		// the person's: all of them, not only the one that answered.
		mine, lerr := s.store.UserPasskeys(ctx, user.ID)
		if lerr != nil {
			return nil, lerr
		}
		who.creds = who.creds[:0]
		for i := range mine {
			who.creds = append(who.creds, credential(&mine[i]))
		}
		cred, err = rp.ValidateLogin(who, c.Session, parsed)
	} else {
		_, cred, err = rp.ValidatePasskeyLogin(func(rawID, userHandle []byte) (webauthn.User, error) {
			if !bytes.Equal(userHandle, who.WebAuthnID()) {
				return nil, errors.New("the user handle is not the credential's owner")
			}
			return who, nil
		}, c.Session, parsed)
	}
	if err != nil {
		return nil, fail("verification", err)
	}
	if !cred.Flags.UserVerified {
		return nil, fail("no_user_verification", nil)
	}
	if cred.Authenticator.CloneWarning {
		return nil, s.cloned(ctx, app, user, stored, int64(parsed.Response.AuthenticatorData.Counter), o)
	}
	kind := "hwk" // a key bound to its device (RFC 8176)
	if stored.BackupEligible {
		kind = "swk" // a synced passkey: copies exist beyond one device
	}
	return &Verified{User: user, AMR: []string{kind, "user", "mfa"}, Use: persistence.PasskeyUse{
		PasskeyID: stored.ID, Seen: stored.SignCount,
		Count: int64(cred.Authenticator.SignCount), BackedUp: cred.Flags.BackupState,
	}}, nil
}

// Lost is the failure of a verified assertion whose use did not count (the
// passkey's counter moved, or it was revoked, meanwhile): the caller
// records it.
func (s *Service) Lost(ctx context.Context, v *Verified, o Origin) error {
	f := failure("counter_moved", errors.New("the counter moved, or the passkey was revoked, meanwhile"))
	f.UserID = v.User.ID
	if err := s.store.AppendAuthEvents(ctx, s.event(persistence.EventSignInFailed, f.UserID, "passkey_"+f.Reason, o, map[string]any{"method": Method})); err != nil {
		return err
	}
	return f
}

// cloned revokes a passkey whose counter did not advance, tells its owner
// and records it; the sign-in fails. The ceremony was new (taken once), so
// this is no replay of an assertion that counted: a second authenticator
// holds the key.
func (s *Service) cloned(ctx context.Context, app *persistence.Client, user *persistence.User, p *persistence.Passkey,
	seen int64, o Origin) error {
	var notice *persistence.Mail
	if s.outbox != nil {
		msg := message(user.Email, app.App.Name, map[string]any{"Name": p.Name})
		if msg.To != "" {
			record, err := s.outbox.Record(msg)
			if err != nil {
				return err
			}
			notice = record
		}
	}
	err := s.store.RevokePasskey(ctx, p.ID, notice, s.event(persistence.EventPasskeyCloned, user.ID, "counter_not_advanced", o,
		map[string]any{"passkeyId": p.ID, "storedCount": p.SignCount, "seenCount": seen}))
	if err != nil && !errors.Is(err, persistence.ErrNotFound) { // ErrNotFound: revoked meanwhile
		return err
	}
	if notice != nil {
		s.store.AfterCommit(ctx, s.outbox.Kick)
	}
	f := failure("clone", fmt.Errorf("the signature counter %d did not advance past %d", seen, p.SignCount))
	f.UserID = user.ID
	return f
}

// --- a person's passkeys

// View is a passkey as its owner sees it (spec, "Passkey credential").
type View struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	DeviceType string     `json:"deviceType"`
	CreatedAt  time.Time  `json:"createdAt"`
	LastUsedAt *time.Time `json:"lastUsedAt"`
	Status     string     `json:"status"`
	BackedUp   bool       `json:"backedUp"`
	AAGUID     string     `json:"aaguid"`
}

// ViewOf is p as its owner sees it.
func ViewOf(p *persistence.Passkey) View {
	aaguid := uuid.Nil.String()
	if id, err := uuid.FromBytes(p.AAGUID); err == nil {
		aaguid = id.String()
	}
	return View{ID: p.ID, Name: p.Name, DeviceType: p.DeviceType, CreatedAt: p.CreatedAt, LastUsedAt: p.LastUsedAt,
		Status: p.Status, BackedUp: p.BackedUp, AAGUID: aaguid}
}

// List is a person's passkeys, oldest first.
func (s *Service) List(ctx context.Context, userID string) ([]View, error) {
	mine, err := s.store.UserPasskeys(ctx, userID)
	if err != nil {
		return nil, err
	}
	out := make([]View, 0, len(mine))
	for i := range mine {
		out = append(out, ViewOf(&mine[i]))
	}
	return out, nil
}

// Rename names one of a person's passkeys.
func (s *Service) Rename(ctx context.Context, userID, id, name string) (*View, error) {
	name = strings.TrimSpace(name)
	var v extensions.ValidationError
	v.CheckText("name", name, true, MaxNameLength)
	if err := v.Err(); err != nil {
		return nil, err
	}
	if uuid.Validate(id) != nil {
		return nil, ErrNotFound
	}
	p, err := s.store.RenamePasskey(ctx, userID, id, name)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	view := ViewOf(p)
	return &view, nil
}

// Delete removes one of a person's passkeys (a lost one), with the event
// USER_MFA_DISABLED and the notice to the person (mail.PasskeyRemoved), in
// one transaction; their only way to sign in stays (ErrLastMethod). app is
// the application the person's token is for.
func (s *Service) Delete(ctx context.Context, app *persistence.Client, userID, id string, o Origin) error {
	if uuid.Validate(id) != nil {
		return ErrNotFound
	}
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		mine, err := s.store.UserPasskeys(ctx, userID)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(mine, func(p persistence.Passkey) bool { return p.ID == id })
		if i < 0 {
			return persistence.ErrNotFound
		}
		if err := s.store.DeletePasskey(ctx, userID, id, s.event(persistence.EventMFADisabled, userID, "", o,
			map[string]any{"method": Method, "passkeyId": id})); err != nil {
			return err
		}
		user, err := s.store.GetUser(ctx, userID)
		if err != nil {
			return err
		}
		return s.outbox.Notify(ctx, s.store, user.Email, s.notice(mail.PasskeyRemoved, app, mine[i].Name, o))
	})
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		return ErrNotFound
	case errors.Is(err, persistence.ErrLastIdentity):
		return ErrLastMethod
	}
	return err
}

// notice is the e-mail of a change to a person's passkeys made through app.
func (s *Service) notice(c mail.Change, app *persistence.Client, name string, o Origin) mail.Notice {
	n := mail.Notice{Change: c, Detail: name, At: s.now(), IP: o.IP}
	if app != nil && app.App != nil {
		n.AppName = app.App.Name
	}
	return n
}

func (s *Service) event(typ, userID, reason string, o Origin, data map[string]any) persistence.AuthEvent {
	e := persistence.AuthEvent{
		ID: uuid.Must(uuid.NewV7()).String(), Type: typ, ClientID: o.ClientID, Reason: reason, IP: o.IP, UserAgent: o.UserAgent,
		Data: data, CreatedAt: s.now(),
	}
	if userID != "" {
		e.UserID = &userID
	}
	if o.ApplicationID != "" {
		e.ApplicationID = &o.ApplicationID
	}
	if o.SessionID != "" {
		e.SessionID = &o.SessionID
	}
	return e
}

//go:embed templates
var templates embed.FS

var (
	textTemplates = texttemplate.Must(texttemplate.ParseFS(templates, "templates/*.txt"))
	htmlTemplates = htmltemplate.Must(htmltemplate.ParseFS(templates, "templates/*.html"))
)

// message is the notice of a cloned passkey.
func message(to, appName string, data map[string]any) mail.Message {
	data["AppName"] = appName
	var text, html bytes.Buffer
	if textTemplates.ExecuteTemplate(&text, "cloned.txt", data) != nil || htmlTemplates.ExecuteTemplate(&html, "cloned.html", data) != nil {
		return mail.Message{}
	}
	return mail.Message{To: to, Subject: "A passkey of your " + appName + " account was turned off", Text: text.String(), HTML: html.String()}
}
