package handlers

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/google/uuid"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// passkeyOrigin and passkeyRP are the test application's web origin and
// rpId: http on localhost, which WebAuthn clients treat as secure.
const (
	testPasskeyOrigin = "http://localhost:8443"
	testPasskeyRP     = "localhost"
)

// passkeyServer is a sign-in server whose application offers passkeys, a
// token of its person, and a software authenticator.
type passkeyServer struct {
	*signinServer
	dbURL string
	token string
	rp    virtualwebauthn.RelyingParty
	auth  virtualwebauthn.Authenticator
}

func newPasskeyServer(t testing.TB, dbURL string, limits *RateLimits) *passkeyServer {
	t.Helper()
	s := &passkeyServer{signinServer: newSigninServer(t, dbURL, limits), dbURL: dbURL}
	s.setApp(t, func(a *persistence.Application) {
		a.RPID, a.WebOrigins = testPasskeyRP, persistence.StringList{testPasskeyOrigin}
		a.SignInMethods = append(a.SignInMethods, "passkey")
	})
	s.rp = virtualwebauthn.RelyingParty{ID: testPasskeyRP, Name: "Acme Notes", Origin: testPasskeyOrigin}
	s.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(s.user.ID)})
	s.token = s.tokenFor(t, s.app, s.appSecret, s.user.Email)
	return s
}

// tokenFor signs a person with the test password in through an
// application's embedded API and answers their access token.
func (s *passkeyServer) tokenFor(t testing.TB, clientID, secret, email string) string {
	t.Helper()
	status, _, out := s.embed(t, "/password", map[string]any{"clientId": clientID, "email": email, "password": testPassword,
		"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"})
	if status != http.StatusOK {
		t.Fatalf("password sign-in: %d %v", status, out)
	}
	status, _, tokens := s.embed(t, "/code/exchange", map[string]any{"code": out["code"], "client_id": clientID, "client_secret": secret, "code_verifier": testVerifier})
	if status != http.StatusOK {
		t.Fatalf("exchange: %d %v", status, tokens)
	}
	return tokens["access_token"].(string)
}

// person adds a person with the test password.
func (s *passkeyServer) person(t testing.TB) *persistence.User {
	t.Helper()
	n := extensions.Now()
	u := &persistence.User{ID: uuid.NewString(), Email: rand8() + "@example.com", Name: "Grace", Status: "active",
		Metadata: persistence.JSONObject{}, PasswordHash: s.user.PasswordHash, CreatedAt: n, UpdatedAt: n}
	if err := s.store.CreateUser(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return u
}

// otherApp adds a second application offering passkeys on the same rpId
// and origin; it answers its client id and secret.
func (s *passkeyServer) otherApp(t testing.TB) (string, string) {
	t.Helper()
	ctx, n := context.Background(), extensions.Now()
	secret := oauth.NewSecret()
	hash, _ := s.provider.Hasher.Hash(ctx, []byte(secret))
	app := &persistence.Application{SecretHash: hash, ID: uuid.NewString(), ClientID: "app_" + rand8(), Name: "Acme Docs",
		Type: persistence.AppConfidential, RedirectURIs: persistence.StringList{testRedirect},
		SignInMethods: persistence.StringList{"password", "passkey"}, MFA: persistence.JSONObject{}, RPID: testPasskeyRP,
		WebOrigins: persistence.StringList{testPasskeyOrigin}, AccessTokenFormat: "opaque", IDTokenSigningAlg: "RS256", CreatedAt: n, UpdatedAt: n}
	if err := s.store.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	return app.ClientID, secret
}

// send sends raw as the body of a passkey route from origin ("" for
// none), with headers as pairs.
func (s *passkeyServer) send(t testing.TB, method, path, token, origin string, raw []byte, headers ...string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+webauthnPath+path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, out := getJSON(t, req)
	return resp.StatusCode, resp.Header, out
}

// call posts body to a passkey route from the application's origin, with
// the person's token when token is set.
func (s *passkeyServer) call(t testing.TB, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	status, _, out := s.send(t, method, path, token, testPasskeyOrigin, raw)
	return status, out
}

// optionsJSON is the options member of a begin answer, as JSON.
func optionsJSON(t testing.TB, out map[string]any) string {
	t.Helper()
	raw, err := json.Marshal(out["options"])
	if err != nil || out["options"] == nil {
		t.Fatalf("no options: %v", out)
	}
	return string(raw)
}

// publicKey is the publicKey member of a begin answer's options.
func publicKey(t testing.TB, out map[string]any) map[string]any {
	t.Helper()
	opts, _ := out["options"].(map[string]any)
	pk, ok := opts["publicKey"].(map[string]any)
	if !ok {
		t.Fatalf("no options.publicKey: %v", out)
	}
	return pk
}

// beginRegister asks register/begin with token and answers the options.
func (s *passkeyServer) beginRegister(t testing.TB, clientID, token string) virtualwebauthn.AttestationOptions {
	t.Helper()
	status, out := s.call(t, http.MethodPost, "/register/begin", token, map[string]any{"clientId": clientID, "name": "Laptop"})
	if status != http.StatusOK {
		t.Fatalf("register/begin: %d %v", status, out)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(optionsJSON(t, out))
	if err != nil {
		t.Fatal(err)
	}
	return *opts
}

// finishRegister sends an attestation to register/finish.
func (s *passkeyServer) finishRegister(t testing.TB, clientID, token, attestation string) (int, map[string]any) {
	t.Helper()
	return s.call(t, http.MethodPost, "/register/finish", token, map[string]any{"clientId": clientID, "credential": json.RawMessage(attestation)})
}

// register adds a credential of the software authenticator to the person.
func (s *passkeyServer) register(t testing.TB, cred virtualwebauthn.Credential) map[string]any {
	t.Helper()
	opts := s.beginRegister(t, s.app, s.token)
	status, out := s.finishRegister(t, s.app, s.token, virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, cred, opts))
	if status != http.StatusOK {
		t.Fatalf("register/finish: %d %v", status, out)
	}
	return out
}

// beginAssert asks authenticate/begin (email "": usernameless).
func (s *passkeyServer) beginAssert(t testing.TB, email string) (virtualwebauthn.AssertionOptions, map[string]any) {
	t.Helper()
	body := map[string]any{"clientId": s.app}
	if email != "" {
		body["email"] = email
	}
	status, out := s.call(t, http.MethodPost, "/authenticate/begin", "", body)
	if status != http.StatusOK {
		t.Fatalf("authenticate/begin: %d %v", status, out)
	}
	opts, err := virtualwebauthn.ParseAssertionOptions(optionsJSON(t, out))
	if err != nil {
		t.Fatal(err)
	}
	return *opts, out
}

// finishAssert sends an assertion to authenticate/finish.
func (s *passkeyServer) finishAssert(t testing.TB, assertion string) (int, map[string]any) {
	t.Helper()
	return s.call(t, http.MethodPost, "/authenticate/finish", "", map[string]any{"clientId": s.app, "credential": json.RawMessage(assertion)})
}

// assert signs in with cred: the options of a begin without e-mail, and
// the finish's answer.
func (s *passkeyServer) assert(t testing.TB, cred virtualwebauthn.Credential) (int, map[string]any) {
	t.Helper()
	opts, _ := s.beginAssert(t, "")
	return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, cred, opts))
}

// expectPasskeyFailed checks the one sanitized refusal of a failed
// verification: nothing in it says what failed.
func expectPasskeyFailed(t testing.TB, what string, status int, out map[string]any) {
	t.Helper()
	mfaRefused(t, what, status, out, http.StatusBadRequest, "passkey_failed")
	if out["message"] != "The passkey could not be verified." || len(out["details"].(map[string]any)) != 0 {
		t.Fatalf("%s: the refusal says more than it should: %v", what, out)
	}
}

// events counts a person's auth events as "type/reason".
func (s *passkeyServer) events(t testing.TB, userID string) map[string]int {
	t.Helper()
	list, err := s.store.ListAuthEvents(context.Background(), userID, persistence.Page{Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range list {
		out[e.Type+"/"+e.Reason]++
	}
	return out
}

// age moves the passkey service's clock past the expiry of every
// ceremony begun so far: five minutes passing.
func (s *passkeyServer) age(t testing.TB) {
	t.Helper()
	s.passkeysLater.Add(int64(passkeys.DefaultTimeout + time.Second))
}

// newPasskeyCredential is a credential of the software authenticator whose
// public key a relying party can read. virtualwebauthn writes an EC2
// coordinate without its leading zero bytes (big.Int.Bytes), which
// go-webauthn rightly refuses (COSE fixes them at 32 bytes): about one key
// in 128, a flaky failure; such keys are drawn again.
func newPasskeyCredential() virtualwebauthn.Credential {
	for {
		c := virtualwebauthn.NewCredential(virtualwebauthn.KeyTypeEC2)
		k, err := x509.ParsePKCS8PrivateKey(c.Key.Data)
		if err != nil {
			panic(err)
		}
		if key := k.(*ecdsa.PrivateKey); len(key.X.Bytes()) == 32 && len(key.Y.Bytes()) == 32 {
			return c
		}
	}
}

// withCounter sets the counter the authenticator signs with next.
func withCounter(cred virtualwebauthn.Credential, n uint32) virtualwebauthn.Credential {
	cred.Counter = n
	return cred
}

func TestPasskeySignIn(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		view := s.register(t, cred)
		if view["name"] != "Laptop" || view["status"] != "active" || view["id"] == nil {
			t.Fatalf("registered %v", view)
		}
		s.auth.AddCredential(cred)
		cred.Counter++
		s.auth.Credentials[0].Counter = cred.Counter
		status, tokens := s.assert(t, cred)
		if status != http.StatusOK || tokens["access_token"] == nil || tokens["refresh_token"] == nil || tokens["id_token"] == nil {
			t.Fatalf("authenticate/finish: %d %v", status, tokens)
		}
		claims := idClaims(t, tokens)
		if claims["sub"] != s.user.ID || !slices.Equal(amrOf(claims), []string{"hwk", "user", "mfa"}) ||
			claims["acr"] != "http://schemas.openid.net/pape/policies/2007/06/multi-factor" {
			t.Fatalf("claims %v", claims)
		}
		// The session is every sign-in's: the person's token works.
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/api/v1/oauth/userinfo", nil)
		req.Header.Set("Authorization", "Bearer "+tokens["access_token"].(string))
		if resp, out := getJSON(t, req); resp.StatusCode != http.StatusOK || out["sub"] != s.user.ID {
			t.Fatalf("userinfo: %d %v", resp.StatusCode, out)
		}
		if ev := s.events(t, s.user.ID); ev["sign_in/"] < 2 {
			t.Fatalf("no sign_in event for the passkey: %v", ev)
		}
	})
}

// Registration answers the spec's credential; the options are what
// navigator.credentials.create expects; the list shows it; the event log
// has USER_MFA_ENABLED. A synced passkey (backup eligible) signs in as swk.
func TestPasskeyRegistration(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		status, out := s.call(t, http.MethodPost, "/register/begin", s.token, map[string]any{"clientId": s.app, "name": " Work laptop "})
		pk := publicKey(t, out)
		sel, _ := pk["authenticatorSelection"].(map[string]any)
		if status != http.StatusOK || out["challenge"] != pk["challenge"] || pk["timeout"] != 300000.0 || sel["userVerification"] != "required" ||
			sel["residentKey"] != "required" || pk["rp"].(map[string]any)["id"] != testPasskeyRP {
			t.Fatalf("register/begin: %d %v", status, out)
		}
		if raw, _ := base64.RawURLEncoding.DecodeString(out["challenge"].(string)); len(raw) != 32 {
			t.Fatalf("a challenge of %d bytes", len(raw))
		}
		opts, _ := virtualwebauthn.ParseAttestationOptions(optionsJSON(t, out))
		if opts.UserID != s.user.ID || opts.UserName != s.user.Email {
			t.Fatalf("user in the options: %+v", opts)
		}
		cred := newPasskeyCredential()
		before := time.Now().Add(-time.Second)
		status, view := s.finishRegister(t, s.app, s.token, virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, cred, *opts))
		if status != http.StatusOK {
			t.Fatalf("register/finish: %d %v", status, view)
		}
		created, err := time.Parse(time.RFC3339, view["createdAt"].(string))
		if err != nil || created.Before(before) || !strings.HasSuffix(view["createdAt"].(string), "Z") {
			t.Fatalf("createdAt %v", view["createdAt"])
		}
		aaguid, _ := uuid.FromBytes(s.auth.Aaguid[:])
		if _, err := uuid.Parse(view["id"].(string)); err != nil || view["name"] != "Work laptop" || view["deviceType"] != "desktop" ||
			view["lastUsedAt"] != nil || view["status"] != "active" || view["backedUp"] != false || view["aaguid"] != aaguid.String() || len(view) != 8 {
			t.Fatalf("the credential: %v", view)
		}
		status, list := s.call(t, http.MethodGet, "/credentials", s.token, nil)
		creds, _ := list["credentials"].([]any)
		if status != http.StatusOK || len(creds) != 1 || creds[0].(map[string]any)["id"] != view["id"] {
			t.Fatalf("list: %d %v", status, list)
		}
		if ev := s.events(t, s.user.ID); ev[persistence.EventMFAEnabled+"/"] != 1 {
			t.Fatalf("events %v", ev)
		}
		// After a sign-in: lastUsedAt is set.
		s.auth.AddCredential(cred)
		if status, out := s.assert(t, withCounter(cred, 1)); status != http.StatusOK {
			t.Fatalf("sign-in: %d %v", status, out)
		}
		_, list = s.call(t, http.MethodGet, "/credentials", s.token, nil)
		if list["credentials"].([]any)[0].(map[string]any)["lastUsedAt"] == nil {
			t.Fatalf("lastUsedAt not set: %v", list)
		}

		// A synced passkey from a phone's browser: no name given, the
		// device's; backed up; its sign-in is swk.
		synced := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(s.user.ID), BackupEligible: true, BackupState: true})
		phone := newPasskeyCredential()
		raw, _ := json.Marshal(map[string]any{"clientId": s.app})
		status, _, out = s.send(t, http.MethodPost, "/register/begin", s.token, testPasskeyOrigin, raw, "User-Agent", "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148")
		if status != http.StatusOK {
			t.Fatalf("register/begin: %d %v", status, out)
		}
		opts, _ = virtualwebauthn.ParseAttestationOptions(optionsJSON(t, out))
		if len(opts.ExcludeCredentials) != 1 {
			t.Fatalf("the person's passkey is not excluded: %v", opts.ExcludeCredentials)
		}
		status, view = s.finishRegister(t, s.app, s.token, virtualwebauthn.CreateAttestationResponse(s.rp, synced, phone, *opts))
		if status != http.StatusOK || view["deviceType"] != "mobile" || view["name"] != "Passkey on a phone" || view["backedUp"] != true {
			t.Fatalf("a synced passkey: %d %v", status, view)
		}
		opts2, _ := s.beginAssert(t, "")
		status, tokens := s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, synced, phone, opts2))
		if status != http.StatusOK || !slices.Equal(amrOf(idClaims(t, tokens)), []string{"swk", "user", "mfa"}) {
			t.Fatalf("a synced passkey's sign-in: %d %v", status, tokens)
		}
	})
}

// Every verification rule of registration: each refusal is the one
// sanitized passkey_failed, recorded with its reason, and nothing is
// stored.
func TestPasskeyRegistrationRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		opts := s.beginRegister(t, s.app, s.token)
		attestation := virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, cred, opts)
		if status, out := s.finishRegister(t, s.app, s.token, attestation); status != http.StatusOK {
			t.Fatalf("register/finish: %d %v", status, out)
		}
		// The same answer again: its ceremony is spent.
		status, out := s.finishRegister(t, s.app, s.token, attestation)
		expectPasskeyFailed(t, "a replayed registration", status, out)
		// The same credential in a new ceremony: registered already.
		status, out = s.finishRegister(t, s.app, s.token, virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, cred, s.beginRegister(t, s.app, s.token)))
		expectPasskeyFailed(t, "the same credential again", status, out)
		// ... also for another person.
		grace := s.person(t)
		graceToken := s.tokenFor(t, s.app, s.appSecret, grace.Email)
		status, out = s.finishRegister(t, s.app, graceToken, virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, cred, s.beginRegister(t, s.app, graceToken)))
		expectPasskeyFailed(t, "another person's credential", status, out)
		if ev := s.events(t, grace.ID); ev[persistence.EventPasskeyRegisterFailed+"/duplicate_credential"] != 1 {
			t.Fatalf("grace's events: %v", ev)
		}

		other, otherSecret := s.otherApp(t)
		otherToken := s.tokenFor(t, other, otherSecret, s.user.Email)
		for _, tc := range []struct {
			name   string
			answer func(opts virtualwebauthn.AttestationOptions) string
			finish func(attestation string) (int, map[string]any)
			reason string
		}{
			{"wrong origin", func(o virtualwebauthn.AttestationOptions) string {
				rp := s.rp
				rp.Origin = "https://evil.example"
				return virtualwebauthn.CreateAttestationResponse(rp, s.auth, newPasskeyCredential(), o)
			}, nil, "verification"},
			{"wrong rpId", func(o virtualwebauthn.AttestationOptions) string {
				rp := s.rp
				rp.ID = "example.com"
				return virtualwebauthn.CreateAttestationResponse(rp, s.auth, newPasskeyCredential(), o)
			}, nil, "verification"},
			{"no user verification", func(o virtualwebauthn.AttestationOptions) string {
				a := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserNotVerified: true})
				return virtualwebauthn.CreateAttestationResponse(s.rp, a, newPasskeyCredential(), o)
			}, nil, "verification"},
			{"no user presence", func(o virtualwebauthn.AttestationOptions) string {
				a := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserNotPresent: true})
				return virtualwebauthn.CreateAttestationResponse(s.rp, a, newPasskeyCredential(), o)
			}, nil, "verification"},
			{"another application's ceremony", func(o virtualwebauthn.AttestationOptions) string {
				return virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, newPasskeyCredential(), o)
			}, func(a string) (int, map[string]any) { return s.finishRegister(t, other, otherToken, a) }, "wrong_application"},
			{"another person's ceremony", func(o virtualwebauthn.AttestationOptions) string {
				return virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, newPasskeyCredential(), o)
			}, func(a string) (int, map[string]any) { return s.finishRegister(t, s.app, graceToken, a) }, "wrong_user"},
			{"an authentication's ceremony", func(virtualwebauthn.AttestationOptions) string {
				o, _ := s.beginAssert(t, "")
				return virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, newPasskeyCredential(),
					virtualwebauthn.AttestationOptions{Challenge: o.Challenge, UserID: s.user.ID})
			}, nil, "unknown_challenge"},
		} {
			opts := s.beginRegister(t, s.app, s.token)
			answer := tc.answer(opts)
			finish := tc.finish
			if finish == nil {
				finish = func(a string) (int, map[string]any) { return s.finishRegister(t, s.app, s.token, a) }
			}
			status, out := finish(answer)
			expectPasskeyFailed(t, tc.name, status, out)
			// The ceremony was consumed by the failure: the right answer
			// to it is refused too.
			status, out = s.finishRegister(t, s.app, s.token, virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, newPasskeyCredential(), opts))
			if tc.name == "an authentication's ceremony" { // it answered another ceremony: this one stands
				if status != http.StatusOK {
					t.Fatalf("%s, then the right answer: %d %v", tc.name, status, out)
				}
				continue
			}
			expectPasskeyFailed(t, tc.name+", then the right answer", status, out)
		}
		ev := s.events(t, s.user.ID)
		for _, reason := range []string{"verification", "wrong_application", "unknown_challenge", "duplicate_credential"} {
			if ev[persistence.EventPasskeyRegisterFailed+"/"+reason] == 0 {
				t.Errorf("no %s/%s event: %v", persistence.EventPasskeyRegisterFailed, reason, ev)
			}
		}
		if ev := s.events(t, grace.ID); ev[persistence.EventPasskeyRegisterFailed+"/wrong_user"] != 1 {
			t.Errorf("no wrong_user event: %v", ev)
		}

		// Five minutes pass.
		opts = s.beginRegister(t, s.app, s.token)
		s.age(t)
		status, out = s.finishRegister(t, s.app, s.token, virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, newPasskeyCredential(), opts))
		expectPasskeyFailed(t, "an expired ceremony", status, out)
		if ev := s.events(t, s.user.ID); ev[persistence.EventPasskeyRegisterFailed+"/expired_challenge"] != 1 {
			t.Fatalf("events %v", ev)
		}
		_, list := s.call(t, http.MethodGet, "/credentials", s.token, nil)
		if n := len(list["credentials"].([]any)); n != 2 {
			t.Fatalf("%d credentials stored", n)
		}
	})
}

// One assertion sent several times at once: one sign-in, the others
// refused (the ceremony is taken once). A disabled person's passkey
// verifies and signs nobody in.
func TestPasskeyAtOnce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		s.register(t, cred)
		opts, _ := s.beginAssert(t, "")
		assertion := virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 1), opts)
		statuses := make([]int, 4)
		var wg sync.WaitGroup
		for i := range statuses {
			wg.Go(func() { statuses[i], _ = s.finishAssert(t, assertion) })
		}
		wg.Wait()
		slices.Sort(statuses)
		if !slices.Equal(statuses, []int{200, 400, 400, 400}) {
			t.Fatalf("statuses %v", statuses)
		}

		if _, err := s.store.UpdateUser(context.Background(), s.user.ID, func(u *persistence.User) ([]persistence.DirectoryEvent, error) {
			u.Status = "disabled"
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		status, out := s.assert(t, withCounter(cred, 2))
		mfaRefused(t, "a disabled person", status, out, http.StatusForbidden, "user_disabled")
	})
}

// Every verification rule of an assertion.
func TestPasskeyAssertionRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		s.register(t, cred)
		other, _ := s.otherApp(t)
		n := uint32(0)
		next := func() virtualwebauthn.Credential { n++; return withCounter(cred, n) }

		// A replayed assertion: its ceremony is spent.
		opts, _ := s.beginAssert(t, "")
		assertion := virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, next(), opts)
		if status, out := s.finishAssert(t, assertion); status != http.StatusOK {
			t.Fatalf("sign-in: %d %v", status, out)
		}
		status, out := s.finishAssert(t, assertion)
		expectPasskeyFailed(t, "a replayed assertion", status, out)

		for _, tc := range []struct {
			name   string
			answer func(o virtualwebauthn.AssertionOptions) (int, map[string]any)
		}{
			{"wrong origin", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				rp := s.rp
				rp.Origin = "http://localhost:9999"
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(rp, s.auth, next(), o))
			}},
			{"wrong rpId", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				rp := s.rp
				rp.ID = "example.com"
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(rp, s.auth, next(), o))
			}},
			{"no user verification", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				a := s.auth
				a.Options.UserNotVerified = true
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, a, next(), o))
			}},
			{"no user presence", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				a := s.auth
				a.Options.UserNotPresent = true
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, a, next(), o))
			}},
			{"a user handle not the owner's", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				a := s.auth
				a.Options.UserHandle = []byte(uuid.NewString())
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, a, next(), o))
			}},
			{"a signature by another key", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				forged := newPasskeyCredential()
				forged.ID, forged.Counter = cred.ID, n+100
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, forged, o))
			}},
			{"another application's ceremony", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				return s.call(t, http.MethodPost, "/authenticate/finish", "", map[string]any{"clientId": other,
					"credential": json.RawMessage(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, next(), o))})
			}},
			{"a registration's ceremony", func(virtualwebauthn.AssertionOptions) (int, map[string]any) {
				reg := s.beginRegister(t, s.app, s.token)
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, next(), virtualwebauthn.AssertionOptions{Challenge: reg.Challenge}))
			}},
			{"an unknown credential", func(o virtualwebauthn.AssertionOptions) (int, map[string]any) {
				return s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, newPasskeyCredential(), o))
			}},
		} {
			opts, _ := s.beginAssert(t, "")
			status, out := tc.answer(opts)
			expectPasskeyFailed(t, tc.name, status, out)
			// Consumed whatever the outcome: the right answer to the same
			// ceremony is refused too.
			status, out = s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, next(), opts))
			if tc.name != "a registration's ceremony" {
				expectPasskeyFailed(t, tc.name+", then the right answer", status, out)
			}
		}
		// Five minutes pass.
		opts, _ = s.beginAssert(t, "")
		s.age(t)
		status, out = s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, next(), opts))
		expectPasskeyFailed(t, "an expired ceremony", status, out)

		// None of the refusals cost the credential: it signs in.
		if status, out := s.assert(t, next()); status != http.StatusOK {
			t.Fatalf("the credential after the refusals: %d %v", status, out)
		}
		ev := s.events(t, s.user.ID)
		// (The failures before the credential is known, a ceremony unknown,
		// spent, expired or another application's, are nobody's.)
		if ev["sign_in_failed/passkey_verification"] != 6 {
			t.Fatalf("events %v", ev)
		}
		for k := range ev {
			if strings.HasPrefix(k, "sign_in_failed/") && !strings.HasPrefix(k, "sign_in_failed/passkey_") {
				t.Fatalf("a failure not named passkey_*: %v", ev)
			}
		}
		_, list := s.call(t, http.MethodGet, "/credentials", s.token, nil)
		if c := list["credentials"].([]any)[0].(map[string]any); c["status"] != "active" {
			t.Fatalf("credential %v", c)
		}
	})
}

// A counter that does not advance (equal or backwards) is a clone: the
// credential is revoked, the sign-in refused, the event logged and the
// owner told; the credential is refused afterwards. A counter that stays
// 0 (an authenticator that keeps none) keeps working.
func TestPasskeyClone(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		for _, tc := range []struct {
			name        string
			first, then uint32
		}{{"equal", 5, 5}, {"backwards", 7, 3}} {
			cred := newPasskeyCredential()
			id := s.register(t, cred)["id"]
			if m := s.next(t); m.To != s.user.Email || m.Subject != "A passkey was added to your Acme Notes account" {
				t.Fatalf("%s: the notice of the passkey added: %+v", tc.name, m)
			}
			if status, out := s.assert(t, withCounter(cred, tc.first)); status != http.StatusOK {
				t.Fatalf("%s: sign-in: %d %v", tc.name, status, out)
			}
			status, out := s.assert(t, withCounter(cred, tc.then))
			expectPasskeyFailed(t, tc.name+": a clone", status, out)
			m := s.next(t)
			if m.To != s.user.Email || !strings.Contains(m.Subject, "passkey") || !strings.Contains(m.Subject, "turned off") || !strings.Contains(m.Text, "Laptop") {
				t.Fatalf("%s: the notice: %+v", tc.name, m)
			}
			status, out = s.assert(t, withCounter(cred, tc.first+100))
			expectPasskeyFailed(t, tc.name+": the revoked credential", status, out)
			_, list := s.call(t, http.MethodGet, "/credentials", s.token, nil)
			for _, c := range list["credentials"].([]any) {
				if c := c.(map[string]any); c["id"] == id && c["status"] != "revoked" {
					t.Fatalf("%s: %v", tc.name, c)
				}
			}
			// Nor is it a method check-email offers (it was the person's only passkey).
			if _, _, out := s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": s.user.Email}); !slices.Equal(toStrings(out["methods"]), []string{"password"}) {
				t.Fatalf("%s: check-email: %v", tc.name, out)
			}
			// Nor does it start an e-mail-first ceremony for the person.
			opts, _ := s.beginAssert(t, s.user.Email)
			if slices.Contains(opts.AllowCredentials, base64.RawURLEncoding.EncodeToString(cred.ID)) {
				t.Fatalf("%s: a revoked credential allowed", tc.name)
			}
		}
		ev := s.events(t, s.user.ID)
		if ev[persistence.EventPasskeyCloned+"/counter_not_advanced"] != 2 || ev["sign_in_failed/passkey_clone"] != 2 ||
			ev["sign_in_failed/passkey_revoked_credential"] != 2 {
			t.Fatalf("events %v", ev)
		}
		select {
		case m := <-s.mails:
			t.Fatalf("a second notice: %+v", m)
		default:
		}

		zero := newPasskeyCredential()
		s.register(t, zero)
		for i := range 3 {
			if status, out := s.assert(t, zero); status != http.StatusOK {
				t.Fatalf("a counter of 0, sign-in %d: %d %v", i, status, out)
			}
		}
		// Once it counts, it must advance.
		if status, out := s.assert(t, withCounter(zero, 1)); status != http.StatusOK {
			t.Fatalf("a counter started: %d %v", status, out)
		}
		status, out := s.assert(t, zero)
		expectPasskeyFailed(t, "back to 0", status, out)
	})
}

// With an e-mail, the options list the person's passkeys; an unknown
// e-mail, or a person without passkeys, gets usernameless options of the
// same shape. An email-first ceremony takes only that person's passkeys.
func TestPasskeyEmailFirst(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		s.register(t, cred)
		opts, out := s.beginAssert(t, s.user.Email)
		pk := publicKey(t, out)
		if !slices.Equal(opts.AllowCredentials, []string{base64.RawURLEncoding.EncodeToString(cred.ID)}) || pk["userVerification"] != "required" ||
			pk["rpId"] != testPasskeyRP || pk["timeout"] != 300000.0 || out["challenge"] != pk["challenge"] {
			t.Fatalf("email-first options: %v", out)
		}
		keys := func(m map[string]any) []string {
			var k []string
			for name := range m {
				if name != "allowCredentials" {
					k = append(k, name)
				}
			}
			slices.Sort(k)
			return k
		}
		_, usernameless := s.beginAssert(t, "")
		without := s.person(t)
		for _, email := range []string{"nobody@example.com", without.Email} {
			o, out := s.beginAssert(t, email)
			if len(o.AllowCredentials) != 0 || !slices.Equal(keys(publicKey(t, out)), keys(publicKey(t, usernameless))) ||
				!slices.Equal(keys(out), keys(usernameless)) {
				t.Fatalf("%s: %v, usernameless %v", email, out, usernameless)
			}
		}
		if status, out := s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 1), opts)); status != http.StatusOK {
			t.Fatalf("email-first sign-in: %d %v", status, out)
		}
		// A second passkey: the ceremony lists both, and either answers it.
		second := newPasskeyCredential()
		s.register(t, second)
		opts, _ = s.beginAssert(t, s.user.Email)
		if len(opts.AllowCredentials) != 2 {
			t.Fatalf("allowCredentials of two passkeys: %v", opts.AllowCredentials)
		}
		if status, out := s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(second, 1), opts)); status != http.StatusOK {
			t.Fatalf("email-first sign-in with the second of two passkeys: %d %v", status, out)
		}
		// And verification still decides: no user verification, refused.
		opts, _ = s.beginAssert(t, s.user.Email)
		unverified := s.auth
		unverified.Options.UserNotVerified = true
		status, out := s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, unverified, withCounter(second, 2), opts))
		expectPasskeyFailed(t, "an e-mail-first assertion without user verification", status, out)

		// Another person's passkey answering Ada's ceremony.
		graceToken := s.tokenFor(t, s.app, s.appSecret, without.Email)
		graceAuth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(without.ID)})
		graceCred := newPasskeyCredential()
		if status, out := s.finishRegister(t, s.app, graceToken, virtualwebauthn.CreateAttestationResponse(s.rp, graceAuth, graceCred, s.beginRegister(t, s.app, graceToken))); status != http.StatusOK {
			t.Fatalf("grace's passkey: %d %v", status, out)
		}
		opts, _ = s.beginAssert(t, s.user.Email)
		status, out = s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(s.rp, graceAuth, withCounter(graceCred, 1), opts))
		expectPasskeyFailed(t, "another person's passkey", status, out)
		if ev := s.events(t, without.ID); ev["sign_in_failed/passkey_wrong_user"] != 1 {
			t.Fatalf("events %v", ev)
		}
	})
}

// A person's credentials: renamed and deleted by their owner only; the
// last way in stays; USER_MFA_DISABLED on deletion.
func TestPasskeyCredentials(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		id := s.register(t, cred)["id"].(string)

		status, out := s.call(t, http.MethodPut, "/credentials/"+id, s.token, map[string]any{"name": "  Office  "})
		if status != http.StatusOK || out["name"] != "Office" || out["id"] != id || out["status"] != "active" {
			t.Fatalf("rename: %d %v", status, out)
		}
		for _, body := range []any{map[string]any{}, map[string]any{"name": ""}, map[string]any{"name": "   "}, map[string]any{"name": strings.Repeat("n", 65)},
			map[string]any{"name": 5}, map[string]any{"name": "x", "extra": 1}} {
			status, out := s.call(t, http.MethodPut, "/credentials/"+id, s.token, body)
			if status != http.StatusBadRequest || (out["error"] != "invalid_request" && out["error"] != "invalid_json") {
				t.Fatalf("rename with %v: %d %v", body, status, out)
			}
		}
		// Another person's passkey, and ids that are not theirs.
		grace := s.person(t)
		graceToken := s.tokenFor(t, s.app, s.appSecret, grace.Email)
		for _, bad := range []string{id, uuid.NewString(), "not-a-uuid"} {
			status, out := s.call(t, http.MethodPut, "/credentials/"+bad, graceToken, map[string]any{"name": "Mine"})
			mfaRefused(t, "rename "+bad, status, out, http.StatusNotFound, "not_found")
			status, out = s.call(t, http.MethodDelete, "/credentials/"+bad, graceToken, nil)
			mfaRefused(t, "delete "+bad, status, out, http.StatusNotFound, "not_found")
		}
		if _, list := s.call(t, http.MethodGet, "/credentials", graceToken, nil); len(list["credentials"].([]any)) != 0 {
			t.Fatalf("grace sees %v", list)
		}

		// Ada signs in with a password too: the passkey goes.
		if status, out := s.call(t, http.MethodDelete, "/credentials/"+id, s.token, nil); status != http.StatusNoContent {
			t.Fatalf("delete: %d %v", status, out)
		}
		if ev := s.events(t, s.user.ID); ev[persistence.EventMFADisabled+"/"] != 1 || ev[persistence.EventMFAEnabled+"/"] != 1 {
			t.Fatalf("events %v", ev)
		}
		status, out = s.assert(t, withCounter(cred, 1))
		expectPasskeyFailed(t, "a deleted passkey", status, out)

		// A passkey-only person: the last passkey stays.
		id = s.register(t, cred)["id"].(string)
		req, _ := http.NewRequest(http.MethodDelete, s.URL+"/api/v1/auth/link/password", nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		if resp, out := getJSON(t, req); resp.StatusCode != http.StatusOK || !slices.Equal(toStrings(out["remainingIdentities"]), []string{"passkey"}) {
			t.Fatalf("unlink the password: %d %v", resp.StatusCode, out)
		}
		status, out = s.call(t, http.MethodDelete, "/credentials/"+id, s.token, nil)
		mfaRefused(t, "the last way in", status, out, http.StatusConflict, "last_identity")
		if status, out := s.assert(t, withCounter(cred, 2)); status != http.StatusOK {
			t.Fatalf("the kept passkey: %d %v", status, out)
		}
	})
}

// A passkey-only person: check-email names passkey alone; an e-mailed
// code is 409 account_exists naming passkey.
func TestPasskeyOnlyPerson(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		s.register(t, newPasskeyCredential())
		_, _, out := s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": s.user.Email})
		if !slices.Equal(toStrings(out["methods"]), []string{"password", "passkey"}) {
			t.Fatalf("check-email: %v", out)
		}
		req, _ := http.NewRequest(http.MethodDelete, s.URL+"/api/v1/auth/link/password", nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		if resp, out := getJSON(t, req); resp.StatusCode != http.StatusOK {
			t.Fatalf("unlink the password: %d %v", resp.StatusCode, out)
		}
		_, _, out = s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": s.user.Email})
		if !slices.Equal(toStrings(out["methods"]), []string{"passkey"}) || out["method"] != "passkey" {
			t.Fatalf("check-email of a passkey-only person: %v", out)
		}
		for path, body := range map[string]map[string]any{
			"/otp/send": {"clientId": s.app, "email": s.user.Email},
			"/magic-link/send": {"clientId": s.app, "email": s.user.Email, "redirectUri": testRedirect,
				"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"},
		} {
			status, _, out := s.embed(t, path, body)
			if status != http.StatusConflict || out["error"] != "account_exists" || !slices.Equal(toStrings(out["existingIdentities"]), []string{"passkey"}) {
				t.Fatalf("%s: %d %v", path, status, out)
			}
		}
		// An application that does not offer passkeys lists none.
		s.setApp(t, func(a *persistence.Application) { a.SignInMethods = persistence.StringList{"password", "otp"} })
		if _, _, out = s.embed(t, "/check-email", map[string]any{"clientId": s.app, "email": s.user.Email}); slices.Contains(toStrings(out["methods"]), "passkey") {
			t.Fatalf("check-email without passkeys offered: %v", out)
		}
	})
}

// Who may call: a person's token of the application named, from one of its
// web origins.
func TestPasskeyAccess(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		other, otherSecret := s.otherApp(t)
		otherToken := s.tokenFor(t, other, otherSecret, s.user.Email)
		machine := s.adminToken(t)
		routes := []struct{ method, path string }{
			{http.MethodPost, "/register/begin"}, {http.MethodPost, "/register/finish"}, {http.MethodGet, "/credentials"},
			{http.MethodPut, "/credentials/" + uuid.NewString()}, {http.MethodDelete, "/credentials/" + uuid.NewString()},
		}
		body, _ := json.Marshal(map[string]any{"clientId": s.app, "name": "x", "credential": map[string]any{}})
		for _, r := range routes {
			what := r.method + " " + r.path
			status, _, out := s.send(t, r.method, r.path, machine, testPasskeyOrigin, body)
			mfaRefused(t, what+" with a machine token", status, out, http.StatusForbidden, "user_token_required")
			status, _, out = s.send(t, r.method, r.path, "", testPasskeyOrigin, body)
			mfaRefused(t, what+" without a token", status, out, http.StatusUnauthorized, "unauthorized")
			status, _, out = s.send(t, r.method, r.path, s.token, "https://evil.example", body)
			mfaRefused(t, what+" from another origin", status, out, http.StatusForbidden, "origin_not_allowed")
		}
		// The token of another application than the one named.
		for _, path := range []string{"/register/begin", "/register/finish"} {
			status, _, out := s.send(t, http.MethodPost, path, otherToken, testPasskeyOrigin, body)
			mfaRefused(t, path+" with another application's token", status, out, http.StatusForbidden, "client_mismatch")
		}
		// The public routes: only the application's origins, or a server.
		for _, path := range []string{"/authenticate/begin", "/authenticate/finish"} {
			status, h, out := s.send(t, http.MethodPost, path, "", "https://evil.example", body)
			mfaRefused(t, path+" from another origin", status, out, http.StatusForbidden, "origin_not_allowed")
			if h.Get("Access-Control-Allow-Origin") != "" {
				t.Fatalf("%s: another origin may read", path)
			}
		}
		status, h, _ := s.send(t, http.MethodPost, "/authenticate/begin", "", testPasskeyOrigin, body)
		if status != http.StatusOK || h.Get("Access-Control-Allow-Origin") != testPasskeyOrigin || h.Get("Cache-Control") != "no-store" {
			t.Fatalf("authenticate/begin: %d %v", status, h)
		}
		if status, _, out := s.send(t, http.MethodPost, "/authenticate/begin", "", "", body); status != http.StatusOK {
			t.Fatalf("a server's call: %d %v", status, out)
		}
		status, _, out := s.send(t, http.MethodPost, "/authenticate/begin", "", "", []byte(`{"clientId":"app_nobody"}`))
		if status < 400 || status >= 500 || out["error"] == nil {
			t.Fatalf("an unknown application: %d %v", status, out)
		}
		// An application without passkeys.
		s.setApp(t, func(a *persistence.Application) { a.SignInMethods = persistence.StringList{"password"} })
		status, _, out = s.send(t, http.MethodPost, "/authenticate/begin", "", testPasskeyOrigin, body)
		mfaRefused(t, "an application without passkeys", status, out, http.StatusBadRequest, "passkeys_unavailable")

		preflight := func(origin string) *http.Response {
			req, _ := http.NewRequest(http.MethodOptions, s.URL+webauthnPath+"/register/begin", nil)
			req.Header.Set("Origin", origin)
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		if resp := preflight(testPasskeyOrigin); resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != testPasskeyOrigin ||
			!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "DELETE") ||
			!strings.Contains(strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers")), "authorization") {
			t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
		}
		if resp := preflight("https://evil.example"); resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatalf("a foreign preflight: %d %v", resp.StatusCode, resp.Header)
		}
	})
}

// Limits: every route per address, a person's own routes per person too.
func TestPasskeyLimits(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		limits := DefaultRateLimits()
		limits.Passkey = Rate{Period: time.Minute, Limit: 3}
		s := newPasskeyServer(t, dbURL, &limits)
		for i := range 3 {
			status, h, out := s.send(t, http.MethodPost, "/authenticate/begin", "", testPasskeyOrigin, []byte(`{"clientId":"`+s.app+`"}`))
			if status != http.StatusOK || h.Get("X-RateLimit-Limit") != "3" {
				t.Fatalf("begin %d: %d %v %v", i, status, h, out)
			}
		}
		status, h, out := s.send(t, http.MethodPost, "/authenticate/begin", "", testPasskeyOrigin, []byte(`{"clientId":"`+s.app+`"}`))
		mfaRefused(t, "past the limit", status, out, http.StatusTooManyRequests, "rate_limited")
		if h.Get("Retry-After") == "" || h.Get("Access-Control-Allow-Origin") != testPasskeyOrigin {
			t.Fatalf("429 headers %v", h)
		}
		// The same from another address is served.
		req, _ := http.NewRequest(http.MethodPost, s.URL+webauthnPath+"/authenticate/begin", strings.NewReader(`{"clientId":"`+s.app+`"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: realAddr{}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("another address: %d", resp.StatusCode)
		}
	})
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		limits := DefaultRateLimits()
		limits.PasskeyUser = Rate{Period: time.Minute, Limit: 2}
		s := newPasskeyServer(t, dbURL, &limits)
		grace := s.person(t)
		graceToken := s.tokenFor(t, s.app, s.appSecret, grace.Email)
		for range 2 {
			if status, out := s.call(t, http.MethodGet, "/credentials", s.token, nil); status != http.StatusOK {
				t.Fatalf("list: %d %v", status, out)
			}
		}
		status, out := s.call(t, http.MethodPost, "/register/begin", s.token, map[string]any{"clientId": s.app})
		mfaRefused(t, "past the person's limit", status, out, http.StatusTooManyRequests, "rate_limited")
		// Another person, from the same address, is served.
		if status, out := s.call(t, http.MethodGet, "/credentials", graceToken, nil); status != http.StatusOK {
			t.Fatalf("another person: %d %v", status, out)
		}
	})
}

// Failed assertions count against the address and the passkey's owner
// (signinFailures): past either budget an address that failed is refused,
// the right passkey too; the owner, from an address that has not failed,
// signs in.
func TestPasskeyFailureLimits(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		limits := DefaultRateLimits()
		limits.SignIn, limits.SignInEmail = Rate{Period: time.Minute, Limit: 10}, Rate{Period: time.Minute, Limit: 2}
		s := newPasskeyServer(t, dbURL, &limits)
		cred := newPasskeyCredential()
		s.register(t, cred)
		wrong := s.rp
		wrong.Origin = "http://localhost:9999"
		for i := range 2 {
			opts, _ := s.beginAssert(t, "")
			status, out := s.finishAssert(t, virtualwebauthn.CreateAssertionResponse(wrong, s.auth, withCounter(cred, uint32(i+1)), opts))
			expectPasskeyFailed(t, "a wrong origin", status, out)
		}
		status, out := s.assert(t, withCounter(cred, 10))
		mfaRefused(t, "the owner's budget spent", status, out, http.StatusTooManyRequests, "rate_limited")
		// From another address.
		opts, _ := s.beginAssert(t, "")
		raw, _ := json.Marshal(map[string]any{"clientId": s.app, "credential": json.RawMessage(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 11), opts))})
		req, _ := http.NewRequest(http.MethodPost, s.URL+webauthnPath+"/authenticate/finish", bytes.NewReader(raw))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: realAddr{}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the owner from another address: %d", resp.StatusCode)
		}
	})
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		limits := DefaultRateLimits()
		limits.SignIn = Rate{Period: time.Minute, Limit: 3}
		s := newPasskeyServer(t, dbURL, &limits)
		cred := newPasskeyCredential()
		s.register(t, cred)
		for range 3 { // unknown credentials: nobody's, the address's
			status, out := s.assert(t, newPasskeyCredential())
			expectPasskeyFailed(t, "an unknown credential", status, out)
		}
		status, out := s.assert(t, withCounter(cred, 1))
		mfaRefused(t, "the address's budget spent", status, out, http.StatusTooManyRequests, "rate_limited")
		status, _, out = s.embed(t, "/passkey/finish", map[string]any{"clientId": s.app, "credential": map[string]any{}}, "Origin", testPasskeyOrigin)
		expectSignInError(t, status, out, http.StatusTooManyRequests, "rate_limited")
	})
}

// The embedded API: a passkey sign-in ends in the code every embedded
// sign-in ends in; errors are the sign-in shape.
func TestEmbeddedPasskey(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		s.register(t, cred)
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)
		begin := func(body map[string]any) virtualwebauthn.AssertionOptions {
			t.Helper()
			status, _, out := s.embed(t, "/passkey/begin", body, "Origin", testPasskeyOrigin)
			if status != http.StatusOK {
				t.Fatalf("passkey/begin: %d %v", status, out)
			}
			opts, err := virtualwebauthn.ParseAssertionOptions(optionsJSON(t, out))
			if err != nil {
				t.Fatal(err)
			}
			return *opts
		}
		finish := func(body map[string]any) (int, map[string]any) {
			t.Helper()
			status, _, out := s.embed(t, "/passkey/finish", body, "Origin", testPasskeyOrigin)
			return status, out
		}
		opts := begin(map[string]any{"clientId": s.app, "email": s.user.Email})
		assertion := json.RawMessage(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 1), opts))
		status, out := finish(map[string]any{"clientId": s.app, "credential": assertion})
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_request") // no PKCE
		status, out = finish(map[string]any{"clientId": s.app, "credential": assertion, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if status != http.StatusOK || out["code"] == nil || out["expiresIn"] != 600.0 {
			t.Fatalf("passkey/finish: %d %v", status, out)
		}
		status, tokens := s.embeddedExchange(t, out["code"].(string), testVerifier)
		if status != http.StatusOK {
			t.Fatalf("exchange: %d %v", status, tokens)
		}
		if claims := idClaims(t, tokens); claims["sub"] != s.user.ID || !slices.Equal(amrOf(claims), []string{"hwk", "user", "mfa"}) || claims["acr"] != signin.ACRMultiFactor {
			t.Fatalf("claims %v", claims)
		}
		// Replayed: the sign-in error shape, sanitized.
		status, out = finish(map[string]any{"clientId": s.app, "credential": assertion, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
		expectSignInError(t, status, out, http.StatusBadRequest, "passkey_failed")
		if out["error_description"] != "The passkey could not be verified." || len(out) != 2 {
			t.Fatalf("replayed: %v", out)
		}
		// Usernameless, under an MFA policy: a passkey is two factors, no step-up.
		s.requireMFA(t, signin.MFARequired)
		opts = begin(map[string]any{"clientId": s.app})
		status, out = finish(map[string]any{"clientId": s.app, "credential": json.RawMessage(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 2), opts)),
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if status != http.StatusOK || out["code"] == nil || out["mfaRequired"] != nil {
			t.Fatalf("a passkey under MFA required: %d %v", status, out)
		}
		// A ceremony of the embedded API is not one of a step-up.
		status, out = finish(map[string]any{"clientId": s.app, "credential": json.RawMessage(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 3), begin(map[string]any{"clientId": s.app}))),
			"mfaSessionId": "no-such-step"})
		expectSignInError(t, status, out, http.StatusBadRequest, "expired_token")
	})
}

// The passkey as the second factor after a password, in the embedded API.
func TestEmbeddedPasskeyStepUp(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := newPasskeyCredential()
		s.register(t, cred)
		s.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": signin.MFARequired, "factors": []any{"passkey"}}
		})
		challenge := oauth2.S256ChallengeFromVerifier(testVerifier)
		password := func() string {
			t.Helper()
			status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
				"codeChallenge": challenge, "codeChallengeMethod": "S256"}, "Origin", testPasskeyOrigin)
			if status != http.StatusOK || out["mfaRequired"] != true || out["code"] != nil || !slices.Contains(toStrings(out["methods"]), "passkey") {
				t.Fatalf("password: %d %v", status, out)
			}
			return out["mfaSessionId"].(string)
		}
		begin := func(handle string) virtualwebauthn.AssertionOptions {
			t.Helper()
			status, _, out := s.embed(t, "/passkey/begin", map[string]any{"clientId": s.app, "mfaSessionId": handle}, "Origin", testPasskeyOrigin)
			if status != http.StatusOK {
				t.Fatalf("passkey/begin: %d %v", status, out)
			}
			opts, _ := virtualwebauthn.ParseAssertionOptions(optionsJSON(t, out))
			if !slices.Equal(opts.AllowCredentials, []string{base64.RawURLEncoding.EncodeToString(cred.ID)}) {
				t.Fatalf("the step-up does not name the person's passkey: %v", out)
			}
			return *opts
		}
		finish := func(handle string, assertion string) (int, map[string]any) {
			t.Helper()
			status, _, out := s.embed(t, "/passkey/finish", map[string]any{"clientId": s.app, "mfaSessionId": handle, "credential": json.RawMessage(assertion)}, "Origin", testPasskeyOrigin)
			return status, out
		}
		handle := password()
		// The step-up's ceremony is not a first factor's, nor the reverse.
		status, _, out := s.embed(t, "/passkey/finish", map[string]any{"clientId": s.app, "codeChallenge": challenge, "codeChallengeMethod": "S256",
			"credential": json.RawMessage(virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 1), begin(handle)))})
		expectSignInError(t, status, out, http.StatusBadRequest, "passkey_failed")
		first, _ := s.beginAssert(t, "")
		status, out = finish(handle, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 2), first))
		expectSignInError(t, status, out, http.StatusBadRequest, "passkey_failed")

		status, out = finish(handle, virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, withCounter(cred, 3), begin(handle)))
		if status != http.StatusOK || out["code"] == nil {
			t.Fatalf("passkey/finish: %d %v", status, out)
		}
		status, tokens := s.embeddedExchange(t, out["code"].(string), testVerifier)
		if status != http.StatusOK {
			t.Fatalf("exchange: %d %v", status, tokens)
		}
		if claims := idClaims(t, tokens); !slices.Equal(amrOf(claims), []string{"pwd", "hwk", "user", "mfa"}) || claims["acr"] != signin.ACRMultiFactor {
			t.Fatalf("claims %v", claims)
		}
		// The step-up is used once.
		status, _, out = s.embed(t, "/passkey/begin", map[string]any{"clientId": s.app, "mfaSessionId": handle}, "Origin", testPasskeyOrigin)
		expectSignInError(t, status, out, http.StatusBadRequest, "expired_token")

		// Another person's passkey does not answer Ada's step-up.
		grace := s.person(t)
		s.setApp(t, func(a *persistence.Application) { a.MFA = persistence.JSONObject{} })
		graceToken := s.tokenFor(t, s.app, s.appSecret, grace.Email)
		s.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": signin.MFARequired, "factors": []any{"passkey"}}
		})
		graceAuth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(grace.ID)})
		graceCred := newPasskeyCredential()
		if status, out := s.finishRegister(t, s.app, graceToken, virtualwebauthn.CreateAttestationResponse(s.rp, graceAuth, graceCred, s.beginRegister(t, s.app, graceToken))); status != http.StatusOK {
			t.Fatalf("grace's passkey: %d %v", status, out)
		}
		handle = password()
		status, out = finish(handle, virtualwebauthn.CreateAssertionResponse(s.rp, graceAuth, withCounter(graceCred, 1), begin(handle)))
		expectSignInError(t, status, out, http.StatusBadRequest, "passkey_failed")
	})
}

// A step-up that did not offer passkey (the person has none: TOTP is
// asked) gives no passkey ceremony.
func TestEmbeddedPasskeyStepUpNotOffered(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		s.enrolTOTP(t, s.user.ID)
		s.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": signin.MFARequired, "factors": []any{"totp", "passkey"}}
		})
		status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
			"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"})
		if status != http.StatusOK || !slices.Equal(toStrings(out["methods"]), []string{"totp", "recovery_code"}) {
			t.Fatalf("password: %d %v", status, out)
		}
		status, _, out = s.embed(t, "/passkey/begin", map[string]any{"clientId": s.app, "mfaSessionId": out["mfaSessionId"]})
		expectSignInError(t, status, out, http.StatusBadRequest, "invalid_request")
	})
}

// A person holds at most 20 passkeys.
func TestPasskeyTooMany(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		for range 20 {
			s.register(t, newPasskeyCredential())
		}
		status, out := s.call(t, http.MethodPost, "/register/begin", s.token, map[string]any{"clientId": s.app})
		mfaRefused(t, "the 21st passkey", status, out, http.StatusConflict, "too_many_passkeys")
	})
}

// Bodies the stores cannot hold or the parser will not take: clear 400s
// (413 for a huge one), never a 5xx, on the API and the embedded routes.
func TestPasskeyBadBodies(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		app := `"clientId":"` + s.app + `"`
		nulChallenge := base64.RawURLEncoding.EncodeToString([]byte(`{"type":"webauthn.get","challenge":"\u0000abc","origin":"` + testPasskeyOrigin + `"}`))
		badUTF8Challenge := base64.RawURLEncoding.EncodeToString([]byte("{\"type\":\"webauthn.get\",\"challenge\":\"\xff\xfe\",\"origin\":\"" + testPasskeyOrigin + "\"}"))
		assertionWith := func(clientData string) string {
			return `{"id":"AAAA","rawId":"AAAA","type":"public-key","response":{"clientDataJSON":"` + clientData +
				`","authenticatorData":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 37)) + `","signature":"AAAA","userHandle":"AAAA"}}`
		}
		for _, tc := range []struct {
			name, body string
			status     int
			code       string
		}{
			{"NUL", `{` + app + `,"email":"a\u0000@example.com"}`, 400, "invalid_request"},
			{"invalid UTF-8", "{" + app + ",\"email\":\"\xff\xfe\"}", 400, "invalid_request"},
			{"huge", `{` + app + `,"credential":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "payload_too_large"},
			{"deep", `{` + app + `,"credential":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, 400, "invalid_json"},
			{"deep in range", `{` + app + `,"credential":` + strings.Repeat(`{"a":`, 5000) + `1` + strings.Repeat("}", 5000) + `}`, 400, "passkey_failed"},
			{"credential a string", `{` + app + `,"credential":"abc"}`, 400, "passkey_failed"},
			{"credential a number", `{` + app + `,"credential":7}`, 400, "passkey_failed"},
			{"credential an array", `{` + app + `,"credential":[]}`, 400, "passkey_failed"},
			{"credential empty", `{` + app + `,"credential":{}}`, 400, "passkey_failed"},
			{"credential null", `{` + app + `,"credential":null}`, 400, "invalid_request"},
			{"credential missing", `{` + app + `}`, 400, "invalid_request"},
			{"wrong types inside", `{` + app + `,"credential":{"id":5,"rawId":[1],"type":true,"response":"x"}}`, 400, "passkey_failed"},
			{"clientId a number", `{"clientId":7,"credential":{}}`, 400, "invalid_request"},
			{"no clientId", `{"credential":{}}`, 400, "invalid_request"},
			{"unknown member", `{` + app + `,"credential":{},"admin":true}`, 400, "invalid_request"},
			{"not JSON", `{` + app, 400, "invalid_json"},
			{"NUL in the challenge", `{` + app + `,"credential":` + assertionWith(nulChallenge) + `}`, 400, "passkey_failed"},
			{"invalid UTF-8 in the challenge", `{` + app + `,"credential":` + assertionWith(badUTF8Challenge) + `}`, 400, "passkey_failed"},
			{"a long challenge", `{` + app + `,"credential":` + assertionWith(base64.RawURLEncoding.EncodeToString([]byte(`{"type":"webauthn.get","challenge":"`+strings.Repeat("A", 100000)+`"}`))) + `}`, 400, "passkey_failed"},
		} {
			for _, path := range []string{"/authenticate/finish", "/register/finish"} {
				status, _, out := s.send(t, http.MethodPost, path, s.token, testPasskeyOrigin, []byte(tc.body))
				if status != tc.status || out["error"] != tc.code {
					t.Errorf("%s %s: %d %v, want %d %s", path, tc.name, status, out, tc.status, tc.code)
				}
				if _, ok := out["details"].(map[string]any); !ok {
					t.Errorf("%s %s: not the envelope: %v", path, tc.name, out)
				}
			}
			// The embedded route: the sign-in shape, invalid_request for a
			// body it cannot use.
			body := tc.body
			if tc.code == "passkey_failed" {
				body = strings.Replace(body, app, app+`,"codeChallenge":"`+oauth2.S256ChallengeFromVerifier(testVerifier)+`","codeChallengeMethod":"S256"`, 1)
			}
			status, _, out := s.embed(t, "/passkey/finish", body, "Origin", testPasskeyOrigin)
			want := tc.code
			if want != "passkey_failed" {
				want = "invalid_request"
			}
			if status != tc.status || out["error"] != want || out["error_description"] == nil {
				t.Errorf("embedded %s: %d %v, want %d %s", tc.name, status, out, tc.status, want)
			}
		}
	})
}
