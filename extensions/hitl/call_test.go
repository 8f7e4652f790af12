package hitl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/identityd/identityd/extensions"
)

// The canonical body: key order and whitespace do not matter; any change
// of a value, a key, a type or a number's digits does (issue 39).
func TestCanonicalJSON(t *testing.T) {
	base := `{"email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`
	same := []string{
		base,
		"{\n  \"nested\": {\"a\": [true, null], \"b\": 1},\n  \"n\": 9007199254740993,\n\t\"roles\": [\"x\", \"y\"], \"name\": \"A\", \"email\": \"a@example.com\"\n}\n",
		`{"name":"A","email":"a@\u0065xample.com","roles":["x","y"],"nested":{"b":1,"a":[true,null]},"n":9007199254740993}`,
		`{"email":"b@example.com","email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`, // the last of a duplicate key, as the handler reads it
	}
	different := []string{
		`{"email":"b@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`,
		`{"email":"a@example.com","name":"a","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`,
		`{"email":"a@example.com","name":"A","roles":["y","x"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`,
		`{"email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740992,"nested":{"b":1,"a":[true,null]}}`, // 2^53: a double would read both alike
		`{"email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":"1","a":[true,null]}}`,
		`{"email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[false,null]}}`,
		`{"email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true]}}`,
		`{"email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]},"admin":true}`,
		`{"Email":"a@example.com","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`,
		`{"email":"a@example.com ","name":"A","roles":["x","y"],"n":9007199254740993,"nested":{"b":1,"a":[true,null]}}`,
	}
	want, err := CanonicalJSON([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if want != `{"email":"a@example.com","n":9007199254740993,"name":"A","nested":{"a":[true,null],"b":1},"roles":["x","y"]}` {
		t.Fatalf("canonical form: %s", want)
	}
	for _, s := range same {
		if got, err := CanonicalJSON([]byte(s)); err != nil || got != want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", s, got, err, want)
		}
	}
	seen := map[string]string{want: base}
	for _, s := range different {
		got, err := CanonicalJSON([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("%s reads as %s", s, prev)
		}
		seen[got] = s
	}
	// No body, empty, whitespace and null are all no body; HTML stays as written.
	for _, s := range []string{"", " \n", "null"} {
		if got, err := CanonicalJSON([]byte(s)); err != nil || got != "" {
			t.Errorf("%q: %q %v", s, got, err)
		}
	}
	if got, _ := CanonicalJSON([]byte(`{"why":"<b>&</b>"}`)); got != `{"why":"<b>&</b>"}` {
		t.Errorf("HTML escaped: %s", got)
	}
	for _, bad := range []string{`{"a":`, `{"a":1} {"b":2}`, `{"a":1}x`, `nope`} {
		if _, err := CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// A call's digest covers its method, its path with the query (in any
// order of parameters) and its body; the explicit request's call (NewCall,
// from decoded JSON) digests as the gated call's (from the raw body).
func TestCallDigest(t *testing.T) {
	body, _ := CanonicalJSON([]byte(`{"name": "A", "email": "a@example.com"}`))
	gated := Call{Method: "POST", Path: CanonicalPath("/api/v1/m2m/users", "b=2&a=1&a=0"), Body: body}
	var decoded any
	dec := json.NewDecoder(strings.NewReader(`{"email":"a@example.com","name":"A"}`))
	dec.UseNumber()
	if err := dec.Decode(&decoded); err != nil {
		t.Fatal(err)
	}
	var v extensions.ValidationError
	asked := NewCall(&v, "POST", "/api/v1/m2m/users?a=1&a=0&b=2", decoded, func(p string) string { return p })
	if v.Err() != nil || asked.Digest() != gated.Digest() || asked.Path != "/api/v1/m2m/users?a=1&a=0&b=2" {
		t.Fatalf("asked %+v (%v), gated %+v", asked, v.Err(), gated)
	}
	for _, other := range []Call{
		{Method: "PUT", Path: gated.Path, Body: gated.Body},
		{Method: gated.Method, Path: "/api/v1/m2m/users?a=0&a=1&b=2", Body: gated.Body},
		{Method: gated.Method, Path: "/api/v1/m2m/users", Body: gated.Body},
		{Method: gated.Method, Path: gated.Path, Body: ""},
		{Method: gated.Method, Path: gated.Path + `{"email":"a@example.com","name":"A"}`, Body: ""}, // parts cannot slide into each other
	} {
		if other.Digest() == gated.Digest() {
			t.Errorf("%+v digests as %+v", other, gated)
		}
	}
	// Bad calls name their fields.
	v = extensions.ValidationError{}
	NewCall(&v, "TRACE", "users/1", nil, func(p string) string { return p })
	if v.Fields["method"] == "" || v.Fields["path"] == "" {
		t.Fatalf("fields %v", v.Fields)
	}
	for _, p := range []string{"https://evil.example/x", "//evil.example/x", "/x#frag", "/users/\u202e24", ""} {
		v = extensions.ValidationError{}
		NewCall(&v, "GET", p, nil, func(p string) string { return p })
		if v.Fields["path"] == "" {
			t.Errorf("%q: fields %v", p, v.Fields)
		}
	}
	v = extensions.ValidationError{}
	NewCall(&v, "POST", "/x", map[string]any{"big": strings.Repeat("x", MaxCallBodyBytes)}, func(p string) string { return p })
	if v.Fields["body"] == "" {
		t.Errorf("a huge body: %v", v.Fields)
	}
	// The path shown hides what hide hides; the digest is the real path's.
	c := NewCall(&extensions.ValidationError{}, "POST", "/api/v1/m2m/invites/secret/accept", nil, func(string) string { return "/api/v1/m2m/invites/{token}/accept" })
	if c.shown() != "/api/v1/m2m/invites/{token}/accept" || c.Digest() != (Call{Method: "POST", Path: "/api/v1/m2m/invites/secret/accept"}).Digest() {
		t.Errorf("hidden: %+v", c)
	}
}
