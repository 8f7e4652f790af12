package handlers

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
)

// TestOpenAPIAuthzAnswers drives fine-grained authorization, application
// access and analytics through their routes, successes and refusals, and
// checks every request and answer against the document.
func TestOpenAPIAuthzAnswers(t *testing.T) {
	o, _ := openAPIOptions(t)
	doc, err := libopenapi.NewDocument(openAPIDocument)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	c := &openAPIClient{t: t, h: New(o), v: v}
	basic := func(id, secret string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(url.QueryEscape(id)+":"+url.QueryEscape(secret)))
	}
	token := func(auth string) string {
		return "Bearer " + c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: auth, contentType: formType, body: "grant_type=client_credentials", status: 200})["access_token"].(string)
	}
	admin := token(basic(openAPIAdmin, openAPIAdminSecret))
	send := func(method, target, auth, body string, status int, invalid bool) map[string]any {
		t.Helper()
		ct := jsonMedia
		if body == "" {
			ct = ""
		}
		return c.do(exchange{method: method, target: target, auth: auth, contentType: ct, body: body, status: status, invalid: invalid})
	}
	do := func(method, target, auth, body string, status int) map[string]any {
		t.Helper()
		return send(method, target, auth, body, status, false)
	}
	// bad breaks the document on purpose (no token, missing fields): the
	// answer is checked, not the request.
	bad := func(method, target, auth, body string, status int) {
		t.Helper()
		send(method, target, auth, body, status, true)
	}
	const model = `{"dsl":"model\n  schema 1.1\ntype user\ntype group\n  relations\n    define member: [user]\ntype doc\n  relations\n    define viewer: [user, group#member]\n"}`
	do("GET", "/api/v1/m2m/authz/model", admin, "", 404)
	m := do("PUT", "/api/v1/m2m/authz/model", admin, model, 201)
	do("PUT", "/api/v1/m2m/authz/model", admin, `{"dsl":"nope"}`, 400)
	do("PUT", "/api/v1/m2m/authz/model", admin, `{"schema_version":"1.1","type_definitions":[{"type":"user"}]}`, 201)
	do("GET", "/api/v1/m2m/authz/model?id="+m["id"].(string), admin, "", 200)
	bad("GET", "/api/v1/m2m/authz/model", "", "", 401)
	do("PUT", "/api/v1/m2m/authz/model", admin, model, 201)
	do("POST", "/api/v1/m2m/authz/tuples", admin, `{"writes":[{"user":"user:ann","relation":"member","object":"group:g"},{"user":"group:g#member","relation":"viewer","object":"doc:1"}]}`, 200)
	do("POST", "/api/v1/m2m/authz/tuples", admin, `{"writes":[{"user":"user:ann","relation":"owner","object":"doc:1"}]}`, 400)
	page := do("GET", "/api/v1/m2m/authz/tuples?limit=1", admin, "", 200)
	do("GET", "/api/v1/m2m/authz/tuples?cursor="+url.QueryEscape(page["nextCursor"].(string)), admin, "", 200)
	do("GET", "/api/v1/m2m/authz/tuples?cursor=x", admin, "", 400)
	if got := do("POST", "/api/v1/m2m/authz/check", admin, `{"user":"user:ann","relation":"viewer","object":"doc:1"}`, 200); got["allowed"] != true {
		t.Fatalf("check: %v", got)
	}
	do("POST", "/api/v1/m2m/authz/check", admin, `{"user":"user:bo","relation":"viewer","object":"doc:1","contextualTuples":[{"user":"user:bo","relation":"member","object":"group:g"}]}`, 200)
	do("POST", "/api/v1/m2m/authz/batch-check", admin, `{"checks":[{"user":"user:ann","relation":"viewer","object":"doc:1"},{"user":"user:ann","relation":"nope","object":"doc:1"}]}`, 200)
	do("POST", "/api/v1/m2m/authz/list-objects", admin, `{"user":"user:ann","relation":"viewer","type":"doc"}`, 200)
	bad("POST", "/api/v1/m2m/authz/check", admin, `{"user":"user:ann"}`, 400)
	c.do(exchange{method: "POST", target: "/api/v1/m2m/authz/check", auth: admin, contentType: "text/plain", body: "x", status: 415, invalid: true})
	bad("POST", "/api/v1/m2m/authz/check", admin, `{"user":"`+strings.Repeat("a", 1<<20)+`"}`, 413)

	// Application access.
	app := do("POST", "/api/v1/applications", admin, `{"name":"Portal","redirectUris":["https://portal.example/callback"]}`, 201)
	sa := do("POST", "/api/v1/service-accounts", admin, `{"name":"portal backend","scopes":["users:read","users:admin","analytics:read"]}`, 201)
	saTok := token(basic(sa["clientId"].(string), sa["clientSecret"].(string)))
	appID, saID := app["id"].(string), sa["id"].(string)
	do("GET", "/api/v1/m2m/applications/"+appID+"/users", saTok, "", 403)
	do("PUT", "/api/v1/applications/"+appID+"/service-accounts/"+saID, admin, "", 200)
	do("PUT", "/api/v1/applications/"+appID+"/service-accounts/0190d7a2-0000-7000-8000-000000000000", admin, "", 404)
	do("GET", "/api/v1/applications/"+appID+"/service-accounts", admin, "", 200)
	do("GET", "/api/v1/m2m/applications/"+appID+"/users", saTok, "", 200)
	do("GET", "/api/v1/m2m/applications/"+appID+"/sessions", saTok, "", 200)
	do("DELETE", "/api/v1/applications/"+appID+"/service-accounts/"+saID, admin, "", 204)
	do("GET", "/api/v1/m2m/applications/"+appID+"/sessions", saTok, "", 403)

	// Analytics.
	do("GET", "/api/v1/m2m/analytics/overview", saTok, "", 200)
	do("GET", "/api/v1/m2m/analytics/overview?from=2026-02-01&to=2026-01-01", saTok, "", 400)
	do("GET", "/api/v1/m2m/analytics/events?outcome=failure&limit=5", saTok, "", 200)
	do("GET", "/api/v1/m2m/analytics/events?cursor=x", saTok, "", 400)
	do("GET", "/api/v1/m2m/analytics/users/active", saTok, "", 200)
	bad("GET", "/api/v1/m2m/analytics/users/active", "", "", 401)

	// End-user API keys and usage (issue 18).
	keys := "/api/v1/m2m/applications/" + appID + "/api-keys"
	user := do("POST", "/api/v1/m2m/users", admin, `{"email":"key-owner@example.com","name":"Key Owner"}`, 201)
	owner := `"owner":{"type":"user","id":"` + user["id"].(string) + `"}`
	ksa := do("POST", "/api/v1/service-accounts", admin, `{"name":"keys backend","tier":"startup","scopes":["api-keys:issue","api-keys:read","api-keys:revoke","analytics:read"]}`, 201)
	kTok := token(basic(ksa["clientId"].(string), ksa["clientSecret"].(string)))
	do("POST", keys, kTok, `{"name":"ci",`+owner+`}`, 403)
	do("PUT", "/api/v1/applications/"+appID+"/service-accounts/"+ksa["id"].(string), admin, "", 200)
	k := do("POST", keys, kTok, `{"name":"ci","scopes":["orders:read"],"metadata":{"plan":"gold"},"expiresAt":"`+time.Now().AddDate(1, 0, 0).UTC().Format(time.RFC3339)+`",`+owner+`}`, 201)
	do("POST", keys, kTok, `{"name":"ci","owner":{"type":"user","id":"0190d7a2-0000-7000-8000-000000000000"}}`, 400)
	bad("POST", keys, kTok, `{"name":"ci"}`, 400)
	do("GET", keys, kTok, "", 200)
	do("GET", keys+"/"+k["id"].(string), kTok, "", 200)
	do("GET", keys+"/0190d7a2-0000-7000-8000-000000000000", kTok, "", 404)
	if v := do("POST", "/api/v1/m2m/api-keys/validate", kTok, `{"key":"`+k["key"].(string)+`"}`, 200); v["valid"] != true {
		t.Fatalf("validation: %v", v)
	}
	do("POST", "/api/v1/m2m/api-keys/validate", kTok, `{"key":"idk_nonsense"}`, 200)
	bad("POST", "/api/v1/m2m/api-keys/validate", kTok, `{"key":5}`, 400)
	bad("POST", "/api/v1/m2m/api-keys/validate", saTok, `{"key":"x"}`, 403)
	do("DELETE", keys+"/"+k["id"].(string), kTok, "", 204)
	if v := do("POST", "/api/v1/m2m/api-keys/validate", kTok, `{"key":"`+k["key"].(string)+`"}`, 200); v["valid"] != false || v["reason"] != "revoked" {
		t.Fatalf("revoked: %v", v)
	}
	do("GET", "/api/v1/m2m/usage", kTok, "", 200)
	do("GET", "/api/v1/m2m/usage?granularity=minute", kTok, "", 200)
	do("GET", "/api/v1/m2m/usage?applicationId="+appID, kTok, "", 200)
	do("GET", "/api/v1/m2m/usage?serviceAccountId="+saID, kTok, "", 403)
	do("GET", "/api/v1/m2m/usage?serviceAccountId="+saID, admin, "", 200)
	bad("GET", "/api/v1/m2m/usage?granularity=hour", kTok, "", 400)
	do("PATCH", "/api/v1/service-accounts/"+ksa["id"].(string), admin, `{"tier":"enterprise"}`, 200)
	bad("PATCH", "/api/v1/service-accounts/"+ksa["id"].(string), admin, `{"tier":"gold"}`, 400)
	do("POST", "/api/v1/service-accounts/"+ksa["id"].(string)+"/limits/reset", admin, "", 200)
	do("POST", "/api/v1/service-accounts/0190d7a2-0000-7000-8000-000000000000/limits/reset", admin, "", 404)
}
