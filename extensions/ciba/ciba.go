// Package ciba is people's delegation to agents through OpenID Connect
// Client-Initiated Backchannel Authentication (CIBA Core 1.0), poll mode
// (issue 16): a user-delegated agent asks a person, the person decides on
// a hosted page, the agent polls for a token that speaks for the person
// (sub) with the agent acting (act). Every step is on the agent's audit
// trail and in the person's auth event log, in the transaction that makes
// it. No HTTP here (handlers/ciba.go); the token grant is oauth/ciba.go.
package ciba

import (
	"cmp"
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateDelegation(ctx context.Context, d *persistence.Delegation, audit []persistence.AuditEntry, events ...persistence.AuthEvent) error
	GetDelegation(ctx context.Context, id string) (*persistence.Delegation, error)
	DelegationByHash(ctx context.Context, hash []byte) (*persistence.Delegation, error)
	UpdateDelegation(ctx context.Context, id string, fn func(*persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error)) (*persistence.Delegation, error)
	ListDelegations(ctx context.Context, f persistence.DelegationFilter, p persistence.Page, now time.Time) ([]persistence.Delegation, int, error)
	OpenDelegations(ctx context.Context, f persistence.DelegationFilter) ([]string, error)
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
	AfterCommit(ctx context.Context, fn func())
	QueueMail(ctx context.Context, m *persistence.Mail) error
}

// Bounds and defaults (docs/decisions.md, "CIBA delegation").
const (
	DefaultExpiry     = 600  // seconds a request waits for the person, unless requested_expiry says
	MinExpiry         = 1    // requested_expiry bounds (CIBA Core §7.1: a positive integer)
	MaxExpiry         = 3600 // as a HITL request's timeout
	Interval          = 5    // seconds between polls (CIBA Core §7.3's default)
	SlowDownStep      = 5    // what slow_down adds to the interval (RFC 8628 §3.5)
	MaxBindingMessage = 100  // characters
	MaxScopes         = 20
	MaxReason         = 1000
	authReqIDLength   = 43 // oauth.NewSecret: 256 bits, base64url
)

// Audit actions on the agent's trail, and auth event types of the person's log.
const (
	ActionRequested = "delegation_requested"
	ActionApproved  = "delegation_approved"
	ActionDenied    = "delegation_denied"
	ActionExpired   = "delegation_expired"
	ActionRedeemed  = "delegation_redeemed"
	ActionRevoked   = "delegation_revoked"
)

// PurposeAuthReqID is the HKDF label of the auth_req_id hash key.
const PurposeAuthReqID = "ciba auth_req_id"

// ConsentPath is the hosted page where the person decides: ConsentPath + id.
const ConsentPath = "/delegations/consent/"

// Refusals of the API routes and the page.
var (
	ErrAlreadyDecided = extensions.Conflict("already_decided", "The request has been decided already.", nil)
	ErrRequestExpired = extensions.Conflict("request_expired", "The request lapsed before this decision.", nil)
	ErrNotRevocable   = extensions.Conflict("delegation_not_active", "Only a pending or active delegation can be revoked.", nil)
	ErrNotYours       = extensions.NewError(http.StatusForbidden, "not_delegator", "Only the person asked may decide this request.", nil)
	ErrLifetime       = extensions.NewError(http.StatusBadRequest, "invalid_request", "Choose one of the lifetimes offered.", nil)
)

// ShorterLifetimes are what a person may approve a delegation for instead
// of the lifetime asked, each offered when shorter than it: round
// durations, so that the choice reads at a glance.
var ShorterLifetimes = []time.Duration{30 * 24 * time.Hour, 7 * 24 * time.Hour, 24 * time.Hour, time.Hour, 15 * time.Minute}

// Choice is a lifetime a delegation may be approved for.
type Choice struct {
	Seconds int
	Words   string // "7 days"
	Asked   bool   // the lifetime the agent asked
}

// LifetimeChoices lists what d may be approved for: the lifetime asked,
// then the shorter ones, longest first.
func LifetimeChoices(d *persistence.Delegation) []Choice {
	out := []Choice{{Seconds: d.LifetimeSeconds, Words: duration(time.Duration(d.LifetimeSeconds) * time.Second), Asked: true}}
	for _, l := range ShorterLifetimes {
		if n := int(l / time.Second); n < d.LifetimeSeconds {
			out = append(out, Choice{Seconds: n, Words: duration(l)})
		}
	}
	return out
}

// CIBA's backchannel errors (CIBA Core §13) that RFC 6749 lacks.
var (
	errUnknownUser = &fosite.RFC6749Error{ErrorField: "unknown_user_id", CodeField: http.StatusBadRequest,
		DescriptionField: "The login_hint names no person who can be asked."}
	errBindingMessage = &fosite.RFC6749Error{ErrorField: "invalid_binding_message", CodeField: http.StatusBadRequest,
		DescriptionField: "The binding_message is not acceptable."}
)

// Config is what the service needs beside its store.
type Config struct {
	Hasher  *oauth.SecretHasher // auth_req_id hashes (oauth.NewHasher(secret, PurposeAuthReqID))
	Details oauth.DetailsPolicy // authorization_details, checked as at the token endpoint; nil refuses them
	// DefaultLifetime is how long an approved delegation lasts when the
	// agent names no delegation_expires_in (the access-token lifetime);
	// MaxLifetime the most it may ask (IDENTITYD_DELEGATION_MAX_TTL).
	DefaultLifetime time.Duration
	MaxLifetime     time.Duration
}

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	cfg    Config
	now    func() time.Time
	outbox *mail.Outbox // nil: people are not e-mailed (Notify)
	issuer string
}

// Notify makes the service e-mail the people asked through outbox, with
// links to the consent page under issuer. Call it before serving.
func (s *Service) Notify(outbox *mail.Outbox, issuer string) { s.outbox, s.issuer = outbox, issuer }

// New returns a Service.
func New(store Store, cfg Config) *Service {
	return &Service{store: store, cfg: cfg, now: extensions.Now}
}

var _ oauth.Backchannel = (*Service)(nil)

// Status is a delegation's status at now: pending or active past its end
// has expired, to the instant, whether or not that has been written.
func Status(d *persistence.Delegation, now time.Time) string {
	if (d.Status == persistence.DelegationPending || d.Status == persistence.DelegationActive) && !now.Before(d.ExpiresAt) {
		return persistence.DelegationExpired
	}
	return d.Status
}

// ReadScope tells whether a scope only reads: a person's identity claims
// (openid, profile, email, roles) or a catalog scope ending in ":read".
func ReadScope(s string) bool {
	return s == oauth.ScopeOpenID || s == oauth.ScopeProfile || s == oauth.ScopeEmail || s == oauth.ScopeRoles || strings.HasSuffix(s, ":read")
}

// Delegable tells whether a person may delegate scope s to agent client:
// the person's own claims (what their applications allow, without
// offline_access: a refresh token comes with a long delegation, not with
// a scope), and catalog scopes the agent holds itself, never admin,
// agents:*, tokens:introspect or delegations:* (a delegation does not
// manage identityd or other delegations).
func Delegable(client *persistence.Client, s string) bool {
	if slices.Contains(persistence.ApplicationScopes, s) {
		return s != oauth.ScopeOfflineAccess
	}
	if s == oauth.ScopeAdmin || s == oauth.ScopeIntrospect || strings.HasPrefix(s, "agents:") || strings.HasPrefix(s, "delegations:") {
		return false
	}
	return slices.Contains(client.Scopes, s)
}

// MayAsk decides who may ask for a delegation (CIBA Core §13
// unauthorized_client otherwise): a user-delegated agent holding the
// delegate capability at trust registered or above.
func MayAsk(client *persistence.Client) error {
	switch {
	case client.Agent == nil || !client.GetGrantTypes().Has(oauth.GrantCIBA):
		return fosite.ErrUnauthorizedClient.WithHint("Only user-delegated agents may ask people for a delegation.")
	case !slices.Contains(client.Agent.Capabilities, agents.Delegate):
		return fosite.ErrUnauthorizedClient.WithHint("The agent lacks the delegate capability.")
	case !agents.AtLeast(client.Agent.TrustLevel, agents.Registered):
		return fosite.ErrUnauthorizedClient.WithHint("A sandboxed agent may not ask for a delegation.")
	}
	return nil
}

// Request is a backchannel authentication request's parameters.
type Request struct {
	Scope          string
	LoginHint      string
	BindingMessage string
	Details        string          // authorization_details, its JSON text
	RequestedExp   string          // requested_expiry, as sent: how long the request waits for the person
	Lifetime       string          // delegation_expires_in, as sent: how long the delegation lasts once approved
	Other          map[string]bool // other parameters sent (the unsupported ones are refused)
	AgentName      string          // the agent's display name, for the e-mail
}

// Asked is the answer to a backchannel request (CIBA Core §7.3).
type Asked struct {
	Delegation *persistence.Delegation
	AuthReqID  string
	ExpiresIn  int
	Interval   int
	Lifetime   int // seconds the delegation will last once approved
}

// Ask checks a backchannel request of client, records the pending
// delegation and e-mails the person, in one transaction. Refusals are
// RFC 6749 / CIBA Core §13 errors.
func (s *Service) Ask(ctx context.Context, client *persistence.Client, in Request) (*Asked, error) {
	if err := MayAsk(client); err != nil {
		return nil, err
	}
	for _, p := range []string{"login_hint_token", "id_token_hint", "user_code", "request", "client_notification_token"} {
		if in.Other[p] {
			return nil, fosite.ErrInvalidRequest.WithHintf("The parameter '%s' is not supported: poll mode with login_hint only.", p)
		}
	}
	scopes := fosite.RemoveEmpty(strings.Split(in.Scope, " "))
	if len(scopes) == 0 {
		return nil, fosite.ErrInvalidRequest.WithHint("The 'scope' parameter is required (CIBA Core section 7.1).")
	}
	scopes = extensions.Distinct(scopes)
	if len(scopes) > MaxScopes {
		return nil, fosite.ErrInvalidScope.WithHintf("At most %d scopes.", MaxScopes)
	}
	writes := !agents.AtLeast(client.Agent.TrustLevel, agents.Verified)
	for _, sc := range scopes {
		if !Delegable(client, sc) {
			return nil, fosite.ErrInvalidScope.WithHint(oauth.DescriptionText("The scope '" + sc + "' cannot be delegated to this agent."))
		}
		if writes && !ReadScope(sc) {
			return nil, fosite.ErrInvalidScope.WithHint(oauth.DescriptionText("A registered agent may be delegated read scopes only, not '" + sc + "'."))
		}
	}
	if in.LoginHint == "" {
		return nil, fosite.ErrInvalidRequest.WithHint("The 'login_hint' parameter (an e-mail address or user id) is required.")
	}
	if !extensions.ValidText(in.BindingMessage) || len([]rune(in.BindingMessage)) > MaxBindingMessage ||
		strings.IndexFunc(in.BindingMessage, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return nil, errBindingMessage.WithHintf("At most %d characters of text, on one line.", MaxBindingMessage)
	}
	expiry := DefaultExpiry
	if in.RequestedExp != "" {
		n, err := strconv.Atoi(in.RequestedExp)
		if err != nil || n < MinExpiry || n > MaxExpiry {
			return nil, fosite.ErrInvalidRequest.WithHintf("requested_expiry must be a whole number of seconds from %d to %d.", MinExpiry, MaxExpiry)
		}
		expiry = n
	}
	lifetime, err := s.lifetime(in.Lifetime)
	if err != nil {
		return nil, err
	}
	var detailsText *string
	var entries []any
	if in.Details != "" {
		var err error
		if entries, err = s.details(ctx, client, in.Details); err != nil {
			return nil, err
		}
		b, err := json.Marshal(entries)
		if err != nil {
			return nil, err
		}
		text := string(b)
		detailsText = &text
	}
	user, err := s.person(ctx, in.LoginHint)
	if err != nil {
		return nil, err
	}
	now := s.now()
	id := oauth.NewSecret()
	hash, _ := s.cfg.Hasher.Hash(ctx, []byte(id))
	d := &persistence.Delegation{
		ID: uuid.Must(uuid.NewV7()).String(), AgentID: client.RecordID, ClientID: client.ID, UserID: user.ID, Scopes: scopes,
		AuthorizationDetails: detailsText, BindingMessage: in.BindingMessage, Status: persistence.DelegationPending, AuthReqHash: hash,
		PollInterval: Interval, LifetimeSeconds: lifetime, CreatedAt: now, ExpiresAt: now.Add(time.Duration(expiry) * time.Second),
	}
	actor := persistence.Actor{Subject: client.ID, ClientID: client.ID, AgentID: client.RecordID}
	facts := map[string]any{"expiresAt": d.ExpiresAt, "bindingMessage": d.BindingMessage, "lifetimeSeconds": lifetime}
	err = s.store.InTx(ctx, func(ctx context.Context) error {
		if err := s.store.CreateDelegation(ctx, d, []persistence.AuditEntry{s.entry(d, actor, ActionRequested, now, facts)},
			s.event(d, actor, ActionRequested, now, facts)); err != nil {
			return err
		}
		return s.notify(ctx, d, user, client, cmp.Or(in.AgentName, client.ID))
	})
	if err != nil {
		return nil, err
	}
	return &Asked{Delegation: d, AuthReqID: id, ExpiresIn: expiry, Interval: Interval, Lifetime: lifetime}, nil
}

// lifetime reads delegation_expires_in, identityd's extension of the
// backchannel request: how long the delegation lasts once approved, in
// seconds, from 1 to the server's maximum; the default when not sent.
// CIBA's requested_expiry is the auth_req_id's lifetime (CIBA Core §7.1),
// not the delegation's, hence a parameter of its own; one above the
// maximum is refused rather than shortened, so that no agent believes it
// holds what it does not.
func (s *Service) lifetime(text string) (int, error) {
	most := int(s.cfg.MaxLifetime / time.Second)
	if text == "" {
		return min(int(s.cfg.DefaultLifetime/time.Second), most), nil
	}
	n, err := strconv.Atoi(text)
	if err != nil || n < 1 || n > most {
		return 0, fosite.ErrInvalidRequest.WithHintf("delegation_expires_in must be a whole number of seconds from 1 to %d.", most)
	}
	return n, nil
}

// details checks authorization_details as the token endpoint would for
// client, and a registered agent's entries as read-only; a HITL approval
// cannot be delegated.
func (s *Service) details(ctx context.Context, client *persistence.Client, text string) ([]any, error) {
	if s.cfg.Details == nil {
		return nil, oauth.InvalidDetails("No authorization details types are registered.")
	}
	if strings.Contains(text, oauth.TypeHITLApproval) {
		return nil, oauth.InvalidDetails("A hitl_approval entry cannot be delegated.")
	}
	entries, conds, err := s.cfg.Details.Grant(ctx, client, text)
	if err != nil {
		return nil, err
	}
	if !agents.AtLeast(client.Agent.TrustLevel, agents.Verified) {
		for i, c := range conds {
			if c.Writes {
				return nil, oauth.InvalidDetails("authorization_details[" + strconv.Itoa(i) + "]: a registered agent may be delegated read-only actions only.")
			}
		}
	}
	return entries, nil
}

// person is whom login_hint names: an e-mail address or a user id, of an
// active person.
func (s *Service) person(ctx context.Context, hint string) (*persistence.User, error) {
	if !extensions.ValidText(hint) || len(hint) > 320 {
		return nil, errUnknownUser
	}
	var u *persistence.User
	var err error
	switch {
	case strings.Contains(hint, "@"):
		u, err = s.store.GetUserByEmail(ctx, hint)
	case uuid.Validate(hint) == nil:
		u, err = s.store.GetUser(ctx, hint)
	default:
		return nil, errUnknownUser
	}
	if errors.Is(err, persistence.ErrNotFound) || (err == nil && u.Status != "active") {
		return nil, errUnknownUser
	}
	return u, err
}

// Poll implements oauth.Backchannel: it runs in the token request's unit
// of work, whose refusals (but not the poll answers, oauth.PollAnswer)
// roll back, so a redemption is spent only with its token, and of two
// concurrent polls of one approval one gets the token (row lock).
func (s *Service) Poll(ctx context.Context, client *persistence.Client, authReqID string) (*oauth.DelegatedGrant, error) {
	invalid := fosite.ErrInvalidGrant.WithHint("The auth_req_id is not valid for this client.")
	if len(authReqID) != authReqIDLength {
		return nil, invalid
	}
	hash, _ := s.cfg.Hasher.Hash(ctx, []byte(authReqID))
	d, err := s.store.DelegationByHash(ctx, hash)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, invalid
	} else if err != nil {
		return nil, err
	}
	// The lookup found the row by its hash; compare once more in constant time.
	if !hmac.Equal(d.AuthReqHash, hash) || d.ClientID != client.ID {
		return nil, invalid
	}
	var answer error
	actor := persistence.Actor{Subject: client.ID, ClientID: client.ID, AgentID: client.RecordID}
	d, err = s.store.UpdateDelegation(ctx, d.ID, func(d *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
		now := s.now()
		if d.RedeemedAt != nil {
			return nil, nil, invalid.WithHint("The auth_req_id has been used already.")
		}
		if audit, events := s.lapse(d, now); audit != nil {
			answer = oauth.ErrExpiredToken
			return audit, events, nil
		}
		last := d.LastPollAt
		d.LastPollAt = &now
		switch d.Status {
		case persistence.DelegationPending:
			answer = oauth.ErrAuthorizationPending
			if last != nil && now.Sub(*last) < time.Duration(d.PollInterval)*time.Second {
				d.PollInterval += SlowDownStep // RFC 8628 §3.5, which CIBA Core §11 follows
				answer = oauth.ErrSlowDown.WithHintf("Poll at most every %d seconds.", d.PollInterval)
			}
		case persistence.DelegationDenied, persistence.DelegationRevoked:
			answer = oauth.ErrCIBAAccessDenied
		case persistence.DelegationExpired:
			answer = oauth.ErrExpiredToken
		case persistence.DelegationActive:
			d.RedeemedAt = &now
			return []persistence.AuditEntry{s.entry(d, actor, ActionRedeemed, now, map[string]any{"expiresAt": d.ExpiresAt})}, nil, nil
		}
		return nil, nil, nil
	})
	if err != nil {
		return nil, err
	}
	if answer != nil {
		return nil, answer
	}
	g := &oauth.DelegatedGrant{DelegationID: d.ID, UserID: d.UserID, Scopes: d.Scopes, ExpiresAt: d.ExpiresAt, AuthTime: *d.DecidedAt}
	if d.AuthorizationDetails != nil {
		// Checked again as the agent is now: a ceiling it lost since
		// refuses the token (and, rolled back, spends nothing).
		if g.Details, g.Conditions, err = s.cfg.Details.Grant(ctx, client, *d.AuthorizationDetails); err != nil {
			return nil, err
		}
	}
	// The scopes narrow to what the agent still holds, as a refresh and
	// every use of its tokens narrow them; none left refuses the token
	// (RFC 6749 §5.1: the answer's scope then says what was granted).
	g.Scopes = slices.DeleteFunc(slices.Clone(d.Scopes), func(sc string) bool { return !Delegable(client, sc) })
	if len(g.Scopes) == 0 {
		return nil, fosite.ErrInvalidGrant.WithHint("The agent no longer holds any scope the delegation grants.")
	}
	return g, nil
}

// lapse writes a due expiry on d (locked): a pending request or an active
// delegation past its end becomes expired, dated at its end.
func (s *Service) lapse(d *persistence.Delegation, now time.Time) ([]persistence.AuditEntry, []persistence.AuthEvent) {
	if Status(d, now) != persistence.DelegationExpired || d.Status == persistence.DelegationExpired {
		return nil, nil
	}
	was := d.Status
	d.Status = persistence.DelegationExpired
	facts := map[string]any{"was": was}
	return []persistence.AuditEntry{s.entry(d, persistence.Actor{}, ActionExpired, d.ExpiresAt, facts)},
		[]persistence.AuthEvent{s.event(d, persistence.Actor{}, ActionExpired, d.ExpiresAt, facts)}
}

// Get reads one delegation as stored, whoever's (callers decide who may see it).
func (s *Service) Get(ctx context.Context, id string) (*persistence.Delegation, error) {
	return s.store.GetDelegation(ctx, id)
}

// Decider is the person who decides, signed in on the hosted page.
type Decider struct {
	UserID    string
	SessionID string
}

func (who Decider) actor() persistence.Actor {
	return persistence.Actor{Subject: who.UserID, SessionID: who.SessionID}
}

// Decide approves or denies a pending request; only the person asked may.
// Under the row lock a second decision is 409 already_decided and one
// after the request lapsed 409 request_expired. An approval starts the
// delegation's lifetime: lifetime seconds, one of LifetimeChoices (0: the
// lifetime asked; another is ErrLifetime).
func (s *Service) Decide(ctx context.Context, who Decider, id string, approve bool, lifetime int) (*persistence.Delegation, error) {
	d, err := s.store.GetDelegation(ctx, id)
	if err != nil {
		return nil, err
	}
	if d.UserID != who.UserID {
		return nil, ErrNotYours
	}
	if lifetime == 0 {
		lifetime = d.LifetimeSeconds
	}
	if !slices.ContainsFunc(LifetimeChoices(d), func(c Choice) bool { return c.Seconds == lifetime }) {
		return nil, ErrLifetime
	}
	var refusal error
	d, err = s.store.UpdateDelegation(ctx, id, func(d *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
		now := s.now()
		if audit, events := s.lapse(d, now); audit != nil || d.Status == persistence.DelegationExpired {
			refusal = ErrRequestExpired.With(map[string]any{"status": persistence.DelegationExpired})
			return audit, events, nil // the lapse is written; the decision is refused
		}
		if d.Status != persistence.DelegationPending {
			return nil, nil, ErrAlreadyDecided.With(map[string]any{"status": d.Status})
		}
		action := ActionDenied
		d.Status = persistence.DelegationDenied
		facts := map[string]any{"scopes": []string(d.Scopes)}
		if approve {
			action, d.Status = ActionApproved, persistence.DelegationActive
			if lifetime != d.LifetimeSeconds {
				facts["lifetimeAsked"], d.LifetimeSeconds = d.LifetimeSeconds, lifetime
			}
			d.ExpiresAt = now.Add(time.Duration(d.LifetimeSeconds) * time.Second)
		}
		d.DecidedAt, d.DecidedBy = &now, who.actor()
		facts["expiresAt"] = d.ExpiresAt
		return []persistence.AuditEntry{s.entry(d, who.actor(), action, now, facts)}, []persistence.AuthEvent{s.event(d, who.actor(), action, now, facts)}, nil
	})
	if err != nil {
		return nil, err
	}
	return d, refusal
}

// Revoke ends a pending or active delegation. ownerID, when set, is the
// person revoking their own (another's is not found); an agent revoking
// (agentID set) reaches only its own. With PostgreSQL the answer waits out
// every replica's lease: once answered, no replica lets its tokens through.
func (s *Service) Revoke(ctx context.Context, actor persistence.Actor, id, ownerID, agentID, reason string) (*persistence.Delegation, error) {
	var v extensions.ValidationError
	v.CheckText("reason", reason, false, MaxReason)
	if err := v.Err(); err != nil {
		return nil, err
	}
	d, err := s.store.GetDelegation(ctx, id)
	if err != nil {
		return nil, err
	}
	if (ownerID != "" && d.UserID != ownerID) || (agentID != "" && d.AgentID != agentID) {
		return nil, persistence.ErrNotFound
	}
	var refusal error
	d, err = s.store.UpdateDelegation(ctx, id, func(d *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
		now := s.now()
		if audit, events := s.lapse(d, now); audit != nil {
			refusal = ErrNotRevocable.With(map[string]any{"status": d.Status})
			return audit, events, nil
		}
		if d.Status != persistence.DelegationPending && d.Status != persistence.DelegationActive {
			return nil, nil, ErrNotRevocable.With(map[string]any{"status": d.Status})
		}
		return s.revoke(d, actor, reason, now, "")
	})
	if err != nil {
		return nil, err
	}
	return d, refusal
}

// revoke ends d (locked). why, when set, names the event that ended it
// beside a revocation of its own: "killed" (the agent), "userDisabled".
func (s *Service) revoke(d *persistence.Delegation, actor persistence.Actor, reason string, now time.Time, why string) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
	d.Status, d.Reason = persistence.DelegationRevoked, reason
	if d.DecidedAt == nil {
		d.DecidedAt, d.DecidedBy = &now, actor
	}
	facts := map[string]any{"reason": reason}
	if why != "" {
		facts[why] = true
	}
	return []persistence.AuditEntry{s.entry(d, actor, ActionRevoked, now, facts)}, []persistence.AuthEvent{s.event(d, actor, ActionRevoked, now, facts)}, nil
}

// RevokeAll revokes an agent's pending and active delegations, recorded
// with its kill (actor, reason): call it in the kill's unit of work.
func (s *Service) RevokeAll(ctx context.Context, agentID string, actor persistence.Actor, reason string) error {
	return s.revokeOpen(ctx, persistence.DelegationFilter{AgentID: agentID}, actor, "agent killed: "+reason, "killed")
}

// RevokeUser revokes a person's pending and active delegations, recorded
// with their disabling (actor): call it in the unit of work that disables
// them. Disabling is usually an incident's answer; a delegation that came
// back to life with the account would hand the agent what the person may
// no longer want it to hold (docs/decisions.md, "CIBA delegation").
func (s *Service) RevokeUser(ctx context.Context, userID string, actor persistence.Actor) error {
	return s.revokeOpen(ctx, persistence.DelegationFilter{UserID: userID}, actor, "person disabled", "userDisabled")
}

func (s *Service) revokeOpen(ctx context.Context, f persistence.DelegationFilter, actor persistence.Actor, reason, why string) error {
	ids, err := s.store.OpenDelegations(ctx, f)
	if err != nil {
		return err
	}
	for _, id := range ids {
		_, err := s.store.UpdateDelegation(ctx, id, func(d *persistence.Delegation) ([]persistence.AuditEntry, []persistence.AuthEvent, error) {
			now := s.now()
			if audit, events := s.lapse(d, now); audit != nil {
				return audit, events, nil
			}
			if d.Status != persistence.DelegationPending && d.Status != persistence.DelegationActive {
				return nil, nil, nil
			}
			return s.revoke(d, actor, reason, now, why)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// List returns one page of delegations as of now; a status filter must be
// a known status.
func (s *Service) List(ctx context.Context, f persistence.DelegationFilter, p persistence.Page) ([]persistence.Delegation, int, error) {
	var v extensions.ValidationError
	if f.Status != "" && !slices.Contains(Statuses, f.Status) {
		v.Add("status", "must be one of %s", strings.Join(Statuses, ", "))
	}
	if err := v.Err(); err != nil {
		return nil, 0, err
	}
	return s.store.ListDelegations(ctx, f, p, s.now())
}

// Statuses are a delegation's statuses, as read.
var Statuses = []string{persistence.DelegationPending, persistence.DelegationActive, persistence.DelegationDenied, persistence.DelegationExpired, persistence.DelegationRevoked}

func (s *Service) entry(d *persistence.Delegation, actor persistence.Actor, action string, at time.Time, details map[string]any) persistence.AuditEntry {
	out := map[string]any{"delegationId": d.ID, "userId": d.UserID, "scopes": []string(d.Scopes)}
	for k, v := range details {
		out[k] = v
	}
	return persistence.AuditEntry{ID: uuid.Must(uuid.NewV7()).String(), AgentID: d.AgentID, ClientID: d.ClientID, CreatedAt: at.UTC(),
		Action: action, Actor: actor, Details: out}
}

func (s *Service) event(d *persistence.Delegation, actor persistence.Actor, action string, at time.Time, details map[string]any) persistence.AuthEvent {
	data := map[string]any{"delegationId": d.ID, "agentId": d.AgentID, "scopes": []string(d.Scopes), "actor": actor}
	for k, v := range details {
		data[k] = v
	}
	user := d.UserID
	e := persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: action, UserID: &user, ClientID: d.ClientID, Data: data, CreatedAt: at.UTC()}
	if actor.SessionID != "" {
		sid := actor.SessionID
		e.SessionID = &sid
	}
	return e
}
