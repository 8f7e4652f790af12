package handlers

import (
	"encoding/base64"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
)

// TestOpenAPIResetAnswers drives password reset through its routes,
// successes and refusals, and checks every request and answer against the
// document (as TestOpenAPIAnswers does for the rest).
func TestOpenAPIResetAnswers(t *testing.T) {
	o, mails := openAPIOptions(t)
	o.Reset.SetFloor(time.Millisecond)
	doc, err := libopenapi.NewDocument(openAPIDocument)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	c := &openAPIClient{t: t, h: New(o), v: v}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(url.QueryEscape(openAPIAdmin)+":"+url.QueryEscape(openAPIAdminSecret)))
	admin := "Bearer " + c.do(exchange{method: "POST", target: "/api/v1/oauth/token", auth: basic, contentType: formType,
		body: "grant_type=client_credentials", status: 200})["access_token"].(string)
	send := func(target, auth, body string, status int) map[string]any {
		t.Helper()
		return c.do(exchange{method: "POST", target: target, auth: auth, contentType: jsonMedia, body: body, status: status})
	}
	app := send("/api/v1/applications", admin, `{"name":"Acme Notes","redirectUris":["https://notes.example/callback"],"passwordResetUri":"https://notes.example/reset"}`, 201)
	clientID := app["clientId"].(string)
	send("/api/v1/applications", admin, `{"name":"Acme Notes","redirectUris":["https://notes.example/callback"],"passwordResetUri":"https://evil.example/reset"}`, 400)
	send("/api/v1/m2m/users", admin, `{"email":"ada@example.com","password":"correct horse battery"}`, 201)

	send(forgotPasswordPath, "", `{"email":"ada@example.com","clientId":"`+clientID+`"}`, 200)
	var token string
	deadline := time.Now().Add(10 * time.Second)
	for token == "" {
		if m, ok := mails.last(); ok {
			if found := regexp.MustCompile(`https://notes\.example/reset\?token=([A-Za-z0-9_-]{43})`).FindStringSubmatch(m.Text); found != nil {
				token = found[1]
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no reset e-mail")
		}
		time.Sleep(10 * time.Millisecond)
	}
	send(forgotPasswordPath, "", `{"email":"nobody@example.com","clientId":"`+clientID+`"}`, 200)
	send(forgotPasswordPath, "", `{"email":"ada@example.com","clientId":"app_none"}`, 400)
	c.do(exchange{method: "POST", target: forgotPasswordPath, contentType: jsonMedia, body: `{"email":"ada@example.com"}`, status: 400, invalid: true})

	c.do(exchange{method: "GET", target: resetVerifyPath + "?token=" + token, status: 200})
	c.do(exchange{method: "GET", target: resetVerifyPath + "?token=unknown", status: 400})
	send(resetPasswordPath, "", `{"token":"`+token+`","newPassword":"password"}`, 400)
	send(resetPasswordPath, "", `{"token":"unknown","newPassword":"a brand new passphrase"}`, 400)
	send(resetPasswordPath, "", `{"token":"`+token+`","newPassword":"a brand new passphrase"}`, 200)
	send(resetPasswordPath, "", `{"token":"`+token+`","newPassword":"a brand new passphrase"}`, 400)
	c.do(exchange{method: "GET", target: resetVerifyPath + "?token=" + token, status: 400})

	c.do(exchange{method: "GET", target: forgotPagePath + "?client_id=" + clientID, status: 200})
	c.do(exchange{method: "GET", target: resetPagePath + "?token=" + token, status: 400})
}
