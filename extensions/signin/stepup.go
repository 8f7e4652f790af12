package signin

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/extensions/risk"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Multi-factor sign-in: an application's mfa policy (off, optional,
// required) or a risk rule steps a sign-in up after its first factor. The
// second factor, among the application's mfa.factors (none listed: any),
// is the person's TOTP (or one of their recovery codes), or, for a person
// without TOTP whose first factor was not an e-mail, a code e-mailed now.
// A required step-up with no such factor is refused (mfa_required); a
// risk step-up without one goes on (logged as mfa_unavailable): the
// person cannot be asked for more.
const (
	StepMFA = "mfa" // the hosted flow waits for the second factor

	FactorTOTP     = "totp"
	FactorOTP      = "otp" // an e-mailed code
	FactorRecovery = "recovery_code"
	FactorPasskey  = "passkey" // an assertion of one of the person's passkeys (extensions/passkeys)

	MFAPendingTTL = 10 * time.Minute

	// ACRMultiFactor is the acr of a multi-factor sign-in: the OpenID
	// Provider Authentication Policy Extension's multi-factor policy,
	// which relying parties commonly test for.
	ACRMultiFactor = "http://schemas.openid.net/pape/policies/2007/06/multi-factor"

	// MFA policies of an application (Application.mfa.policy).
	MFAOff      = "off"
	MFAOptional = "optional"
	MFARequired = "required"
)

// SecondFactor is the person's own second factor (the mfa package).
type SecondFactor interface {
	Enabled(ctx context.Context, userID string) (bool, error)
	Verify(ctx context.Context, userID, code string, o mfa.Origin) (string, error)
}

// StepUp is a sign-in waiting for its second factor: the pending record,
// the handle the embedded API answers (mfaSessionId; "" on the hosted
// page), and the factors offered.
type StepUp struct {
	Pending *persistence.MFAPending
	Handle  string
	Factors []string
}

// Methods are the factor names a step-up accepts: the factors, and
// recovery codes where TOTP is one.
func (u *StepUp) Methods() []string {
	out := slices.Clone(u.Factors)
	if slices.Contains(out, FactorTOTP) {
		out = append(out, FactorRecovery)
	}
	return out
}

// ErrMFARequired refuses a sign-in the application requires a second
// factor of, when the person has none it accepts.
var ErrMFARequired = extensions.NewError(http.StatusForbidden, "mfa_required",
	"This application requires a second factor this account does not have yet: set up an authenticator app, then sign in again.", nil)

// ErrMFAExpired refuses a step-up that is unknown, used or too old.
var ErrMFAExpired = extensions.NewError(http.StatusBadRequest, "expired_token", "This sign-in has expired. Sign in again.", nil)

// errFactor refuses a method the step-up did not offer.
var errFactor = extensions.NewError(http.StatusBadRequest, "invalid_request", "This second factor is not offered for this sign-in.", nil)

// mfaPolicy is an application's policy name (off when unset).
func mfaPolicy(app *persistence.AppFacts) string {
	if p, ok := app.MFA["policy"].(string); ok && p != "" {
		return p
	}
	return MFAOff
}

// factorsFor are the second factors to ask of user after a first factor
// (amr), or none when the sign-in need not be stepped up. risky: a risk
// rule asked for one.
func (s *Service) factorsFor(ctx context.Context, app *persistence.Client, user *persistence.User, amr []string, risky bool, c Client) ([]string, error) {
	policy := mfaPolicy(app.App)
	if policy == MFAOff && !risky || slices.Contains(amr, "mfa") {
		return nil, nil // a passkey that verified its user is two factors already
	}
	allowed := func(f string) bool {
		list, _ := app.App.MFA["factors"].([]any)
		if len(list) == 0 {
			return true
		}
		return slices.ContainsFunc(list, func(v any) bool { return v == f })
	}
	hasTOTP, hasPasskey := false, false
	if s.second != nil && allowed(FactorTOTP) {
		var err error
		if hasTOTP, err = s.second.Enabled(ctx, user.ID); err != nil {
			return nil, err
		}
	}
	// A passkey where its ceremony can run: the embedded API's page (a web
	// origin on the rpId), or the hosted page (identityd's origin on it).
	if user.ID != "" && s.cfg.PasskeyFactor != nil && s.cfg.PasskeyFactor(app, !c.NoDevice) {
		var err error
		if hasPasskey, err = s.store.HasPasskey(ctx, user.ID); err != nil {
			return nil, err
		}
	}
	var factors []string
	if hasPasskey {
		factors = append(factors, FactorPasskey)
	}
	if hasTOTP {
		factors = append(factors, FactorTOTP)
	}
	switch {
	case factors != nil:
		return factors, nil
	case policy == MFAOptional && !risky:
		return nil, nil // optional: only those who enrolled a factor
	case !slices.Contains(amr, "email") && allowed(FactorOTP):
		return []string{FactorOTP}, nil
	}
	return nil, nil
}

// finish ends a first factor: it opens the session, or, when the sign-in
// must be stepped up, records the step-up (and e-mails its code) and
// answers it in Result.StepUp. f is the hosted flow (nil: the embedded
// API, whose code will carry challenge).
func (s *Service) finish(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User, amr []string,
	challenge string, c Client) (*Result, error) {
	d, err := s.decide(ctx, app, user, amr, c)
	if err != nil {
		return nil, err
	}
	return s.complete(ctx, f, app, user, amr, challenge, d, persistence.Opening{}, c)
}

// decision is what a first factor leads to: the risk rules that
// triggered, and the second factors to ask (none: sign in).
type decision struct{ risk, factors []string }

// decide applies the risk rules (recording what triggers) and the
// application's MFA policy to a first factor; a required second factor
// the person lacks is refused here (ErrMFARequired, recorded). It only
// reads, but for the events: run it before the sign-in's unit of work. A
// person still to be made (a sign-up) has an empty ID.
func (s *Service) decide(ctx context.Context, app *persistence.Client, user *persistence.User, amr []string, c Client) (decision, error) {
	risk, err := s.assess(ctx, app, user.ID, user.Email, "sign_in", c)
	if err != nil {
		return decision{}, err
	}
	factors, err := s.factorsFor(ctx, app, user, amr, len(risk) > 0, c)
	if err != nil {
		return decision{}, err
	}
	// A first factor that is two already (a passkey that verified its
	// user: amr mfa) meets a required policy; it has no factor to add.
	if factors == nil && mfaPolicy(app.App) == MFARequired && !slices.Contains(amr, "mfa") {
		var uid *string
		if user.ID != "" {
			uid = &user.ID
		}
		if err := s.store.AppendAuthEvents(ctx, s.event(persistence.EventSignInFailed, uid, app.RecordID, app.ID, nil, ReasonMFAUnavailable, c,
			map[string]any{"amr": amr})); err != nil {
			return decision{}, err
		}
		return decision{}, ErrMFARequired
	}
	return decision{risk: risk, factors: factors}, nil
}

// complete carries out a decision: the session, or the step-up. guard,
// when it has one, is what the first factor spends with it: an e-mailed
// challenge (Spend) or a passkey's ceremony and counter (Passkey).
func (s *Service) complete(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User, amr []string,
	challenge string, d decision, guard persistence.Opening, c Client) (*Result, error) {
	risk, factors := d.risk, d.factors
	if factors == nil {
		o := persistence.Opening{Spend: guard.Spend, Passkey: guard.Passkey}
		if len(risk) > 0 {
			o.Events = append(o.Events, s.event(persistence.EventMFAUnavailable, &user.ID, app.RecordID, app.ID, nil, "", c,
				map[string]any{"amr": amr, "risk": risk}))
		}
		return s.start(ctx, f, app, user, amr, o, c)
	}
	now := s.now()
	p := &persistence.MFAPending{
		ID: uuid.NewString(), UserID: user.ID, ClientID: app.ID, AMR: amr, Factors: factors, Risk: persistence.StringList(risk),
		CodeChallenge: challenge, CreatedAt: now, ExpiresAt: now.Add(MFAPendingTTL),
	}
	if p.Risk == nil {
		p.Risk = persistence.StringList{}
	}
	up := &StepUp{Pending: p, Factors: factors}
	if f != nil {
		p.FlowID = &f.ID
	} else {
		up.Handle = oauth.NewSecret()
		p.HandleHash = s.handleHash(up.Handle)
	}
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		if guard.Spend != nil {
			if err := s.store.SpendChallenge(ctx, *guard.Spend, now); err != nil {
				return err
			}
		}
		if guard.Passkey != nil {
			if err := s.store.UsePasskey(ctx, *guard.Passkey, now); err != nil {
				return err
			}
		}
		if err := s.store.CreateMFAPending(ctx, p); err != nil {
			return err
		}
		if f != nil {
			if _, err := s.store.UpdateSignInFlow(ctx, f.ID, func(stored *persistence.SignInFlow) error {
				if stored.Step != f.Step {
					return ErrWrongStep
				}
				stored.Step = StepMFA
				return nil
			}); err != nil {
				return err
			}
		}
		if slices.Contains(factors, FactorOTP) {
			return s.sendStepUpCode(ctx, app, user, p, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Result{User: user, StepUp: up}, nil
}

// sendStepUpCode e-mails the code of a step-up.
func (s *Service) sendStepUpCode(ctx context.Context, app *persistence.Client, user *persistence.User, p *persistence.MFAPending, c Client) error {
	now := s.now()
	ch := &persistence.EmailChallenge{
		ID: uuid.NewString(), Kind: persistence.ChallengeStepUpOTP, Email: user.Email, UserID: &user.ID, ClientID: app.ID,
		FlowID: &p.ID, CreatedAt: now, ExpiresAt: now.Add(OTPTTL),
	}
	code := newOTP()
	ch.SecretHash = s.otpHash(ch.ID, code)
	msg := s.message("otp", user.Email, app.App.Name, map[string]any{"Code": code})
	if msg.To == "" {
		return errors.New("rendering the sign-in e-mail failed")
	}
	record, err := s.outbox.Record(msg)
	if err != nil {
		return err
	}
	if err := s.store.CreateEmailChallenge(ctx, ch, record,
		s.event(persistence.EventCodeSent, &user.ID, app.RecordID, app.ID, nil, "", c, map[string]any{"email": user.Email, "stage": "mfa"})); err != nil {
		return err
	}
	s.store.AfterCommit(ctx, s.outbox.Kick)
	return nil
}

func (s *Service) handleHash(handle string) []byte {
	h, _ := s.handles.Hash(context.Background(), []byte(handle))
	return h
}

// PendingStepUp is the embedded step-up of an mfaSessionId, for app.
func (s *Service) PendingStepUp(ctx context.Context, app *persistence.Client, handle string) (*StepUp, error) {
	if handle == "" || len(handle) > maxCodeLength {
		return nil, ErrMFAExpired
	}
	p, err := s.store.MFAPendingByHandle(ctx, s.handleHash(handle))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrMFAExpired
	}
	if err != nil {
		return nil, err
	}
	if p.ClientID != app.ID {
		return nil, ErrMFAExpired
	}
	return s.pendingAlive(p)
}

// FlowStepUp is a hosted flow's step-up.
func (s *Service) FlowStepUp(ctx context.Context, f *persistence.SignInFlow) (*StepUp, error) {
	if f.Step != StepMFA {
		return nil, ErrWrongStep
	}
	p, err := s.store.MFAPendingOfFlow(ctx, f.ID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrMFAExpired
	}
	if err != nil {
		return nil, err
	}
	return s.pendingAlive(p)
}

func (s *Service) pendingAlive(p *persistence.MFAPending) (*StepUp, error) {
	if p.UsedAt != nil || !s.now().Before(p.ExpiresAt) {
		return nil, ErrMFAExpired
	}
	return &StepUp{Pending: p, Factors: p.Factors}, nil
}

// VerifyStepUp checks the second factor of a step-up (method: one of its
// Methods) and opens the session, with amr the first factor's, the
// second's and "mfa", and acr ACRMultiFactor. f is the hosted flow (nil:
// embedded).
func (s *Service) VerifyStepUp(ctx context.Context, up *StepUp, f *persistence.SignInFlow, app *persistence.Client, method, code string, c Client) (*Result, error) {
	p := up.Pending
	if p.ClientID != app.ID || (f != nil && (p.FlowID == nil || *p.FlowID != f.ID)) {
		return nil, ErrMFAExpired
	}
	if !slices.Contains(up.Methods(), method) {
		return nil, errFactor
	}
	user, err := s.store.GetUser(ctx, p.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrMFAExpired
	}
	if err != nil {
		return nil, err
	}
	code = strings.TrimSpace(code)
	var second []string
	var spend *persistence.Spend
	switch method {
	case FactorTOTP, FactorRecovery:
		// Outside any unit: a refused code's count and event must stay.
		used, err := s.second.Verify(ctx, user.ID, code, mfa.Origin{ClientID: app.ID, ApplicationID: app.RecordID, IP: c.IP, UserAgent: c.UserAgent})
		if err != nil {
			return nil, err
		}
		second = []string{"otp"}
		if used == FactorRecovery {
			second = []string{"kba"} // a recovery code: something the person kept (RFC 8176 has no closer value)
		}
	case FactorOTP:
		ch, err := s.store.PendingOTP(ctx, persistence.ChallengeStepUpOTP, user.Email, app.ID, p.ID)
		if errors.Is(err, persistence.ErrNotFound) {
			return nil, s.failed(ctx, app, user.Email, &user.ID, ReasonNoCode, c, ErrCodeExpired)
		}
		if err != nil {
			return nil, err
		}
		if err := s.checkCode(ctx, app, ch, code, c); err != nil {
			return nil, err
		}
		spend = &persistence.Spend{Challenge: ch.ID, MaxAttempts: MaxOTPAttempts} // with the session
		second = []string{"otp", "email"}
	default: // a passkey is no code: PasskeyStepUp
		return nil, errFactor
	}
	return s.stepUpDone(ctx, up, f, app, user, second, persistence.Opening{Spend: spend}, c)
}

// PasskeyStepUp finishes a step-up with an assertion of one of the
// person's passkeys that extensions/passkeys verified for it (userID its
// owner, amr what it proved, use counted with the session).
func (s *Service) PasskeyStepUp(ctx context.Context, up *StepUp, f *persistence.SignInFlow, app *persistence.Client, userID string, amr []string,
	use persistence.PasskeyUse, c Client) (*Result, error) {
	p := up.Pending
	if p.ClientID != app.ID || (f != nil && (p.FlowID == nil || *p.FlowID != f.ID)) || p.UserID != userID {
		return nil, ErrMFAExpired
	}
	if !slices.Contains(up.Factors, FactorPasskey) {
		return nil, errFactor
	}
	user, err := s.store.GetUser(ctx, p.UserID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrMFAExpired
	}
	if err != nil {
		return nil, err
	}
	return s.stepUpDone(ctx, up, f, app, user, amr, persistence.Opening{Passkey: &use}, c)
}

// stepUpDone opens the session of a step-up whose second factor was
// proved (second: its amr values; guard: what it spends), once: amr the
// first factor's, the second's and "mfa", acr ACRMultiFactor.
func (s *Service) stepUpDone(ctx context.Context, up *StepUp, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User,
	second []string, guard persistence.Opening, c Client) (*Result, error) {
	p := up.Pending
	amr := slices.Clone([]string(p.AMR))
	for _, m := range append(second, "mfa") {
		if !slices.Contains(amr, m) {
			amr = append(amr, m)
		}
	}
	var res *Result
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		ok, err := s.store.UseMFAPending(ctx, p.ID, s.now())
		if err != nil {
			return err
		}
		if !ok {
			return ErrMFAExpired
		}
		res, err = s.start(ctx, f, app, user, amr, guard, c)
		return err
	})
	if errors.Is(err, persistence.ErrChallengeUsed) {
		return nil, ErrCodeExpired // another request used the code first
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// assess applies the risk rules to a sign-in step (stage: check_email,
// sign_in) and records each rule that triggered (risk_triggered, the
// rule's name as reason). It answers the rules; when the assessment
// cannot be made (storage), it steps up anyway ("unassessed").
func (s *Service) assess(ctx context.Context, app *persistence.Client, userID, email, stage string, c Client) ([]string, error) {
	if s.risk == nil {
		return nil, nil
	}
	a, err := s.risk.Assess(ctx, risk.Input{UserID: userID, Email: email, IP: c.addr(), DeviceSecret: c.Device, NoDevice: c.NoDevice, At: s.now()})
	if err != nil {
		if persistence.Unavailable(err) {
			return nil, err
		}
		a.Rules = []string{"unassessed"}
	}
	if len(a.Rules) == 0 {
		return nil, nil
	}
	var uid *string
	if userID != "" {
		uid = &userID
	}
	events := make([]persistence.AuthEvent, len(a.Rules))
	for i, rule := range a.Rules {
		events[i] = s.event(persistence.EventRiskTriggered, uid, app.RecordID, app.ID, nil, rule, c, map[string]any{"email": email, "stage": stage})
	}
	return a.Rules, s.store.AppendAuthEvents(ctx, events...)
}

// riskFailure tells the risk engine of a failed sign-in.
func (s *Service) riskFailure(ctx context.Context, email string, c Client) {
	if s.risk != nil {
		s.risk.RecordFailure(ctx, c.addr(), email, s.now())
	}
}
