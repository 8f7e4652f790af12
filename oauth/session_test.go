package oauth

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/ory/fosite"
	"github.com/ory/fosite/token/jwt"
)

// A session reads back from its stored JSON as it was, numbers by their text.
func TestSessionRoundTrip(t *testing.T) {
	exp := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	s := &Session{
		Act:      &Actor{Subject: "agt_b", Act: &Actor{Subject: "agt_c"}},
		Chain:    []ChainLink{{ClientID: "sa_x", PrincipalID: "id-x"}},
		Exchange: &Provenance{SubjectClientID: "sa_x"},
		Details: []GrantedDetail{{
			Entry:     map[string]any{"type": "payment", "amount": json.Number("12345678901234567890.5")},
			Condition: DetailCondition{Capabilities: []string{"write_users"}, Writes: true},
		}},
	}
	s.SetSubject("sa_x")
	s.SetExpiresAt(fosite.AccessToken, exp)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	got := &Session{}
	if err := json.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, s)
	}
}

// Tokens issued before the typed session were stored as fosite's default
// session with our fields in "extra": they read back with every field, so
// that a delegated token keeps its chain (and dies with it) across an upgrade.
func TestSessionReadsLegacyExtra(t *testing.T) {
	legacy := `{"expires_at":{"access_token":"2026-11-22T10:00:00Z"},"username":"","subject":"sa_x","extra":{
		"act":{"sub":"agt_b","act":{"sub":"agt_c"}},
		"identityd_chain":[["sa_x","id-x"],["agt_c","id-c#2"]],
		"identityd_exchange":{"subjectClientId":"sa_x"},
		"authorization_details":[{"type":"payment","amount":1e400}],
		"identityd_detail_conditions":[{"capabilities":["write_users"],"writes":true}]}}`
	s := &Session{}
	if err := json.Unmarshal([]byte(legacy), s); err != nil {
		t.Fatal(err)
	}
	want := &Session{
		Act:      &Actor{Subject: "agt_b", Act: &Actor{Subject: "agt_c"}},
		Chain:    []ChainLink{{"sa_x", "id-x"}, {"agt_c", "id-c#2"}},
		Exchange: &Provenance{SubjectClientID: "sa_x"},
		Details: []GrantedDetail{{
			Entry:     map[string]any{"type": "payment", "amount": json.Number("1e400")},
			Condition: DetailCondition{Capabilities: []string{"write_users"}, Writes: true},
		}},
	}
	want.Subject = "sa_x"
	want.ExpiresAt = map[fosite.TokenType]time.Time{fosite.AccessToken: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("legacy session:\n got %#v\nwant %#v", s, want)
	}

	// Entries whose conditions cannot be read back hold nothing.
	broken := `{"extra":{"authorization_details":[{"type":"a"},{"type":"b"}],"identityd_detail_conditions":[{}]}}`
	s = &Session{}
	if err := json.Unmarshal([]byte(broken), s); err != nil {
		t.Fatal(err)
	}
	if s.Details == nil || len(s.Details) != 0 {
		t.Fatalf("mismatched conditions: details %#v, want bound and empty", s.Details)
	}
}

// A clone shares nothing a caller may change: the cache hands out clones of
// one stored session to concurrent requests.
func TestSessionClone(t *testing.T) {
	s := &Session{Chain: []ChainLink{{"a", "b"}}, Details: []GrantedDetail{{Entry: "x"}}}
	s.SetExpiresAt(fosite.AccessToken, time.Unix(100, 0))
	s.Claims = &jwt.IDTokenClaims{Audience: []string{"app"}, AuthenticationMethodsReferences: []string{"pwd"}, Extra: map[string]any{"k": "v"}}
	s.Headers = &jwt.Headers{Extra: map[string]any{"kid": "1"}}
	s.claims = map[string]any{"agent_id": "x"}

	c := s.Clone().(*Session)
	c.SetExpiresAt(fosite.AccessToken, time.Unix(200, 0))
	c.Chain[0].ClientID = "changed"
	c.Details[0].Entry = "changed"
	c.Claims.Audience[0], c.Claims.AuthenticationMethodsReferences[0], c.Claims.Extra["k"] = "changed", "changed", "changed"
	c.Headers.Extra["kid"] = "changed"
	if s.GetExpiresAt(fosite.AccessToken) != time.Unix(100, 0) || s.Chain[0].ClientID != "a" || s.Details[0].Entry != "x" ||
		s.Claims.Audience[0] != "app" || s.Claims.AuthenticationMethodsReferences[0] != "pwd" || s.Claims.Extra["k"] != "v" || s.Headers.Extra["kid"] != "1" {
		t.Fatalf("changing the clone changed the original: %#v", s)
	}
	if c.claims != nil {
		t.Fatal("a clone carries the request-time claims of the original")
	}
	if (*Session)(nil).Clone() != nil {
		t.Fatal("a nil session clones to something")
	}
}
