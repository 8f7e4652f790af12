// Package invites invites people by e-mail on behalf of a service account:
// the invite, the message that carries its link, the redirect to the
// application's accept page, and the single acceptance by the same account.
package invites

import (
	"bytes"
	"context"
	"embed"
	"errors"
	htmltemplate "html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	texttemplate "text/template"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	GetServiceAccount(ctx context.Context, id string) (*persistence.ServiceAccount, error)
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	CreateInvite(ctx context.Context, inv *persistence.Invite, newUser *persistence.User, m *persistence.Mail, events ...persistence.DirectoryEvent) error
	InviteByToken(ctx context.Context, tokenHash []byte, key string) (*persistence.Invite, error)
	AcceptInvite(ctx context.Context, id string, at time.Time, events ...persistence.DirectoryEvent) (bool, error)
	AfterCommit(ctx context.Context, fn func())
}

// FollowPath is where an invite link points: {issuer}/invites/{token}.
const FollowPath = "/invites/"

// Service makes and consumes invites.
type Service struct {
	store  Store
	hasher extensions.Hasher // the invite key's
	legacy extensions.Hasher // the client-secret key's, which hashed invites made before migration 0007
	outbox *mail.Outbox
	issuer string
	ttl    time.Duration
	now    func() time.Time
}

// New returns a Service. Tokens are hashed with a key derived from the
// system secret for invites alone. Links in messages start with issuer.
func New(store Store, systemSecret []byte, outbox *mail.Outbox, issuer string, ttl time.Duration) *Service {
	return &Service{store: store, hasher: oauth.NewHasher(systemSecret, oauth.PurposeInviteToken), legacy: oauth.NewSecretHasher(systemSecret),
		outbox: outbox, issuer: strings.TrimSuffix(issuer, "/"), ttl: ttl, now: extensions.Now}
}

// Caller is the principal making or accepting an invite.
type Caller struct {
	ClientID         string
	ServiceAccountID string // set only when a service account acts for itself
	Actor            persistence.Actor
}

// Input is the spec's invite create body.
type Input struct {
	Email           string
	RedirectURI     string
	InviteAcceptURI string
	State           string
	FirstName       string
	LastName        string
	AppName         string
	Metadata        map[string]any
}

// Errors of the invite API beyond validation.
var (
	ErrNotServiceAccount = extensions.NewError(http.StatusForbidden, "forbidden", "Only service accounts invite users.", nil)
	ErrNotCreator        = extensions.NewError(http.StatusForbidden, "forbidden", "The invite was made by another service account.", nil)
	// ErrExpired: RFC 9110's 410, the invite is gone for good.
	ErrExpired = extensions.NewError(http.StatusGone, "invite_expired", "The invite has expired.", nil)
	// ErrNoInvite: unknown, or accepted already (a token is single-use).
	ErrNoInvite = extensions.NewError(http.StatusNotFound, "not_found", "No pending invite has this token.", nil)
)

// Create records an invite (and the user, when new) with its e-mail, in
// one transaction, and has the e-mail sent. It returns the invite.
func (s *Service) Create(ctx context.Context, caller Caller, in Input) (*persistence.Invite, error) {
	if caller.ServiceAccountID == "" {
		return nil, ErrNotServiceAccount
	}
	sa, err := s.store.GetServiceAccount(ctx, caller.ServiceAccountID)
	if err != nil {
		return nil, err
	}
	var v extensions.ValidationError
	directory.CheckEmail(&v, "email", in.Email)
	switch {
	case in.RedirectURI == "":
		v.Add("redirect_uri", "is required")
	case !slices.Contains(sa.RedirectURIs, in.RedirectURI):
		v.Add("redirect_uri", "must equal a redirect URI registered on the service account")
	}
	acceptURI := in.RedirectURI
	if in.InviteAcceptURI != "" {
		if err := extensions.CheckHTTPSURL(in.InviteAcceptURI); err != nil {
			v.Add("invite_accept_uri", "%s", err.Error())
		} else if !slices.ContainsFunc(sa.RedirectURIs, func(r string) bool { return origin(r) == origin(in.InviteAcceptURI) }) {
			v.Add("invite_accept_uri", "its origin must be the origin of a redirect URI registered on the service account")
		}
		acceptURI = in.InviteAcceptURI
	}
	v.CheckText("state", in.State, false, 512)
	v.CheckText("first_name", in.FirstName, false, 100)
	v.CheckText("last_name", in.LastName, false, 100)
	v.CheckText("app_name", in.AppName, false, 100)
	for field, val := range map[string]string{"state": in.State, "first_name": in.FirstName, "last_name": in.LastName, "app_name": in.AppName} {
		if strings.ContainsAny(val, "\r\n") { // one line: they go into the subject, the greeting, the redirect
			v.Add(field, "must be one line")
		}
	}
	if in.Metadata != nil {
		directory.CheckMetadata(&v, "metadata", in.Metadata)
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		inv, err := s.create(ctx, caller, in, acceptURI)
		// Two invites racing to create one new user: the loser finds the
		// user the winner made.
		if errors.Is(err, persistence.ErrDuplicate) && attempt == 0 {
			continue
		}
		return inv, err
	}
}

func (s *Service) create(ctx context.Context, caller Caller, in Input, acceptURI string) (*persistence.Invite, error) {
	now := s.now()
	token := oauth.NewSecret()
	hash, err := s.hasher.Hash(ctx, []byte(token))
	if err != nil {
		return nil, err
	}
	inv := &persistence.Invite{
		ID: uuid.Must(uuid.NewV7()).String(), TokenHash: hash, TokenKey: persistence.InviteTokenKey, Email: in.Email,
		CreatorClientID: caller.ClientID, CreatorPrincipal: caller.ServiceAccountID, RedirectURI: in.RedirectURI, AcceptURI: acceptURI,
		State: in.State, AppName: in.AppName, Metadata: in.Metadata, Status: persistence.InviteSent, CreatedAt: now, ExpiresAt: now.Add(s.ttl),
	}
	if inv.Metadata == nil {
		inv.Metadata = persistence.JSONObject{}
	}
	var events []persistence.DirectoryEvent
	var newUser *persistence.User
	u, err := s.store.GetUserByEmail(ctx, in.Email)
	switch {
	case err == nil:
		inv.UserID, inv.UserExisted = u.ID, true
	case errors.Is(err, persistence.ErrNotFound):
		newUser = &persistence.User{
			ID: uuid.Must(uuid.NewV7()).String(), Email: in.Email,
			FirstName: strings.TrimSpace(in.FirstName), LastName: strings.TrimSpace(in.LastName), Status: directory.StatusInvited,
			Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now,
		}
		newUser.Name = strings.TrimSpace(newUser.FirstName + " " + newUser.LastName)
		inv.UserID = newUser.ID
		events = append(events, directory.Event(directory.UserCreated, caller.Actor, now, newUser.ID, "", map[string]any{"email": in.Email, "via": "invite"}))
	default:
		return nil, err
	}
	events = append(events, directory.Event(directory.InviteSent, caller.Actor, now, inv.UserID, "",
		map[string]any{"inviteId": inv.ID, "email": in.Email, "userExists": inv.UserExisted}))
	msg, err := s.message(inv, in, token)
	if err != nil {
		return nil, err
	}
	record, err := s.outbox.Record(msg)
	if err != nil {
		return nil, err
	}
	if err := s.store.CreateInvite(ctx, inv, newUser, record, events...); err != nil {
		return nil, err
	}
	s.store.AfterCommit(ctx, s.outbox.Kick) // the message is there to send once committed
	return inv, nil
}

//go:embed templates
var templates embed.FS

var (
	textTemplate = texttemplate.Must(texttemplate.ParseFS(templates, "templates/invite.txt"))
	htmlTemplate = htmltemplate.Must(htmltemplate.ParseFS(templates, "templates/invite.html"))
)

// message is the invite's e-mail: a link to identityd that leads on to
// the application's accept page.
func (s *Service) message(inv *persistence.Invite, in Input, token string) (mail.Message, error) {
	app := in.AppName
	if app == "" {
		app = "your application"
	}
	data := map[string]any{
		"AppName": app, "FirstName": in.FirstName, "Link": s.issuer + FollowPath + token,
		"Expires": inv.ExpiresAt.Format("2 January 2006, 15:04 MST"),
	}
	var text, html bytes.Buffer
	if err := textTemplate.Execute(&text, data); err != nil {
		return mail.Message{}, err
	}
	if err := htmlTemplate.Execute(&html, data); err != nil {
		return mail.Message{}, err
	}
	return mail.Message{To: inv.Email, Subject: "You are invited to " + app, Text: text.String(), HTML: html.String()}, nil
}

// find reads a pending invite by its token. Unknown and already accepted
// invites are ErrNoInvite (a token is single-use).
func (s *Service) find(ctx context.Context, token string) (*persistence.Invite, error) {
	if token == "" || len(token) > 100 {
		return nil, ErrNoInvite
	}
	inv, err := s.byToken(ctx, s.hasher, token, persistence.InviteTokenKey)
	if errors.Is(err, persistence.ErrNotFound) {
		// Made before invites had a key of their own: a legacy row only.
		inv, err = s.byToken(ctx, s.legacy, token, persistence.LegacyInviteTokenKey)
	}
	if errors.Is(err, persistence.ErrNotFound) || (err == nil && inv.Status != persistence.InviteSent) {
		return nil, ErrNoInvite
	} else if err != nil {
		return nil, err
	}
	return inv, nil
}

func (s *Service) byToken(ctx context.Context, h extensions.Hasher, token, key string) (*persistence.Invite, error) {
	hash, err := h.Hash(ctx, []byte(token))
	if err != nil {
		return nil, err
	}
	return s.store.InviteByToken(ctx, hash, key)
}

func (s *Service) expired(inv *persistence.Invite) bool { return !s.now().Before(inv.ExpiresAt) }

// Status reads a pending invite (the public status endpoint).
func (s *Service) Status(ctx context.Context, token string) (*persistence.Invite, time.Duration, error) {
	inv, err := s.find(ctx, token)
	if err != nil {
		return nil, 0, err
	}
	if s.expired(inv) {
		return nil, 0, ErrExpired
	}
	return inv, inv.ExpiresAt.Sub(s.now()), nil
}

// Follow is where the e-mailed link leads: the application's accept page
// with invite_token, email, app_name, user_exists (and state when given)
// added to its query.
func (s *Service) Follow(ctx context.Context, token string) (string, error) {
	inv, _, err := s.Status(ctx, token)
	if err != nil {
		return "", err
	}
	u, err := url.Parse(inv.AcceptURI)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("invite_token", token)
	q.Set("email", inv.Email)
	q.Set("app_name", inv.AppName)
	q.Set("user_exists", strconv.FormatBool(inv.UserExisted))
	if inv.State != "" {
		q.Set("state", inv.State)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Accept consumes an invite for the service account that made it, once.
func (s *Service) Accept(ctx context.Context, caller Caller, token string) (*persistence.Invite, error) {
	inv, err := s.find(ctx, token)
	if err != nil {
		return nil, err
	}
	if caller.ServiceAccountID == "" || caller.ClientID != inv.CreatorClientID || caller.ServiceAccountID != inv.CreatorPrincipal {
		return nil, ErrNotCreator
	}
	if s.expired(inv) {
		return nil, ErrExpired
	}
	now := s.now()
	ok, err := s.store.AcceptInvite(ctx, inv.ID, now, directory.Event(directory.InviteAccepted, caller.Actor, now, inv.UserID, "",
		map[string]any{"inviteId": inv.ID, "email": inv.Email}))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrNoInvite // accepted meanwhile
	}
	inv.Status, inv.AcceptedAt = persistence.InviteAccepted, &now
	return inv, nil
}

// origin is scheme://host[:port] of a URL, lower-cased; "" when it has none.
func origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return ""
	}
	return strings.ToLower(u.Scheme + "://" + u.Host)
}
