package oauth

import (
	"net/url"
	"slices"
	"testing"

	"github.com/identityd/identityd/persistence"
)

// RFC 8693 §2.1: each audience value is one audience, spaces and all; empty
// values are omitted ones (RFC 6749 §3.2).
func TestTargets(t *testing.T) {
	for _, c := range []struct {
		form url.Values
		want []string
		err  bool
	}{
		{url.Values{"audience": {"urn:example:one two"}}, []string{"urn:example:one two"}, false},
		{url.Values{"audience": {"a", "b c"}}, []string{"a", "b c"}, false},
		{url.Values{"audience": {""}, "resource": {""}}, []string{}, false},
		{url.Values{"audience": {"a"}, "resource": {"https://r.example/x"}}, []string{"a", "https://r.example/x"}, false},
		{url.Values{"resource": {"relative"}}, nil, true},
		{url.Values{"resource": {"https://r.example/#f"}}, nil, true},
	} {
		got, err := targets(c.form)
		if (err != nil) != c.err || (!c.err && !slices.Equal(got, c.want)) {
			t.Errorf("%v: got %q, %v; want %q", c.form, got, err, c.want)
		}
	}
}

func TestMayIntrospect(t *testing.T) {
	plain := &persistence.Client{ID: "sa_a", Scopes: []string{"users:read"}}
	rs := &persistence.Client{ID: "sa_rs", Scopes: []string{ScopeIntrospect}}
	admin := &persistence.Client{ID: "sa_admin", Scopes: []string{ScopeAdmin}}
	for _, c := range []struct {
		caller *persistence.Client
		owner  string
		want   bool
	}{
		{plain, "sa_a", true}, {plain, "sa_b", false}, {rs, "sa_b", true}, {admin, "sa_b", true},
	} {
		if got := MayIntrospect(c.caller, c.owner); got != c.want {
			t.Errorf("%s on %s's token: %v", c.caller.ID, c.owner, got)
		}
	}
}
