package handlers

import (
	"context"
	"errors"
	"net/http"
	"slices"

	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/persistence"
)

// Passkeys on the hosted page (issue 14): the e-mail step offers "Sign in
// with a passkey" and the browser's passkeys in the e-mail field's
// autofill; the second-factor step offers "Use a passkey" when the
// step-up takes one. The page's script (pages/web/passkey.js) asks
// signinPasskeyOptionsPath for a ceremony with the flow's form (flow,
// csrf_token) and posts the browser's credential, as JSON in the field
// credential, to signinPasskeyPath, which ends the step as every other
// form does: signed in and back to the application, or on to the
// second-factor step (never after a passkey that verified its person: it
// is two factors). The ceremonies run on identityd's origin, under the
// application's rpId (passkeys.Where{Hosted: true}).
const (
	signinPasskeyOptionsPath = signinPath + "/passkey/options"
	signinPasskeyPath        = signinPath + "/passkey"
)

// passkeyPage is the passkey button of the flow's step (up: its step-up,
// on the second-factor step), with problem, a refused passkey, beside it;
// nil where none is offered.
func (a *api) passkeyPage(app *persistence.Client, f *persistence.SignInFlow, up *signin.StepUp, problem string) *pages.Passkey {
	if a.passkeys == nil {
		return nil
	}
	p := &pages.Passkey{Options: signinPasskeyOptionsPath, Action: signinPasskeyPath, Error: problem}
	switch {
	case f.Step == signin.StepEmail && a.passkeys.Offered(app, true):
		p.Label, p.Conditional = "Sign in with a passkey", true
	case f.Step == signin.StepMFA && up != nil && slices.Contains(up.Factors, signin.FactorPasskey) && a.passkeys.AsFactor(app, true):
		p.Label = "Use a passkey"
		p.Only = !slices.ContainsFunc(up.Factors, func(f string) bool { return f != signin.FactorPasskey })
	default:
		return nil
	}
	return p
}

// mfaMessage is the second-factor step's lead: what it asks for.
func mfaMessage(f *persistence.SignInFlow, up *signin.StepUp, passkey *pages.Passkey) string {
	switch {
	case passkey != nil && passkey.Only:
		return "Confirm it is you with one of your passkeys."
	case slices.Contains(up.Factors, signin.FactorTOTP) && passkey != nil:
		return "Use one of your passkeys, or enter the 6-digit code from your authenticator app or one of your recovery codes."
	case slices.Contains(up.Factors, signin.FactorTOTP):
		return "Enter the 6-digit code from your authenticator app, or one of your recovery codes."
	}
	return "We have emailed a 6-digit code to " + f.Email + ". It works for 10 minutes."
}

// errNoPasskeyHere refuses a passkey ceremony the flow's step does not
// offer.
var errNoPasskeyHere = newError(http.StatusBadRequest, "invalid_request", "This step does not take a passkey.", nil)

// passkeyStep is the ceremony the flow's step runs: a first factor (up
// nil) before the second-factor step, the step-up's second factor on it.
func (a *api) passkeyStep(ctx context.Context, f *persistence.SignInFlow, app *persistence.Client) (passkeys.Where, *signin.StepUp, error) {
	where := passkeys.Where{Hosted: true}
	switch f.Step {
	case signin.StepDone:
		return where, nil, signin.ErrWrongStep
	case signin.StepMFA:
		up, err := a.signin.FlowStepUp(ctx, f)
		if err != nil {
			return where, nil, err
		}
		if a.passkeyPage(app, f, up, "") == nil {
			return where, nil, errNoPasskeyHere
		}
		where.StepUp = up.Pending.ID
		return where, up, nil
	}
	if !a.passkeys.Offered(app, true) {
		return where, nil, errNoPasskeyHere
	}
	return where, nil, nil
}

// POST /signin/passkey/options (flow, csrf_token): the options of a new
// ceremony for the flow's step, as JSON {"options": {"publicKey": …}}:
// discoverable (any passkey of the rpId the browser holds) for a first
// factor, the step-up person's passkeys for a second. Refusals are the
// pages' (HTML, with their status): the script reads the status only.
func (a *api) signinPasskeyOptions(w http.ResponseWriter, r *http.Request) {
	f, app, _, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	where, up, err := a.passkeyStep(ctx, f, app)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	stepUser := ""
	if up != nil {
		stepUser = up.Pending.UserID
	}
	options, err := a.passkeys.BeginAuthentication(ctx, app, "", where, stepUser)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	pages.SetHeaders(w.Header())
	writeJSON(w, http.StatusOK, map[string]any{"options": options})
}

// POST /signin/passkey (flow, csrf_token, credential): the browser's
// assertion verified and the step ended with it, as every step ends. A
// refused passkey is said on the step's page ("The passkey could not be
// verified.", nothing more: spec, Errors 9) and counts as a wrong
// password does: against the address and the person the credential
// belongs to, whose spent budget refuses only addresses that have failed.
func (a *api) signinPasskey(w http.ResponseWriter, r *http.Request) {
	f, app, browser, ok := a.pageStep(w, r)
	if !ok {
		return
	}
	if a.signinFailures.refusedAs(w, r, "", a.tooManyAttempts) {
		return
	}
	ctx := r.Context()
	where, up, err := a.passkeyStep(ctx, f, app)
	if err != nil {
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	var limited *limiter.Context
	where.Admit = func(user *persistence.User) error {
		if a.signinFailures.refusedAs(w, r, limitKey("user", user.ID), func(_ http.ResponseWriter, _ *http.Request, c limiter.Context) { limited = &c }) {
			return errPasskeyLimited
		}
		return nil
	}
	v, err := a.passkeys.FinishAuthentication(ctx, app, []byte(r.PostForm.Get("credential")), where, passkeyOrigins(r, app))
	var failure *passkeys.Failure
	switch {
	case limited != nil:
		a.tooManyAttempts(w, r, *limited)
		return
	case errors.As(err, &failure):
		logger(r).InfoContext(ctx, "passkey verification failed", "reason", failure.Reason, "detail", failure.Detail)
		claimed := ""
		if failure.UserID != "" {
			claimed = limitKey("user", failure.UserID)
		}
		a.signinFailures.failedAs(r, claimed)
		a.renderStepPage(w, r, http.StatusBadRequest, f, app, browser, "", passkeys.ErrFailed.Message)
		return
	case err != nil:
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	var res *signin.Result
	if up != nil {
		res, err = a.signin.PasskeyStepUp(ctx, up, f, app, v.User.ID, v.AMR, v.Use, a.browserClient(r))
	} else {
		res, err = a.signin.PasskeySignIn(ctx, f, app, v.User, v.AMR, "", v.Use, a.browserClient(r))
	}
	if errors.Is(err, persistence.ErrPasskeyUseLost) { // another assertion moved the counter first
		a.signinFailures.failedAs(r, limitKey("user", v.User.ID))
		if err = a.passkeys.Lost(ctx, v, passkeyOrigins(r, app)); errors.As(err, &failure) {
			logger(r).InfoContext(ctx, "passkey verification failed", "reason", failure.Reason, "detail", failure.Detail)
			a.renderStepPage(w, r, http.StatusBadRequest, f, app, browser, "", passkeys.ErrFailed.Message)
			return
		}
	}
	switch {
	case errors.Is(err, signin.ErrDisabled):
		a.renderStep(w, r, http.StatusForbidden, f, app, browser, signin.ErrDisabled.Message)
		return
	case err != nil:
		a.pageError(w, r, "Sign-in failed", err)
		return
	}
	a.signedIn(w, r, f, res)
}

// errPasskeyLimited ends an assertion whose person's failure budget is
// spent (signinPasskey answers the 429 page).
var errPasskeyLimited = errors.New("the person's sign-in failures are spent")
