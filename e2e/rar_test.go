package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Rich authorization requests (RFC 9396) over real HTTP: the type registry,
// the dry-run validator, and authorization_details bound to tokens under the
// agent's capability ceiling, read back through introspection.

const (
	rarTypesPath    = "/api/v1/rar/types"
	rarValidatePath = "/api/v1/rar/validate"
)

// paymentType is a type with a schema, allowed actions and locations, one
// read-only action and a required capability.
func paymentType(name string) map[string]any {
	return map[string]any{
		"type": name, "displayName": "Payment initiation", "description": "One payment to one creditor.",
		"allowedActions":       []string{"initiate", "status", "cancel"},
		"readOnlyActions":      []string{"status"},
		"allowedLocations":     []string{"https://pay.example/payments"},
		"requiredCapabilities": []string{"write_users"},
		"schema": map[string]any{
			"type":     "object",
			"required": []string{"instructedAmount", "creditorName"},
			"properties": map[string]any{
				"instructedAmount": map[string]any{
					"type": "object", "required": []string{"currency", "amount"},
					"properties": map[string]any{
						"currency": map[string]any{"enum": []string{"EUR", "USD"}},
						"amount":   map[string]any{"type": "string", "pattern": `^[0-9]+(\.[0-9]{1,2})?$`},
					},
				},
				"creditorName": map[string]any{"type": "string", "maxLength": 70},
			},
		},
	}
}

// payment is an entry of paymentType asking for actions.
func payment(typ string, actions ...string) map[string]any {
	return map[string]any{
		"type": typ, "actions": actions, "locations": []string{"https://pay.example/payments"},
		"instructedAmount": map[string]any{"currency": "EUR", "amount": "45.00"}, "creditorName": "Merchant A",
	}
}

func (s *server) registerType(admin string, body map[string]any) map[string]any {
	s.t.Helper()
	r := s.do(http.MethodPost, rarTypesPath, body, bearer(admin)...)
	if r.Status != http.StatusCreated {
		s.t.Fatalf("register type: %s", describe(r))
	}
	return r.JSON(s.t)
}

// detailsToken asks for a client-credentials token carrying details (a JSON
// array, sent as its text in the form, RFC 9396 §6).
func (s *server) detailsToken(clientID, secret string, details any) *response {
	s.t.Helper()
	text, err := json.Marshal(details)
	if err != nil {
		s.t.Fatal(err)
	}
	form := url.Values{"grant_type": {"client_credentials"}, "authorization_details": {string(text)}}
	return s.do(http.MethodPost, tokenPath, form, basic(clientID, secret)...)
}

// sameJSON tells whether two values encode to the same JSON.
func sameJSON(t *testing.T, got, want any) bool {
	t.Helper()
	var g, w any
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if json.Unmarshal(gb, &g) != nil || json.Unmarshal(wb, &w) != nil {
		t.Fatal("not JSON")
	}
	return reflect.DeepEqual(g, w)
}

func TestRARTypeRegistry(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		admin := s.adminToken()
		_, reader := s.registryToken(admin, "reader", "users:read")

		created := s.registerType(admin, paymentType("payment_initiation"))
		exactKeys(t, created, "type", "displayName", "description", "allowedActions", "allowedLocations", "readOnlyActions",
			"requiredCapabilities", "schema", "createdAt", "updatedAt")
		if !sameJSON(t, created["schema"], paymentType("")["schema"]) {
			t.Fatalf("schema answered as %v", created["schema"])
		}
		isoZ(t, created["createdAt"])

		t.Run("refusals", func(t *testing.T) {
			s := s.as(t)
			expectError(t, s.do(http.MethodPost, rarTypesPath, paymentType("payment_initiation"), bearer(admin)...), http.StatusConflict, "type_exists")
			with := func(edit func(map[string]any)) map[string]any {
				b := paymentType("t_" + strings.ToLower(randomString()[:8]))
				edit(b)
				return b
			}
			for _, c := range []struct {
				name  string
				body  map[string]any
				field string
			}{
				{"name with a slash", with(func(b map[string]any) { b["type"] = "pay/ment" }), "type"},
				{"no schema", with(func(b map[string]any) { delete(b, "schema") }), "schema"},
				{"schema not an object", with(func(b map[string]any) { b["schema"] = true }), "schema"},
				{"invalid schema", with(func(b map[string]any) { b["schema"] = map[string]any{"type": 12} }), "schema"},
				{"remote $ref", with(func(b map[string]any) { b["schema"] = map[string]any{"$ref": "https://schemas.example/pay.json"} }), "schema"},
				{"file $ref", with(func(b map[string]any) { b["schema"] = map[string]any{"$ref": "file:///etc/passwd"} }), "schema"},
				{"oversize schema", with(func(b map[string]any) { b["schema"] = map[string]any{"description": strings.Repeat("x", 70_000)} }), "schema"},
				{"read-only action not allowed", with(func(b map[string]any) { b["readOnlyActions"] = []string{"refund"} }), "readOnlyActions[0]"},
				{"relative location", with(func(b map[string]any) { b["allowedLocations"] = []string{"/payments"} }), "allowedLocations[0]"},
				{"unknown capability", with(func(b map[string]any) { b["requiredCapabilities"] = []string{"launch"} }), "requiredCapabilities[0]"},
			} {
				r := s.do(http.MethodPost, rarTypesPath, c.body, bearer(admin)...)
				expectFields(t, r, c.field)
				if c.field == "schema" {
					msg := r.JSON(t)["details"].(map[string]any)["fields"].(map[string]any)["schema"].(string)
					t.Logf("%s: %s", c.name, msg)
				}
			}
			expectError(t, s.do(http.MethodPost, rarTypesPath, with(func(b map[string]any) { b["extra"] = 1 }), bearer(admin)...), http.StatusBadRequest, "invalid_request")
			expectError(t, s.do(http.MethodPost, rarTypesPath, with(func(b map[string]any) { b["allowedActions"] = "initiate" }), bearer(admin)...), http.StatusBadRequest, "invalid_request")
			expectError(t, s.do(http.MethodPost, rarTypesPath, `{"type":`, bearer(admin)...), http.StatusBadRequest, "invalid_json")
			// Writes need admin; reads any valid token; nothing works without one.
			expectScopeRefused(t, s.do(http.MethodPost, rarTypesPath, paymentType("by_reader"), bearer(reader)...), "admin")
			expectScopeRefused(t, s.do(http.MethodPut, rarTypesPath+"/payment_initiation", paymentType("payment_initiation"), bearer(reader)...), "admin")
			expectScopeRefused(t, s.do(http.MethodDelete, rarTypesPath+"/payment_initiation", nil, bearer(reader)...), "admin")
			expectError(t, s.do(http.MethodGet, rarTypesPath, nil), http.StatusUnauthorized, "unauthorized")
		})

		// Registrations racing for one name: exactly one wins.
		t.Run("concurrent registrations", func(t *testing.T) {
			const n = 8
			statuses := make(chan int, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					statuses <- s.as(t).do(http.MethodPost, rarTypesPath, paymentType("raced"), bearer(admin)...).Status
				})
			}
			wg.Wait()
			close(statuses)
			count := map[int]int{}
			for st := range statuses {
				count[st]++
			}
			if count[http.StatusCreated] != 1 || count[http.StatusConflict] != n-1 {
				t.Fatalf("statuses %v, want one 201 and %d 409", count, n-1)
			}
			if r := s.as(t).do(http.MethodDelete, rarTypesPath+"/raced", nil, bearer(admin)...); r.Status != http.StatusNoContent {
				t.Fatalf("delete: %s", describe(r))
			}
		})

		// Read: the list leaves schemas out, one type has it.
		list := mustOK(t, s.do(http.MethodGet, rarTypesPath, nil, bearer(reader)...))
		types := list["types"].([]any)
		if list["total"] != float64(1) || len(types) != 1 || types[0].(map[string]any)["schema"] != nil {
			t.Fatalf("list: %v", list)
		}
		one := mustOK(t, s.do(http.MethodGet, rarTypesPath+"/payment_initiation", nil, bearer(reader)...))
		if !sameJSON(t, one["schema"], paymentType("")["schema"]) || one["displayName"] != "Payment initiation" {
			t.Fatalf("one type: %v", one)
		}
		expectError(t, s.do(http.MethodGet, rarTypesPath+"/none", nil, bearer(reader)...), http.StatusNotFound, "not_found")

		// Discovery lists the registered types, in both documents.
		for _, doc := range []string{"/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"} {
			md := mustOK(t, s.do(http.MethodGet, doc, nil))
			if got := strs(md["authorization_details_types_supported"]); !reflect.DeepEqual(got, []string{"hitl_approval", "payment_initiation"}) {
				t.Fatalf("%s lists %v", doc, got)
			}
		}

		// Replace: every field; the name in the body, if any, must match.
		body := paymentType("payment_initiation")
		body["allowedActions"] = []string{"initiate", "status"}
		replaced := mustOK(t, s.do(http.MethodPut, rarTypesPath+"/payment_initiation", body, bearer(admin)...))
		if !reflect.DeepEqual(strs(replaced["allowedActions"]), []string{"initiate", "status"}) || replaced["createdAt"] != created["createdAt"] {
			t.Fatalf("replaced: %v", replaced)
		}
		expectFields(t, s.do(http.MethodPut, rarTypesPath+"/payment_initiation", paymentType("other"), bearer(admin)...), "type")
		expectError(t, s.do(http.MethodPut, rarTypesPath+"/none", paymentType("none"), bearer(admin)...), http.StatusNotFound, "not_found")
		// The replaced type rules at once: "cancel" is gone.
		r := s.detailsToken(s.AdminID, s.AdminSecret, []any{payment("payment_initiation", "cancel")})
		expectRFC6749(t, r, http.StatusBadRequest, "invalid_authorization_details")

		// Delete.
		if r := s.do(http.MethodDelete, rarTypesPath+"/payment_initiation", nil, bearer(admin)...); r.Status != http.StatusNoContent {
			t.Fatalf("delete: %s", describe(r))
		}
		expectError(t, s.do(http.MethodDelete, rarTypesPath+"/payment_initiation", nil, bearer(admin)...), http.StatusNotFound, "not_found")
		md := mustOK(t, s.do(http.MethodGet, "/.well-known/openid-configuration", nil))
		if got := strs(md["authorization_details_types_supported"]); !reflect.DeepEqual(got, []string{"hitl_approval"}) {
			t.Fatalf("deleted type still advertised (only the built-in hitl_approval stays): %v", got)
		}
		expectRFC6749(t, s.detailsToken(s.AdminID, s.AdminSecret, []any{payment("payment_initiation", "initiate")}), http.StatusBadRequest, "invalid_authorization_details")
	})
}

func TestRARValidate(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		admin := s.superToken()
		s.registerType(admin, paymentType("payment_initiation"))
		_, reader := s.registryToken(admin, "reader", "users:read")
		validate := func(tok string, body any) *response {
			return s.do(http.MethodPost, rarValidatePath, body, bearer(tok)...)
		}

		ok := mustOK(t, validate(reader, map[string]any{"authorization_details": []any{payment("payment_initiation", "initiate")}}))
		if ok["valid"] != true || len(ok["errors"].([]any)) != 0 {
			t.Fatalf("good details: %v", ok)
		}

		bad := payment("payment_initiation", "initiate", "refund")
		bad["instructedAmount"] = map[string]any{"currency": "GBP", "amount": 45}
		bad["locations"] = []string{"https://evil.example/"}
		res := mustOK(t, validate(reader, map[string]any{"authorization_details": []any{payment("payment_initiation", "status"), bad, map[string]any{"type": "wire"}, "text"}}))
		if res["valid"] != false {
			t.Fatalf("bad details answered valid: %v", res)
		}
		type problem struct{ index, typ, pointer, message string }
		var got []problem
		for _, e := range res["errors"].([]any) {
			m := e.(map[string]any)
			exactKeys(t, m, append([]string{"index", "pointer", "message"}, func() []string {
				if _, ok := m["type"]; ok {
					return []string{"type"}
				}
				return nil
			}()...)...)
			typ, _ := m["type"].(string)
			got = append(got, problem{index: strings.TrimSuffix(strings.TrimSuffix(jsonText(m["index"]), ".0"), ""), typ: typ, pointer: m["pointer"].(string), message: m["message"].(string)})
		}
		want := []struct{ index, pointer, contains string }{
			{"1", "/actions/1", `action "refund" is not allowed`},
			{"1", "/locations/0", `location "https://evil.example/" is not allowed`},
			{"1", "/instructedAmount/amount", "want string"},
			{"1", "/instructedAmount/currency", "value must be one of"},
			{"2", "/type", `"wire" is not registered`},
			{"3", "", "must be a JSON object"},
		}
		for _, w := range want {
			found := false
			for _, g := range got {
				if g.index == w.index && g.pointer == w.pointer && strings.Contains(g.message, w.contains) {
					found = true
				}
			}
			if !found {
				t.Errorf("no problem at entry %s %s containing %q; got %+v", w.index, w.pointer, w.contains, got)
			}
		}
		if len(got) != len(want) {
			t.Errorf("got %d problems, want %d: %+v", len(got), len(want), got)
		}

		// An agent meets its own ceiling in the dry run: this one is
		// sandboxed and lacks write_users.
		ag := s.createAgent(admin, map[string]any{"name": "validator", "type": "autonomous", "capabilities": []string{"read_users"}})
		agTok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken
		res = mustOK(t, validate(agTok, map[string]any{"authorization_details": []any{payment("payment_initiation", "initiate")}}))
		if res["valid"] != false || !strings.Contains(jsonText(res["errors"]), `requires capability \"write_users\"`) ||
			!strings.Contains(jsonText(res["errors"]), "read-only actions") {
			t.Fatalf("agent ceiling in the dry run: %v", res)
		}

		// Input that is not an authorization_details array is a 400.
		for _, c := range []struct {
			name string
			body any
			code string
		}{
			{"not an array", map[string]any{"authorization_details": map[string]any{"type": "payment_initiation"}}, "invalid_authorization_details"},
			{"empty array", map[string]any{"authorization_details": []any{}}, "invalid_authorization_details"},
			{"repeated member", `{"authorization_details":[{"type":"payment_initiation","type":"x"}]}`, "invalid_authorization_details"},
			{"too deep", `{"authorization_details":[{"type":"payment_initiation","x":` + strings.Repeat("[", 30) + strings.Repeat("]", 30) + `}]}`, "invalid_authorization_details"},
			{"too many entries", map[string]any{"authorization_details": make([]any, 21)}, "invalid_authorization_details"},
			{"missing", map[string]any{}, "invalid_request"},
			{"unknown field", map[string]any{"authorization_details": []any{}, "x": 1}, "invalid_request"},
			{"malformed JSON", `{"authorization_details": [`, "invalid_json"},
		} {
			expectError(t, validate(reader, c.body), http.StatusBadRequest, c.code)
		}
		expectError(t, s.do(http.MethodPost, rarValidatePath, map[string]any{"authorization_details": []any{}}), http.StatusUnauthorized, "unauthorized")
	})
}

func jsonText(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestRARTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		ctx := context.Background()
		admin := s.superToken()
		s.registerType(admin, paymentType("payment_initiation"))
		s.registerType(admin, map[string]any{"type": "account_information", "allowedActions": []string{"list", "read"}, "schema": map[string]any{}})
		acct := s.createAccount(admin, map[string]any{"name": "payments backend", "scopes": []string{"users:read"}})

		t.Run("Go x/oauth2 client, both auth styles", func(t *testing.T) {
			details := []any{payment("payment_initiation", "initiate"), map[string]any{"type": "account_information", "actions": []string{"read"}}}
			text, _ := json.Marshal(details)
			for _, style := range []oauth2.AuthStyle{oauth2.AuthStyleInHeader, oauth2.AuthStyleInParams} {
				cfg := clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: acct.ClientSecret, TokenURL: s.URL + tokenPath,
					AuthStyle: style, EndpointParams: url.Values{"authorization_details": {string(text)}}}
				tok, err := cfg.Token(ctx)
				if err != nil {
					t.Fatalf("style %v: %v", style, err)
				}
				if !sameJSON(t, tok.Extra("authorization_details"), details) {
					t.Fatalf("token response details %v, want %v", tok.Extra("authorization_details"), details)
				}
				in := s.introspect(t, tok.AccessToken, acct.ClientID, acct.ClientSecret)
				expectActive(t, in, acct.ClientID)
				if !sameJSON(t, in["authorization_details"], details) {
					t.Fatalf("introspection details %v", in["authorization_details"])
				}
				// A resource server with tokens:introspect reads them too.
				if in := s.introspect(t, tok.AccessToken, s.AdminID, s.AdminSecret); !sameJSON(t, in["authorization_details"], details) {
					t.Fatalf("resource server reads %v", in["authorization_details"])
				}
			}
			// Refused through the library.
			cfg := clientcredentials.Config{ClientID: acct.ClientID, ClientSecret: acct.ClientSecret, TokenURL: s.URL + tokenPath,
				EndpointParams: url.Values{"authorization_details": {`[{"type":"wire_transfer"}]`}}}
			_, err := cfg.Token(ctx)
			var re *oauth2.RetrieveError
			if !errors.As(err, &re) || re.ErrorCode != "invalid_authorization_details" || re.Response.StatusCode != http.StatusBadRequest ||
				!strings.Contains(re.ErrorDescription, `'wire_transfer' is not registered`) {
				t.Fatalf("unregistered type through x/oauth2: %v", err)
			}
		})

		t.Run("JSON body", func(t *testing.T) {
			details := []any{map[string]any{"type": "account_information", "actions": []string{"list"}}}
			r := s.as(t).do(http.MethodPost, tokenPath, map[string]any{"grant_type": "client_credentials", "client_id": acct.ClientID,
				"client_secret": acct.ClientSecret, "authorization_details": details})
			if m := mustOK(t, r); !sameJSON(t, m["authorization_details"], details) {
				t.Fatalf("JSON body details: %v", m)
			}
		})

		t.Run("numbers keep their value", func(t *testing.T) {
			// Beyond float64: too large, too precise. Introspection must say
			// what the token response said (PostgreSQL's jsonb may write the
			// same number another way, 1e400 in digits).
			text := `[{"type":"account_information","n":12345678901234567890,"f":1.50,"big":1e400}]`
			tr := s.as(t).do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "authorization_details": {text}}, basic(acct.ClientID, acct.ClientSecret)...)
			tok := decodeToken(t, tr).AccessToken
			for _, body := range [][]byte{tr.Body, s.as(t).do(http.MethodPost, introspectPath, url.Values{"token": {tok}}, basic(acct.ClientID, acct.ClientSecret)...).Body} {
				var m struct {
					Details []map[string]any `json:"authorization_details"`
				}
				dec := json.NewDecoder(bytes.NewReader(body))
				dec.UseNumber()
				if err := dec.Decode(&m); err != nil || len(m.Details) != 1 {
					t.Fatalf("%s: %v", body, err)
				}
				for name, want := range map[string]string{"n": "12345678901234567890", "f": "1.50", "big": "1e400"} {
					num, _ := m.Details[0][name].(json.Number)
					got, _, err1 := big.ParseFloat(string(num), 10, 2000, big.ToNearestEven)
					exp, _, err2 := big.ParseFloat(want, 10, 2000, big.ToNearestEven)
					if err1 != nil || err2 != nil || got.Cmp(exp) != 0 {
						t.Fatalf("%s reads %s, want %s: %s", name, m.Details[0][name], want, body)
					}
				}
			}
			// And the token works on the API.
			mustOK(t, s.as(t).do(http.MethodGet, whoamiPath, nil, bearer(tok)...))
		})

		t.Run("no details, no claim", func(t *testing.T) {
			tr := decodeToken(t, s.as(t).do(http.MethodPost, tokenPath, ccForm(""), basic(acct.ClientID, acct.ClientSecret)...))
			if in := s.introspect(t, tr.AccessToken, acct.ClientID, acct.ClientSecret); in["authorization_details"] != nil {
				t.Fatalf("token without details introspects with %v", in["authorization_details"])
			}
		})

		t.Run("refusals", func(t *testing.T) {
			s := s.as(t)
			wrongLocation := payment("payment_initiation", "initiate")
			wrongLocation["locations"] = []string{"https://evil.example/"}
			wrongAmount := payment("payment_initiation", "initiate")
			wrongAmount["instructedAmount"] = map[string]any{"currency": "EUR", "amount": "45.001"}
			for _, c := range []struct {
				name, text, says string
			}{
				{"unregistered type", `[{"type":"wire_transfer"}]`, `'wire_transfer' is not registered`},
				{"action not allowed", jsonText([]any{payment("payment_initiation", "refund")}), `action 'refund' is not allowed`},
				{"location not allowed", jsonText([]any{wrongLocation}), "/locations/0"},
				{"schema", jsonText([]any{wrongAmount}), "/instructedAmount/amount"},
				{"no type", `[{"actions":["read"]}]`, "/type"},
				{"not an array", `{"type":"account_information"}`, "must be a JSON array"},
				{"empty array", `[]`, "at least one entry"},
				{"malformed", `[{"type":`, "not valid JSON"},
				{"repeated member", `[{"type":"account_information","type":"payment_initiation"}]`, `repeats the member 'type'`},
				{"too deep", `[{"type":"account_information","x":` + strings.Repeat("[", 20) + strings.Repeat("]", 20) + `}]`, "nests deeper than 16"},
				{"too many entries", "[" + strings.Repeat(`{"type":"account_information"},`, 20) + `{"type":"account_information"}]`, "more than 20 entries"},
				{"too large", `[{"type":"account_information","x":"` + strings.Repeat("x", 40_000) + `"}]`, "exceeds 32768 bytes"},
				// error_description stays within RFC 6749 §5.2's characters.
				{"unicode and backslash in a value", `[{"type":"zahlung_\u00e9\\"}]`, "'zahlung_???' is not registered"},
			} {
				form := url.Values{"grant_type": {"client_credentials"}, "authorization_details": {c.text}}
				r := s.do(http.MethodPost, tokenPath, form, basic(acct.ClientID, acct.ClientSecret)...)
				expectRFC6749(t, r, http.StatusBadRequest, "invalid_authorization_details")
				if d := r.JSON(t)["error_description"].(string); !strings.Contains(d, c.says) {
					t.Errorf("%s: error_description %q does not say %q", c.name, d, c.says)
				}
			}
			// Bytes that are not UTF-8, in this parameter as in any other,
			// are refused before it is read (docs/decisions.md).
			r := s.do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "authorization_details": {"[{\"type\":\"account_information\",\"x\":\"\xff\"}]"}},
				basic(acct.ClientID, acct.ClientSecret)...)
			expectRFC6749(t, r, http.StatusBadRequest, "invalid_request")
			// The parameter given twice is a repeated parameter.
			r = s.do(http.MethodPost, tokenPath, "grant_type=client_credentials&authorization_details=[]&authorization_details=[]",
				append(basic(acct.ClientID, acct.ClientSecret), "Content-Type", "application/x-www-form-urlencoded")...)
			expectRFC6749(t, r, http.StatusBadRequest, "invalid_request")
			// A JSON body whose details are not an array.
			r = s.do(http.MethodPost, tokenPath, map[string]any{"grant_type": "client_credentials", "client_id": acct.ClientID,
				"client_secret": acct.ClientSecret, "authorization_details": map[string]any{"type": "account_information"}})
			expectRFC6749(t, r, http.StatusBadRequest, "invalid_request")
			// Bad credentials are answered first: the details say nothing to a stranger.
			r = s.detailsToken(acct.ClientID, "wrong", []any{map[string]any{"type": "wire_transfer"}})
			expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
		})
	})
}

// The capability ceiling: what an agent may be granted follows its
// capabilities and trust level, at issue and on every use of the token.
func TestRARAgentCeiling(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		admin := s.superToken()
		s.registerType(admin, paymentType("payment_initiation"))
		s.registerType(admin, map[string]any{"type": "account_information", "allowedActions": []string{"list", "read"}, "schema": map[string]any{}})

		writer := s.createAgent(admin, map[string]any{"name": "payer", "type": "autonomous", "capabilities": []string{"write_users"}})
		reader := s.createAgent(admin, map[string]any{"name": "reader", "type": "autonomous", "capabilities": []string{"read_users"}})

		// Sandboxed: read-only actions only, and named.
		r := s.detailsToken(writer.ClientID, writer.ClientSecret, []any{payment("payment_initiation", "initiate")})
		expectRFC6749(t, r, http.StatusBadRequest, "invalid_authorization_details")
		if d := r.JSON(t)["error_description"].(string); !strings.Contains(d, "sandboxed agent may ask only for the read-only actions") {
			t.Fatalf("sandboxed refusal says %q", d)
		}
		noActions := payment("payment_initiation")
		delete(noActions, "actions")
		expectRFC6749(t, s.detailsToken(writer.ClientID, writer.ClientSecret, []any{noActions}), http.StatusBadRequest, "invalid_authorization_details")
		readOnly := []any{payment("payment_initiation", "status")}
		tr := decodeToken(t, s.detailsToken(writer.ClientID, writer.ClientSecret, readOnly))
		if in := s.introspect(t, tr.AccessToken, writer.ClientID, writer.ClientSecret); !sameJSON(t, in["authorization_details"], readOnly) {
			t.Fatalf("read-only details: %v", in)
		}

		// A required capability the agent lacks, at any trust level.
		r = s.detailsToken(reader.ClientID, reader.ClientSecret, []any{payment("payment_initiation", "status")})
		expectRFC6749(t, r, http.StatusBadRequest, "invalid_authorization_details")
		if d := r.JSON(t)["error_description"].(string); !strings.Contains(d, `requires capability 'write_users'`) {
			t.Fatalf("capability refusal says %q", d)
		}
		// A type that requires nothing is open to it.
		decodeToken(t, s.detailsToken(reader.ClientID, reader.ClientSecret, []any{map[string]any{"type": "account_information", "actions": []string{"read"}}}))

		// Registered: writes allowed; the grant and the refusal are audited.
		mustOK(t, s.changeTrust(admin, writer.ID, "registered", "reviewed"))
		granted := []any{payment("payment_initiation", "initiate"), payment("payment_initiation", "status")}
		tr = decodeToken(t, s.detailsToken(writer.ClientID, writer.ClientSecret, granted))
		var raw map[string]any
		_ = json.Unmarshal(s.detailsToken(writer.ClientID, writer.ClientSecret, granted).Body, &raw)
		if raw["agent_id"] != writer.ID || !sameJSON(t, raw["authorization_details"], granted) {
			t.Fatalf("agent token response: %v", raw)
		}
		in := s.introspect(t, tr.AccessToken, writer.ClientID, writer.ClientSecret)
		if !sameJSON(t, in["authorization_details"], granted) || in["agent_id"] != writer.ID || in["identityd_detail_conditions"] != nil {
			t.Fatalf("agent introspection: %v", in)
		}
		expectRFC6749(t, s.detailsToken(writer.ClientID, writer.ClientSecret, []any{map[string]any{"type": "wire_transfer"}}), http.StatusBadRequest, "invalid_authorization_details")
		audit := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+writer.ID+"/audit?action=token_issued,token_refused", nil, bearer(admin)...))
		var issuedWithDetails, refused bool
		for _, e := range audit["entries"].([]any) {
			m := e.(map[string]any)
			d, _ := m["details"].(map[string]any)
			switch m["action"] {
			case "token_issued":
				if sameJSON(t, d["authorizationDetails"], granted) {
					issuedWithDetails = true
				}
			case "token_refused":
				if d["error"] == "invalid_authorization_details" {
					refused = true
				}
			}
		}
		if !issuedWithDetails || !refused {
			t.Fatalf("audit lacks token_issued with the details (%v) or token_refused (%v): %s", issuedWithDetails, refused, jsonText(audit))
		}

		// Demoted to sandboxed: the token keeps only its read-only entry, at once.
		mustOK(t, s.changeTrust(admin, writer.ID, "sandboxed", "incident"))
		in = s.introspect(t, tr.AccessToken, writer.ClientID, writer.ClientSecret)
		if !sameJSON(t, in["authorization_details"], granted[1:]) {
			t.Fatalf("after demotion the token holds %v, want only the read-only entry", in["authorization_details"])
		}
		// Stripped of the capability: nothing of that type is left.
		if r := s.do(http.MethodPut, agentsPath+"/"+writer.ID+"/capabilities", map[string]any{"capabilities": []string{"read_users"}}, bearer(admin)...); r.Status != http.StatusOK {
			t.Fatalf("set capabilities: %s", describe(r))
		}
		in = s.introspect(t, tr.AccessToken, writer.ClientID, writer.ClientSecret)
		if d, ok := in["authorization_details"].([]any); !ok || len(d) != 0 {
			t.Fatalf("after losing write_users the token holds %v, want []", in["authorization_details"])
		}
	})
}
