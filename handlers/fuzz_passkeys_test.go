package handlers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/descope/virtualwebauthn"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// passkeyFuzzServer is a passkey server of one dialect with a registered
// credential (an authenticator that keeps no counter, so that no order of
// inputs revokes it as a clone) and the answers its real ceremonies make.
type passkeyFuzzServer struct {
	*passkeyServer
	cred virtualwebauthn.Credential
	// signed are the signed parts of the real ceremonies made for this
	// server (clientDataJSON and authenticatorData or attestationObject):
	// the only answers that may succeed.
	signed map[string]bool
}

// passkeyFuzzServers starts a server per dialect (no rate limits: the
// fuzzer would spend them).
func passkeyFuzzServers(f *testing.F) []*passkeyFuzzServer {
	var out []*passkeyFuzzServer
	urls := dbtest.URLs(f)
	for _, dialect := range []string{"sqlite", "postgres"} {
		if dbURL, ok := urls[dialect]; ok {
			s := &passkeyFuzzServer{passkeyServer: newPasskeyServer(f, dbURL, nil), signed: map[string]bool{}}
			s.cred = newPasskeyCredential()
			s.register(f, s.cred)
			s.auth.AddCredential(s.cred)
			out = append(out, s)
		}
	}
	return out
}

// signedParts is the key of an answer's signed parts (decoded, so that
// spelling does not matter), "" when it has none.
func signedParts(credential []byte) string {
	var c struct {
		Response struct {
			ClientDataJSON    string `json:"clientDataJSON"`
			AuthenticatorData string `json:"authenticatorData"`
			AttestationObject string `json:"attestationObject"`
			Signature         string `json:"signature"`
		} `json:"response"`
	}
	if json.Unmarshal(credential, &c) != nil {
		return ""
	}
	dec := func(s string) string {
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
		if err != nil {
			b, _ = base64.StdEncoding.DecodeString(s)
		}
		return string(b)
	}
	r := c.Response
	return dec(r.ClientDataJSON) + "\x00" + dec(r.AuthenticatorData) + "\x00" + dec(r.AttestationObject)
}

// anySigned tells whether parts are a real ceremony's answer on any server.
func anySigned(servers []*passkeyFuzzServer, parts string) bool {
	for _, s := range servers {
		if s.signed[parts] {
			return true
		}
	}
	return false
}

// The three finish routes' routes, as the fuzzer picks them.
var passkeyFinishRoutes = []string{webauthnPath + "/register/finish", webauthnPath + "/authenticate/finish", embeddedPath + "/passkey/finish"}

// FuzzPasskeyFinish sends arbitrary bodies to the three finish parsers
// (register/finish with the person's token, authenticate/finish, the
// embedded passkey/finish) on a real store of each dialect, seeded with
// real ceremonies of the software authenticator: never a 5xx, always the
// route's error shape, and no success but a real ceremony's answer.
func FuzzPasskeyFinish(f *testing.F) {
	servers := passkeyFuzzServers(f)
	pkce := `,"codeChallenge":"` + oauth2.S256ChallengeFromVerifier(testVerifier) + `","codeChallengeMethod":"S256"`
	// "{{app}}" stands for each server's application: the same input is the
	// same request on both.
	app := `"clientId":"{{app}}"`
	for _, s := range servers {
		wrap := func(route int, credential string) {
			extra := ""
			if route == 2 {
				extra = pkce
			}
			f.Add(uint8(route), []byte(`{`+app+extra+`,"credential":`+credential+`}`))
		}
		// Real ceremonies: a registration, and assertions for both
		// sign-in routes (usernameless and e-mail first).
		attestation := virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, newPasskeyCredential(), s.beginRegister(f, s.app, s.token))
		s.signed[signedParts([]byte(attestation))] = true
		wrap(0, attestation)
		for route := 1; route <= 2; route++ {
			for _, email := range []string{"", s.user.Email} {
				opts, _ := s.beginAssert(f, email)
				assertion := virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, s.cred, opts)
				s.signed[signedParts([]byte(assertion))] = true
				wrap(route, assertion)
				// Variants: a user handle dropped, the response's members
				// as the wrong types, the whole thing in another member.
				wrap(route, strings.Replace(assertion, `"userHandle"`, `"x"`, 1))
				wrap(route, strings.Replace(assertion, `"signature":"`, `"signature":7,"s":"`, 1))
				wrap(route, `{"response":`+assertion+`}`)
			}
		}
	}
	for route := range 3 {
		for _, body := range []string{``, `{}`, `null`, `[]`, `{"clientId":null}`, `{"clientId":"app_none","credential":{}}`, `{` + app + `,"credential":{}}`,
			`{"credential":{"id":"AAAA","rawId":"AAAA","type":"public-key","response":{}}}`, `{"clientId":"\u0000"}`, "{\"clientId\":\"\xff\"}",
			`{"clientId":"x","credential":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`} {
			f.Add(uint8(route), []byte(body))
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		path := passkeyFinishRoutes[int(route)%len(passkeyFinishRoutes)]
		embedded := strings.HasPrefix(path, embeddedPath)
		var b struct {
			Credential json.RawMessage `json:"credential"`
		}
		_ = json.Unmarshal(body, &b)
		parts := signedParts(b.Credential)
		var first string
		for _, s := range servers {
			req, _ := http.NewRequest(http.MethodPost, s.URL+path, bytes.NewReader(bytes.ReplaceAll(body, []byte("{{app}}"), []byte(s.app))))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Origin", testPasskeyOrigin)
			if strings.HasSuffix(path, "/register/finish") {
				req.Header.Set("Authorization", "Bearer "+s.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				t.Fatalf("%s %q: %d %s", path, body, resp.StatusCode, raw)
			}
			var out map[string]any
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("%s %q: not JSON: %s", path, body, raw)
			}
			if resp.StatusCode < 400 && !s.signed[parts] {
				t.Fatalf("%s %q: %d without a real ceremony's answer: %s", path, body, resp.StatusCode, raw)
			}
			if resp.StatusCode >= 400 {
				_, envelope := out["details"].(map[string]any)
				if embedded && (out["error"] == nil || out["error_description"] == nil || len(out) != 2) ||
					!embedded && (!envelope || out["error"] == nil || out["message"] == nil) {
					t.Fatalf("%s %q: error shape %s", path, body, raw)
				}
			}
			// Both dialects answer alike, but for a real ceremony's answer
			// (its ceremony is one server's).
			if answer := resp.Status + " " + toJSON(out["error"]); parts == "" || !anySigned(servers, parts) {
				if first == "" {
					first = answer
				} else if answer != first {
					t.Fatalf("%s %q: the dialects differ: %s and %s", path, body, first, answer)
				}
			}
		}
	})
}

// FuzzPasskeyAssertion reaches past the parser into verification: for
// each input, each server begins a real ceremony, the input's clientData
// gets its challenge (for "{{challenge}}"), and, when signed, the
// registered credential signs authenticatorData and clientData as an
// authenticator would (else sig is the signature). An assertion is
// accepted only if what WebAuthn requires holds: signed by the key, a
// webauthn.get for this ceremony from the application's origin, for its
// rpId, the user present and verified.
func FuzzPasskeyAssertion(f *testing.F) {
	servers := passkeyFuzzServers(f)
	rpHash := sha256.Sum256([]byte(testPasskeyRP))
	authData := func(flags byte, counter uint32) []byte {
		return append(append(rpHash[:], flags), byte(counter>>24), byte(counter>>16), byte(counter>>8), byte(counter))
	}
	good := `{"type":"webauthn.get","challenge":"{{challenge}}","origin":"` + testPasskeyOrigin + `"}`
	for _, seed := range []struct {
		clientData string
		authData   []byte
		signed     bool
	}{
		{good, authData(0x05, 0), true},
		{good, authData(0x05, 9), true},
		{good, authData(0x01, 0), true}, // no user verification
		{good, authData(0x04, 0), true}, // no user presence
		{good, authData(0x1d, 0), true}, // backup flags
		{good, authData(0x45, 0), true}, // attested data claimed, none there
		{good, authData(0x85, 0), true}, // extensions claimed, none there
		{good, authData(0x05, 0), false},
		{good, append(authData(0x05, 0), 0xa0), true},
		{strings.Replace(good, "webauthn.get", "webauthn.create", 1), authData(0x05, 0), true},
		{strings.Replace(good, testPasskeyOrigin, "http://localhost:9999", 1), authData(0x05, 0), true},
		{strings.Replace(good, testPasskeyOrigin, "https://localhost:8443", 1), authData(0x05, 0), true},
		{strings.Replace(good, `"}`, `","crossOrigin":true,"topOrigin":"https://evil.example"}`, 1), authData(0x05, 0), true},
		{strings.Replace(good, `{{challenge}}`, `{{challenge}}A`, 1), authData(0x05, 0), true},
		{strings.Replace(good, `{{challenge}}`, "\u0000", 1), authData(0x05, 0), true},
		{`{"type":"webauthn.get","challenge":"{{challenge}}","origin":"` + testPasskeyOrigin + `","type":"payment.get"}`, authData(0x05, 0), true},
		{good, authData(0x05, 0)[:36], true},
		{`null`, nil, true},
	} {
		for route := range 2 {
			f.Add(uint8(route), seed.clientData, seed.authData, seed.signed, []byte("sig"))
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, clientDataTemplate string, authenticatorData []byte, signed bool, sig []byte) {
		embedded := route%2 == 1
		var first string
		for _, s := range servers {
			// The credential may have been revoked as a clone by an input
			// before: every input starts from an active one.
			db, _, err := persistence.Open(context.Background(), s.dbURL)
			if err != nil {
				t.Fatal(err)
			}
			_, err = db.Exec(db.Rebind(`UPDATE passkeys SET status = ?, sign_count = 0`), persistence.PasskeyActive)
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			opts, _ := s.beginAssert(t, "")
			challenge := base64.RawURLEncoding.EncodeToString(opts.Challenge)
			clientData := []byte(strings.ReplaceAll(clientDataTemplate, "{{challenge}}", challenge))
			signature := sig
			if signed {
				clientHash := sha256.Sum256(clientData)
				digest := sha256.Sum256(append(bytes.Clone(authenticatorData), clientHash[:]...))
				if signature, err = s.cred.Key.Sign(digest[:]); err != nil {
					t.Fatal(err)
				}
			}
			b64 := base64.RawURLEncoding.EncodeToString
			id := b64(s.cred.ID)
			credential, _ := json.Marshal(map[string]any{"id": id, "rawId": id, "type": "public-key", "response": map[string]any{
				"clientDataJSON": b64(clientData), "authenticatorData": b64(authenticatorData), "signature": b64(signature), "userHandle": b64([]byte(s.user.ID))}})
			body := map[string]any{"clientId": s.app, "credential": json.RawMessage(credential)}
			path := webauthnPath + "/authenticate/finish"
			if embedded {
				path = embeddedPath + "/passkey/finish"
				body["codeChallenge"], body["codeChallengeMethod"] = oauth2.S256ChallengeFromVerifier(testVerifier), "S256"
			}
			raw, _ := json.Marshal(body)
			req, _ := http.NewRequest(http.MethodPost, s.URL+path, bytes.NewReader(raw))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Origin", testPasskeyOrigin)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				t.Fatalf("%s %q %x: %d %s", path, clientData, authenticatorData, resp.StatusCode, answer)
			}
			var out map[string]any
			if err := json.Unmarshal(answer, &out); err != nil {
				t.Fatalf("%s: not JSON: %s", path, answer)
			}
			// Each server ran the same ceremony: both dialects answer alike.
			if answer := resp.Status + " " + toJSON(out["error"]); first == "" {
				first = answer
			} else if answer != first {
				t.Fatalf("%s %q %x: the dialects differ: %s and %s", path, clientData, authenticatorData, first, answer)
			}
			if resp.StatusCode >= 400 {
				if out["error"] != "passkey_failed" && out["error"] != "invalid_request" {
					t.Fatalf("%s %q %x: %d %s", path, clientData, authenticatorData, resp.StatusCode, answer)
				}
				// The authenticator's own answer must pass: else the
				// harness tests nothing past the refusals.
				if signed && clientDataTemplate == good && bytes.Equal(authenticatorData, authData(0x05, 0)) {
					t.Fatalf("%s: a real assertion refused: %s", path, answer)
				}
				continue
			}
			var cd struct{ Type, Challenge, Origin string }
			_ = json.Unmarshal(clientData, &cd)
			valid := signed && cd.Type == "webauthn.get" && cd.Challenge == challenge && cd.Origin == testPasskeyOrigin &&
				len(authenticatorData) >= 37 && bytes.Equal(authenticatorData[:32], rpHash[:]) && authenticatorData[32]&0x05 == 0x05
			if !valid {
				t.Fatalf("%s: signed in with %q %x (signed %v): %s", path, clientData, authenticatorData, signed, answer)
			}
		}
	})
}
