package rar

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/identityd/identityd/extensions"
)

// Bounds on a type's JSON Schema.
const (
	MaxSchemaBytes = 64 << 10
	MaxSchemaDepth = 32
)

// schemaURL is where a type's schema is said to live while it compiles; no
// document is ever fetched from it.
const schemaURL = "https://identityd.invalid/rar-type-schema.json" // .invalid: RFC 2606

// errNoRemote refuses every schema document but the one being compiled (and
// the embedded meta-schemas, which the library serves itself): a type's
// schema must be whole, and compiling must never read a file or the network.
var errNoRemote = errors.New("references outside the schema are not allowed")

type refuseLoader struct{}

func (refuseLoader) Load(string) (any, error) { return nil, errNoRemote }

// compileSchema checks and compiles a type's schema: a JSON object within
// the bounds above, valid against its meta-schema (draft 2020-12 unless it
// names another with $schema), with no reference to another document.
func compileSchema(text []byte) (*jsonschema.Schema, error) {
	if len(text) > MaxSchemaBytes {
		return nil, fmt.Errorf("must be at most %d bytes of JSON", MaxSchemaBytes)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(text))
	if err != nil {
		return nil, errors.New("must be valid JSON")
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, errors.New("must be a JSON object")
	}
	if depth(doc) > MaxSchemaDepth {
		return nil, fmt.Errorf("must not nest deeper than %d levels", MaxSchemaDepth)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, schemaProblem(err)
	}
	return sch, nil
}

// compileNew compiles a schema being registered: compileSchema, and no
// reference cycle (refCycle). Stored schemas are compiled without the
// second check, so a type registered before it keeps working as it did.
func compileNew(text []byte) (*jsonschema.Schema, error) {
	sch, err := compileSchema(text)
	if err != nil {
		return nil, err
	}
	if loc := refCycle(sch); loc != "" {
		return nil, fmt.Errorf("refers back to itself at %q without reaching into the value checked (a $ref cycle), so no value could be checked against it", loc)
	}
	return sch, nil
}

// refCycle returns the location of a subschema that applies itself again to
// the same value: through $ref, $dynamicRef, $recursiveRef and the
// applicators that stay on the value (allOf, anyOf, oneOf, not, if, then,
// else, dependentSchemas), without passing through one that reaches into it
// (properties, items, ...). Validation there could never end, and the
// library refuses every value at it as a "reference cycle": {"$ref": "#"}
// is such a schema. Recursion through the value is fine: a tree's schema
// refers to itself under "items". "" when there is none.
//
// $dynamicRef and $recursiveRef are resolved at validation time; here each
// may lead to any schema with its anchor, so a cycle is found wherever one
// could occur.
func refCycle(root *jsonschema.Schema) string {
	var all []*jsonschema.Schema
	seen := map[*jsonschema.Schema]bool{}
	var visit func(*jsonschema.Schema)
	visit = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		all = append(all, s)
		for _, c := range sameValue(s, nil, nil) {
			visit(c)
		}
		for _, c := range intoValue(s) {
			visit(c)
		}
	}
	visit(root)
	dynamic := map[string][]*jsonschema.Schema{}
	var recursive []*jsonschema.Schema
	for _, s := range all {
		if s.DynamicAnchor != "" {
			dynamic[s.DynamicAnchor] = append(dynamic[s.DynamicAnchor], s)
		}
		if s.RecursiveAnchor {
			recursive = append(recursive, s)
		}
	}
	const onPath, done = 1, 2
	state := map[*jsonschema.Schema]int{}
	var cycle func(*jsonschema.Schema) *jsonschema.Schema
	cycle = func(s *jsonschema.Schema) *jsonschema.Schema {
		switch state[s] {
		case onPath:
			return s
		case done:
			return nil
		}
		state[s] = onPath
		for _, n := range sameValue(s, dynamic, recursive) {
			if c := cycle(n); c != nil {
				return c
			}
		}
		state[s] = done
		return nil
	}
	for _, s := range all {
		if c := cycle(s); c != nil {
			return strings.ReplaceAll(c.Location, schemaURL, "")
		}
	}
	return ""
}

// sameValue lists the subschemas s applies to the value it is applied to;
// dynamic and recursive hold the schemas with each $dynamicAnchor and with
// $recursiveAnchor, where a dynamic reference may lead.
func sameValue(s *jsonschema.Schema, dynamic map[string][]*jsonschema.Schema, recursive []*jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else, s.RecursiveRef}
	out = append(append(append(out, s.AllOf...), s.AnyOf...), s.OneOf...)
	for _, d := range s.DependentSchemas {
		out = append(out, d)
	}
	for _, d := range s.Dependencies {
		if d, ok := d.(*jsonschema.Schema); ok {
			out = append(out, d)
		}
	}
	if r := s.RecursiveRef; r != nil && r.RecursiveAnchor {
		out = append(out, recursive...)
	}
	if d := s.DynamicRef; d != nil {
		out = append(out, d.Ref)
		if d.Anchor != "" && d.Ref.DynamicAnchor == d.Anchor {
			out = append(out, dynamic[d.Anchor]...)
		}
	}
	return slices.DeleteFunc(out, func(c *jsonschema.Schema) bool { return c == nil })
}

// intoValue lists the subschemas s applies to parts of its value: its
// members, items, property names or decoded content.
func intoValue(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.PropertyNames, s.UnevaluatedProperties, s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema}
	for _, p := range s.Properties {
		out = append(out, p)
	}
	for _, p := range s.PatternProperties {
		out = append(out, p)
	}
	out = append(out, s.PrefixItems...)
	for _, v := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
		switch v := v.(type) {
		case *jsonschema.Schema:
			out = append(out, v)
		case []*jsonschema.Schema:
			out = append(out, v...)
		}
	}
	return slices.DeleteFunc(out, func(c *jsonschema.Schema) bool { return c == nil })
}

// schemaProblem words a compile error for the admin who wrote the schema.
func schemaProblem(err error) error {
	var load *jsonschema.LoadURLError
	var meta *jsonschema.SchemaValidationError
	switch {
	case errors.As(err, &load):
		return fmt.Errorf("refers to %q: %v", load.URL, errNoRemote)
	case errors.As(err, &meta):
		var ve *jsonschema.ValidationError
		if errors.As(meta.Err, &ve) {
			loc, msg := firstLeaf(ve)
			return fmt.Errorf("is not a valid JSON Schema: at %q: %s", loc, msg)
		}
		return errors.New("is not a valid JSON Schema")
	default:
		return fmt.Errorf("cannot be compiled: %s", strings.ReplaceAll(err.Error(), schemaURL, "schema"))
	}
}

// depth measures how deeply a decoded JSON value nests.
func depth(v any) int { return extensions.JSONDepth(v) }
