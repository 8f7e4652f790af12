package authz

import (
	"bytes"
	"encoding/json"
	"net/http"

	openfgav1 "github.com/openfga/api/proto/openfga/v1"
	"github.com/openfga/language/pkg/go/transformer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/identityd/identityd/extensions"
)

// ParseModel reads a model as the API takes it: OpenFGA's JSON form
// ({"schema_version", "type_definitions", "conditions"}, as OpenFGA's own
// API and tools write it), or the DSL in a JSON string ({"dsl": "model\n
// schema 1.1\n..."}), parsed by OpenFGA's language library. Whether the
// model is sound (types, relations, cycles) is the engine's to judge when
// it is written.
func ParseModel(body []byte) (*openfgav1.AuthorizationModel, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(body, &probe); err != nil {
		return nil, extensions.NewError(http.StatusBadRequest, "invalid_json", "The body must be a JSON object: an OpenFGA model in its JSON form, or {\"dsl\": \"...\"}.", nil)
	}
	if raw, ok := probe["dsl"]; ok {
		if len(probe) != 1 {
			return nil, invalidModel("A model in the DSL is sent alone: {\"dsl\": \"...\"}, without other members.", "")
		}
		var dsl string
		if err := json.Unmarshal(raw, &dsl); err != nil {
			return nil, invalidModel("dsl must be a string.", "")
		}
		m, err := transformer.TransformDSLToProto(dsl)
		if err != nil {
			return nil, invalidModel("The DSL does not parse: "+err.Error(), err.Error())
		}
		return m, nil
	}
	if _, ok := probe["id"]; ok {
		// OpenFGA names every version itself; an id in the body would look
		// like it chose one.
		return nil, invalidModel("A model's id is given by the engine when it is written; leave id out.", "")
	}
	var m openfgav1.AuthorizationModel
	if err := protojson.Unmarshal(body, &m); err != nil {
		return nil, invalidModel("The model is not an OpenFGA model in its JSON form: "+err.Error(), err.Error())
	}
	return &m, nil
}

func invalidModel(message, reason string) error {
	details := map[string]any{}
	if reason != "" {
		details["reason"] = reason
	}
	return extensions.NewError(http.StatusBadRequest, "invalid_model", message, details)
}

// ModelJSON is a stored model as the API answers it: its id (the version),
// the model in OpenFGA's JSON form, and the same in the DSL.
func ModelJSON(m *openfgav1.AuthorizationModel) map[string]any {
	raw, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	var form map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	_ = dec.Decode(&form)
	delete(form, "id")
	out := map[string]any{"id": m.GetId(), "model": form}
	if dsl, err := transformer.TransformJSONProtoToDSL(m); err == nil {
		out["dsl"] = dsl
	}
	return out
}
