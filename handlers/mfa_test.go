package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// mfaServer is a server with the second factor's routes, a person, an
// application they sign in through, and the service behind the routes (the
// one sign-in asks, Verify).
type mfaServer struct {
	*signinServer
	svc *mfa.Service
	web *flowApp
}

func newMFAServer(t testing.TB, dbURL string) *mfaServer {
	t.Helper()
	s := &mfaServer{signinServer: newSigninServer(t, dbURL, nil)}
	s.svc = s.mfa
	s.user = s.passwordless(t)
	s.web = s.addApp(t, persistence.AppConfidential, oauth.AlgRS256, "opaque")
	return s
}

// tokenOf is an access token of u, issued through the code flow in a new
// SSO session, and that session's id.
func (s *mfaServer) tokenOf(t testing.TB, u *persistence.User) (string, string) {
	t.Helper()
	as := *s.signinServer
	as.user = u
	who := as.signedIn(t)
	tok, _ := s.codeFlow(t, s.web, who, "openid")
	return tok.AccessToken, who.SessionID
}

// send sends body (as is) with a bearer token and answers the status, the
// headers and the decoded body.
func (s *mfaServer) send(t testing.TB, method, path, token, contentType, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, out := getJSON(t, req)
	return resp.StatusCode, resp.Header, out
}

// totpCode is a TOTP code of secret, steps steps from now; it waits out the
// last two seconds of a step, so that the server sees the step it was made
// for.
func totpCode(t testing.TB, secret string, steps int) string {
	t.Helper()
	if left := mfa.Period - time.Duration(time.Now().UnixNano())%mfa.Period; left < 2*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
	c, err := totp.GenerateCode(secret, time.Now().Add(time.Duration(steps)*mfa.Period))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mfaRefused checks an answer is the envelope with status and code.
func mfaRefused(t testing.TB, what string, status int, out map[string]any, wantStatus int, wantCode string) {
	t.Helper()
	if _, ok := out["details"].(map[string]any); status != wantStatus || out["error"] != wantCode || out["message"] == "" || !ok || len(out) != 3 {
		t.Fatalf("%s: %d %v, want %d %s", what, status, out, wantStatus, wantCode)
	}
}

var mfaRecoveryForm = regexp.MustCompile(`^[a-z2-7]{5}-[a-z2-7]{5}$`)

func TestMFATOTP(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := newMFAServer(t, dbURL)
		token, session := s.tokenOf(t, s.user)
		enroll := func() map[string]any {
			t.Helper()
			status, h, out := s.send(t, http.MethodPost, mfaTOTPEnrollPath, token, "", "")
			if status != http.StatusOK || h.Get("Cache-Control") != "no-store" {
				t.Fatalf("enroll: %d %v", status, out)
			}
			return out
		}
		codeBody := func(c string) string { b, _ := json.Marshal(map[string]string{"code": c}); return string(b) }
		confirm := func(c string) (int, map[string]any) {
			t.Helper()
			status, _, out := s.send(t, http.MethodPost, mfaTOTPConfirmPath, token, "application/json", codeBody(c))
			return status, out
		}
		disable := func(c string) (int, map[string]any) {
			t.Helper()
			status, _, out := s.send(t, http.MethodDelete, mfaTOTPPath, token, "application/json", codeBody(c))
			return status, out
		}

		// Enrol, then again before confirming: the second secret replaces the first.
		first := enroll()
		e := enroll()
		secret, _ := e["secret"].(string)
		uri, _ := e["otpauthUri"].(string)
		qr, _ := e["qrCode"].(string)
		if secret == "" || secret == first["secret"] || !strings.HasPrefix(uri, "otpauth://totp/127.0.0.1:"+s.user.Email+"?") ||
			!strings.Contains(uri, "secret="+secret) || !strings.HasPrefix(qr, "data:image/png;base64,iVBORw0KGgo") {
			t.Fatalf("enrolment %v", e)
		}
		status, out := confirm("000000")
		mfaRefused(t, "a wrong code", status, out, http.StatusBadRequest, "invalid_code")
		status, out = confirm(totpCode(t, first["secret"].(string), 0))
		mfaRefused(t, "the replaced secret's code", status, out, http.StatusBadRequest, "invalid_code")
		if status, out := disable(totpCode(t, secret, 0)); status != http.StatusNotFound || out["error"] != "mfa_not_enabled" {
			t.Fatalf("disabling a pending factor: %d %v", status, out)
		}

		// Confirm with the previous step's code (±1 step): on, with recovery codes.
		confirming := totpCode(t, secret, -1)
		status, out = confirm(confirming)
		codes, _ := out["recoveryCodes"].([]any)
		if status != http.StatusOK || out["enabled"] != true || len(codes) != mfa.RecoveryCodes {
			t.Fatalf("confirm: %d %v", status, out)
		}
		for _, c := range codes {
			if !mfaRecoveryForm.MatchString(c.(string)) {
				t.Fatalf("recovery code %q", c)
			}
		}
		if on, err := s.svc.Enabled(ctx, s.user.ID); !on || err != nil {
			t.Fatalf("enabled: %v %v", on, err)
		}
		status, _, out = s.send(t, http.MethodPost, mfaTOTPEnrollPath, token, "", "")
		mfaRefused(t, "enrolling when on", status, out, http.StatusConflict, "mfa_already_enabled")
		status, out = confirm("123456")
		mfaRefused(t, "confirming when on", status, out, http.StatusConflict, "mfa_already_enabled")

		// Replay: the confirming code, and a code sign-in just used.
		status, out = disable(confirming)
		mfaRefused(t, "the confirming code again", status, out, http.StatusBadRequest, "invalid_code")
		now := totpCode(t, secret, 0)
		if method, err := s.svc.Verify(ctx, s.user.ID, now, mfa.Origin{}); err != nil || method != mfa.MethodTOTP {
			t.Fatalf("sign-in's check: %q %v", method, err)
		}
		status, out = disable(now)
		mfaRefused(t, "a code used in its step", status, out, http.StatusBadRequest, "invalid_code")

		// A recovery code works once.
		if method, err := s.svc.Verify(ctx, s.user.ID, codes[0].(string), mfa.Origin{}); err != nil || method != mfa.MethodRecoveryCode {
			t.Fatalf("a recovery code at sign-in: %q %v", method, err)
		}
		status, out = disable(codes[0].(string))
		mfaRefused(t, "a spent recovery code", status, out, http.StatusBadRequest, "invalid_code")
		if status, out := disable(strings.ToUpper(codes[1].(string))); status != http.StatusNoContent {
			t.Fatalf("disabling with a recovery code: %d %v", status, out)
		}
		status, out = disable(codes[2].(string))
		mfaRefused(t, "disabling when off", status, out, http.StatusNotFound, "mfa_not_enabled")
		if _, err := s.svc.Verify(ctx, s.user.ID, codes[3].(string), mfa.Origin{}); !errors.Is(err, mfa.ErrNotEnabled) {
			t.Fatalf("a recovery code once off: %v", err)
		}

		// On again, off with the next step's code (±1 step).
		secret = enroll()["secret"].(string)
		if status, out := confirm(totpCode(t, secret, 0)); status != http.StatusOK {
			t.Fatalf("confirm again: %d %v", status, out)
		}
		if status, out := disable(totpCode(t, secret, 1)); status != http.StatusNoContent {
			t.Fatalf("disabling with a TOTP code: %d %v", status, out)
		}

		// The log: the token's client and session on what came through the
		// routes; no code in it. Counts by type (a failure's reason depends
		// on whether a step ended meanwhile: replayed or too old).
		events, err := s.store.ListAuthEvents(ctx, s.user.ID, persistence.Page{Limit: 200})
		if err != nil {
			t.Fatal(err)
		}
		count := map[string]int{}
		for _, ev := range events {
			count[ev.Type]++
			if ev.Type != persistence.EventMFARecoveryCodeUsed && (ev.ClientID != s.web.id || ev.SessionID == nil || *ev.SessionID != session || ev.IP != "127.0.0.1") {
				t.Fatalf("event %+v: not the token's origin", ev)
			}
			if data, _ := json.Marshal(ev); strings.Contains(string(data), confirming) || strings.Contains(string(data), secret) ||
				strings.Contains(strings.ToLower(string(data)), strings.ReplaceAll(codes[1].(string), "-", "")) {
				t.Fatalf("event %+v holds a secret", ev)
			}
		}
		want := map[string]int{
			persistence.EventMFAEnabled: 2, persistence.EventMFADisabled: 2, persistence.EventMFARecoveryCodeUsed: 2, persistence.EventMFAVerifyFailed: 5,
		}
		if !maps.Equal(count, want) {
			t.Fatalf("events %v, want %v", count, want)
		}
	})
}

// Only a person's own token manages their second factor.
func TestMFAUserTokenRequired(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newMFAServer(t, dbURL)
		machine := s.adminToken(t)
		for _, r := range []struct{ method, path, body string }{
			{http.MethodPost, mfaTOTPEnrollPath, ""},
			{http.MethodPost, mfaTOTPConfirmPath, `{"code":"123456"}`},
			{http.MethodDelete, mfaTOTPPath, `{"code":"123456"}`},
		} {
			status, _, out := s.send(t, r.method, r.path, machine, "application/json", r.body)
			mfaRefused(t, r.method+" "+r.path+" with a machine token", status, out, http.StatusForbidden, "user_token_required")
			status, _, out = s.send(t, r.method, r.path, "", "application/json", r.body)
			mfaRefused(t, r.method+" "+r.path+" without a token", status, out, http.StatusUnauthorized, "unauthorized")
			status, _, out = s.send(t, r.method, r.path, "not-a-token", "application/json", r.body)
			mfaRefused(t, r.method+" "+r.path+" with a bad token", status, out, http.StatusUnauthorized, "invalid_token")
		}
	})
}

// Wrong codes are bounded per person (5 per 15 minutes): past them even the
// right code is refused, 429 with Retry-After; another person is not.
func TestMFATooManyTries(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newMFAServer(t, dbURL)
		token, _ := s.tokenOf(t, s.user)
		status, _, e := s.send(t, http.MethodPost, mfaTOTPEnrollPath, token, "", "")
		if status != http.StatusOK {
			t.Fatalf("enroll: %d %v", status, e)
		}
		for i := range mfa.DefaultMaxTries {
			status, _, out := s.send(t, http.MethodPost, mfaTOTPConfirmPath, token, "application/json", `{"code":"000000"}`)
			mfaRefused(t, fmt.Sprint("wrong code ", i+1), status, out, http.StatusBadRequest, "invalid_code")
		}
		body := `{"code":"` + totpCode(t, e["secret"].(string), 0) + `"}`
		status, h, out := s.send(t, http.MethodPost, mfaTOTPConfirmPath, token, "application/json", body)
		mfaRefused(t, "past the limit", status, out, http.StatusTooManyRequests, "rate_limited")
		if h.Get("Retry-After") == "" || h.Get("Retry-After") == "0" {
			t.Fatalf("Retry-After %q", h.Get("Retry-After"))
		}
		// Another person's tries are their own.
		other := s.passwordless(t)
		otherToken, _ := s.tokenOf(t, other)
		status, _, e = s.send(t, http.MethodPost, mfaTOTPEnrollPath, otherToken, "", "")
		if status != http.StatusOK {
			t.Fatalf("enroll: %d %v", status, e)
		}
		body = `{"code":"` + totpCode(t, e["secret"].(string), 0) + `"}`
		if status, _, out := s.send(t, http.MethodPost, mfaTOTPConfirmPath, otherToken, "application/json", body); status != http.StatusOK {
			t.Fatalf("another person: %d %v", status, out)
		}
	})
}

// mfaBadBodies are bodies confirm and delete refuse before any code is
// checked: status and error code.
var mfaBadBodies = []struct {
	contentType, body string
	status            int
	code              string
}{
	{"application/json", `{"code":"12\u0000456"}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", "{\"code\":\"12\x00456\"}", http.StatusBadRequest, "invalid_json"},
	{"application/json", "{\"code\":\"12\xff456\"}", http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":"\ud800"}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":123456}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":["123456"]}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":null}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":""}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":"123456","extra":1}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":"` + strings.Repeat("1", 65) + `"}`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":"123456"} {}`, http.StatusBadRequest, "invalid_json"},
	{"application/json", `[]`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `"123456"`, http.StatusBadRequest, "invalid_request"},
	{"application/json", `{"code":`, http.StatusBadRequest, "invalid_json"},
	{"application/json", ``, http.StatusBadRequest, "invalid_json"},
	{"application/json", `{"code":"` + strings.Repeat("1", 2<<20) + `"}`, http.StatusRequestEntityTooLarge, "payload_too_large"},
	{"text/plain", `{"code":"123456"}`, http.StatusUnsupportedMediaType, "unsupported_media_type"},
}

// Malformed bodies are refused with the envelope, and cost no try: the
// right code still passes after all of them.
func TestMFABadBodies(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newMFAServer(t, dbURL)
		token, _ := s.tokenOf(t, s.user)
		status, _, e := s.send(t, http.MethodPost, mfaTOTPEnrollPath, token, "", "")
		if status != http.StatusOK {
			t.Fatalf("enroll: %d %v", status, e)
		}
		secret := e["secret"].(string)
		for _, path := range []struct{ method, path string }{{http.MethodPost, mfaTOTPConfirmPath}, {http.MethodDelete, mfaTOTPPath}} {
			for _, b := range mfaBadBodies {
				status, _, out := s.send(t, path.method, path.path, token, b.contentType, b.body)
				mfaRefused(t, path.method+" "+path.path+" "+strings.ToValidUTF8(b.body[:min(len(b.body), 40)], "?"), status, out, b.status, b.code)
			}
		}
		if status, _, out := s.send(t, http.MethodPost, mfaTOTPConfirmPath, token, "application/json", `{"code":"`+totpCode(t, secret, 0)+`"}`); status != http.StatusOK {
			t.Fatalf("the right code after bad bodies: %d %v", status, out)
		}
	})
}

var mfaErrorCode = regexp.MustCompile(`^[a-z][a-z_]*$`)

// FuzzMFACodeBody: confirm and delete's body parser (readCode) on any
// bytes: a code it accepts is text the stores hold, of a bounded length,
// as sent; a refusal is a 4xx with a stable code. Every input also goes
// through the live routes, which never answer 5xx and always the envelope.
func FuzzMFACodeBody(f *testing.F) {
	for _, b := range mfaBadBodies {
		if len(b.body) < 1000 {
			f.Add(b.body)
		}
	}
	for _, seed := range []string{`{"code":"123456"}`, `{"code":"123 456"}`, `{"code":"abcde-fghij"}`, `{"code":"ABCDE FGHIJ"}`,
		`{"code":"\u0661\u0662\u0663\u0664\u0665\u0666"}`, `{"code":"123456","code":"654321"}`, `{"Code":"123456"}`, `{"code":"\\u0000"}`, `null`} {
		f.Add(seed)
	}
	s := newMFAServer(f, dbtest.URLs(f)["sqlite"])
	token, _ := s.tokenOf(f, s.user)
	if status, _, out := s.send(f, http.MethodPost, mfaTOTPEnrollPath, token, "", ""); status != http.StatusOK {
		f.Fatalf("enroll: %d %v", status, out)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest(http.MethodPost, mfaTOTPConfirmPath, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		c, err := readCode(r)
		var e *apiError
		switch {
		case err == nil:
			if c == "" || len(c) > maxCodeLength || !extensions.ValidText(c) {
				t.Fatalf("%q: accepted code %q", body, c)
			}
			var sent struct{ Code string }
			if json.Unmarshal([]byte(body), &sent) != nil || sent.Code != c {
				t.Fatalf("%q: code %q, sent %q", body, c, sent.Code)
			}
		case errors.As(err, &e):
			if e.Status < 400 || e.Status >= 500 || !mfaErrorCode.MatchString(e.Code) {
				t.Fatalf("%q: refused %d %q", body, e.Status, e.Code)
			}
		default:
			var v *extensions.ValidationError
			if !errors.As(err, &v) {
				t.Fatalf("%q: %v", body, err)
			}
		}
		for _, method := range []string{http.MethodPost, http.MethodDelete} {
			path := mfaTOTPConfirmPath
			if method == http.MethodDelete {
				path = mfaTOTPPath
			}
			status, _, out := s.send(t, method, path, token, "application/json", body)
			if status < 300 { // a right code, by chance
				continue
			}
			code, _ := out["error"].(string)
			if !slices.Contains([]int{400, 404, 409, 413, 415, 429}, status) || !mfaErrorCode.MatchString(code) {
				t.Fatalf("%s %q: %d %v", method, body, status, out)
			}
		}
	})
}
