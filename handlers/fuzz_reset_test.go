package handlers

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/persistence/dbtest"
)

// FuzzResetBodies posts arbitrary bodies to forgot-password and
// reset-password: never an internal failure, always the spec's envelope
// for a refusal, the neutral message for a forgot-password success, and
// never a changed password (the fuzzer holds no token).
func FuzzResetBodies(f *testing.F) {
	s := newSigninServer(f, dbtest.URLs(f)["sqlite"], nil)
	s.reset.SetFloor(time.Millisecond) // many requests, none measured
	go func() {
		for range s.mails { // the reset e-mails of the seeds and the fuzzer's finds
		}
	}()
	paths := []string{forgotPasswordPath, resetPasswordPath}
	for i := range paths {
		for _, seed := range []string{
			`{"email":"` + s.user.Email + `","clientId":"` + s.app + `"}`,
			`{"email":"` + s.user.Email + `","clientId":"` + s.app + `","captchaToken":"x"}`,
			`{"email":"nobody@example.com","clientId":"app_none"}`,
			`{"token":"` + strings.Repeat("A", 43) + `","newPassword":"a brand new password"}`,
			`{"token":"x","newPassword":""}`, `{"token":"x","newPassword":null}`, `{"token":"` + strings.Repeat("x", 2000) + `","newPassword":"p"}`,
			``, `{}`, `[]`, `null`, `{"email":null}`, `{"email":"\u0000","clientId":"` + s.app + `"}`, `{"email":{"a":1}}`,
			`{"email":"a@example.com","clientId":"` + s.app + `"} {}`, `{"newPassword":"` + strings.Repeat("é", 1100) + `","token":"t"}`,
		} {
			f.Add(i, seed)
		}
	}
	f.Fuzz(func(t *testing.T, which int, body string) {
		path := paths[(which%len(paths)+len(paths))%len(paths)]
		req, _ := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, raw)
		}
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %q: not JSON: %s", path, body, raw)
		}
		if resp.StatusCode >= 400 {
			if _, ok := out["details"].(map[string]any); !ok || out["error"] == nil || out["message"] == nil {
				t.Fatalf("%s %q: error shape %s", path, body, raw)
			}
			return
		}
		if path == resetPasswordPath || out["message"] != reset.Neutral {
			t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, raw)
		}
	})
}

// FuzzResetVerify sends arbitrary tokens (query-encoded) to verify: never an internal
// failure, never valid (the fuzzer holds no token), always verify's shape.
func FuzzResetVerify(f *testing.F) {
	s := newSigninServer(f, dbtest.URLs(f)["sqlite"], nil)
	for _, seed := range []string{"", "x", " ", strings.Repeat("A", 43), "\x00", "\xff", "a+b", strings.Repeat("z", 5000), "x&token=y"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, query string) {
		resp, err := http.Get(s.URL + resetVerifyPath + "?" + url.Values{"token": {query}}.Encode())
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%q: %d %s", query, resp.StatusCode, raw)
		}
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil || resp.StatusCode == http.StatusOK || out["error"] == nil {
			t.Fatalf("%q: %d %s", query, resp.StatusCode, raw)
		}
	})
}
