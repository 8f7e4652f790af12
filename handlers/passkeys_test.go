package handlers

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/descope/virtualwebauthn"
	"golang.org/x/oauth2"

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
	token string
	rp    virtualwebauthn.RelyingParty
	auth  virtualwebauthn.Authenticator
}

func newPasskeyServer(t *testing.T, dbURL string, limits *RateLimits) *passkeyServer {
	t.Helper()
	s := &passkeyServer{signinServer: newSigninServer(t, dbURL, limits)}
	s.setApp(t, func(a *persistence.Application) {
		a.RPID, a.WebOrigins = testPasskeyRP, persistence.StringList{testPasskeyOrigin}
		a.SignInMethods = append(a.SignInMethods, "passkey")
	})
	s.rp = virtualwebauthn.RelyingParty{ID: testPasskeyRP, Name: "Acme Notes", Origin: testPasskeyOrigin}
	s.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(s.user.ID)})
	status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
		"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"})
	if status != http.StatusOK {
		t.Fatalf("password sign-in: %d %v", status, out)
	}
	status, tokens := s.embeddedExchange(t, out["code"].(string), testVerifier)
	if status != http.StatusOK {
		t.Fatalf("exchange: %d %v", status, tokens)
	}
	s.token = tokens["access_token"].(string)
	return s
}

// call posts body to a passkey route from the application's origin, with
// the person's token when token is set.
func (s *passkeyServer) call(t *testing.T, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(method, s.URL+webauthnPath+path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", testPasskeyOrigin)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, out := getJSON(t, req)
	return resp.StatusCode, out
}

// optionsJSON is the options member of a begin answer, as JSON.
func optionsJSON(t *testing.T, out map[string]any) string {
	t.Helper()
	raw, err := json.Marshal(out["options"])
	if err != nil || out["options"] == nil {
		t.Fatalf("no options: %v", out)
	}
	return string(raw)
}

// register adds a credential of the software authenticator to the person.
func (s *passkeyServer) register(t *testing.T, cred virtualwebauthn.Credential) map[string]any {
	t.Helper()
	status, out := s.call(t, http.MethodPost, "/register/begin", s.token, map[string]any{"clientId": s.app, "name": "Laptop"})
	if status != http.StatusOK {
		t.Fatalf("register/begin: %d %v", status, out)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(optionsJSON(t, out))
	if err != nil {
		t.Fatal(err)
	}
	attestation := virtualwebauthn.CreateAttestationResponse(s.rp, s.auth, cred, *opts)
	status, out = s.call(t, http.MethodPost, "/register/finish", s.token, map[string]any{"clientId": s.app, "credential": json.RawMessage(attestation)})
	if status != http.StatusOK {
		t.Fatalf("register/finish: %d %v", status, out)
	}
	return out
}

// assert signs in with cred: the options of a begin without e-mail, and
// the finish's answer.
func (s *passkeyServer) assert(t *testing.T, cred virtualwebauthn.Credential) (int, map[string]any) {
	t.Helper()
	status, out := s.call(t, http.MethodPost, "/authenticate/begin", "", map[string]any{"clientId": s.app})
	if status != http.StatusOK {
		t.Fatalf("authenticate/begin: %d %v", status, out)
	}
	opts, err := virtualwebauthn.ParseAssertionOptions(optionsJSON(t, out))
	if err != nil {
		t.Fatal(err)
	}
	assertion := virtualwebauthn.CreateAssertionResponse(s.rp, s.auth, cred, *opts)
	return s.call(t, http.MethodPost, "/authenticate/finish", "", map[string]any{"clientId": s.app, "credential": json.RawMessage(assertion)})
}

func TestPasskeySignIn(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		cred := virtualwebauthn.NewCredential(virtualwebauthn.KeyTypeEC2)
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
	})
}
