package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

const linkAPI = "/api/v1/auth/link"

// Account linking over HTTP and SMTP: an account that signs in with a
// password is told account_exists when it asks for a code, links the code
// with its password, and then the password and the code sign in one
// person (one sub, checked with go-oidc); an account without a password
// links with a code e-mailed to it; the person sees and removes methods
// with their own token, never the last.
func TestLinking(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := startLogged(t, dbURL, box.env()...)
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		app := newHostedApp(t, s, admin, "Acme Link", redirect, map[string]any{"signInMethods": []string{"password", "otp", "magic-link"}})
		const pat, patPassword = "pat@example.com", "a long and private passphrase"
		r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": pat, "name": "Pat", "password": patPassword}, bearer(admin)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		patID := r.JSON(t)["id"].(string)
		link := func(path string, body map[string]any) *response {
			return s.do(http.MethodPost, linkAPI+path, body)
		}
		signInWithPassword := func(t *testing.T) (string, idClaims) {
			t.Helper()
			verifier, challenge := pkce()
			r := s.embed(t, "/password", map[string]any{"clientId": app.id, "email": pat, "password": patPassword, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
			if r.Status != http.StatusOK {
				t.Fatalf("password sign-in: %s", describe(r))
			}
			return codeExchanged(t, s, app.id, exchangeCode(t, s, app.id, app.secret, r.JSON(t)["code"].(string), verifier))
		}

		// A code asked for a password account: 409 account_exists, pointing
		// at initiate (spec rule 4).
		body := expectSignInError(t, s.embed(t, "/otp/send", map[string]any{"clientId": app.id, "email": pat}), http.StatusConflict, "account_exists")
		if body["linkingEndpoint"] != linkAPI+"/initiate" {
			t.Fatalf("account_exists: %v", body)
		}

		// Bad input gets the envelope.
		for _, b := range []map[string]any{{}, {"email": pat, "newProvider": "otp"}, {"email": pat, "newProvider": "otp", "clientId": app.id, "extra": 1}} {
			if r := link("/initiate", b); r.Status != http.StatusBadRequest || r.JSON(t)["error"] == "" {
				t.Fatalf("initiate %v: %s", b, describe(r))
			}
		}
		if r := link("/initiate", map[string]any{"email": "nobody@example.com", "newProvider": "otp", "clientId": app.id}); r.Status != http.StatusNotFound {
			t.Fatalf("an unknown address: %s", describe(r))
		}

		// Link the code with the password.
		r = link("/initiate", map[string]any{"email": pat, "newProvider": "otp", "clientId": app.id})
		if r.Status != http.StatusOK {
			t.Fatalf("initiate: %s", describe(r))
		}
		started := r.JSON(t)
		if started["verificationRequired"] != "password" || !slices.Equal(strs(started["existingIdentities"]), []string{"password"}) || started["message"] == "" {
			t.Fatalf("initiate answer: %v", started)
		}
		token := started["linkingToken"].(string)
		if r := link("/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"password": "not it"}}); r.Status != http.StatusUnauthorized {
			t.Fatalf("a wrong password: %s", describe(r))
		}
		if r := link("/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"password": patPassword, "code": "123456"}}); r.Status != http.StatusBadRequest {
			t.Fatalf("both proofs: %s", describe(r))
		}
		sent := len(box.to(pat))
		r = link("/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"password": patPassword}})
		if r.Status != http.StatusOK {
			t.Fatalf("verify: %s", describe(r))
		}
		if m := r.JSON(t); m["success"] != true || m["userId"] != patID || m["linkedProvider"] != "otp" {
			t.Fatalf("verify answer: %v", m)
		}
		if m := box.after(t, pat, sent); !strings.Contains(m.Text, "otp") {
			t.Fatalf("the notice: %q", m.Text)
		}
		if r := link("/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"password": patPassword}}); r.Status != http.StatusBadRequest {
			t.Fatalf("a token used twice: %s", describe(r))
		}

		// One person, whatever the method (rule 3).
		verifier, challenge := pkce()
		code := embeddedOTP(t, s, box, app.id, app.name, pat)
		_, byCode := codeExchanged(t, s, app.id, exchangeCode(t, s, app.id, app.secret, verifyOTP(t, s, app.id, pat, code, challenge), verifier))
		access, byPassword := signInWithPassword(t)
		if byCode.Sub != patID || byPassword.Sub != patID {
			t.Fatalf("sub %s by code and %s by password, the person is %s", byCode.Sub, byPassword.Sub, patID)
		}

		// The person's methods, with their own token; the admin's is refused.
		r = s.do(http.MethodGet, linkAPI+"/identities", nil, bearer(access)...)
		if r.Status != http.StatusOK {
			t.Fatalf("identities: %s", describe(r))
		}
		ids := strs(r.JSON(t)["identities"])
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"otp", "password"}) || r.JSON(t)["email"] != pat {
			t.Fatalf("identities: %s", r.Body)
		}
		if r := s.do(http.MethodGet, linkAPI+"/identities", nil, bearer(admin)...); r.Status != http.StatusForbidden {
			t.Fatalf("identities with a machine's token: %s", describe(r))
		}

		// Unlink the password; the code stays, and is the last.
		r = s.do(http.MethodDelete, linkAPI+"/password", nil, bearer(access)...)
		if r.Status != http.StatusOK || !slices.Equal(strs(r.JSON(t)["remainingIdentities"]), []string{"otp"}) || r.JSON(t)["unlinkedProvider"] != "password" {
			t.Fatalf("unlink: %s", describe(r))
		}
		expectSignInError(t, s.embed(t, "/password", map[string]any{"clientId": app.id, "email": pat, "password": patPassword, "codeChallenge": challenge, "codeChallengeMethod": "S256"}),
			http.StatusUnauthorized, "invalid_credentials")
		if r := s.do(http.MethodDelete, linkAPI+"/otp", nil, bearer(access)...); r.Status != http.StatusConflict || r.JSON(t)["error"] != "last_method" {
			t.Fatalf("unlink the last: %s", describe(r))
		}
		if r := s.do(http.MethodDelete, linkAPI+"/magic_link", nil, bearer(access)...); r.Status != http.StatusNotFound {
			t.Fatalf("unlink a method not linked: %s", describe(r))
		}

		// Without a password: a code e-mailed to the account proves it.
		const kim = "kim@example.com"
		if r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": kim, "name": "Kim"}, bearer(admin)...); r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		sent = len(box.to(kim))
		r = link("/initiate", map[string]any{"email": kim, "newProvider": "magic_link", "clientId": app.id})
		if r.Status != http.StatusOK || r.JSON(t)["verificationRequired"] != "email_code" {
			t.Fatalf("initiate without a password: %s", describe(r))
		}
		token = r.JSON(t)["linkingToken"].(string)
		mailed := box.after(t, kim, sent)
		code = codeIn(t, mailed)
		if r := link("/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"code": otherCode(code, 0)}}); r.Status != http.StatusBadRequest || r.JSON(t)["error"] != "invalid_code" {
			t.Fatalf("a wrong code: %s", describe(r))
		}
		if r := link("/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"code": code}}); r.Status != http.StatusOK {
			t.Fatalf("verify with the code: %s", describe(r))
		}
	})
}

// codeIn is the six-digit code of a message.
func codeIn(t *testing.T, m sentMail) string {
	t.Helper()
	for _, f := range strings.Fields(m.Text) {
		if len(f) == 6 && strings.Trim(f, "0123456789") == "" {
			return f
		}
	}
	t.Fatalf("no code in %q", m.Text)
	return ""
}

// Linking an upstream provider (a second identityd): on the hosted page,
// proved by the account's password, then the password and the provider
// sign in one sub; the person unlinks the provider (which is then offered
// linking again) and cannot unlink the last method. Through the API, an
// account without a password proves itself with a code e-mailed to it.
func TestLinkingUpstream(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		u := newUpstreamSetup(t, dbURL, box.env()...)
		rp := u.rp
		account := func(t *testing.T, email, password string) string {
			t.Helper()
			body := map[string]any{"email": email, "name": "Pat"}
			if password != "" {
				body["password"] = password
			}
			r := rp.do(http.MethodPost, inviteUsers, body, bearer(u.rpAdmin)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create the account: %s", describe(r))
			}
			return r.JSON(t)["id"].(string)
		}
		upstreamSub := func(t *testing.T, email string) (string, string) {
			t.Helper()
			b, r, a := u.hosted(u.app, email)
			tok, c := b.finish(u.app, a, r)
			return c.Sub, tok.AccessToken
		}

		// Hosted: the offer, the password, signed in as the account.
		const pat = "pat@example.com"
		patID := account(t, pat, "the account's own passphrase")
		u.person(u.up, u.upAdmin, pat, true)
		b, offer, a := u.hosted(u.app, pat)
		expectPage(t, offer, http.StatusConflict, "Link to my account")
		proof := b.submit(offer, "/signin/link", "", nil)
		expectPage(t, proof, http.StatusOK, `<label for="password">Password</label>`, "Acme SSO")
		wrong := b.submit(proof, "/signin/link/verify", "", url.Values{"password": {"not it"}})
		expectPage(t, wrong, http.StatusUnauthorized, "The password is not right", `aria-invalid="true"`)
		_, c := b.finish(u.app, a, b.submit(wrong, "/signin/link/verify", "", url.Values{"password": {"the account's own passphrase"}}))
		if c.Sub != patID {
			t.Fatalf("linked and signed in as %s, the account is %s", c.Sub, patID)
		}
		if sub, _ := upstreamSub(t, pat); sub != patID {
			t.Fatalf("the provider now signs in %s", sub)
		}
		verifier, challenge := pkce()
		r := rp.embed(t, "/password", map[string]any{"clientId": u.app.id, "email": pat, "password": "the account's own passphrase",
			"codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if r.Status != http.StatusOK {
			t.Fatalf("password sign-in: %s", describe(r))
		}
		access, byPassword := codeExchanged(t, rp, u.app.id, exchangeCode(t, rp, u.app.id, u.app.secret, r.JSON(t)["code"].(string), verifier))
		if byPassword.Sub != patID {
			t.Fatalf("the password signs in %s", byPassword.Sub)
		}

		// Unlink the provider: the next sign-in through it is offered
		// linking again; the password, the last method, stays.
		r = rp.do(http.MethodDelete, linkAPI+"/acme-sso", nil, bearer(access)...)
		if r.Status != http.StatusOK || !slices.Equal(strs(r.JSON(t)["remainingIdentities"]), []string{"password"}) {
			t.Fatalf("unlink: %s", describe(r))
		}
		if _, r, _ := u.hosted(u.app, pat); r.Status != http.StatusConflict {
			t.Fatalf("after unlinking, the provider: %s", describe(r))
		}
		if r := rp.do(http.MethodDelete, linkAPI+"/password", nil, bearer(access)...); r.Status != http.StatusConflict || r.JSON(t)["error"] != "last_method" {
			t.Fatalf("unlink the last: %s", describe(r))
		}

		// The API, for an account without a password: the 409's pending
		// link, a code e-mailed to the account, then one sub.
		const kim = "kim@example.com"
		kimID := account(t, kim, "")
		u.person(u.up, u.upAdmin, kim, true)
		_, challenge = pkce()
		eb := newHostedBrowser(t, rp, u.redirect)
		start := rp.URL + "/api/v1/embedded/auth/providers/acme-sso/start?" + url.Values{"clientId": {u.app.id}, "redirectUri": {u.redirect},
			"codeChallenge": {challenge}, "codeChallengeMethod": {"S256"}}.Encode()
		conflict := expectSignInError(t, u.atUpstream(eb, eb.get(start), kim), http.StatusConflict, "account_exists")
		sent := len(box.to(kim))
		r = rp.do(http.MethodPost, linkAPI+"/initiate", map[string]any{"email": kim, "newProvider": "acme-sso", "clientId": u.app.id,
			"pendingLink": conflict["pendingLink"]})
		if r.Status != http.StatusOK || r.JSON(t)["verificationRequired"] != "email_code" {
			t.Fatalf("initiate: %s", describe(r))
		}
		token := r.JSON(t)["linkingToken"]
		code := codeIn(t, box.after(t, kim, sent))
		if r := rp.do(http.MethodPost, linkAPI+"/verify", map[string]any{"linkingToken": token, "verification": map[string]any{"code": code}}); r.Status != http.StatusOK {
			t.Fatalf("verify: %s", describe(r))
		}
		if sub, _ := upstreamSub(t, kim); sub != kimID {
			t.Fatalf("the provider signs in %s, the account is %s", sub, kimID)
		}
	})
}
