package rar

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
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
func depth(v any) int {
	deepest := 0
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			deepest = max(deepest, depth(e))
		}
	case []any:
		for _, e := range v {
			deepest = max(deepest, depth(e))
		}
	default:
		return 0
	}
	return deepest + 1
}
