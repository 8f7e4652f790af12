// Package directory holds users, organizations and roles: their rules, and
// the events every change records.
package directory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http"
	netmail "net/mail"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
)

// Store is the storage this package needs.
type Store interface {
	CreateUser(ctx context.Context, u *persistence.User, events ...persistence.DirectoryEvent) error
	GetUser(ctx context.Context, id string) (*persistence.User, error)
	GetUserByEmail(ctx context.Context, email string) (*persistence.User, error)
	ListUsers(ctx context.Context, f persistence.UserFilter, p persistence.Page) ([]persistence.User, int, error)
	ListApplicationUsers(ctx context.Context, appID string, p persistence.Page) ([]persistence.User, int, error)
	UpdateUser(ctx context.Context, id string, fn func(*persistence.User) ([]persistence.DirectoryEvent, error)) (*persistence.User, error)
	DeleteUser(ctx context.Context, id string, events ...persistence.DirectoryEvent) error
	CreateOrg(ctx context.Context, o *persistence.Org, events ...persistence.DirectoryEvent) error
	GetOrg(ctx context.Context, id string) (*persistence.Org, error)
	ListOrgs(ctx context.Context, p persistence.Page) ([]persistence.Org, int, error)
	UpdateOrg(ctx context.Context, id string, fn func(*persistence.Org) ([]persistence.DirectoryEvent, error)) (*persistence.Org, error)
	DeleteOrg(ctx context.Context, id string, events ...persistence.DirectoryEvent) error
	AddMember(ctx context.Context, m *persistence.Member, events ...persistence.DirectoryEvent) error
	RemoveMember(ctx context.Context, orgID, userID string, events ...persistence.DirectoryEvent) error
	ListMembers(ctx context.Context, orgID string, p persistence.Page) ([]persistence.Member, int, error)
	CreateRole(ctx context.Context, r *persistence.Role, events ...persistence.DirectoryEvent) error
	GetRole(ctx context.Context, name string) (*persistence.Role, error)
	ListRoles(ctx context.Context, p persistence.Page) ([]persistence.Role, int, error)
	DeleteRole(ctx context.Context, name string, events ...persistence.DirectoryEvent) error
	AssignRole(ctx context.Context, userID, role string, at time.Time, events ...persistence.DirectoryEvent) (bool, error)
	RemoveRole(ctx context.Context, userID, role string, events ...persistence.DirectoryEvent) (bool, error)
	UserRoles(ctx context.Context, userID string) ([]persistence.Role, error)
	ApproverRole(ctx context.Context, role string) (bool, error)
	EndUserSSOSessions(ctx context.Context, userID string, ended persistence.AuthEvent) (int, error)
	RevokeUserTokens(ctx context.Context, userID string) (int, error)
	QueueMail(ctx context.Context, m *persistence.Mail) error
	AfterCommit(ctx context.Context, fn func())
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// Event types of the directory's log.
const (
	UserCreated    = "user.created"
	UserUpdated    = "user.updated"
	UserDeleted    = "user.deleted"
	OrgCreated     = "org.created"
	OrgUpdated     = "org.updated"
	OrgDeleted     = "org.deleted"
	MemberAdded    = "org.member_added"
	MemberRemoved  = "org.member_removed"
	RoleCreated    = "role.created"
	RoleDeleted    = "role.deleted"
	RoleAssigned   = "role.assigned"
	RoleRemoved    = "role.removed"
	InviteSent     = "invite.sent"
	InviteAccepted = "invite.accepted"
)

// User statuses: invited users were created by an invite not yet accepted.
const (
	StatusActive   = "active"
	StatusInvited  = "invited"
	StatusDisabled = persistence.UserDisabled // the store signs a disabled person out
)

// Statuses lists the user statuses.
var Statuses = []string{StatusActive, StatusInvited, StatusDisabled}

// Organization member roles.
var MemberRoles = []string{"owner", "admin", "member"}

// SessionEndEmailChanged is the reason of the sessions a change of the
// person's e-mail address ends (session_ended).
const SessionEndEmailChanged = "email_changed"

// Service applies the rules and calls the store.
type Service struct {
	store  Store
	now    func() time.Time
	outbox *mail.Outbox // nil: no notice of a changed address is e-mailed (Notify)
	issuer string
}

// New returns a Service.
func New(store Store) *Service { return &Service{store: store, now: extensions.Now} }

// Notify makes the service e-mail the old address of a person whose
// address changes, through outbox; issuer names the server in the message.
func (s *Service) Notify(outbox *mail.Outbox, issuer string) { s.outbox, s.issuer = outbox, issuer }

// Powers is what the caller's token holds beyond the route's own scope,
// for the changes that would reach admin in two steps (issue 39): the
// roles that decide agents' actions, and the address a password reset is
// mailed to. (Console administration has routes of its own, admin only.)
type Powers struct {
	Admin      bool // the admin scope: roles a HITL policy names as approver
	UsersAdmin bool // users:admin (or admin): a person's email and emailVerified
}

// needs refuses a change the caller's token lacks the scope for (403
// insufficient_scope, as a route's own scope is refused).
func needs(scope string) error {
	return extensions.NewError(http.StatusForbidden, "insufficient_scope", "The access token lacks the scope this change needs.",
		map[string]any{"requiredScope": scope})
}

// mayChange refuses the changes of a user that need more than users:write.
func (p Powers) mayChange(changed map[string]any) error {
	_, email := changed["email"]
	_, verified := changed["emailVerified"]
	if (email || verified) && !p.UsersAdmin {
		return needs("users:admin")
	}
	return nil
}

// Event builds a directory event.
func Event(typ string, actor persistence.Actor, at time.Time, userID, orgID string, data map[string]any) persistence.DirectoryEvent {
	e := persistence.DirectoryEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: typ, Actor: actor, Data: data, CreatedAt: at}
	if userID != "" {
		e.UserID = &userID
	}
	if orgID != "" {
		e.OrgID = &orgID
	}
	return e
}

// MaxMetadataBytes bounds the metadata object of a user, organization or invite.
const MaxMetadataBytes = 16 << 10

// CheckEmail validates an e-mail address: one bare addr-spec (RFC 5322),
// at most 254 characters (RFC 5321's path limit).
func CheckEmail(v *extensions.ValidationError, field, email string) {
	a, err := netmail.ParseAddress(email)
	switch {
	case email == "":
		v.Add(field, "is required")
	case len(email) > 254 || err != nil || a.Address != email || a.Name != "":
		v.Add(field, "must be one e-mail address, like name@example.com")
	}
}

// CheckMetadata bounds a metadata object, measured as compact JSON (without
// HTML escaping, which would count '<' six times).
func CheckMetadata(v *extensions.ValidationError, field string, m map[string]any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil || b.Len()-1 > MaxMetadataBytes { // Encode adds a newline
		v.Add(field, "must be a JSON object of at most %d bytes", MaxMetadataBytes)
	}
}

// UserInput is what a caller sets on a user; nil fields are not set (on
// update: left as they are).
type UserInput struct {
	Email         *string
	EmailVerified *bool
	Name          *string
	FirstName     *string
	LastName      *string
	Status        *string
	Metadata      *map[string]any
	Password      *string // create only
}

var errEmailTaken = extensions.Conflict("email_exists", "A user with this e-mail address exists.", nil)

func (s *Service) applyUser(u *persistence.User, in UserInput, create bool) (map[string]any, error) {
	var v extensions.ValidationError
	changed := map[string]any{}
	if in.Email != nil {
		CheckEmail(&v, "email", *in.Email)
		if *in.Email != u.Email {
			changed["email"] = *in.Email
		}
		u.Email = *in.Email
	} else if create {
		v.Add("email", "is required")
	}
	text := func(field string, p *string, dst *string, max int) {
		if p == nil {
			return
		}
		t := strings.TrimSpace(*p) // stored trimmed, so checked and compared trimmed
		v.CheckText(field, t, false, max)
		if t != *dst {
			changed[field] = t
		}
		*dst = t
	}
	text("name", in.Name, &u.Name, 200)
	text("firstName", in.FirstName, &u.FirstName, 100)
	text("lastName", in.LastName, &u.LastName, 100)
	if in.EmailVerified != nil {
		if *in.EmailVerified != u.EmailVerified {
			changed["emailVerified"] = *in.EmailVerified
		}
		u.EmailVerified = *in.EmailVerified
	}
	if in.Status != nil {
		if !slices.Contains([]string{StatusActive, StatusDisabled}, *in.Status) {
			v.Add("status", "must be %s or %s", StatusActive, StatusDisabled)
		}
		if *in.Status != u.Status {
			changed["status"] = *in.Status
		}
		u.Status = *in.Status
	}
	if in.Metadata != nil {
		CheckMetadata(&v, "metadata", *in.Metadata)
		u.Metadata = *in.Metadata
		changed["metadata"] = true
	}
	if in.Password != nil {
		switch n := len([]rune(*in.Password)); {
		case n < MinPasswordLength:
			v.Add("password", "must be at least %d characters", MinPasswordLength)
		case n > maxPasswordLength:
			v.Add("password", "must be at most %d characters", maxPasswordLength)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	if in.Password != nil {
		hash, err := HashPassword(*in.Password)
		if err != nil {
			return nil, err
		}
		u.PasswordHash = &hash
		changed["password"] = true
	}
	return changed, nil
}

// CreateUser adds a user, active unless the input says otherwise.
func (s *Service) CreateUser(ctx context.Context, actor persistence.Actor, in UserInput) (*persistence.User, error) {
	now := s.now()
	u := &persistence.User{ID: uuid.Must(uuid.NewV7()).String(), Status: StatusActive, Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now}
	if _, err := s.applyUser(u, in, true); err != nil {
		return nil, err
	}
	err := s.store.CreateUser(ctx, u, Event(UserCreated, actor, now, u.ID, "", map[string]any{"email": u.Email}))
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, errEmailTaken
	}
	return u, err
}

// GetUser reads one user; an id that is no UUID is not found.
func (s *Service) GetUser(ctx context.Context, id string) (*persistence.User, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetUser(ctx, id)
}

// ListUsers returns one page of users; a status filter must be a known status.
func (s *Service) ListUsers(ctx context.Context, f persistence.UserFilter, p persistence.Page) ([]persistence.User, int, error) {
	var v extensions.ValidationError
	if f.Status != "" && !slices.Contains(Statuses, f.Status) {
		v.Add("status", "must be one of %s", strings.Join(Statuses, ", "))
	}
	v.CheckText("q", f.Q, false, 200)
	v.CheckText("email", f.Email, false, 254)
	if err := v.Err(); err != nil {
		return nil, 0, err
	}
	return s.store.ListUsers(ctx, f, p)
}

// UpdateUser changes the fields given (not the password: that is a
// credential, managed with users:admin by the sign-in work). What the
// caller's powers do not cover is refused when it would change (sent as
// it is, it passes). A changed address is where a password reset is
// mailed, so in the same unit of work the old address is e-mailed a
// notice and the person signed out everywhere (their sessions end, their
// refresh token families are revoked with their access tokens).
func (s *Service) UpdateUser(ctx context.Context, actor persistence.Actor, p Powers, id string, in UserInput) (*persistence.User, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	if in.Password != nil {
		return nil, &extensions.ValidationError{Fields: map[string]string{"password": "cannot be changed here"}}
	}
	var u *persistence.User
	err := s.store.InTx(ctx, func(ctx context.Context) error {
		oldEmail := ""
		var err error
		u, err = s.store.UpdateUser(ctx, id, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			was := u.Email
			changed, err := s.applyUser(u, in, false)
			if err != nil || len(changed) == 0 {
				return nil, err
			}
			if err := p.mayChange(changed); err != nil {
				return nil, err
			}
			if _, ok := changed["email"]; ok {
				oldEmail = was
			}
			u.UpdatedAt = s.now()
			return []persistence.DirectoryEvent{Event(UserUpdated, actor, u.UpdatedAt, u.ID, "", map[string]any{"changed": changed})}, nil
		})
		if err != nil || oldEmail == "" {
			return err
		}
		return s.emailChanged(ctx, actor, u, oldEmail)
	})
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, errEmailTaken
	}
	return u, err
}

// SetConsoleAdmin gives (on) or takes (off) the person's console
// administration: through an application marked adminConsole, their token
// acts as an admin token. The routes are the admin's only (DESIGN: admin
// token); setting it as it is changes nothing. Taking it bites at the
// person's next call, which reads it.
func (s *Service) SetConsoleAdmin(ctx context.Context, actor persistence.Actor, id string, on bool) (*persistence.User, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.UpdateUser(ctx, id, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
		if u.ConsoleAdmin == on {
			return nil, nil
		}
		u.ConsoleAdmin, u.UpdatedAt = on, s.now()
		return []persistence.DirectoryEvent{Event(UserUpdated, actor, u.UpdatedAt, u.ID, "", map[string]any{"changed": map[string]any{"consoleAdmin": on}})}, nil
	})
}

// emailChanged signs the person out everywhere and e-mails their old
// address a notice, in ctx's unit of work.
func (s *Service) emailChanged(ctx context.Context, actor persistence.Actor, u *persistence.User, oldEmail string) error {
	ended := persistence.AuthEvent{Reason: SessionEndEmailChanged, ClientID: actor.ClientID, CreatedAt: u.UpdatedAt}
	if _, err := s.store.EndUserSSOSessions(ctx, u.ID, ended); err != nil {
		return err
	}
	if _, err := s.store.RevokeUserTokens(ctx, u.ID); err != nil {
		return err
	}
	if s.outbox == nil {
		return nil
	}
	return s.outbox.Queue(ctx, s.store, emailChangedMessage(oldEmail, s.issuer, u.UpdatedAt))
}

// emailChangedMessage is the notice to a person's old address. It does not
// name the new one: whoever reads the old mailbox learns only that the
// account moved.
func emailChangedMessage(to, issuer string, at time.Time) mail.Message {
	when := at.UTC().Format("2006-01-02 15:04:05")
	text := fmt.Sprintf("The e-mail address of your account at %s was changed from this address to another one at %s (UTC), "+
		"and you were signed out everywhere. Messages about the account, password reset links included, now go to the new address.\n\n"+
		"If you did not expect this, contact your administrator at once.\n", issuer, when)
	body := fmt.Sprintf("<p>The e-mail address of your account at %s was changed from this address to another one at %s (UTC), "+
		"and you were signed out everywhere. Messages about the account, password reset links included, now go to the new address.</p>"+
		"<p>If you did not expect this, contact your administrator at once.</p>", html.EscapeString(issuer), when)
	return mail.Message{To: to, Subject: "The e-mail address of your account was changed", Text: text, HTML: body}
}

// DeleteUser removes a user with their credentials, memberships, roles and invites.
func (s *Service) DeleteUser(ctx context.Context, actor persistence.Actor, id string) error {
	u, err := s.GetUser(ctx, id)
	if err != nil {
		return err
	}
	return s.store.DeleteUser(ctx, id, Event(UserDeleted, actor, s.now(), id, "", map[string]any{"email": u.Email}))
}

// --- organizations

var slugSyntax = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

// OrgInput is what a caller sets on an organization; nil fields are left.
type OrgInput struct {
	Name     *string
	Slug     *string
	Metadata *map[string]any
}

var errSlugTaken = extensions.Conflict("slug_exists", "An organization with this slug exists.", nil)

func applyOrg(o *persistence.Org, in OrgInput, create bool) (map[string]any, error) {
	var v extensions.ValidationError
	changed := map[string]any{}
	if in.Name != nil {
		name := strings.TrimSpace(*in.Name)
		v.CheckText("name", name, true, 200)
		if name != o.Name {
			changed["name"] = name
		}
		o.Name = name
	} else if create {
		v.Add("name", "is required")
	}
	if in.Slug == nil && create && o.Name != "" {
		if slug := slugFrom(o.Name); slug != "" {
			in.Slug = &slug
		} else {
			v.Add("slug", "cannot be made from this name (it has no letters a-z or digits): give one")
		}
	}
	if in.Slug != nil {
		if !slugSyntax.MatchString(*in.Slug) {
			v.Add("slug", "must be 1 to 63 lower-case letters, digits and inner hyphens")
		}
		if *in.Slug != o.Slug {
			changed["slug"] = *in.Slug
		}
		o.Slug = *in.Slug
	}
	if in.Metadata != nil {
		CheckMetadata(&v, "metadata", *in.Metadata)
		o.Metadata = *in.Metadata
		changed["metadata"] = true
	}
	return changed, v.Err()
}

// slugFrom derives a slug from a name: lower-case letters and digits, other
// runs of characters as one hyphen.
func slugFrom(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	s := strings.TrimSuffix(b.String(), "-")
	if len(s) > 63 {
		s = strings.TrimSuffix(s[:63], "-")
	}
	return s
}

// CreateOrg adds an organization; without a slug, one is made from the name.
func (s *Service) CreateOrg(ctx context.Context, actor persistence.Actor, in OrgInput) (*persistence.Org, error) {
	now := s.now()
	o := &persistence.Org{ID: uuid.Must(uuid.NewV7()).String(), Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now}
	if _, err := applyOrg(o, in, true); err != nil {
		return nil, err
	}
	err := s.store.CreateOrg(ctx, o, Event(OrgCreated, actor, now, "", o.ID, map[string]any{"name": o.Name, "slug": o.Slug}))
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, errSlugTaken
	}
	return o, err
}

// GetOrg reads one organization.
func (s *Service) GetOrg(ctx context.Context, id string) (*persistence.Org, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	return s.store.GetOrg(ctx, id)
}

// ListOrgs returns one page of organizations.
func (s *Service) ListOrgs(ctx context.Context, p persistence.Page) ([]persistence.Org, int, error) {
	return s.store.ListOrgs(ctx, p)
}

// UpdateOrg changes the fields given.
func (s *Service) UpdateOrg(ctx context.Context, actor persistence.Actor, id string, in OrgInput) (*persistence.Org, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, persistence.ErrNotFound
	}
	o, err := s.store.UpdateOrg(ctx, id, func(o *persistence.Org) ([]persistence.DirectoryEvent, error) {
		changed, err := applyOrg(o, in, false)
		if err != nil || len(changed) == 0 {
			return nil, err
		}
		o.UpdatedAt = s.now()
		return []persistence.DirectoryEvent{Event(OrgUpdated, actor, o.UpdatedAt, "", o.ID, map[string]any{"changed": changed})}, nil
	})
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, errSlugTaken
	}
	return o, err
}

// DeleteOrg removes an organization and its memberships.
func (s *Service) DeleteOrg(ctx context.Context, actor persistence.Actor, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return persistence.ErrNotFound
	}
	return s.store.DeleteOrg(ctx, id, Event(OrgDeleted, actor, s.now(), "", id, map[string]any{}))
}

// Members returns one page of an organization's members; the organization must exist.
func (s *Service) Members(ctx context.Context, orgID string, p persistence.Page) ([]persistence.Member, int, error) {
	if _, err := s.GetOrg(ctx, orgID); err != nil {
		return nil, 0, err
	}
	return s.store.ListMembers(ctx, orgID, p)
}

var errMemberExists = extensions.Conflict("member_exists", "The user is a member of this organization.", nil)

// AddMember makes a user a member, with a role (member by default).
func (s *Service) AddMember(ctx context.Context, actor persistence.Actor, orgID, userID, role string) (*persistence.Member, error) {
	if role == "" {
		role = "member"
	}
	if !slices.Contains(MemberRoles, role) {
		return nil, &extensions.ValidationError{Fields: map[string]string{"role": "must be one of " + strings.Join(MemberRoles, ", ")}}
	}
	if _, err := s.GetOrg(ctx, orgID); err != nil {
		return nil, err
	}
	u, err := s.GetUser(ctx, userID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, &extensions.ValidationError{Fields: map[string]string{"userId": "no user has this id"}}
	} else if err != nil {
		return nil, err
	}
	now := s.now()
	m := &persistence.Member{OrgID: orgID, UserID: userID, Role: role, JoinedAt: now, Email: u.Email, Name: u.Name}
	err = s.store.AddMember(ctx, m, Event(MemberAdded, actor, now, userID, orgID, map[string]any{"role": role}))
	switch {
	case errors.Is(err, persistence.ErrDuplicate):
		return nil, errMemberExists
	case errors.Is(err, persistence.ErrMissingReference): // the user or organization was deleted meanwhile
		return nil, fmt.Errorf("user or organization deleted meanwhile: %w", persistence.ErrNotFound)
	}
	return m, err
}

// RemoveMember ends a membership.
func (s *Service) RemoveMember(ctx context.Context, actor persistence.Actor, orgID, userID string) error {
	if _, err := uuid.Parse(orgID); err != nil {
		return persistence.ErrNotFound
	}
	if _, err := uuid.Parse(userID); err != nil {
		return persistence.ErrNotFound
	}
	return s.store.RemoveMember(ctx, orgID, userID, Event(MemberRemoved, actor, s.now(), userID, orgID, map[string]any{}))
}

// --- roles

var roleSyntax = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.:-]{0,63}$`)

var errRoleExists = extensions.Conflict("role_exists", "A role of this name exists.", nil)

// CreateRole adds a role.
func (s *Service) CreateRole(ctx context.Context, actor persistence.Actor, name, description string) (*persistence.Role, error) {
	var v extensions.ValidationError
	switch {
	case !roleSyntax.MatchString(name):
		v.Add("name", "must be 1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter")
	case name == "assign" || name == "remove": // /roles/assign and /roles/remove are routes
		v.Add("name", "is reserved")
	}
	v.CheckText("description", description, false, 500)
	if err := v.Err(); err != nil {
		return nil, err
	}
	r := &persistence.Role{Name: name, Description: description, CreatedAt: s.now()}
	err := s.store.CreateRole(ctx, r, Event(RoleCreated, actor, r.CreatedAt, "", "", map[string]any{"role": name}))
	if errors.Is(err, persistence.ErrDuplicate) {
		return nil, errRoleExists
	}
	return r, err
}

// ListRoles returns one page of roles.
func (s *Service) ListRoles(ctx context.Context, p persistence.Page) ([]persistence.Role, int, error) {
	return s.store.ListRoles(ctx, p)
}

// DeleteRole removes a role and its assignments; a role a HITL policy
// names as approver only with the admin scope.
func (s *Service) DeleteRole(ctx context.Context, actor persistence.Actor, p Powers, name string) error {
	if err := s.mayHandRole(ctx, p, name); err != nil {
		return err
	}
	return s.store.DeleteRole(ctx, name, Event(RoleDeleted, actor, s.now(), "", "", map[string]any{"role": name}))
}

// mayHandRole refuses, without the admin scope, to give, take or delete a
// role whose holders decide agents' actions (a HITL policy, or a pending
// request, names it as approver): who approves is the admin's choice, as
// the policy is.
func (s *Service) mayHandRole(ctx context.Context, p Powers, role string) error {
	if p.Admin || role == "" {
		return nil
	}
	approver, err := s.store.ApproverRole(ctx, role)
	if err != nil {
		return err
	}
	if approver {
		return needs("admin")
	}
	return nil
}

// NotFoundError names which of several records does not exist (404).
type NotFoundError struct{ What string }

func (e *NotFoundError) Error() string { return e.What + " not found" }

// Is makes a NotFoundError a persistence.ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == persistence.ErrNotFound }

// userAndRole checks that both are given and exist.
func (s *Service) userAndRole(ctx context.Context, userID, role string) error {
	var v extensions.ValidationError
	if userID == "" {
		v.Add("userId", "is required")
	}
	if role == "" {
		v.Add("role", "is required")
	}
	if err := v.Err(); err != nil {
		return err
	}
	if _, err := s.GetUser(ctx, userID); errors.Is(err, persistence.ErrNotFound) {
		return &NotFoundError{What: "user"}
	} else if err != nil {
		return err
	}
	if _, err := s.store.GetRole(ctx, role); errors.Is(err, persistence.ErrNotFound) {
		return &NotFoundError{What: "role"}
	} else if err != nil {
		return err
	}
	return nil
}

// AssignRole gives a user a role; assigning it again changes nothing. It
// returns the user's roles. An approver role needs the admin scope
// (mayHandRole).
func (s *Service) AssignRole(ctx context.Context, actor persistence.Actor, p Powers, userID, role string) ([]persistence.Role, error) {
	if err := s.userAndRole(ctx, userID, role); err != nil {
		return nil, err
	}
	if err := s.mayHandRole(ctx, p, role); err != nil {
		return nil, err
	}
	now := s.now()
	if _, err := s.store.AssignRole(ctx, userID, role, now, Event(RoleAssigned, actor, now, userID, "", map[string]any{"role": role})); err != nil {
		return nil, notFoundOnConflict(err)
	}
	return s.store.UserRoles(ctx, userID)
}

// RemoveRole takes a role from a user; removing one they do not hold
// changes nothing. It returns the user's roles. An approver role needs the
// admin scope (mayHandRole).
func (s *Service) RemoveRole(ctx context.Context, actor persistence.Actor, p Powers, userID, role string) ([]persistence.Role, error) {
	if err := s.userAndRole(ctx, userID, role); err != nil {
		return nil, err
	}
	if err := s.mayHandRole(ctx, p, role); err != nil {
		return nil, err
	}
	if _, err := s.store.RemoveRole(ctx, userID, role, Event(RoleRemoved, actor, s.now(), userID, "", map[string]any{"role": role})); err != nil {
		return nil, err
	}
	return s.store.UserRoles(ctx, userID)
}

// notFoundOnConflict: a foreign key broken by a concurrent deletion of the
// user or role reads as the deletion it is.
func notFoundOnConflict(err error) error {
	if errors.Is(err, persistence.ErrMissingReference) {
		return fmt.Errorf("user or role deleted meanwhile: %w", persistence.ErrNotFound)
	}
	return err
}

// UserRoles lists a user's roles; the user must exist.
func (s *Service) UserRoles(ctx context.Context, userID string) ([]persistence.Role, error) {
	if _, err := s.GetUser(ctx, userID); err != nil {
		return nil, err
	}
	return s.store.UserRoles(ctx, userID)
}

// ApplicationUsers returns one page of the people who have signed in
// through an application (per-application M2M reads, issue 17).
func (s *Service) ApplicationUsers(ctx context.Context, appID string, p persistence.Page) ([]persistence.User, int, error) {
	return s.store.ListApplicationUsers(ctx, appID, p)
}
