package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/descope/virtualwebauthn"
	"golang.org/x/oauth2"
)

// The passkey phases (issue 14): people sign in with a passkey from an
// application's own page, usernameless: begin, the authenticator signs
// (ES256, a software authenticator in loadgen, as a browser's would),
// finish. Begin and finish together are one operation. The first phase
// uses the embedded API, whose finish answers a code (its exchange is the
// embedded phase's); the second the spec's /authenticate routes, whose
// finish answers the application's tokens (a code made and exchanged in
// the server).
//
// Before the phase, not measured: an application offering passkeys on
// localhost, people with a password, each signed in once through the
// embedded API for a token, with which they register one passkey. A person
// is used by one worker at a time (a pool), so that their authenticator's
// signature counter only goes forward.

const (
	passkeyOrigin = "http://localhost:8443" // the application's page: never requested
	passkeyRPID   = "localhost"
	webauthnAPI   = "/api/v1/auth/webauthn"
)

// passkeyPerson is a person's authenticator, holding their one passkey.
// The software authenticator registers it; sign-ins are signed here with
// key, parsed once, and counter: virtualwebauthn parses its stored key
// again for every signature, which cost the load generator a sixth of its
// CPU, taken from the server that shares the machine.
type passkeyPerson struct {
	auth    virtualwebauthn.Authenticator
	cred    virtualwebauthn.Credential
	key     *ecdsa.PrivateKey
	counter uint32
}

// assertion is the PublicKeyCredential a browser answers
// navigator.credentials.get(options) with (WebAuthn Level 3 §6.3.3 and
// §7.2): user present and verified, the counter one more, ES256 over the
// authenticator data and the client data's hash.
func (p *passkeyPerson) assertion(options json.RawMessage) (json.RawMessage, error) {
	var o struct {
		PublicKey struct {
			Challenge string `json:"challenge"`
		} `json:"publicKey"`
	}
	if err := json.Unmarshal(options, &o); err != nil || o.PublicKey.Challenge == "" {
		return nil, fmt.Errorf("begin's options without a challenge: %v", err)
	}
	clientData, _ := json.Marshal(map[string]string{"type": "webauthn.get", "challenge": o.PublicKey.Challenge, "origin": passkeyOrigin})
	p.counter++
	rpIDHash := sha256.Sum256([]byte(passkeyRPID))
	authData := binary.BigEndian.AppendUint32(append(rpIDHash[:], 0x01|0x04), p.counter) // UP, UV
	clientHash := sha256.Sum256(clientData)
	digest := sha256.Sum256(append(slices.Clip(authData), clientHash[:]...))
	sig, err := ecdsa.SignASN1(rand.Reader, p.key, digest[:])
	if err != nil {
		return nil, err
	}
	b64 := base64.RawURLEncoding.EncodeToString
	id := b64(p.cred.ID)
	return json.Marshal(map[string]any{"type": "public-key", "id": id, "rawId": id, "response": map[string]string{
		"authenticatorData": b64(authData), "clientDataJSON": b64(clientData), "signature": b64(sig), "userHandle": b64(p.auth.Options.UserHandle)}})
}

// runPasskeys makes the application and the people, then measures passkey
// sign-ins.
func runPasskeys(ctx context.Context, cfg config, c *client, pid int, admin string) (passkeyResults, error) {
	app, err := c.create(ctx, admin, "/api/v1/applications", map[string]any{
		"name": "bench-passkeys", "redirectUris": []string{benchRedirect}, "idTokenSigningAlg": "ES256",
		"signInMethods": []string{"password", "passkey"}, "rpId": passkeyRPID, "webOrigins": []string{passkeyOrigin},
	})
	if err != nil {
		return passkeyResults{}, fmt.Errorf("register the passkey application: %w", err)
	}
	rp := virtualwebauthn.RelyingParty{ID: passkeyRPID, Name: "bench-passkeys", Origin: passkeyOrigin}
	people := make(chan *passkeyPerson, 2*cfg.concurrency)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	slots := make(chan struct{}, 4) // a password sign-in each: argon2id, bounded
	for i := range cap(people) {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			p, err := c.registerPasskey(ctx, admin, app, rp, i)
			if err != nil {
				once.Do(func() { firstErr = err })
				return
			}
			people <- p
		})
	}
	wg.Wait()
	if firstErr != nil {
		return passkeyResults{}, fmt.Errorf("register passkeys: %w", firstErr)
	}
	var r passkeyResults
	// The application's page, usernameless, answered with a code its
	// backend exchanges (the embedded API, as the OTP phase).
	verifier := oauth2.GenerateVerifier()
	challenge := oauth2.S256ChallengeFromVerifier(verifier)
	if r.embedded, err = runPhase(ctx, "passkey sign-ins, code", cfg, pid, func(ctx context.Context, _ uint64) error {
		p := <-people
		defer func() { people <- p }()
		var begun struct {
			Options json.RawMessage `json:"options"`
		}
		if err := c.postJSON(ctx, embeddedAPI+"/passkey/begin", "", map[string]any{"clientId": app.id}, &begun, "Origin", passkeyOrigin); err != nil {
			return err
		}
		assertion, err := p.assertion(begun.Options)
		if err != nil {
			return err
		}
		var out struct {
			Code string `json:"code"`
		}
		if err := c.postJSON(ctx, embeddedAPI+"/passkey/finish", "", map[string]any{"clientId": app.id, "credential": assertion,
			"codeChallenge": challenge, "codeChallengeMethod": "S256"}, &out, "Origin", passkeyOrigin); err != nil {
			return err
		}
		if out.Code == "" {
			return errors.New("a passkey sign-in without a code")
		}
		return nil
	}); err != nil {
		return r, err
	}
	// The spec's route: answered with the application's tokens.
	r.tokens, err = runPhase(ctx, "passkey sign-ins, tokens", cfg, pid, func(ctx context.Context, _ uint64) error {
		p := <-people
		defer func() { people <- p }()
		var begun struct {
			Options json.RawMessage `json:"options"`
		}
		if err := c.passkeyCall(ctx, "/authenticate/begin", "", map[string]any{"clientId": app.id}, &begun); err != nil {
			return err
		}
		assertion, err := p.assertion(begun.Options)
		if err != nil {
			return err
		}
		var t tokens
		if err := c.passkeyCall(ctx, "/authenticate/finish", "", map[string]any{"clientId": app.id, "credential": assertion}, &t); err != nil {
			return err
		}
		if t.AccessToken == "" || t.RefreshToken == "" || !isES256JWT(t.IDToken) {
			return errors.New("a passkey sign-in without an access token, a refresh token and an ES256 ID token")
		}
		return nil
	})
	return r, err
}

// passkeyResults are the passkey phases: begin and finish answered with a
// code (the embedded API), and with tokens (the spec's route).
type passkeyResults struct{ embedded, tokens phaseResult }

// registerPasskey makes person i: created with a password, signed in once
// through the embedded API, and given a passkey with the token.
func (c *client) registerPasskey(ctx context.Context, admin string, app account, rp virtualwebauthn.RelyingParty, i int) (*passkeyPerson, error) {
	email := fmt.Sprintf("passkey-%d@example.com", i)
	var user struct {
		ID string `json:"id"`
	}
	if err := c.adminJSON(ctx, admin, "/api/v1/m2m/users", map[string]any{"email": email, "name": "Passkey Person", "password": benchPassword}, &user); err != nil {
		return nil, fmt.Errorf("create a person: %w", err)
	}
	verifier := oauth2.GenerateVerifier()
	var signedIn struct {
		Code string `json:"code"`
	}
	if err := c.postJSON(ctx, embeddedAPI+"/password", "", map[string]any{"clientId": app.id, "email": email, "password": benchPassword,
		"codeChallenge": oauth2.S256ChallengeFromVerifier(verifier), "codeChallengeMethod": "S256"}, &signedIn); err != nil {
		return nil, fmt.Errorf("sign in: %w", err)
	}
	var t tokens
	if err := c.postJSON(ctx, embeddedAPI+"/code/exchange", "", map[string]any{"code": signedIn.Code, "client_id": app.id,
		"client_secret": app.secret, "code_verifier": verifier}, &t); err != nil {
		return nil, fmt.Errorf("exchange: %w", err)
	}
	p := &passkeyPerson{
		auth: virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(user.ID)}),
		cred: newES256Credential(),
	}
	var begun struct {
		Options json.RawMessage `json:"options"`
	}
	if err := c.passkeyCall(ctx, "/register/begin", t.AccessToken, map[string]any{"clientId": app.id}, &begun); err != nil {
		return nil, fmt.Errorf("register/begin: %w", err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(begun.Options))
	if err != nil {
		return nil, err
	}
	attestation := virtualwebauthn.CreateAttestationResponse(rp, p.auth, p.cred, *opts)
	if err := c.passkeyCall(ctx, "/register/finish", t.AccessToken, map[string]any{"clientId": app.id, "credential": json.RawMessage(attestation)}, &map[string]any{}); err != nil {
		return nil, fmt.Errorf("register/finish: %w", err)
	}
	key, err := x509.ParsePKCS8PrivateKey(p.cred.Key.Data)
	if err != nil {
		return nil, err
	}
	p.key = key.(*ecdsa.PrivateKey)
	return p, nil
}

// newES256Credential is a P-256 credential whose public key's coordinates
// are 32 bytes long: the software authenticator writes them without their
// leading zero bytes, which the server rightly refuses (one key in 64).
func newES256Credential() virtualwebauthn.Credential {
	for {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		if len(key.X.Bytes()) != 32 || len(key.Y.Bytes()) != 32 {
			continue
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			panic(err)
		}
		return virtualwebauthn.NewCredentialWithImportedKey(virtualwebauthn.KeyTypeEC2, der)
	}
}

// passkeyCall posts body to a passkey route from the application's page.
func (c *client) passkeyCall(ctx context.Context, path, token string, body, out any) error {
	return c.postJSON(ctx, webauthnAPI+path, token, body, out, "Origin", passkeyOrigin)
}

// postJSON posts body as JSON and decodes a 200 answer into out; headers
// are name and value pairs.
func (c *client) postJSON(ctx context.Context, path, token string, body, out any, headers ...string) error {
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return c.do(req, http.StatusOK, out)
}
