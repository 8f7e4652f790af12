package oauth

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/openid"

	"github.com/identityd/identityd/persistence"
)

// Session is identityd's one fosite session: fosite's OpenID Connect
// session (subject, expiry, ID token claims) and, as typed fields, what our
// handlers add. It is stored with its token as JSON; the unexported fields
// live only while a request is handled.
type Session struct {
	openid.DefaultSession

	// SessionID is the single sign-on session a person's tokens belong to:
	// they live no longer than it.
	SessionID string `json:"session_id,omitempty"`

	// Act is a delegated token's act claim (RFC 8693 §4.1): who acts for
	// the subject, hop by hop.
	Act *Actor `json:"act,omitempty"`
	// Chain lists the principals a delegated token depends on: its subject
	// token's client and the earlier actors. Never shown.
	Chain []ChainLink `json:"chain,omitempty"`
	// Exchange says what an exchanged token was based on (for the audit).
	Exchange *Provenance `json:"exchange,omitempty"`
	// Details are the authorization_details granted (RFC 9396), each with
	// what its agent must keep holding for it to hold.
	Details []GrantedDetail `json:"authorization_details,omitempty"`
	// JITGrants are the just-in-time grants whose scopes the token
	// carries: it is active only while each of them is (tokens.go).
	JITGrants []string `json:"jit_grants,omitempty"`
	// DelegationID is the person's delegation (CIBA, issue 16) the token
	// speaks under: it lives no longer than the delegation, and tokens
	// exchanged from it carry it on.
	DelegationID string `json:"delegation_id,omitempty"`

	// A delegation's subject token's entries, which grantDetails narrows
	// or inherits (delegated: the request is a delegation).
	inherited []any
	delegated bool
	// expiryCap: the token lives no longer (DetailCondition.Until).
	expiryCap time.Time
	// claims are what the token says now (narrow): introspection shows them.
	claims map[string]any
}

// Actor is one hop of an act claim.
type Actor struct {
	Subject string `json:"sub"`
	Act     *Actor `json:"act,omitempty"`
}

// depth counts the actors of an act claim.
func (a *Actor) depth() int {
	n := 0
	for ; a != nil; a = a.Act {
		n++
	}
	return n
}

// ChainLink is a principal a delegated token depends on: a client as the
// principal it was when the token was made.
type ChainLink struct {
	ClientID    string `json:"client_id"`
	PrincipalID string `json:"principal_id"`
}

// Provenance is what an exchanged token was based on: a platform token's
// issuer and subject, or an access token's client.
type Provenance struct {
	Issuer          string `json:"issuer,omitempty"`
	Subject         string `json:"subject,omitempty"`
	SubjectClientID string `json:"subjectClientId,omitempty"`
}

// GrantedDetail is one authorization_details entry bound to a token.
type GrantedDetail struct {
	Entry     any             `json:"entry"`
	Condition DetailCondition `json:"condition"`
}

var (
	_ fosite.Session              = (*Session)(nil)
	_ fosite.ExtraClaimsSession   = (*Session)(nil)
	_ openid.Session              = (*Session)(nil)
	_ persistence.SSOBound        = (*Session)(nil)
	_ persistence.DelegationBound = (*Session)(nil)
)

// DelegationRef implements persistence.DelegationBound.
func (s *Session) DelegationRef() string { return s.DelegationID }

// SSOSessionID implements persistence.SSOBound: a person's tokens live no
// longer than their SSO session.
func (s *Session) SSOSessionID() string { return s.SessionID }

// NewSession is the session every token request and introspection starts with.
func NewSession() *Session { return &Session{} }

// Clone implements fosite.Session: a copy whose maps and lists can change
// without touching s (what they hold is shared and never changed). The
// request-time fields are not copied.
func (s *Session) Clone() fosite.Session {
	if s == nil {
		return nil
	}
	c := &Session{DefaultSession: s.DefaultSession, SessionID: s.SessionID, Act: s.Act, Chain: slices.Clone(s.Chain), Exchange: s.Exchange, Details: slices.Clone(s.Details),
		JITGrants: slices.Clone(s.JITGrants), DelegationID: s.DelegationID}
	c.ExpiresAt = maps.Clone(s.ExpiresAt)
	if s.Claims != nil {
		claims := *s.Claims
		claims.Audience = slices.Clone(claims.Audience)
		claims.AuthenticationMethodsReferences = slices.Clone(claims.AuthenticationMethodsReferences)
		claims.Extra = maps.Clone(claims.Extra)
		c.Claims = &claims
	}
	if s.Headers != nil {
		headers := *s.Headers
		headers.Extra = maps.Clone(headers.Extra)
		c.Headers = &headers
	}
	return c
}

// GetExtraClaims implements fosite.ExtraClaimsSession: introspection
// writes these at the top level (RFC 7662 §2.2; RFC 9396 §9.2). They are
// what narrow found the token to mean now; a fresh map each call.
func (s *Session) GetExtraClaims() map[string]any {
	out := maps.Clone(s.claims)
	if out == nil {
		out = map[string]any{}
	}
	return out
}

// GrantedEntries are the authorization_details entries bound to the token
// when it was issued.
func (s *Session) GrantedEntries() []any {
	if s.Details == nil {
		return nil
	}
	out := make([]any, len(s.Details))
	for i, d := range s.Details {
		out[i] = d.Entry
	}
	return out
}

// UnmarshalJSON reads a stored session, numbers keeping their text (as
// json.Number), and the form tokens issued before the typed session were
// stored in: fosite's default session, whose "extra" held these fields
// under other names.
func (s *Session) UnmarshalJSON(b []byte) error {
	type plain Session // without this method
	var v struct {
		plain
		Extra map[string]any `json:"extra"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	// Expiries set before keep their place unless stored ones replace
	// them, as encoding/json merges into a map: fosite sets the new access
	// and refresh tokens' expiries on the request's session before it
	// reads the code into it.
	set := s.ExpiresAt
	*s = Session(v.plain)
	for kind, at := range set {
		if _, ok := s.ExpiresAt[kind]; !ok {
			s.SetExpiresAt(kind, at)
		}
	}
	if v.Extra != nil {
		return s.fromExtra(v.Extra)
	}
	return nil
}

// fromExtra reads the fields of a session stored before the typed session.
func (s *Session) fromExtra(extra map[string]any) error {
	recode := func(from any, to any) error {
		if from == nil {
			return nil
		}
		b, err := json.Marshal(from)
		if err != nil {
			return err
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		return dec.Decode(to)
	}
	var chain [][2]string
	var conds []DetailCondition
	if err := recode(extra["act"], &s.Act); err != nil {
		return err
	}
	if err := recode(extra["identityd_chain"], &chain); err != nil {
		return err
	}
	if err := recode(extra["identityd_exchange"], &s.Exchange); err != nil {
		return err
	}
	if err := recode(extra["identityd_detail_conditions"], &conds); err != nil {
		return err
	}
	for _, link := range chain {
		s.Chain = append(s.Chain, ChainLink{ClientID: link[0], PrincipalID: link[1]})
	}
	if entries, ok := extra["authorization_details"].([]any); ok {
		s.Details = []GrantedDetail{} // bound, even if none can be read back: say less, never more
		if len(conds) == len(entries) {
			for i, e := range entries {
				s.Details = append(s.Details, GrantedDetail{Entry: e, Condition: conds[i]})
			}
		}
	}
	return nil
}
