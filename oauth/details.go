package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
)

// Rich authorization requests (RFC 9396) at the token endpoint: the
// authorization_details parameter is checked by a DetailsPolicy (the rar
// extension), bound to the token in its session, returned in the token
// response (§7) and in introspection (§9.2), and, like scopes, narrowed on
// every use to what the token's agent may still hold.

// ErrInvalidAuthorizationDetails is RFC 9396 §5's error.
var ErrInvalidAuthorizationDetails = &fosite.RFC6749Error{
	ErrorField:       "invalid_authorization_details",
	DescriptionField: "The authorization_details parameter is invalid.",
	CodeField:        http.StatusBadRequest,
}

// InvalidDetails is ErrInvalidAuthorizationDetails saying what is wrong.
func InvalidDetails(hint string) *fosite.RFC6749Error {
	return ErrInvalidAuthorizationDetails.WithHint(DescriptionText(hint))
}

// DescriptionText makes text fit for error_description, whose characters
// RFC 6749 §5.2 limits to printable ASCII without '"' and '\': a quote
// becomes an apostrophe, anything else outside the set a '?'. Hints that
// quote the client's input need it.
func DescriptionText(text string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '"':
			return '\''
		case r == '\\' || r < 0x20 || r > 0x7e:
			return '?'
		}
		return r
	}, text)
}

// TypeHITLApproval is the built-in authorization_details type that redeems
// a human-in-the-loop approval (extensions/hitl); no RAR type may take its name.
const TypeHITLApproval = "hitl_approval"

// ClaimAuthorizationDetails names the details in the token response and in
// introspection; session extras under this key are the entries granted.
const ClaimAuthorizationDetails = "authorization_details"

// DetailCondition is what an agent must keep holding for a granted entry to
// keep holding: the capabilities its type requires, and whether it asks for
// more than read-only actions (which sandboxed agents may not have).
type DetailCondition struct {
	Capabilities []string `json:"capabilities,omitempty"`
	Writes       bool     `json:"writes,omitempty"`
	// Until: the entry holds no longer than this (a HITL approval's
	// validity), and a token that carries it lives no longer either.
	Until *time.Time `json:"until,omitempty"`
}

// DetailsPolicy decides authorization_details.
type DetailsPolicy interface {
	// Grant checks an authorization_details parameter (its JSON text) for
	// client and returns the entries to bind with their conditions, or
	// ErrInvalidAuthorizationDetails saying what is wrong.
	Grant(ctx context.Context, client *persistence.Client, text string) ([]any, []DetailCondition, error)
	// Holds tells whether a granted entry's condition still holds for client.
	Holds(client *persistence.Client, c DetailCondition) bool
}

// grantDetails is the token-endpoint handler that binds authorization_details
// to client-credentials and token-exchange tokens. It runs after the client
// is known (authenticated, or settled by the exchange) and before the token
// is issued, so a refusal leaves nothing issued.
type grantDetails struct{ policy DetailsPolicy }

var _ fosite.TokenEndpointHandler = (*grantDetails)(nil)

func (g *grantDetails) HandleTokenEndpointRequest(ctx context.Context, req fosite.AccessRequester) error {
	form := req.GetRequestForm()
	session, ok := req.GetSession().(*Session)
	if !ok {
		return fosite.ErrServerError.WithDebug("unexpected session type")
	}
	// A delegated token carries at most its subject token's entries: a
	// subset when the request names some, else all of them, each within
	// the new client's own ceiling.
	inherited, delegated := session.inherited, session.delegated
	text := form.Get(ClaimAuthorizationDetails)
	switch {
	case text == "" && len(inherited) == 0:
		return nil
	case text == "":
		b, err := json.Marshal(inherited)
		if err != nil {
			return fosite.ErrServerError.WithWrap(err)
		}
		text = string(b)
	}
	client, ok := req.GetClient().(*persistence.Client)
	if !ok || g.policy == nil {
		return InvalidDetails("No authorization details types are registered.")
	}
	entries, conds, err := g.policy.Grant(ctx, client, text)
	var rfc *fosite.RFC6749Error
	if errors.As(err, &rfc) {
		if delegated && form.Get(ClaimAuthorizationDetails) == "" {
			return InvalidDetails("The subject token's authorization_details exceed what this client may hold; ask for a subset with authorization_details. " + rfc.HintField)
		}
		return err
	} else if err != nil {
		return fosite.ErrServerError.WithWrap(err)
	}
	if delegated {
		for i, e := range entries {
			if !containsJSON(inherited, e) {
				return InvalidDetails(fmt.Sprintf("authorization_details[%d] was not granted to the subject token.", i))
			}
		}
	}
	session.Details = make([]GrantedDetail, len(entries))
	for i := range entries {
		session.Details[i] = GrantedDetail{Entry: entries[i], Condition: conds[i]}
		if u := conds[i].Until; u != nil && (session.expiryCap.IsZero() || u.Before(session.expiryCap)) {
			session.expiryCap = *u
		}
	}
	return nil
}

// expiryCap is the token-endpoint handler, after the grant's own, that
// makes a token live no longer than what it carries (DetailCondition.Until).
type expiryCap struct{}

var _ fosite.TokenEndpointHandler = (*expiryCap)(nil)

func (expiryCap) HandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) error {
	s, ok := req.GetSession().(*Session)
	if !ok || s.expiryCap.IsZero() {
		return nil
	}
	if exp := s.GetExpiresAt(fosite.AccessToken); exp.IsZero() || s.expiryCap.Before(exp) {
		s.SetExpiresAt(fosite.AccessToken, s.expiryCap)
	}
	return nil
}

func (expiryCap) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

func (expiryCap) CanSkipClientAuth(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne(GrantTokenExchange)
}

func (expiryCap) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne("client_credentials") || req.GetGrantTypes().ExactOne(GrantTokenExchange)
}

// containsJSON tells whether list (a JSON array as decoded) holds an entry
// equal to e as JSON: same members, same values, numbers by their text.
func containsJSON(list any, e any) bool {
	want, err := json.Marshal(e)
	if err != nil {
		return false
	}
	entries, _ := list.([]any)
	for _, x := range entries {
		if got, err := json.Marshal(x); err == nil && string(got) == string(want) {
			return true
		}
	}
	return false
}

func (*grantDetails) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

// CanSkipClientAuth defers to the token exchange, which runs first and
// settles the client (a federation exchange has no client secret).
func (*grantDetails) CanSkipClientAuth(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne(GrantTokenExchange)
}

func (*grantDetails) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne("client_credentials") || req.GetGrantTypes().ExactOne(GrantTokenExchange)
}

// GrantedDetails returns the authorization_details a request was granted, or nil.
func GrantedDetails(req fosite.Requester) []any {
	if s, ok := req.GetSession().(*Session); ok {
		return s.GrantedEntries()
	}
	return nil
}

// jitScopes is the token-endpoint handler, after the grant's own, that
// binds a client-credentials token carrying scopes of an agent's
// just-in-time grants to those grants: it names them in the session
// (introspection and the API refuse the token once one has ended) and
// lives no longer than the earliest of them. Each scope is taken from the
// live grant that holds it longest.
type jitScopes struct{}

var _ fosite.TokenEndpointHandler = (*jitScopes)(nil)

func (jitScopes) HandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) error {
	c, ok := req.GetClient().(*persistence.Client)
	s, sok := req.GetSession().(*Session)
	if !ok || !sok || c.Agent == nil || len(c.Agent.Grants) == 0 {
		return nil
	}
	live := c.Agent.LiveGrants(time.Now())
	for _, scope := range req.GetGrantedScopes() {
		if slices.Contains(c.Scopes, scope) {
			continue
		}
		var best *persistence.LiveGrant
		for i := range live {
			if slices.Contains(live[i].Scopes, scope) && (best == nil || live[i].ExpiresAt.After(best.ExpiresAt)) {
				best = &live[i]
			}
		}
		if best == nil {
			return fosite.ErrInvalidScope.WithHintf("The scope '%s' is not held.", scope)
		}
		if !slices.Contains(s.JITGrants, best.ID) {
			s.JITGrants = append(s.JITGrants, best.ID)
		}
		if s.expiryCap.IsZero() || best.ExpiresAt.Before(s.expiryCap) {
			s.expiryCap = best.ExpiresAt
		}
	}
	return nil
}

func (jitScopes) PopulateTokenEndpointResponse(context.Context, fosite.AccessRequester, fosite.AccessResponder) error {
	return fosite.ErrUnknownRequest
}

func (jitScopes) CanSkipClientAuth(context.Context, fosite.AccessRequester) bool { return false }

func (jitScopes) CanHandleTokenEndpointRequest(_ context.Context, req fosite.AccessRequester) bool {
	return req.GetGrantTypes().ExactOne("client_credentials")
}

// grantsHold tells whether the just-in-time grants a token names are all
// still live for its client as it is now.
func grantsHold(c *persistence.Client, ids []string) bool {
	if len(ids) == 0 {
		return true
	}
	if c.Agent == nil {
		return false
	}
	live := c.Agent.LiveGrants(time.Now())
	for _, id := range ids {
		if !slices.ContainsFunc(live, func(g persistence.LiveGrant) bool { return g.ID == id }) {
			return false
		}
	}
	return true
}
