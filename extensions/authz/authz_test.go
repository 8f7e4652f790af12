package authz

import (
	"errors"
	"strings"
	"testing"

	openfgav1 "github.com/openfga/api/proto/openfga/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/identityd/identityd/extensions"
)

func TestParseModel(t *testing.T) {
	for _, c := range []struct {
		name, body string
		types      int
		code       string
	}{
		{"dsl", `{"dsl":"model\n  schema 1.1\ntype user\ntype doc\n  relations\n    define viewer: [user]\n"}`, 2, ""},
		{"json form", `{"schema_version":"1.1","type_definitions":[{"type":"user"}]}`, 1, ""},
		{"dsl and more", `{"dsl":"model\n  schema 1.1\n","schema_version":"1.1"}`, 0, "invalid_model"},
		{"dsl not a string", `{"dsl":1}`, 0, "invalid_model"},
		{"bad dsl", `{"dsl":"type"}`, 0, "invalid_model"},
		{"id given", `{"id":"01","schema_version":"1.1","type_definitions":[]}`, 0, "invalid_model"},
		{"unknown member", `{"schema_version":"1.1","type_definitions":[],"nope":1}`, 0, "invalid_model"},
		{"wrong type", `{"schema_version":"1.1","type_definitions":{}}`, 0, "invalid_model"},
		{"not an object", `[1]`, 0, "invalid_json"},
	} {
		m, err := ParseModel([]byte(c.body))
		var e *extensions.Error
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.code == "" && len(m.GetTypeDefinitions()) != c.types:
			t.Errorf("%s: %d types, want %d", c.name, len(m.GetTypeDefinitions()), c.types)
		case c.code != "" && (!errors.As(err, &e) || e.Code != c.code):
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
	}
}

func TestCheckTuples(t *testing.T) {
	full := Tuple{User: "user:a", Relation: "r", Object: "doc:1"}
	for _, c := range []struct {
		name  string
		list  []Tuple
		field string
	}{
		{"fine", []Tuple{full}, ""},
		{"no user", []Tuple{{Relation: "r", Object: "doc:1"}}, "w[0].user"},
		{"no relation", []Tuple{full, {User: "user:a", Object: "doc:1"}}, "w[1].relation"},
		{"no object", []Tuple{{User: "user:a", Relation: "r"}}, "w[0].object"},
		{"condition without name", []Tuple{{User: "user:a", Relation: "r", Object: "doc:1", Condition: &TupleCondition{}}}, "w[0].condition.name"},
		{"too many", []Tuple{full, full, full}, "w"},
	} {
		var v extensions.ValidationError
		CheckTuples("w", c.list, 2, &v)
		if _, ok := v.Fields[c.field]; c.field != "" && !ok || c.field == "" && v.Err() != nil {
			t.Errorf("%s: %v, want a problem with %q", c.name, v.Fields, c.field)
		}
	}
}

func TestEngineError(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{status.Error(codes.InvalidArgument, "bad"), 400, "authz_invalid_request"},
		{status.Error(codes.Code(2000), "type 'x' not found"), 400, "authz_invalid_request"},
		{status.Error(codes.Code(openfgav1.ErrorCode_invalid_continuation_token), "Invalid continuation token"), 400, "invalid_cursor"},
		{status.Error(codes.ResourceExhausted, "throttled"), 422, "authz_unresolved"},
		{status.Error(codes.Aborted, "transactional write failed due to conflict"), 409, "authz_conflict"},
		{status.Error(codes.Code(4000), "internal"), 0, ""},
		{errors.New("plain"), 0, ""},
	} {
		err := engineError(c.err)
		var e *extensions.Error
		if c.status == 0 {
			if errors.As(err, &e) {
				t.Errorf("%v became a refusal: %v", c.err, err)
			}
			continue
		}
		if !errors.As(err, &e) || e.Status != c.status || e.Code != c.code {
			t.Errorf("%v: %v, want %d %s", c.err, err, c.status, c.code)
		}
	}
	if engineError(nil) != nil {
		t.Error("no error became one")
	}
}

func TestDepth(t *testing.T) {
	deep := map[string]any{}
	cur := deep
	for range MaxContextDepth {
		next := map[string]any{}
		cur["a"] = next
		cur = next
	}
	if _, err := structOf(deep); err == nil || !strings.Contains(err.Error(), "nest") {
		t.Errorf("a context %d deep: %v", MaxContextDepth+1, err)
	}
	if _, err := structOf(map[string]any{"a": []any{1, "x", map[string]any{"b": true}}}); err != nil {
		t.Error(err)
	}
}
