package signin

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	htmltemplate "html/template"
	"math/big"
	"net/http"
	"slices"
	"strings"
	texttemplate "text/template"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
)

// E-mailed sign-in: a one-time code (six digits) or a magic link (a 256-bit
// token), sent through the outbox, kept only as a keyed hash, used once.
const (
	OTPTTL         = 10 * time.Minute
	MagicLinkTTL   = 15 * time.Minute
	MaxOTPAttempts = 5 // wrong codes a code survives
	otpDigits      = 6
	maxCodeLength  = 64 // what is read of a submitted code or token
)

// MagicLinkPath is the hosted page a magic link opens: it asks for a click
// before it signs anyone in, so that link scanners, which GET and HEAD
// links, cannot spend it.
const MagicLinkPath = "/signin/magic-link"

// EmbeddedMagicLinkPath is where the embedded API's links lead (spec
// path): the same page, which then sends the browser to the application's
// redirect URI with a code.
const EmbeddedMagicLinkPath = "/api/v1/embedded/auth/magic-link/verify"

// Refusals of e-mailed sign-in.
var (
	ErrInvalidCode      = extensions.NewError(http.StatusBadRequest, "invalid_code", "The code is not right. Check the latest e-mail and try again.", nil)
	ErrTooManyWrongCode = extensions.NewError(http.StatusBadRequest, "invalid_code", "Too many wrong codes. Ask for a new code.", nil)
	ErrCodeExpired      = extensions.NewError(http.StatusBadRequest, "expired_token", "The code or link has expired or was already used. Ask for a new one.", nil)
	ErrUserNotFound     = extensions.NewError(http.StatusNotFound, "user_not_found", "No account uses this e-mail address.", nil)
	ErrMethodNotAllowed = extensions.NewError(http.StatusBadRequest, "invalid_request", "This application does not offer this sign-in method.", nil)
)

// AccountExistsError is a code or link asked for an e-mail address whose
// account signs in another way only: it must be linked first (spec,
// Account linking rule 4).
type AccountExistsError struct{ Identities []string }

func (e *AccountExistsError) Error() string { return "account_exists" }

// Target is where an e-mailed code or link leads: a hosted sign-in flow, or
// the embedded API's authorization code (RedirectURI, CodeChallenge).
type Target struct {
	Flow          *persistence.SignInFlow
	RedirectURI   string
	CodeChallenge string
}

// emailIdentities are the identities an e-mailed code or link may use: both
// prove the same thing, control of the mailbox, so either admits the other.
var emailIdentities = []string{persistence.IdentityOTP, persistence.IdentityMagicLink}

// recipient decides who an e-mailed code or link for email is for: a
// person (who may use it), nobody (nil, nil: an unknown e-mail an
// application lets sign up), or a refusal: ErrUserNotFound,
// *AccountExistsError, ErrDisabled.
func (s *Service) recipient(ctx context.Context, app *persistence.Client, email string) (*persistence.User, error) {
	user, err := s.store.GetUserByEmail(ctx, email)
	if errors.Is(err, persistence.ErrNotFound) {
		if app.App.AllowSignUp {
			return nil, nil
		}
		return nil, ErrUserNotFound
	}
	if err != nil {
		return nil, err
	}
	if user.Status == directory.StatusDisabled {
		return nil, ErrDisabled
	}
	ids, err := s.identityNames(ctx, user.ID)
	if err != nil {
		return nil, err
	}
	if len(ids) > 0 && !slices.ContainsFunc(ids, func(p string) bool { return slices.Contains(emailIdentities, p) }) {
		return nil, &AccountExistsError{Identities: ids}
	}
	return user, nil
}

// identityNames are a person's identity providers, each once.
func (s *Service) identityNames(ctx context.Context, userID string) ([]string, error) {
	list, err := s.store.UserIdentities(ctx, userID)
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, id := range list {
		if !slices.Contains(names, id.Provider) {
			names = append(names, id.Provider)
		}
	}
	return names, nil
}

// SendOTP e-mails a one-time code for email, for the target. On the hosted
// page (t.Flow set) nothing tells whether the address has an account: an
// unknown one gets nothing, and one that signs in another way gets a
// notice instead of a code; both answer nil. The embedded API gets the
// refusal (the spec's check-email tells existence anyway).
func (s *Service) SendOTP(ctx context.Context, app *persistence.Client, email string, t Target, c Client) error {
	return s.send(ctx, persistence.ChallengeOTP, MethodOTP, app, email, t, c)
}

// SendMagicLink e-mails a magic link for email, for the target, as SendOTP.
func (s *Service) SendMagicLink(ctx context.Context, app *persistence.Client, email string, t Target, c Client) error {
	return s.send(ctx, persistence.ChallengeMagicLink, MethodMagicLink, app, email, t, c)
}

func (s *Service) send(ctx context.Context, kind, method string, app *persistence.Client, email string, t Target, c Client) error {
	if app == nil || app.App == nil || !slices.Contains(Methods(app.App), method) {
		return ErrMethodNotAllowed
	}
	email = strings.TrimSpace(email)
	var v extensions.ValidationError
	directory.CheckEmail(&v, "email", email)
	if v.Err() != nil {
		return invalidEmail()
	}
	user, err := s.recipient(ctx, app, email)
	var exists *AccountExistsError
	switch {
	case t.Flow != nil && errors.As(err, &exists):
		return s.queue(ctx, s.message("other", email, app.App.Name, map[string]any{"Methods": strings.Join(exists.Identities, ", ")}))
	case t.Flow != nil && (errors.Is(err, ErrUserNotFound) || errors.Is(err, ErrDisabled)):
		return nil
	case err != nil:
		return err
	}
	now := s.now()
	ch := &persistence.EmailChallenge{
		ID: uuid.NewString(), Kind: kind, Email: email, ClientID: app.ID,
		RedirectURI: t.RedirectURI, CodeChallenge: t.CodeChallenge, CreatedAt: now,
	}
	if user != nil {
		ch.UserID = &user.ID
	}
	if t.Flow != nil {
		ch.FlowID = &t.Flow.ID
	}
	var msg mail.Message
	event := persistence.EventCodeSent
	if kind == persistence.ChallengeOTP {
		code := newOTP()
		ch.SecretHash, ch.ExpiresAt = s.otpHash(ch.ID, code), now.Add(OTPTTL)
		msg = s.message("otp", email, app.App.Name, map[string]any{"Code": code})
	} else {
		token := newLinkToken()
		ch.SecretHash, ch.ExpiresAt = s.linkHash(token), now.Add(MagicLinkTTL)
		path := MagicLinkPath
		if t.Flow == nil {
			path = EmbeddedMagicLinkPath
		}
		msg = s.message("link", email, app.App.Name, map[string]any{"Link": s.issuer + path + "?token=" + token})
		event = persistence.EventLinkSent
	}
	record, err := s.record(msg)
	if err != nil {
		return err
	}
	var userID *string
	if user != nil {
		userID = &user.ID
	}
	if err := s.store.CreateEmailChallenge(ctx, ch, record,
		s.event(event, userID, app.RecordID, app.ID, nil, "", c, map[string]any{"email": email})); err != nil {
		return err
	}
	s.store.AfterCommit(ctx, s.outbox.Kick)
	return nil
}

// record seals a message for the outbox; a message that could not be
// rendered (a zero Message) is an error: the templates are the binary's own.
func (s *Service) record(msg mail.Message) (*persistence.Mail, error) {
	if msg.To == "" {
		return nil, errors.New("rendering an e-mail failed")
	}
	return s.outbox.Record(msg)
}

// queue sends a message that announces no record.
func (s *Service) queue(ctx context.Context, msg mail.Message) error {
	record, err := s.record(msg)
	if err != nil {
		return err
	}
	if err := s.store.QueueMail(ctx, record); err != nil {
		return err
	}
	s.outbox.Kick()
	return nil
}

// newOTP is six decimal digits from crypto/rand.
func newOTP() string {
	n, _ := rand.Int(rand.Reader, big.NewInt(1_000_000)) // never fails: crypto/rand crashes rather than return short
	return fmt.Sprintf("%0*d", otpDigits, n.Int64())
}

// newLinkToken is 256 random bits, base64url.
func newLinkToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// otpHash binds a code to its challenge: the same six digits hash apart in
// two challenges.
func (s *Service) otpHash(id, code string) []byte {
	h, _ := s.codes.Hash(context.Background(), []byte(id+":"+code))
	return h
}

func (s *Service) linkHash(token string) []byte {
	h, _ := s.links.Hash(context.Background(), []byte(token))
	return h
}

// continuation is how a redeemed code or link signs in: the hosted flow
// (nil: the embedded API), the PKCE challenge the code it ends in keeps,
// and the first factor's amr.
type continuation struct {
	flow      *persistence.SignInFlow
	challenge string
	amr       []string
}

// verifyOTP checks the newest code sent for email in the application (for
// the hosted flow next.flow, else the embedded API's). A wrong code counts
// against the code (MaxOTPAttempts). A right one is redeemed (see redeem).
func (s *Service) verifyOTP(ctx context.Context, app *persistence.Client, email, code string, next continuation, c Client) (*Result, error) {
	if app == nil || app.App == nil || !slices.Contains(Methods(app.App), MethodOTP) {
		return nil, ErrMethodNotAllowed
	}
	email, code = strings.TrimSpace(email), strings.TrimSpace(code)
	flowID := ""
	if next.flow != nil {
		flowID = next.flow.ID
	}
	ch, err := s.store.PendingOTP(ctx, persistence.ChallengeOTP, email, app.ID, flowID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, s.failed(ctx, app, email, nil, ReasonNoCode, c, ErrCodeExpired)
	}
	if err != nil {
		return nil, err
	}
	if err := s.checkCode(ctx, app, ch, code, c); err != nil {
		return nil, err
	}
	return s.redeem(ctx, app, ch, persistence.IdentityOTP, next, c)
}

// checkCode checks a code against its challenge: alive, below
// MaxOTPAttempts wrong tries, and right; a wrong one counts.
func (s *Service) checkCode(ctx context.Context, app *persistence.Client, ch *persistence.EmailChallenge, code string, c Client) error {
	switch {
	case !s.now().Before(ch.ExpiresAt):
		return s.failed(ctx, app, ch.Email, ch.UserID, ReasonCodeExpired, c, ErrCodeExpired)
	case ch.Attempts >= MaxOTPAttempts:
		return s.failed(ctx, app, ch.Email, ch.UserID, ReasonTooManyCodes, c, ErrTooManyWrongCode)
	case len(code) != otpDigits || !hmac.Equal(s.otpHash(ch.ID, code), ch.SecretHash):
		n, err := s.store.FailEmailChallenge(ctx, ch.ID)
		if err != nil {
			return err
		}
		refusal := ErrInvalidCode
		if n >= MaxOTPAttempts {
			refusal = ErrTooManyWrongCode
		}
		return s.failed(ctx, app, ch.Email, ch.UserID, ReasonWrongCode, c, refusal)
	}
	return nil
}

// MagicLink reads the challenge of a magic link's token, if it can still
// be used (unknown, used and expired links are ErrCodeExpired). Reading
// does not spend it.
func (s *Service) MagicLink(ctx context.Context, token string) (*persistence.EmailChallenge, error) {
	if token == "" || len(token) > maxCodeLength {
		return nil, ErrCodeExpired
	}
	ch, err := s.store.MagicLinkByHash(ctx, s.linkHash(token))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrCodeExpired
	}
	if err != nil {
		return nil, err
	}
	if ch.UsedAt != nil || !s.now().Before(ch.ExpiresAt) {
		return nil, ErrCodeExpired
	}
	return ch, nil
}

// useMagicLink spends a magic link, as verifyOTP spends a code.
func (s *Service) useMagicLink(ctx context.Context, app *persistence.Client, ch *persistence.EmailChallenge, next continuation, c Client) (*Result, error) {
	if app == nil || app.ID != ch.ClientID {
		return nil, ErrCodeExpired
	}
	return s.redeem(ctx, app, ch, persistence.IdentityMagicLink, next, c)
}

// redeem spends a challenge and signs its person in. What it reads and
// decides comes first: the person, their identities, the risk rules and
// the second factor (a refusal there spends nothing). The writes follow,
// all or nothing: the code spent (the guard: of two requests with one
// code, one wins), the identity recorded, and the session opened or the
// step-up begun; for a returning person they join the group commit
// (persistence.OpenSession). A person made (sign-up) or updated (an
// invited person becomes active, the e-mail verified) takes a unit of work
// that holds them all. Two sign-ups of one new address at once (two
// applications, two tabs): the second finds the address taken when it
// creates the person, and runs again, to sign in the person the first one
// made.
func (s *Service) redeem(ctx context.Context, app *persistence.Client, ch *persistence.EmailChallenge, identity string, next continuation, c Client) (*Result, error) {
	res, err := s.redeemOnce(ctx, app, ch, identity, next, c)
	if errors.Is(err, errSignedUpMeanwhile) {
		res, err = s.redeemOnce(ctx, app, ch, identity, next, c)
	}
	if errors.Is(err, persistence.ErrChallengeUsed) {
		return nil, ErrCodeExpired // another request used it first
	}
	return res, err
}

// errSignedUpMeanwhile is a sign-up that lost the race for its address.
var errSignedUpMeanwhile = errors.New("the address signed up meanwhile")

func (s *Service) redeemOnce(ctx context.Context, app *persistence.Client, ch *persistence.EmailChallenge, identity string, next continuation, c Client) (*Result, error) {
	now := s.now()
	user, err := s.store.GetUserByEmail(ctx, ch.Email)
	signUp := false
	switch {
	case errors.Is(err, persistence.ErrNotFound) && app.App.AllowSignUp:
		signUp, user = true, &persistence.User{Email: ch.Email} // made in the unit below
	case errors.Is(err, persistence.ErrNotFound):
		return nil, ErrCodeExpired // the person was deleted since
	case err != nil:
		return nil, err
	case user.Status == directory.StatusDisabled:
		return nil, ErrDisabled
	case ch.UserID != nil && *ch.UserID != user.ID:
		return nil, ErrCodeExpired // sent to a person since deleted, whose address another now has
	}
	var ids []string
	if !signUp {
		if ids, err = s.identityNames(ctx, user.ID); err != nil {
			return nil, err
		}
		if len(ids) > 0 && !slices.ContainsFunc(ids, func(p string) bool { return slices.Contains(emailIdentities, p) }) {
			return nil, &AccountExistsError{Identities: ids} // linked to another method since the e-mail was sent
		}
	}
	d, err := s.decide(ctx, app, user, next.amr, c)
	if err != nil {
		return nil, err
	}
	spend := &persistence.Spend{Challenge: ch.ID, MaxAttempts: MaxOTPAttempts}
	proved := func(user *persistence.User) {
		if !slices.Contains(ids, identity) {
			spend.Identity = &persistence.Identity{UserID: user.ID, Provider: identity, CreatedAt: now}
		}
	}
	verify := !signUp && (user.Status == directory.StatusInvited || !user.EmailVerified)
	if !signUp && !verify {
		proved(user)
		return s.complete(ctx, next.flow, app, user, next.amr, next.challenge, d, persistence.Opening{Spend: spend}, c)
	}
	var res *Result
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		if signUp {
			if user, err = s.signUp(ctx, app, ch.Email, now); errors.Is(err, persistence.ErrDuplicate) {
				return errSignedUpMeanwhile
			} else if err != nil {
				return err
			}
		} else {
			// The code proved the mailbox: an invited person is now active.
			if user, err = s.store.UpdateUser(ctx, user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
				if u.Status == directory.StatusInvited {
					u.Status = directory.StatusActive
				}
				u.EmailVerified, u.UpdatedAt = true, now
				return []persistence.DirectoryEvent{directory.Event(directory.UserUpdated, persistence.Actor{Subject: u.ID}, now, u.ID, "",
					map[string]any{"fields": []string{"status", "emailVerified"}, "via": identity})}, nil
			}); err != nil {
				return err
			}
		}
		proved(user)
		res, err = s.complete(ctx, next.flow, app, user, next.amr, next.challenge, d, persistence.Opening{Spend: spend}, c)
		return err
	})
	return res, err
}

// signUp creates the person an e-mailed code or link proved the address of.
func (s *Service) signUp(ctx context.Context, app *persistence.Client, email string, now time.Time) (*persistence.User, error) {
	u := &persistence.User{
		ID: uuid.Must(uuid.NewV7()).String(), Email: email, EmailVerified: true, Status: directory.StatusActive,
		Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now,
	}
	actor := persistence.Actor{Subject: u.ID, ClientID: app.ID}
	if err := s.store.CreateUser(ctx, u, directory.Event(directory.UserCreated, actor, now, u.ID, "",
		map[string]any{"email": email, "via": "sign-up", "applicationId": app.RecordID})); err != nil {
		return nil, err
	}
	return u, s.store.AppendAuthEvents(ctx, s.event(persistence.EventUserSignedUp, &u.ID, app.RecordID, app.ID, nil, "", Client{}, nil))
}

// failed records a refused code and answers the refusal.
func (s *Service) failed(ctx context.Context, app *persistence.Client, email string, userID *string, reason string, c Client, refusal error) error {
	s.riskFailure(ctx, email, c)
	if err := s.store.AppendAuthEvents(ctx, s.event(persistence.EventSignInFailed, userID, app.RecordID, app.ID, nil, reason, c,
		map[string]any{"email": email, "method": MethodOTP})); err != nil {
		return err
	}
	return refusal
}

//go:embed templates
var templates embed.FS

var (
	textTemplates = texttemplate.Must(texttemplate.ParseFS(templates, "templates/*.txt"))
	htmlTemplates = htmltemplate.Must(htmltemplate.ParseFS(templates, "templates/*.html"))
)

var subjects = map[string]string{
	"otp":      "Your code for %s",
	"link":     "Sign in to %s",
	"other":    "Sign-in to %s",
	"linkcode": "Your code to link a sign-in method to %s",
	"linked":   "A sign-in method was linked to your %s account",
}

// message renders an e-mail of the templates' name; a zero Message if it
// cannot be rendered (the templates are the binary's own).
func (s *Service) message(name, to, appName string, data map[string]any) mail.Message {
	data["AppName"] = appName
	var text, html bytes.Buffer
	if textTemplates.ExecuteTemplate(&text, name+".txt", data) != nil || htmlTemplates.ExecuteTemplate(&html, name+".html", data) != nil {
		return mail.Message{}
	}
	return mail.Message{To: to, Subject: fmt.Sprintf(subjects[name], appName), Text: text.String(), HTML: html.String()}
}

// --- the hosted page's e-mailed methods

// ChooseMethod moves a flow to a method's step (another method than the
// one offered first), sending the code or link the step waits for; asked
// again, it sends a new one.
func (s *Service) ChooseMethod(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, method string, c Client) (*persistence.SignInFlow, error) {
	step, ok := methodSteps[method]
	if !ok || app == nil || app.App == nil || !slices.Contains(Methods(app.App), method) {
		return nil, ErrMethodNotAllowed
	}
	if f.Step == StepDone || f.Step == StepEmail {
		return nil, ErrWrongStep
	}
	next, err := s.store.UpdateSignInFlow(ctx, f.ID, func(stored *persistence.SignInFlow) error {
		if stored.Step == StepDone || stored.Step == StepEmail {
			return ErrWrongStep
		}
		stored.Step = step
		return nil
	})
	if err != nil {
		return nil, err
	}
	return next, s.sendFor(ctx, next, app, c)
}

// sendFor sends what the flow's step waits for: a code, a link, or nothing.
func (s *Service) sendFor(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, c Client) error {
	switch f.Step {
	case StepOTP:
		return s.SendOTP(ctx, app, f.Email, Target{Flow: f}, c)
	case StepLinkSent:
		return s.SendMagicLink(ctx, app, f.Email, Target{Flow: f}, c)
	}
	return nil
}

// SubmitOTP checks the code of the flow's e-mail and, when right, opens
// the session as SubmitPassword does.
func (s *Service) SubmitOTP(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, code string, c Client) (*Result, error) {
	if f.Step != StepOTP || app == nil || app.ID != f.ClientID {
		return nil, ErrWrongStep
	}
	return s.verifyOTP(ctx, app, f.Email, code, continuation{flow: f, amr: []string{"otp", "email"}}, c)
}

// SignInWithLink spends a hosted flow's magic link and opens the session
// on flow: the flow the link was sent for, or, opened in another browser, a
// copy of it bound to that browser (the caller's).
func (s *Service) SignInWithLink(ctx context.Context, ch *persistence.EmailChallenge, f *persistence.SignInFlow, app *persistence.Client, c Client) (*Result, error) {
	if ch.FlowID == nil || app == nil || app.ID != ch.ClientID || f.ClientID != ch.ClientID {
		return nil, ErrCodeExpired
	}
	return s.useMagicLink(ctx, app, ch, continuation{flow: f, amr: []string{"email"}}, c)
}

// LinkFlow is the flow a magic link continues in the browser holding
// browserSecret: its own flow when that browser began it, else a new flow
// for the same authorization request, bound to this browser, at the
// link's step.
func (s *Service) LinkFlow(ctx context.Context, ch *persistence.EmailChallenge, browserSecret string) (*persistence.SignInFlow, error) {
	if ch.FlowID == nil {
		return nil, ErrCodeExpired
	}
	if f, err := s.Flow(ctx, *ch.FlowID, browserSecret); err == nil {
		if f.Step != StepLinkSent {
			return nil, ErrCodeExpired
		}
		return f, nil
	} else if !errors.Is(err, ErrFlowExpired) {
		return nil, err
	}
	orig, err := s.store.GetSignInFlow(ctx, *ch.FlowID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrCodeExpired
	}
	if err != nil {
		return nil, err
	}
	if orig.Step == StepDone || !s.now().Before(orig.ExpiresAt) {
		return nil, ErrCodeExpired
	}
	now := s.now()
	f := &persistence.SignInFlow{
		ID: uuid.NewString(), BrowserHash: s.browserHash(browserSecret), ClientID: orig.ClientID, Request: orig.Request,
		Step: StepLinkSent, Email: orig.Email, CreatedAt: now, ExpiresAt: orig.ExpiresAt,
	}
	return f, s.store.CreateSignInFlow(ctx, f)
}
