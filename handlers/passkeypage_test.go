package handlers

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/descope/virtualwebauthn"
	"golang.org/x/oauth2"

	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// hostedPasskeys is a sign-in server named http://localhost:PORT (its
// hosted page may run ceremonies under the rpId localhost) whose
// application offers passkeys, with the person's passkey registered from
// the application's own page.
type hostedPasskeys struct {
	*signinServer
	issuer string                       // http://localhost:PORT
	page   virtualwebauthn.RelyingParty // the hosted page, as the authenticator sees it
	auth   virtualwebauthn.Authenticator
	cred   virtualwebauthn.Credential
}

func newHostedPasskeys(t *testing.T, dbURL string, limits *RateLimits) *hostedPasskeys {
	t.Helper()
	s := newSigninServer(t, dbURL, limits, func(c *signin.Config, _ *persistence.Store) {
		c.Issuer = strings.Replace(c.Issuer, "127.0.0.1", "localhost", 1)
	})
	s.setApp(t, func(a *persistence.Application) {
		a.RPID, a.WebOrigins = testPasskeyRP, persistence.StringList{testPasskeyOrigin}
		a.SignInMethods = append(a.SignInMethods, "passkey")
	})
	h := &hostedPasskeys{signinServer: s, issuer: strings.Replace(s.URL, "127.0.0.1", "localhost", 1)}
	h.page = virtualwebauthn.RelyingParty{ID: testPasskeyRP, Name: "Acme Notes", Origin: h.issuer}
	h.auth = virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(s.user.ID)})
	h.cred = newPasskeyCredential()
	h.register(t)
	return h
}

// register adds h.cred to the person from the application's own page
// (the API, with a token of a password sign-in).
func (h *hostedPasskeys) register(t *testing.T) {
	t.Helper()
	status, _, out := h.embed(t, "/password", map[string]any{"clientId": h.app, "email": h.user.Email, "password": testPassword,
		"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"})
	if status != http.StatusOK {
		t.Fatalf("password sign-in: %d %v", status, out)
	}
	status, tokens := h.embeddedExchange(t, out["code"].(string), testVerifier)
	if status != http.StatusOK {
		t.Fatalf("exchange: %d %v", status, tokens)
	}
	api := &passkeyServer{signinServer: h.signinServer, token: tokens["access_token"].(string), auth: h.auth,
		rp: virtualwebauthn.RelyingParty{ID: testPasskeyRP, Name: "Acme Notes", Origin: testPasskeyOrigin}}
	api.register(t, h.cred)
	h.auth.AddCredential(h.cred)
}

var passkeyScript = regexp.MustCompile(`<script[^>]*>`)

// expectPasskeyPage checks a step that offers a passkey: the button (hidden
// until the script shows it), the script as a file of this server and no
// other, and a Content-Security-Policy that admits only that script and
// its calls to this server.
func expectPasskeyPage(t *testing.T, p *page, status int, label string) {
	t.Helper()
	if p.status != status || !strings.Contains(p.body, `id="passkey-button" class="outline" hidden`) && !strings.Contains(p.body, `id="passkey-button" hidden`) ||
		!strings.Contains(p.body, ">"+label+"</button>") {
		t.Fatalf("want a %d page with the passkey button %q, got %d %s", status, label, p.status, p.body)
	}
	if scripts := passkeyScript.FindAllString(p.body, -1); !slices.Equal(scripts, []string{`<script src="/signin/assets/passkey.js" defer>`}) {
		t.Fatalf("scripts %v", scripts)
	}
	csp := p.header.Get("Content-Security-Policy")
	if !strings.HasPrefix(csp, "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self';") || strings.Contains(csp, "unsafe") ||
		!strings.Contains(csp, "frame-ancestors 'none'") || p.header.Get("X-Frame-Options") != "DENY" || strings.Contains(p.body, "style=") {
		t.Fatalf("page CSP %q", csp)
	}
}

// emailStep starts a sign-in and answers the e-mail step.
func (b *browser) emailStep() *page {
	b.t.Helper()
	p := b.do(http.MethodGet, b.s.authorizeURL(), nil)
	return b.do(http.MethodGet, p.location, nil)
}

// passwordToMFA signs email in with the password and answers the
// second-factor step it leads to.
func (b *browser) passwordToMFA(email string) *page {
	b.t.Helper()
	f := b.toPasswordStep(email).fields()
	f.Set("password", testPassword)
	p := b.do(http.MethodPost, signinPasswordPath, f)
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinPath+"?flow=") {
		b.t.Fatalf("password: %d %q %s", p.status, p.location, p.body)
	}
	return b.do(http.MethodGet, p.location, nil)
}

// passkeyOptions asks for the ceremony of the step on p, as its script
// does.
func (b *browser) passkeyOptions(p *page) (int, virtualwebauthn.AssertionOptions, map[string]any) {
	b.t.Helper()
	answer := b.do(http.MethodPost, signinPasskeyOptionsPath, p.fields())
	var out map[string]any
	if answer.status != http.StatusOK {
		b.t.Logf("options: %d %s", answer.status, answer.body)
		return answer.status, virtualwebauthn.AssertionOptions{}, nil
	}
	if err := json.Unmarshal([]byte(answer.body), &out); err != nil || answer.header.Get("Cache-Control") != "no-store" {
		b.t.Fatalf("options: %v %s %v", err, answer.body, answer.header)
	}
	raw, _ := json.Marshal(out["options"])
	opts, err := virtualwebauthn.ParseAssertionOptions(string(raw))
	if err != nil {
		b.t.Fatalf("options %s: %v", raw, err)
	}
	return answer.status, *opts, out["options"].(map[string]any)["publicKey"].(map[string]any)
}

// assertion is the authenticator's answer to opts for rp, its counter
// advanced.
func (h *hostedPasskeys) assertion(rp virtualwebauthn.RelyingParty, auth virtualwebauthn.Authenticator, opts virtualwebauthn.AssertionOptions) string {
	h.cred.Counter++
	return virtualwebauthn.CreateAssertionResponse(rp, auth, h.cred, opts)
}

// postPasskey posts a credential with p's form, as the script does.
func (b *browser) postPasskey(p *page, credential string) *page {
	b.t.Helper()
	f := p.fields()
	f.Set("credential", credential)
	return b.do(http.MethodPost, signinPasskeyPath, f)
}

// expectSignedIn follows a step's answer back to the application and
// answers the ID token's claims.
func (h *hostedPasskeys) expectSignedIn(t *testing.T, b *browser, p *page) map[string]any {
	t.Helper()
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.location, signinResumePath+"?flow=") {
		t.Fatalf("not signed in: %d %q %s", p.status, p.location, p.body)
	}
	q := expectRedirectBack(t, b.do(http.MethodGet, p.location, nil))
	return idClaims(t, h.exchange(t, q.Get("code")))
}

// expectRefused checks the step's page again, with the one refusal a
// passkey gets beside its button.
func expectRefused(t *testing.T, p *page, label string) {
	t.Helper()
	expectPasskeyPage(t, p, http.StatusBadRequest, label)
	if !strings.Contains(p.body, `<p id="passkey-error" class="error" role="alert">The passkey could not be verified.</p>`) ||
		!strings.Contains(p.body, `aria-describedby="passkey-error"`) || strings.Contains(p.body, `aria-invalid`) {
		t.Fatalf("refusal not said beside the button: %s", p.body)
	}
}

// The e-mail step offers the passkey (button and autofill); the
// discoverable ceremony signs the person in, multi-factor, and a replay
// of the same assertion, the ceremony used, is refused with nothing but
// "The passkey could not be verified.". Forms without the flow's CSRF
// token get no ceremony.
func TestHostedPasskeySignIn(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		h := newHostedPasskeys(t, dbURL, nil)
		b := h.browser(t)
		step := b.emailStep()
		expectPasskeyPage(t, step, http.StatusOK, "Sign in with a passkey")
		if !strings.Contains(step.body, `autocomplete="username webauthn"`) || !strings.Contains(step.body, `data-conditional="true"`) {
			t.Fatalf("no passkey autofill on the e-mail field: %s", step.body)
		}
		js := b.do(http.MethodGet, "/signin/assets/passkey.js", nil)
		if js.status != http.StatusOK || !strings.HasPrefix(js.header.Get("Content-Type"), "text/javascript") || !strings.Contains(js.body, "navigator.credentials.get") {
			t.Fatalf("the script: %d %v", js.status, js.header)
		}

		forged := step.fields()
		forged.Set("csrf_token", "forged")
		if p := b.do(http.MethodPost, signinPasskeyOptionsPath, forged); p.status != http.StatusForbidden {
			t.Fatalf("options without the CSRF token: %d", p.status)
		}
		status, opts, publicKey := b.passkeyOptions(step)
		if status != http.StatusOK || publicKey["rpId"] != testPasskeyRP || publicKey["userVerification"] != "required" ||
			publicKey["allowCredentials"] != nil || len(opts.Challenge) != 32 {
			t.Fatalf("options %d %v", status, publicKey)
		}
		assertion := h.assertion(h.page, h.auth, opts)
		claims := h.expectSignedIn(t, b, b.postPasskey(step, assertion))
		if claims["sub"] != h.user.ID || !slices.Equal(amrOf(claims), []string{"hwk", "user", "mfa"}) || claims["acr"] != signin.ACRMultiFactor {
			t.Fatalf("claims %v", claims)
		}

		// The same assertion again, on a new sign-in: its ceremony is used.
		again := h.browser(t)
		step = again.emailStep()
		expectRefused(t, again.postPasskey(step, assertion), "Sign in with a passkey")
		// Nothing at all, or not JSON.
		expectRefused(t, again.postPasskey(step, ""), "Sign in with a passkey")
		expectRefused(t, again.postPasskey(step, "{not json"), "Sign in with a passkey")
		// The page's flow still signs in with a good one.
		_, opts, _ = again.passkeyOptions(step)
		h.expectSignedIn(t, again, again.postPasskey(step, h.assertion(h.page, h.auth, opts)))
	})
}

// What the hosted page refuses, each with the same words: an assertion
// made on another origin (the application's own page), one without user
// verification, one begun on the application's page (the API's), and a
// counter that went backwards (which also revokes
// the passkey).
func TestHostedPasskeyRefusals(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		h := newHostedPasskeys(t, dbURL, nil)
		b := h.browser(t)
		step := b.emailStep()
		const label = "Sign in with a passkey"

		_, opts, _ := b.passkeyOptions(step)
		appPage := virtualwebauthn.RelyingParty{ID: testPasskeyRP, Name: "Acme Notes", Origin: testPasskeyOrigin}
		expectRefused(t, b.postPasskey(step, h.assertion(appPage, h.auth, opts)), label)

		_, opts, _ = b.passkeyOptions(step)
		unverified := h.auth
		unverified.Options.UserNotVerified = true
		expectRefused(t, b.postPasskey(step, h.assertion(h.page, unverified, opts)), label)

		status, out := (&passkeyServer{signinServer: h.signinServer}).call(t, http.MethodPost, "/authenticate/begin", "", map[string]any{"clientId": h.app})
		if status != http.StatusOK {
			t.Fatalf("authenticate/begin: %d %v", status, out)
		}
		apiOpts, err := virtualwebauthn.ParseAssertionOptions(optionsJSON(t, out))
		if err != nil {
			t.Fatal(err)
		}
		expectRefused(t, b.postPasskey(step, h.assertion(h.page, h.auth, *apiOpts)), label)

		// Signed in with the counter at 10; then an assertion at 4.
		h.cred.Counter = 9
		other := h.browser(t)
		otherStep := other.emailStep()
		_, opts, _ = other.passkeyOptions(otherStep)
		h.expectSignedIn(t, other, other.postPasskey(otherStep, h.assertion(h.page, h.auth, opts)))
		h.cred.Counter = 3
		_, opts, _ = b.passkeyOptions(step)
		expectRefused(t, b.postPasskey(step, h.assertion(h.page, h.auth, opts)), label)
		list, err := h.store.UserPasskeys(t.Context(), h.user.ID)
		if err != nil || len(list) != 1 || list[0].Status != persistence.PasskeyRevoked {
			t.Fatalf("the cloned passkey: %+v %v", list, err)
		}
		// Revoked: a good counter is refused too.
		h.cred.Counter += 100
		_, opts, _ = b.passkeyOptions(step)
		expectRefused(t, b.postPasskey(step, h.assertion(h.page, h.auth, opts)), label)
	})
}

// An application whose MFA policy requires a passkey: the password leads
// to the second-factor step, which asks for the person's passkey only
// (no code field); the passkey ends it, with amr of both factors. A
// passkey as the first factor needs no second: it is two already.
func TestHostedPasskeySecondFactor(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		h := newHostedPasskeys(t, dbURL, nil)
		h.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": signin.MFARequired, "factors": []any{signin.FactorPasskey}}
		})
		b := h.browser(t)
		mfa := b.passwordToMFA(h.user.Email)
		expectPasskeyPage(t, mfa, http.StatusOK, "Use a passkey")
		if strings.Contains(mfa.body, `name="code"`) || !strings.Contains(mfa.body, "Confirm it is you with one of your passkeys.") ||
			!strings.Contains(mfa.body, "<noscript>") || strings.Contains(mfa.body, "webauthn") {
			t.Fatalf("the passkey step: %s", mfa.body)
		}
		_, opts, publicKey := b.passkeyOptions(mfa)
		if allowed, _ := publicKey["allowCredentials"].([]any); len(allowed) != 1 {
			t.Fatalf("the step-up's options allow %v, want the person's passkey: %v", publicKey["allowCredentials"], publicKey)
		}
		// Refused once (wrong origin), said beside the button; then signed in.
		appPage := virtualwebauthn.RelyingParty{ID: testPasskeyRP, Name: "Acme Notes", Origin: testPasskeyOrigin}
		expectRefused(t, b.postPasskey(mfa, h.assertion(appPage, h.auth, opts)), "Use a passkey")
		_, opts, _ = b.passkeyOptions(mfa)
		claims := h.expectSignedIn(t, b, b.postPasskey(mfa, h.assertion(h.page, h.auth, opts)))
		if amr := amrOf(claims); claims["sub"] != h.user.ID || !slices.Equal(amr, []string{"pwd", "hwk", "user", "mfa"}) || claims["acr"] != signin.ACRMultiFactor {
			t.Fatalf("claims %v", claims)
		}

		// The passkey alone, on the same application: no second factor.
		b = h.browser(t)
		step := b.emailStep()
		_, opts, _ = b.passkeyOptions(step)
		claims = h.expectSignedIn(t, b, b.postPasskey(step, h.assertion(h.page, h.auth, opts)))
		if !slices.Equal(amrOf(claims), []string{"hwk", "user", "mfa"}) {
			t.Fatalf("claims %v", claims)
		}
		// The e-mail step's ceremony is not the second factor's.
		b = h.browser(t)
		step = b.emailStep()
		_, opts, _ = b.passkeyOptions(step)
		mfa = b.passwordToMFA(h.user.Email)
		expectRefused(t, b.postPasskey(mfa, h.assertion(h.page, h.auth, opts)), "Use a passkey")
	})
}

// Where the hosted page cannot run a ceremony (the issuer is not on the
// application's rpId), or the application does not offer passkeys, the
// page shows no button and no script, and the routes refuse.
func TestHostedPasskeyNotOffered(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		h := newHostedPasskeys(t, dbURL, nil)
		for _, change := range []func(a *persistence.Application){
			func(a *persistence.Application) {
				a.RPID, a.WebOrigins = "example.com", persistence.StringList{"https://example.com"}
			},
			func(a *persistence.Application) {
				a.RPID, a.WebOrigins = testPasskeyRP, persistence.StringList{testPasskeyOrigin}
				a.SignInMethods = slices.DeleteFunc(a.SignInMethods, func(m string) bool { return m == "passkey" })
			},
		} {
			h.setApp(t, change)
			b := h.browser(t)
			step := b.emailStep()
			expectPage(t, step, http.StatusOK, `autocomplete="username"`)
			if strings.Contains(step.body, "passkey") {
				t.Fatalf("a passkey on a page that cannot run one: %s", step.body)
			}
			if p := b.do(http.MethodPost, signinPasskeyOptionsPath, step.fields()); p.status != http.StatusBadRequest {
				t.Fatalf("options: %d %s", p.status, p.body)
			}
			f := step.fields()
			f.Set("credential", "{}")
			if p := b.do(http.MethodPost, signinPasskeyPath, f); p.status != http.StatusBadRequest || strings.Contains(p.body, "could not be verified") {
				t.Fatalf("finish: %d %s", p.status, p.body)
			}
		}
	})
}

// Refused passkeys count as wrong passwords: against the person the
// credential belongs to (5 per 15 minutes), refusing the address that
// failed, with the sign-in's 429 page.
func TestHostedPasskeyLimits(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		limits := DefaultRateLimits()
		h := newHostedPasskeys(t, dbURL, &limits)
		b := h.browser(t)
		step := b.emailStep()
		unverified := h.auth
		unverified.Options.UserNotVerified = true
		for i := range 6 {
			_, opts, _ := b.passkeyOptions(step)
			p := b.postPasskey(step, h.assertion(h.page, unverified, opts))
			if i < 5 {
				expectRefused(t, p, "Sign in with a passkey")
				continue
			}
			if p.status != http.StatusTooManyRequests || p.header.Get("Retry-After") == "" || !strings.Contains(p.body, "Too many sign-in attempts") {
				t.Fatalf("attempt %d: %d %s", i+1, p.status, p.body)
			}
		}
	})
}

// A person with TOTP and a passkey, on an application that requires a
// second factor of any kind: the step takes the code or the passkey; a
// refused passkey is said beside its button, not at the code field, and
// the code still works.
func TestHostedPasskeyOrCode(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		h := newHostedPasskeys(t, dbURL, nil)
		h.requireMFA(t, signin.MFARequired)
		secret, _ := h.enrolTOTP(t, h.user.ID)
		b := h.browser(t)
		mfa := b.passwordToMFA(h.user.Email)
		expectPasskeyPage(t, mfa, http.StatusOK, "Use a passkey")
		if !strings.Contains(mfa.body, `name="code"`) || !strings.Contains(mfa.body, "Use one of your passkeys, or enter the 6-digit code") ||
			!strings.Contains(mfa.body, `id="passkey-button" class="outline" hidden`) {
			t.Fatalf("the step: %s", mfa.body)
		}
		_, opts, _ := b.passkeyOptions(mfa)
		unverified := h.auth
		unverified.Options.UserNotVerified = true
		expectRefused(t, b.postPasskey(mfa, h.assertion(h.page, unverified, opts)), "Use a passkey")
		f := mfa.fields()
		f.Set("code", nextStepCode(t, secret))
		p := b.do(http.MethodPost, signinMFAPath, f)
		if amr := amrOf(h.expectSignedIn(t, b, p)); !slices.Equal(amr, []string{"pwd", "otp", "mfa"}) {
			t.Fatalf("amr %v", amr)
		}
	})
}
