package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Per-application access for service accounts (spec: Authentication 3) and
// authentication analytics over events made by real sign-ins (issue 17).

// appEnv is a server with an application, two people who signed in
// through it with their passwords (and one failed attempt), and a service
// account holding users:read, users:admin and analytics:read.
type appEnv struct {
	s           *server
	super       string
	app         hostedApp
	sa          account
	saTok       []string
	patID, kim  string
	signedInAt  time.Time
	passwordErr int
}

const appPassword = "a long and private passphrase"

func newAppEnv(t *testing.T, s *server) *appEnv {
	t.Helper()
	e := &appEnv{s: s, super: s.superToken(), signedInAt: time.Now().UTC()}
	redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
	e.app = newHostedApp(t, s, e.super, "Acme Portal", redirect, map[string]any{"signInMethods": []string{"password"}})
	person := func(email string) string {
		r := s.as(t).do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": email, "password": appPassword}, bearer(e.super)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		return r.JSON(t)["id"].(string)
	}
	e.patID, e.kim = person("pat@example.com"), person("kim@example.com")
	e.signIn(t, "pat@example.com")
	e.signIn(t, "pat@example.com")
	e.signIn(t, "kim@example.com")
	_, challenge := pkce()
	r := s.embed(t, "/password", map[string]any{"clientId": e.app.id, "email": "kim@example.com", "password": "not the passphrase", "codeChallenge": challenge, "codeChallengeMethod": "S256"})
	expectSignInError(t, r, http.StatusUnauthorized, "invalid_credentials")
	e.sa = s.createAccount(e.super, map[string]any{"name": "portal backend", "scopes": []string{"users:read", "users:admin", "analytics:read"}})
	e.saTok = bearer(s.token(e.sa.ClientID, e.sa.ClientSecret, ""))
	return e
}

// signIn signs a person in through the application's embedded password
// sign-in, as its backend would, and exchanges the code.
func (e *appEnv) signIn(t *testing.T, email string) {
	t.Helper()
	verifier, challenge := pkce()
	r := e.s.embed(t, "/password", map[string]any{"clientId": e.app.id, "email": email, "password": appPassword, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
	if r.Status != http.StatusOK {
		t.Fatalf("password sign-in: %s", describe(r))
	}
	codeExchanged(t, e.s, e.app.id, exchangeCode(t, e.s, e.app.id, e.app.secret, r.JSON(t)["code"].(string), verifier))
}

func TestApplicationAccess(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newAppEnv(t, s)
		appID := appRecordID(t, s, e.super, e.app.id)
		users, sessions := "/api/v1/m2m/applications/"+appID+"/users", "/api/v1/m2m/applications/"+appID+"/sessions"
		grant := "/api/v1/applications/" + appID + "/service-accounts/" + e.sa.ID

		// Without the grant: 403 saying the account is not registered.
		for _, path := range []string{users, sessions} {
			d := expectError(t, s.do(http.MethodGet, path, nil, e.saTok...), http.StatusForbidden, "application_not_granted")
			if d["applicationId"] != appID {
				t.Fatalf("details: %v", d)
			}
			if m := s.do(http.MethodGet, path, nil, e.saTok...).JSON(t)["message"].(string); !strings.Contains(m, "not registered to this application") {
				t.Fatalf("message: %q", m)
			}
		}
		// An application that does not exist reads the same to it.
		expectError(t, s.do(http.MethodGet, "/api/v1/m2m/applications/0190d7a2-0000-7000-8000-000000000000/users", nil, e.saTok...), http.StatusForbidden, "application_not_granted")
		expectError(t, s.do(http.MethodGet, "/api/v1/m2m/applications/not-a-uuid/users", nil, e.saTok...), http.StatusNotFound, "not_found")

		// Only an admin grants, and only what exists.
		expectError(t, s.do(http.MethodPut, grant, nil, e.saTok...), http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodPut, "/api/v1/applications/"+appID+"/service-accounts/0190d7a2-0000-7000-8000-000000000000", nil, bearer(e.super)...), http.StatusNotFound, "not_found")
		expectError(t, s.do(http.MethodPut, "/api/v1/applications/0190d7a2-0000-7000-8000-000000000000/service-accounts/"+e.sa.ID, nil, bearer(e.super)...), http.StatusNotFound, "not_found")
		for range 2 { // granting twice is one grant
			if r := s.do(http.MethodPut, grant, nil, bearer(e.super)...); r.Status != http.StatusOK || r.JSON(t)["granted"] != true {
				t.Fatalf("grant: %s", describe(r))
			}
		}
		r := s.do(http.MethodGet, "/api/v1/applications/"+appID+"/service-accounts", nil, bearer(e.super)...)
		if list := r.JSON(t)["serviceAccounts"].([]any); r.Status != http.StatusOK || len(list) != 1 || list[0].(map[string]any)["serviceAccountId"] != e.sa.ID {
			t.Fatalf("grants: %s", describe(r))
		}

		// With the grant: 200, the people who signed in through it and
		// their live sessions.
		r = s.do(http.MethodGet, users, nil, e.saTok...)
		if r.Status != http.StatusOK {
			t.Fatalf("users after the grant: %s", describe(r))
		}
		m := r.JSON(t)
		if m["total"] != 2.0 {
			t.Fatalf("users of the application: %s", r.Body)
		}
		r = s.do(http.MethodGet, sessions, nil, e.saTok...)
		if r.Status != http.StatusOK || r.JSON(t)["total"] != 3.0 {
			t.Fatalf("sessions of the application: %s", describe(r))
		}
		// Another account is still refused; the admin passes without a grant.
		other := s.createAccount(e.super, map[string]any{"name": "other backend", "scopes": []string{"users:read"}})
		expectError(t, s.do(http.MethodGet, users, nil, bearer(s.token(other.ClientID, other.ClientSecret, ""))...), http.StatusForbidden, "application_not_granted")
		if r := s.do(http.MethodGet, users, nil, bearer(e.super)...); r.Status != http.StatusOK {
			t.Fatalf("admin: %s", describe(r))
		}
		// The route's scope comes first.
		expectError(t, s.do(http.MethodGet, sessions, nil, bearer(s.token(e.sa.ClientID, e.sa.ClientSecret, "users:read"))...), http.StatusForbidden, "insufficient_scope")

		// Concurrent grants and withdrawals of one pair are one grant, then none.
		third := s.createAccount(e.super, map[string]any{"name": "third backend", "scopes": []string{"users:read"}})
		race := func(method string, want int) {
			t.Helper()
			var wg sync.WaitGroup
			got := make([]int, 8)
			for i := range got {
				wg.Go(func() {
					if r, err := send(method, s.URL+"/api/v1/applications/"+appID+"/service-accounts/"+third.ID, nil, bearer(e.super)...); err == nil {
						got[i] = r.Status
					}
				})
			}
			wg.Wait()
			for _, st := range got {
				if st != want {
					t.Fatalf("concurrent %s: %v, want all %d", method, got, want)
				}
			}
		}
		race(http.MethodPut, http.StatusOK)
		if r := s.do(http.MethodGet, "/api/v1/applications/"+appID+"/service-accounts", nil, bearer(e.super)...); len(r.JSON(t)["serviceAccounts"].([]any)) != 2 {
			t.Fatalf("grants after concurrent grants: %s", r.Body)
		}
		race(http.MethodDelete, http.StatusNoContent)
		if r := s.do(http.MethodGet, "/api/v1/applications/"+appID+"/service-accounts", nil, bearer(e.super)...); len(r.JSON(t)["serviceAccounts"].([]any)) != 1 {
			t.Fatalf("grants after concurrent withdrawals: %s", r.Body)
		}

		// Withdrawn: refused at the next call; withdrawing again is fine.
		for range 2 {
			if r := s.do(http.MethodDelete, grant, nil, bearer(e.super)...); r.Status != http.StatusNoContent {
				t.Fatalf("withdraw: %s", describe(r))
			}
		}
		expectError(t, s.do(http.MethodGet, users, nil, e.saTok...), http.StatusForbidden, "application_not_granted")
	})
}

func TestAnalytics(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newAppEnv(t, s)
		appID := appRecordID(t, s, e.super, e.app.id)
		today := time.Now().UTC().Format("2006-01-02")

		r := s.do(http.MethodGet, "/api/v1/m2m/analytics/overview", nil, e.saTok...)
		if r.Status != http.StatusOK {
			t.Fatalf("overview: %s", describe(r))
		}
		o := r.JSON(t)
		exactKeys(t, o, "from", "to", "signIns", "failures", "newUsers", "activeUsers", "mfa", "byMethod", "byApplication")
		if o["to"] != today || o["signIns"] != 3.0 || o["failures"] != 1.0 || o["newUsers"] != 2.0 || o["activeUsers"] != 2.0 {
			t.Fatalf("overview: %s", r.Body)
		}
		if mfa := o["mfa"].(map[string]any); mfa["signIns"] != 0.0 || mfa["share"] != 0.0 {
			t.Fatalf("mfa: %v", mfa)
		}
		methods := o["byMethod"].([]any)
		if len(methods) != 1 || methods[0].(map[string]any)["method"] != "password" || methods[0].(map[string]any)["signIns"] != 3.0 || methods[0].(map[string]any)["failures"] != 1.0 {
			t.Fatalf("by method: %v", methods)
		}
		apps := o["byApplication"].([]any)
		if len(apps) != 1 || apps[0].(map[string]any)["applicationId"] != appID || apps[0].(map[string]any)["signIns"] != 3.0 {
			t.Fatalf("by application: %v", apps)
		}
		// A window that ended before today saw nothing.
		r = s.do(http.MethodGet, "/api/v1/m2m/analytics/overview?from=2020-01-01&to=2020-01-31", nil, e.saTok...)
		if o := r.JSON(t); r.Status != http.StatusOK || o["signIns"] != 0.0 || o["activeUsers"] != 0.0 {
			t.Fatalf("an old window: %s", describe(r))
		}

		// The event log: failures only, one person's, one application's,
		// paged by the cursor, newest first.
		events := func(q string) []map[string]any {
			t.Helper()
			var out []map[string]any
			cursor := ""
			for range 100 {
				path := "/api/v1/m2m/analytics/events?limit=2&" + q
				if cursor != "" {
					path += "&cursor=" + url.QueryEscape(cursor)
				}
				r := s.do(http.MethodGet, path, nil, e.saTok...)
				if r.Status != http.StatusOK {
					t.Fatalf("events %s: %s", q, describe(r))
				}
				m := r.JSON(t)
				for _, ev := range m["events"].([]any) {
					out = append(out, ev.(map[string]any))
				}
				next, _ := m["nextCursor"].(string)
				if next == "" {
					return out
				}
				cursor = next
			}
			t.Fatal("the cursor never ends")
			return nil
		}
		failures := events("outcome=failure")
		if len(failures) != 1 || failures[0]["type"] != "sign_in_failed" || failures[0]["outcome"] != "failure" || failures[0]["userId"] != e.kim {
			t.Fatalf("failures: %v", failures)
		}
		pats := events("type=sign_in&userId=" + e.patID)
		if len(pats) != 2 || pats[0]["applicationId"] != appID {
			t.Fatalf("pat's sign-ins: %v", pats)
		}
		all := events("applicationId=" + appID)
		if len(all) < 4 { // 3 sign-ins, a failure
			t.Fatalf("the application's events: %d", len(all))
		}
		for i := 1; i < len(all); i++ {
			if isoZ(t, all[i-1]["createdAt"]).Before(isoZ(t, all[i]["createdAt"])) { // as times: RFC 3339 text drops trailing zeros
				t.Fatalf("not newest first at %d: %v, %v", i, all[i-1]["createdAt"], all[i]["createdAt"])
			}
		}
		if got := events("type=sign_in,sign_in_failed&from=" + url.QueryEscape(e.signedInAt.Add(-time.Minute).Format(time.RFC3339)) + "&to=" + url.QueryEscape(time.Now().Add(time.Minute).UTC().Format(time.RFC3339))); len(got) != 4 {
			t.Fatalf("typed window: %d events", len(got))
		}
		if got := events("outcome=success&type=sign_in_failed"); len(got) != 0 {
			t.Fatalf("contradicting filters: %v", got)
		}

		// The active-users series ends today with the two people.
		r = s.do(http.MethodGet, "/api/v1/m2m/analytics/users/active?from="+time.Now().UTC().AddDate(0, 0, -6).Format("2006-01-02"), nil, e.saTok...)
		if r.Status != http.StatusOK {
			t.Fatalf("active users: %s", describe(r))
		}
		series := r.JSON(t)["series"].([]any)
		last := series[len(series)-1].(map[string]any)
		if len(series) != 7 || last["date"] != today || last["dau"] != 2.0 || last["wau"] != 2.0 || last["mau"] != 2.0 || series[0].(map[string]any)["dau"] != 0.0 {
			t.Fatalf("series: %s", r.Body)
		}

		// Least privilege and bad input.
		noAnalytics := s.createAccount(e.super, map[string]any{"name": "no analytics", "scopes": []string{"users:read"}})
		expectError(t, s.do(http.MethodGet, "/api/v1/m2m/analytics/overview", nil, bearer(s.token(noAnalytics.ClientID, noAnalytics.ClientSecret, ""))...), http.StatusForbidden, "insufficient_scope")
		for _, q := range []string{
			"/overview?from=2026-13-01", "/overview?from=2026-02-01&to=2026-01-01", "/overview?from=2000-01-01&to=2026-01-01", "/overview?to=2999-01-01",
			"/users/active?from=2000-01-01", "/events?cursor=bm90IGEgY3Vyc29y", "/events?cursor=%FF", "/events?cursor=!!", "/events?limit=0", "/events?limit=x",
			"/events?outcome=maybe", "/events?type=nope", "/events?userId=x", "/events?from=yesterday", "/events?type=%00",
		} {
			r := s.do(http.MethodGet, "/api/v1/m2m/analytics"+q, nil, e.saTok...)
			if r.Status != http.StatusBadRequest {
				t.Errorf("%s: %s, want 400", q, describe(r))
				continue
			}
			expectError(t, r, http.StatusBadRequest, r.JSON(t)["error"].(string))
		}
	})
}
