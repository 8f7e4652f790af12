package signin

import (
	"context"
	"errors"

	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/persistence"
)

// Proven finishes a sign-in whose first factor another party proved (an
// upstream OpenID Connect provider, extensions/upstream): the same risk
// rules, MFA policy, session, events and last sign-in as every sign-in,
// with amr the caller's. f is the hosted flow the sign-in continues (nil:
// the embedded API, whose code keeps challenge); it must be the
// application's and not finished or waiting for a second factor.
func (s *Service) Proven(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User, amr []string,
	challenge string, c Client) (*Result, error) {
	return s.proven(ctx, f, app, user, amr, challenge, persistence.Opening{}, c)
}

// PasskeySignIn is Proven for a passkey's assertion that
// extensions/passkeys verified: use, its ceremony and counter, is counted
// with the session (of two finishes of one ceremony, one signs in: the
// other is persistence.ErrChallengeUsed).
func (s *Service) PasskeySignIn(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User, amr []string,
	challenge string, use persistence.PasskeyUse, c Client) (*Result, error) {
	return s.proven(ctx, f, app, user, amr, challenge, persistence.Opening{Passkey: &use}, c)
}

func (s *Service) proven(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client, user *persistence.User, amr []string,
	challenge string, guard persistence.Opening, c Client) (*Result, error) {
	if app == nil || app.App == nil || len(amr) == 0 {
		return nil, ErrWrongStep
	}
	if f != nil && (f.ClientID != app.ID || f.Step == StepDone || f.Step == StepMFA) {
		return nil, ErrWrongStep
	}
	if user.Status != directory.StatusActive {
		return nil, ErrDisabled
	}
	if f != nil && f.Email != user.Email {
		// The flow now knows who signs in (the page of a step-up says
		// where its code went), whatever was typed before.
		next, err := s.store.UpdateSignInFlow(ctx, f.ID, func(stored *persistence.SignInFlow) error {
			if stored.Step != f.Step {
				return ErrWrongStep
			}
			stored.Email = user.Email
			return nil
		})
		if errors.Is(err, persistence.ErrNotFound) {
			return nil, ErrFlowExpired
		}
		if err != nil {
			return nil, err
		}
		f = next
	}
	d, err := s.decide(ctx, app, user, amr, c)
	if err != nil {
		return nil, err
	}
	return s.complete(ctx, f, app, user, amr, challenge, d, guard, c)
}
