package handlers

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

var (
	pendingField = regexp.MustCompile(`name="pending" value="([^"]+)"`)
	anyHidden    = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// hiddenFields are all the hidden fields of a page's first form that
// names them (fields reads the flow's two only).
func hiddenFields(p *page) url.Values {
	v := url.Values{}
	for _, m := range anyHidden.FindAllStringSubmatch(p.body, -1) {
		if v.Get(m[1]) == "" {
			v.Set(m[1], html.UnescapeString(m[2]))
		}
	}
	return v
}

// An upstream sign-in whose e-mail is a password account's: the offer, the
// password proof on the hosted page (a wrong one re-rendered), and then
// the upstream identity signs the same person in, directly the next time.
// The offer works once.
func TestUpstreamHostedLink(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		p := newUpstreamPair(t, dbURL)
		upstreamPerson := p.opUser(t, p.rp.user.Email, true)
		b := p.rp.browser(t)
		offer := p.callback(t, b, p.atUpstream(t, b, p.toUpstream(t, b), p.rp.user.Email))
		expectPage(t, offer, http.StatusConflict, "already exists")
		if pendingField.FindStringSubmatch(offer.body) == nil {
			t.Fatalf("no offer: %s", offer.body)
		}
		proof := b.do(http.MethodPost, LinkPagePath, hiddenFields(offer))
		expectPage(t, proof, http.StatusOK, `<label for="password">Password</label>`)
		wrong := hiddenFields(proof)
		wrong.Set("password", "not the password")
		again := b.do(http.MethodPost, linkVerifyPagePath, wrong)
		expectPage(t, again, http.StatusUnauthorized, `aria-invalid="true"`)
		right := hiddenFields(again)
		right.Set("password", testPassword)
		done := b.do(http.MethodPost, linkVerifyPagePath, right)
		if done.status != http.StatusSeeOther || !strings.HasPrefix(done.location, signinResumePath) {
			t.Fatalf("linked: %d %q %s", done.status, done.location, done.body)
		}
		if sub := p.subOf(t, b.do(http.MethodGet, done.location, nil)); sub != p.rp.user.ID {
			t.Fatalf("signed in as %s, the account is %s", sub, p.rp.user.ID)
		}
		ids, err := p.rp.store.UserIdentities(ctx, p.rp.user.ID)
		if err != nil || len(ids) != 2 || ids[1].Provider != "acme-sso" || ids[1].Issuer != p.op.URL || ids[1].Subject != upstreamPerson.ID {
			t.Fatalf("identities %+v %v", ids, err)
		}
		// The next upstream sign-in is the same person, without a link.
		if sub := p.subOf(t, p.hostedSignIn(t, p.rp.user.Email)); sub != p.rp.user.ID {
			t.Fatalf("the next sign-in is %s", sub)
		}
		// The offer was spent with the link.
		expectPage(t, b.do(http.MethodPost, LinkPagePath, hiddenFields(offer)), http.StatusBadRequest, "expired")
	})
}

// The embedded API's 409 carries the pending link; initiate with it and
// verify with the password link the upstream identity; initiate refuses
// an upstream provider without it, or with another account's address.
func TestUpstreamAPILink(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		p := newUpstreamPair(t, dbURL)
		p.opUser(t, p.rp.user.Email, true)
		b := p.rp.browser(t)
		start := p.rp.URL + embeddedPath + "/providers/acme-sso/start?" + url.Values{"clientId": {p.rp.app}, "redirectUri": {testRedirect},
			"codeChallenge": {strings.Repeat("a", 43)}, "codeChallengeMethod": {"S256"}}.Encode()
		pg := b.do(http.MethodGet, start, nil)
		req, _ := http.NewRequest(http.MethodGet, p.atUpstream(t, b, pg.location, p.rp.user.Email), nil)
		req.Header.Set("Accept", "application/json")
		resp, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var conflict map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&conflict)
		resp.Body.Close()
		pending, _ := conflict["pendingLink"].(string)
		if resp.StatusCode != http.StatusConflict || pending == "" {
			t.Fatalf("409: %d %v", resp.StatusCode, conflict)
		}
		initiate := func(body map[string]any) (int, map[string]any) {
			raw, _ := json.Marshal(body)
			req, _ := http.NewRequest(http.MethodPost, p.rp.URL+LinkingPath, strings.NewReader(string(raw)))
			req.Header.Set("Content-Type", "application/json")
			resp, out := getJSON(t, req)
			return resp.StatusCode, out
		}
		for _, body := range []map[string]any{
			{"email": p.rp.user.Email, "newProvider": "acme-sso", "clientId": p.rp.app},
			{"email": p.rp.user.Email, "newProvider": "acme-sso", "clientId": p.rp.app, "pendingLink": "unknown"},
			{"email": p.rp.user.Email, "newProvider": "otp", "clientId": p.rp.app, "pendingLink": pending},
		} {
			if status, out := initiate(body); status != http.StatusBadRequest {
				t.Fatalf("%v: %d %v", body, status, out)
			}
		}
		status, out := initiate(map[string]any{"email": p.rp.user.Email, "newProvider": "acme-sso", "clientId": p.rp.app, "pendingLink": pending})
		if status != http.StatusOK || out["verificationRequired"] != "password" {
			t.Fatalf("initiate: %d %v", status, out)
		}
		raw, _ := json.Marshal(map[string]any{"linkingToken": out["linkingToken"], "verification": map[string]any{"password": testPassword}})
		req, _ = http.NewRequest(http.MethodPost, p.rp.URL+linkVerifyPath, strings.NewReader(string(raw)))
		req.Header.Set("Content-Type", "application/json")
		if resp, out := getJSON(t, req); resp.StatusCode != http.StatusOK || out["linkedProvider"] != "acme-sso" || out["userId"] != p.rp.user.ID {
			t.Fatalf("verify: %d %v", resp.StatusCode, out)
		}
		if sub := p.subOf(t, p.hostedSignIn(t, p.rp.user.Email)); sub != p.rp.user.ID {
			t.Fatalf("after the link, the upstream signs in %s", sub)
		}
	})
}

// An account without a password proves itself on the hosted page with the
// code e-mailed to it: a wrong code is said on the page, the right one
// links and signs the account in.
func TestUpstreamHostedLinkWithCode(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		p := newUpstreamPair(t, dbURL)
		n := extensions.Now()
		kim := &persistence.User{ID: uuid.NewString(), Email: "kim-" + rand8() + "@example.com", Status: directory.StatusActive,
			Metadata: persistence.JSONObject{}, CreatedAt: n, UpdatedAt: n}
		if err := p.rp.store.CreateUser(ctx, kim); err != nil {
			t.Fatal(err)
		}
		p.opUser(t, kim.Email, true)
		b := p.rp.browser(t)
		offer := p.callback(t, b, p.atUpstream(t, b, p.toUpstream(t, b), kim.Email))
		expectPage(t, offer, http.StatusConflict, "a code we e-mail to you")
		proof := b.do(http.MethodPost, LinkPagePath, hiddenFields(offer))
		expectPage(t, proof, http.StatusOK, `<label for="code">Code</label>`)
		m := p.rp.next(t)
		code := regexp.MustCompile(`\b(\d{6})\b`).FindStringSubmatch(m.Text)
		if m.To != kim.Email || code == nil {
			t.Fatalf("the code's message to %s: %q", m.To, m.Text)
		}
		wrong := hiddenFields(proof)
		wrong.Set("code", otherDigits(code[1]))
		again := b.do(http.MethodPost, linkVerifyPagePath, wrong)
		expectPage(t, again, http.StatusBadRequest, `aria-invalid="true"`)
		right := hiddenFields(again)
		right.Set("code", code[1])
		done := b.do(http.MethodPost, linkVerifyPagePath, right)
		if done.status != http.StatusSeeOther || !strings.HasPrefix(done.location, signinResumePath) {
			t.Fatalf("linked: %d %q %s", done.status, done.location, done.body)
		}
		if sub := p.subOf(t, b.do(http.MethodGet, done.location, nil)); sub != kim.ID {
			t.Fatalf("signed in as %s, the account is %s", sub, kim.ID)
		}
	})
}

// otherDigits is a six-digit code other than code.
func otherDigits(code string) string {
	if code == "000000" {
		return "000001"
	}
	return "000000"
}
