package upstream

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/google/uuid"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

const (
	// StateTTL is how long a person has at the upstream provider before
	// the callback is refused.
	StateTTL = 10 * time.Minute
	// LinkTTL is how long a pending link waits for the linking step (the
	// spec's linking token lifetime).
	LinkTTL = 10 * time.Minute
	// AMR is the method reference of a sign-in through an upstream
	// provider. RFC 8176 registers no value for federation; "fed" is the
	// one Microsoft Entra ID and others use for "a federated identity
	// provider authenticated the person".
	AMR = "fed"
	// maxParam bounds what is read of the callback's parameters.
	maxParam = 4096
)

// Reason codes of the sign_in_failed events of upstream sign-ins.
const (
	ReasonInvalidState     = "upstream_invalid_state"     // unknown, used, expired state, or another browser's
	ReasonUpstreamError    = "upstream_error"             // the provider answered an error, or its token did not verify
	ReasonEmailUnverified  = "upstream_email_unverified"  // no bound identity, and the provider does not vouch for the e-mail
	ReasonAccountExists    = "account_exists"             // the e-mail is an account's that is not linked to the provider
	ReasonSignUpNotAllowed = "upstream_sign_up_forbidden" // no account, and the application does not let people sign up
)

// Refusals of an upstream sign-in.
var (
	ErrNotOffered = extensions.NewError(http.StatusNotFound, "unknown_provider",
		"This application offers no sign-in provider of this name.", nil)
	ErrInvalidState = extensions.NewError(http.StatusBadRequest, "expired_token",
		"This sign-in has expired, was already used, or was started in another browser. Go back to the application and start again.", nil)
	ErrUpstream = extensions.NewError(http.StatusBadGateway, "upstream_error",
		"The sign-in provider did not confirm who you are. Try again, or sign in another way.", nil)
	ErrEmailUnverified = extensions.NewError(http.StatusForbidden, "email_not_verified",
		"The sign-in provider has not verified your e-mail address, so it cannot be used to create or find an account here. Verify it there, or sign in another way.", nil)
	ErrNoAccount = extensions.NewError(http.StatusNotFound, "user_not_found",
		"No account uses this e-mail address, and this application does not let new accounts sign up.", nil)
)

// LinkRequiredError is an upstream identity whose verified e-mail is an
// existing account's that is not linked to this provider: no sign-in. The
// identity waits in a pending link (Handle, LinkTTL) that the linking step
// carries (spec, Account linking rule 4).
type LinkRequiredError struct {
	Identities []string // the account's providers
	Handle     string   // the pending link's handle: 256 random bits, kept only as a keyed hash
	Provider   *persistence.IdentityProvider
	Email      string
}

func (e *LinkRequiredError) Error() string { return "account_exists" }

// Target is where an upstream sign-in continues: a hosted flow, or the
// embedded API (the application's RedirectURI, the PKCE CodeChallenge its
// code keeps).
type Target struct {
	Flow          *persistence.SignInFlow
	RedirectURI   string
	CodeChallenge string
}

// Provider reads the provider name for an application: one it offers,
// else ErrNotOffered.
func (s *Service) Provider(ctx context.Context, app *persistence.Client, name string) (*persistence.IdentityProvider, error) {
	if !nameRe.MatchString(name) {
		return nil, ErrNotOffered
	}
	p, err := s.store.GetIdentityProviderByName(ctx, name)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrNotOffered
	}
	if err != nil {
		return nil, err
	}
	if app == nil || !slices.Contains(p.Applications, app.ID) {
		return nil, ErrNotOffered
	}
	return p, nil
}

// oauth2Config is the authorization code flow's client at a provider.
func (s *Service) oauth2Config(p *persistence.IdentityProvider, op *oidc.Provider, secret string) *oauth2.Config {
	return &oauth2.Config{ClientID: p.ClientID, ClientSecret: secret, Endpoint: op.Endpoint(), RedirectURL: s.RedirectURI(), Scopes: p.Scopes}
}

// Begin records a sign-in through p for app, bound to the browser holding
// browserSecret and continuing at t, and answers the provider's
// authorization URL: code flow, PKCE S256, a fresh state and nonce (256
// bits each, kept only as keyed hashes; the verifier sealed).
func (s *Service) Begin(ctx context.Context, p *persistence.IdentityProvider, app *persistence.Client, browserSecret string, t Target) (string, error) {
	if browserSecret == "" || app == nil || !slices.Contains(p.Applications, app.ID) {
		return "", ErrNotOffered
	}
	if f := t.Flow; f != nil && (f.ClientID != app.ID || f.Step == signin.StepDone || f.Step == signin.StepMFA) {
		return "", signin.ErrWrongStep
	}
	op, err := s.discover(ctx, p.Issuer, false)
	if err != nil {
		return "", ErrUpstream
	}
	state, nonce, verifier := oauth.NewSecret(), oauth.NewSecret(), oauth2.GenerateVerifier()
	now := s.now()
	st := &persistence.UpstreamState{
		ID: uuid.NewString(), StateHash: s.hash(s.states, state), NonceHash: s.hash(s.nonces, nonce), ProviderID: p.ID,
		BrowserHash: s.hash(s.browsers, browserSecret), ClientID: app.ID, RedirectURI: t.RedirectURI, CodeChallenge: t.CodeChallenge,
		CreatedAt: now, ExpiresAt: now.Add(StateTTL),
	}
	st.VerifierSealed = s.verifiers.Seal([]byte(verifier), []byte(st.ID))
	opts := []oauth2.AuthCodeOption{oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)}
	if t.Flow != nil {
		st.FlowID = &t.Flow.ID
		if t.Flow.Email != "" {
			opts = append(opts, oauth2.SetAuthURLParam("login_hint", t.Flow.Email))
		}
	}
	if err := s.store.CreateUpstreamState(ctx, st); err != nil {
		return "", err
	}
	return s.oauth2Config(p, op, "").AuthCodeURL(state, opts...), nil
}

func (s *Service) hash(h *oauth.SecretHasher, secret string) []byte {
	d, _ := h.Hash(context.Background(), []byte(secret))
	return d
}

// Callback is what the provider sent back to CallbackPath.
type Callback struct {
	State, Code, Error string
}

// Claims are what identityd reads of a verified ID token.
type Claims struct {
	Subject       string
	Email         string
	EmailVerified bool
	Name          string
}

// Proof is a verified callback: the provider's ID token, for the pending
// sign-in (State) of an application.
type Proof struct {
	State    *persistence.UpstreamState
	Provider *persistence.IdentityProvider
	App      *persistence.Client
	Claims   Claims
}

// Verify takes the callback's state (once: a replay finds it spent) in
// the browser that began it, trades the code at the provider with the
// PKCE verifier, and verifies the ID token (signature, issuer, audience,
// expiry: go-oidc; the nonce: here). A refusal is ErrInvalidState or
// ErrUpstream, recorded; st is the taken state when there is one (the
// caller learns where the sign-in was to continue).
func (s *Service) Verify(ctx context.Context, browserSecret string, cb Callback, c signin.Client) (proof *Proof, st *persistence.UpstreamState, err error) {
	if cb.State == "" || len(cb.State) > maxParam || len(cb.Code) > maxParam || browserSecret == "" {
		return nil, nil, s.refuse(ctx, nil, "", nil, ReasonInvalidState, c, nil, ErrInvalidState)
	}
	st, err = s.store.TakeUpstreamState(ctx, s.hash(s.states, cb.State), s.now())
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil, s.refuse(ctx, nil, "", nil, ReasonInvalidState, c, nil, ErrInvalidState)
	}
	if err != nil {
		return nil, nil, err
	}
	app, err := s.signin.Application(ctx, st.ClientID)
	if err != nil {
		return nil, st, err
	}
	if !hmac.Equal(st.BrowserHash, s.hash(s.browsers, browserSecret)) {
		return nil, st, s.refuse(ctx, app, "", nil, ReasonInvalidState, c, map[string]any{"cause": "another browser"}, ErrInvalidState)
	}
	p, err := s.store.GetIdentityProvider(ctx, st.ProviderID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, st, ErrInvalidState // deleted meanwhile
	}
	if err != nil {
		return nil, st, err
	}
	upstreamFailed := func(cause string) error {
		return s.refuse(ctx, app, p.Name, nil, ReasonUpstreamError, c, map[string]any{"cause": cause}, ErrUpstream)
	}
	if cb.Error != "" || cb.Code == "" {
		return nil, st, upstreamFailed("the provider answered " + extensions.Truncate(cmpOr(cb.Error, "no code"), 64))
	}
	op, err := s.discover(ctx, p.Issuer, false)
	if err != nil {
		return nil, st, upstreamFailed("discovery: " + extensions.Truncate(err.Error(), 200))
	}
	secret, err := s.secrets.Open(p.ClientSecretSealed, []byte(p.ID))
	if err != nil {
		return nil, st, err
	}
	verifier, err := s.verifiers.Open(st.VerifierSealed, []byte(st.ID))
	if err != nil {
		return nil, st, err
	}
	hctx, cancel := context.WithTimeout(context.WithValue(oidc.ClientContext(ctx, s.http), oauth2.HTTPClient, s.http), 15*time.Second)
	defer cancel()
	tok, err := s.oauth2Config(p, op, string(secret)).Exchange(hctx, cb.Code, oauth2.VerifierOption(string(verifier)))
	if err != nil {
		return nil, st, upstreamFailed("token exchange: " + extensions.Truncate(err.Error(), 200))
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return nil, st, upstreamFailed("no id_token in the token response")
	}
	idt, err := op.Verifier(&oidc.Config{ClientID: p.ClientID, Now: s.now}).Verify(hctx, raw)
	if err != nil {
		return nil, st, upstreamFailed("id_token: " + extensions.Truncate(err.Error(), 200))
	}
	if idt.Nonce == "" || !hmac.Equal(s.hash(s.nonces, idt.Nonce), st.NonceHash) {
		return nil, st, upstreamFailed("id_token: nonce does not match")
	}
	var raw2 struct {
		Email         string          `json:"email"`
		EmailVerified json.RawMessage `json:"email_verified"`
		Name          string          `json:"name"`
	}
	if err := idt.Claims(&raw2); err != nil {
		return nil, st, upstreamFailed("id_token claims: " + extensions.Truncate(err.Error(), 200))
	}
	if idt.Subject == "" || len(idt.Subject) > 255 {
		return nil, st, upstreamFailed("id_token: no usable sub")
	}
	claims := Claims{Subject: idt.Subject, Email: strings.TrimSpace(raw2.Email), EmailVerified: verified(raw2.EmailVerified), Name: raw2.Name}
	if !extensions.ValidText(claims.Name) || len([]rune(claims.Name)) > 200 {
		claims.Name = ""
	}
	return &Proof{State: st, Provider: p, App: app, Claims: claims}, st, nil
}

// verified reads email_verified: true, or the string "true" some
// providers send; anything else is false.
func verified(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "true" || s == `"true"`
}

// Resolution is whom a verified callback signs in: a person bound to the
// upstream identity, or a new person (SignUp).
type Resolution struct {
	Proof  *Proof
	User   *persistence.User
	SignUp bool
}

// Resolve decides whom a proof signs in. The upstream identity bound to
// the provider's issuer and subject signs its person in. Without one: an
// e-mail the provider does not vouch for (email_verified not true) is
// refused (ErrEmailUnverified: nothing is created or linked by it); an
// e-mail that is an account's is *LinkRequiredError, with a pending link
// for the linking step; an unknown e-mail signs up when the application
// allows it, else ErrNoAccount. Each refusal is recorded.
func (s *Service) Resolve(ctx context.Context, proof *Proof, c signin.Client) (*Resolution, error) {
	p, app, cl := proof.Provider, proof.App, proof.Claims
	bound, err := s.store.UpstreamIdentity(ctx, p.Name, p.Issuer, cl.Subject)
	switch {
	case err == nil:
		user, err := s.store.GetUser(ctx, bound.UserID)
		if err != nil {
			return nil, err
		}
		if user.Status != directory.StatusActive {
			return nil, s.refuse(ctx, app, p.Name, &user.ID, signin.ReasonDisabled, c, nil, signin.ErrDisabled)
		}
		return &Resolution{Proof: proof, User: user}, nil
	case !errors.Is(err, persistence.ErrNotFound):
		return nil, err
	}
	var v extensions.ValidationError
	directory.CheckEmail(&v, "email", cl.Email)
	if !cl.EmailVerified || cl.Email == "" || v.Err() != nil {
		return nil, s.refuse(ctx, app, p.Name, nil, ReasonEmailUnverified, c, map[string]any{"email": extensions.Truncate(cl.Email, 320)}, ErrEmailUnverified)
	}
	user, err := s.store.GetUserByEmail(ctx, cl.Email)
	switch {
	case errors.Is(err, persistence.ErrNotFound) && app.App.AllowSignUp:
		return &Resolution{Proof: proof, SignUp: true}, nil
	case errors.Is(err, persistence.ErrNotFound):
		return nil, s.refuse(ctx, app, p.Name, nil, ReasonSignUpNotAllowed, c, map[string]any{"email": cl.Email}, ErrNoAccount)
	case err != nil:
		return nil, err
	case user.Status == directory.StatusDisabled:
		return nil, s.refuse(ctx, app, p.Name, &user.ID, signin.ReasonDisabled, c, nil, signin.ErrDisabled)
	}
	return nil, s.pendingLink(ctx, proof, user, c)
}

// pendingLink records the upstream identity for the linking step and
// answers *LinkRequiredError with its handle.
func (s *Service) pendingLink(ctx context.Context, proof *Proof, user *persistence.User, c signin.Client) error {
	ids, err := s.store.UserIdentities(ctx, user.ID)
	if err != nil {
		return err
	}
	names := []string{}
	for _, id := range ids {
		if !slices.Contains(names, id.Provider) {
			names = append(names, id.Provider)
		}
	}
	now := s.now()
	handle := oauth.NewSecret()
	p := proof.Provider
	l := &persistence.UpstreamLink{
		ID: uuid.NewString(), HandleHash: s.LinkHandleHash(handle), UserID: user.ID, Provider: p.Name, ProviderID: p.ID,
		Issuer: p.Issuer, Subject: proof.Claims.Subject, Email: proof.Claims.Email, EmailVerified: proof.Claims.EmailVerified,
		ClientID: proof.App.ID, CreatedAt: now, ExpiresAt: now.Add(LinkTTL),
	}
	if err := s.store.CreateUpstreamLink(ctx, l, s.event(persistence.EventSignInFailed, &user.ID, proof.App, ReasonAccountExists, c,
		map[string]any{"provider": p.Name, "email": proof.Claims.Email, "linkPending": l.ID})); err != nil {
		return err
	}
	return &LinkRequiredError{Identities: names, Handle: handle, Provider: p, Email: user.Email}
}

// LinkHandleHash is the keyed hash a pending link is found by (its
// handle's): what the linking step looks a handle up with
// (persistence.Store.UpstreamLinkByHash).
func (s *Service) LinkHandleHash(handle string) []byte { return s.hash(s.handles, handle) }

// Complete signs in whom r resolved: the session, events and risk of every
// sign-in (signin.Service.Proven), with amr [AMR]; a sign-up first creates
// the person (active, the e-mail verified by the provider) and binds the
// upstream identity, in the same unit of work. f is the hosted flow (nil:
// the embedded API, whose code keeps challenge).
func (s *Service) Complete(ctx context.Context, r *Resolution, f *persistence.SignInFlow, challenge string, c signin.Client) (*signin.Result, error) {
	amr := []string{AMR}
	if !r.SignUp {
		return s.signin.Proven(ctx, f, r.Proof.App, r.User, amr, challenge, c)
	}
	var res *signin.Result
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		user, err := s.signUp(ctx, r.Proof, c)
		if err != nil {
			return err
		}
		res, err = s.signin.Proven(ctx, f, r.Proof.App, user, amr, challenge, c)
		return err
	})
	if errors.Is(err, persistence.ErrDuplicate) {
		// The address or the upstream identity was taken meanwhile (two
		// first sign-ins at once): the person goes back and signs in
		// again, and is then found.
		return nil, ErrInvalidState
	}
	return res, err
}

// signUp creates the person of a first upstream sign-in, bound to the
// upstream identity.
func (s *Service) signUp(ctx context.Context, proof *Proof, c signin.Client) (*persistence.User, error) {
	now := s.now()
	p, app, cl := proof.Provider, proof.App, proof.Claims
	u := &persistence.User{
		ID: uuid.Must(uuid.NewV7()).String(), Email: cl.Email, EmailVerified: true, Name: cl.Name, Status: directory.StatusActive,
		Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now,
	}
	actor := persistence.Actor{Subject: u.ID, ClientID: app.ID}
	if err := s.store.CreateUser(ctx, u, directory.Event(directory.UserCreated, actor, now, u.ID, "",
		map[string]any{"email": u.Email, "via": "sign-up", "provider": p.Name, "applicationId": app.RecordID})); err != nil {
		return nil, err
	}
	if err := s.store.AddIdentity(ctx, persistence.Identity{UserID: u.ID, Provider: p.Name, Issuer: p.Issuer, Subject: cl.Subject, CreatedAt: now}); err != nil {
		return nil, err
	}
	return u, s.store.AppendAuthEvents(ctx, s.event(persistence.EventUserSignedUp, &u.ID, app, "", c, map[string]any{"provider": p.Name}))
}

// refuse records a refused upstream sign-in and answers refusal.
func (s *Service) refuse(ctx context.Context, app *persistence.Client, provider string, userID *string, reason string, c signin.Client,
	data map[string]any, refusal error) error {
	if data == nil {
		data = map[string]any{}
	}
	data["method"] = AMR
	if provider != "" {
		data["provider"] = provider
	}
	if err := s.store.AppendAuthEvents(ctx, s.event(persistence.EventSignInFailed, userID, app, reason, c, data)); err != nil {
		return err
	}
	return refusal
}

func (s *Service) event(typ string, userID *string, app *persistence.Client, reason string, c signin.Client, data map[string]any) persistence.AuthEvent {
	e := persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: typ, UserID: userID, Reason: reason, IP: c.IP, UserAgent: c.UserAgent,
		Data: data, CreatedAt: s.now()}
	if app != nil {
		id := app.RecordID
		e.ApplicationID, e.ClientID = &id, app.ID
	}
	return e
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Methods are the providers (names) a person of email may sign in through
// in app, for check-email: of the providers the application offers, those
// the person has an identity with; for an unknown address (exists false),
// all of them when the application lets people sign up (a first sign-in
// through one creates the account), else none. A disabled person has none.
func (s *Service) Methods(ctx context.Context, app *persistence.Client, email string, exists bool) ([]string, error) {
	offered, err := s.store.IdentityProvidersOf(ctx, app.ID)
	if err != nil || len(offered) == 0 {
		return nil, err
	}
	var out []string
	if !exists {
		if app.App.AllowSignUp {
			for _, p := range offered {
				out = append(out, p.Name)
			}
		}
		return out, nil
	}
	user, err := s.store.GetUserByEmail(ctx, strings.TrimSpace(email))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if user.Status == directory.StatusDisabled {
		return nil, nil
	}
	ids, err := s.store.UserIdentities(ctx, user.ID)
	if err != nil {
		return nil, err
	}
	for _, p := range offered {
		if slices.ContainsFunc(ids, func(id persistence.Identity) bool { return id.Provider == p.Name && id.Issuer == p.Issuer }) {
			out = append(out, p.Name)
		}
	}
	return out, nil
}

// ErrLinkExpired refuses a pending link that is unknown, used or older
// than LinkTTL.
var ErrLinkExpired = extensions.NewError(http.StatusBadRequest, "expired_token",
	"This sign-in has expired or was already linked. Sign in with the provider again.", nil)

// PendingLink reads the pending link of a handle (the hosted form's
// `pending`, the embedded 409's `pendingLink`) while it can be used:
// unknown, used or expired is ErrLinkExpired. Reading does not spend it:
// the linking step spends it with the link (signin.VerifyLink).
func (s *Service) PendingLink(ctx context.Context, handle string) (*persistence.UpstreamLink, error) {
	if handle == "" || len(handle) > maxParam {
		return nil, ErrLinkExpired
	}
	l, err := s.store.UpstreamLinkByHash(ctx, s.LinkHandleHash(handle))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, ErrLinkExpired
	}
	if err != nil {
		return nil, err
	}
	if l.UsedAt != nil || !s.now().Before(l.ExpiresAt) {
		return nil, ErrLinkExpired
	}
	return l, nil
}
