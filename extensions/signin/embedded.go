package signin

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/persistence"
)

// The embedded sign-in API: the same rules as the hosted page, answered to
// an application's own page. Each sign-in opens an SSO session (without a
// cookie) that the code the API answers is issued for.

// EmailCheck is what check-email tells an application's page of an
// address: whether it has an account, and the methods its person can use
// in this application (for an unknown address, those that sign up).
type EmailCheck struct {
	Exists     bool
	Methods    []string
	MFAEnabled bool
}

// CheckEmail answers check-email. The spec exposes existence here; the
// per-address limits bound how fast it can be asked. The risk rules are
// applied and what triggers is recorded; the answer does not change (the
// step-up comes after the first factor).
func (s *Service) CheckEmail(ctx context.Context, app *persistence.Client, email string, c Client) (*EmailCheck, error) {
	email, err := checkedEmail(email)
	if err != nil {
		return nil, err
	}
	offered := Methods(app.App)
	user, err := s.store.GetUserByEmail(ctx, email)
	userID := ""
	if user != nil {
		userID = user.ID
	}
	if err == nil || errors.Is(err, persistence.ErrNotFound) {
		if _, err := s.assess(ctx, app, userID, email, "check_email", c); err != nil {
			return nil, err
		}
	}
	if errors.Is(err, persistence.ErrNotFound) {
		out := &EmailCheck{Methods: []string{}}
		if app.App.AllowSignUp {
			out.Methods = slices.DeleteFunc(slices.Clone(offered), func(m string) bool { return m == MethodPassword })
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	out := &EmailCheck{Exists: true, Methods: []string{}}
	if user.Status == directory.StatusDisabled {
		return out, nil
	}
	ids, err := s.identityNames(ctx, user.ID)
	if err != nil {
		return nil, err
	}
	byEmail := len(ids) == 0 || slices.ContainsFunc(ids, func(p string) bool { return slices.Contains(emailIdentities, p) })
	for _, m := range offered {
		switch {
		case m == MethodPassword && slices.Contains(ids, persistence.IdentityPassword):
		case (m == MethodOTP || m == MethodMagicLink) && byEmail:
		default:
			continue
		}
		out.Methods = append(out.Methods, m)
	}
	if slices.Contains(ids, persistence.IdentityPasskey) && slices.Contains(app.App.SignInMethods, FactorPasskey) && app.App.RPID != "" {
		// Only an active passkey signs in: revoked ones (clones) keep the
		// identity but are no method.
		active, err := s.store.HasPasskey(ctx, user.ID)
		if err != nil {
			return nil, err
		}
		if active {
			out.Methods = append(out.Methods, FactorPasskey)
		}
	}
	if s.second != nil {
		if out.MFAEnabled, err = s.second.Enabled(ctx, user.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkedEmail is email without surrounding space, if it is one address.
func checkedEmail(email string) (string, error) {
	email = strings.TrimSpace(email)
	var v extensions.ValidationError
	directory.CheckEmail(&v, "email", email)
	if v.Err() != nil {
		return "", invalidEmail()
	}
	return email, nil
}

// PasswordSignIn signs a person in with e-mail and password; challenge is
// the PKCE challenge a step-up keeps for the code it ends in.
func (s *Service) PasswordSignIn(ctx context.Context, app *persistence.Client, email, password, challenge string, c Client) (*Result, error) {
	if !slices.Contains(Methods(app.App), MethodPassword) {
		return nil, ErrMethodNotAllowed
	}
	email, err := checkedEmail(email)
	if err != nil {
		return nil, err
	}
	user, err := s.passwordUser(ctx, app, email, password, c)
	if err != nil {
		return nil, err
	}
	return s.finish(ctx, nil, app, user, []string{"pwd"}, challenge, c)
}

// OTPSignIn signs a person in with the code the embedded API sent.
func (s *Service) OTPSignIn(ctx context.Context, app *persistence.Client, email, code, challenge string, c Client) (*Result, error) {
	email, err := checkedEmail(email)
	if err != nil {
		return nil, err
	}
	return s.verifyOTP(ctx, app, email, code, continuation{challenge: challenge, amr: []string{"otp", "email"}}, c)
}

// EmbeddedLinkSignIn spends a magic link the embedded API sent.
func (s *Service) EmbeddedLinkSignIn(ctx context.Context, ch *persistence.EmailChallenge, app *persistence.Client, c Client) (*Result, error) {
	if ch.FlowID != nil {
		return nil, ErrCodeExpired
	}
	return s.useMagicLink(ctx, app, ch, continuation{challenge: ch.CodeChallenge, amr: []string{"email"}}, c)
}

// OriginRegistered tells whether some application lists origin among its
// web origins.
func (s *Service) OriginRegistered(ctx context.Context, origin string) (bool, error) {
	return s.store.OriginRegistered(ctx, origin)
}
