package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence/dbtest"
)

// An honest retry of a refresh is never punished (issue 39): within the
// reuse grace window (IDENTITYD_REFRESH_REUSE_GRACE, 10 s by default) a
// refresh token presented again, concurrently, after a lost answer, or
// after a kill -9 of the server between the committed refresh and its
// retry, gets tokens, and every access token answered before stays
// active. Driven by x/oauth2, as a client would.
func TestRefreshRetries(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := startLogged(t, dbURL, "IDENTITYD_RISK_DISABLED=all")
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read users:admin")
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
		app := newHostedApp(t, s, admin, "Acme Notes", redirect, map[string]any{"signInMethods": []string{"password"}})
		app.conf.Scopes = append(app.conf.Scopes, "offline_access")
		const email = "katherine@example.com"
		s.createPerson(t, admin, email, resetPassword, "")
		tok, _ := passwordSignIn(t, s, app, redirect, email, resetPassword)
		refresh := func(rt string) (*oauth2.Token, error) {
			return app.conf.TokenSource(ctx, &oauth2.Token{RefreshToken: rt}).Token()
		}
		var answered []string // every access token answered
		allActive := func(when string) {
			t.Helper()
			for i, at := range answered {
				if m := s.introspect(t, at, app.id, app.secret); m["active"] != true {
					t.Fatalf("%s: access token %d of %d answered before is inactive: %v", when, i, len(answered), m)
				}
			}
		}

		// Ten concurrent refreshes with one token: all answered.
		const racers = 10
		type result struct {
			tok *oauth2.Token
			err error
		}
		results := make(chan result, racers)
		for range racers {
			go func() {
				tok, err := refresh(tok.RefreshToken)
				results <- result{tok, err}
			}()
		}
		var latest *oauth2.Token
		for range racers {
			r := <-results
			if r.err != nil {
				t.Errorf("a concurrent refresh: %v", r.err)
				continue
			}
			answered = append(answered, r.tok.AccessToken)
			latest = r.tok
		}
		if t.Failed() {
			t.FailNow()
		}
		allActive("after concurrent refreshes")

		// An answer lost: the client retries with the same token.
		lost, err := refresh(latest.RefreshToken)
		if err != nil {
			t.Fatal(err)
		}
		answered = append(answered, lost.AccessToken)
		retried, err := refresh(latest.RefreshToken)
		if err != nil {
			t.Fatalf("the retry of a refresh whose answer was lost: %v", err)
		}
		answered = append(answered, retried.AccessToken)
		allActive("after a retry")

		// The server dies (kill -9) right after a committed refresh; the
		// client retries once it is back, on the same database.
		lost, err = refresh(retried.RefreshToken)
		if err != nil {
			t.Fatal(err)
		}
		answered = append(answered, lost.AccessToken)
		if err := s.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-s.exited
		s.waitErr = nil // killed on purpose
		s.launch()
		retried, err = refresh(retried.RefreshToken)
		if err != nil {
			t.Fatalf("the retry after a crash: %v", err)
		}
		answered = append(answered, retried.AccessToken)
		allActive("after the crash and the retry")
		if _, err := refresh(retried.RefreshToken); err != nil {
			t.Fatalf("the family lives on: %v", err)
		}

		// After the window (1 s here), counted from the first use, reuse
		// is reuse: the family is revoked (RFC 9700 §4.14.2).
		s = startLogged(t, dbURL, "IDENTITYD_RISK_DISABLED=all", "IDENTITYD_REFRESH_REUSE_GRACE=1s")
		admin = s.token(s.AdminID, s.AdminSecret, "admin users:write users:read users:admin")
		app = newHostedApp(t, s, admin, "Acme Notes", redirect, map[string]any{"signInMethods": []string{"password"}})
		app.conf.Scopes = append(app.conf.Scopes, "offline_access")
		s.createPerson(t, admin, email, resetPassword, "")
		tok, _ = passwordSignIn(t, s, app, redirect, email, resetPassword)
		next, err := refresh(tok.RefreshToken)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := refresh(tok.RefreshToken); err != nil {
			t.Fatalf("within the window: %v", err)
		}
		time.Sleep(1100 * time.Millisecond)
		if _, err := refresh(tok.RefreshToken); oauthError(err) != "invalid_grant" {
			t.Fatalf("reuse after the window: %v", err)
		}
		if _, err := refresh(next.RefreshToken); oauthError(err) != "invalid_grant" {
			t.Fatalf("the family after reuse: %v", err)
		}
		for _, at := range []string{tok.AccessToken, next.AccessToken} {
			expectInactive(t, s.introspect(t, at, app.id, app.secret))
		}
	})
}

// oauthError is the error code of a failed x/oauth2 token request.
func oauthError(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		return re.ErrorCode
	}
	return ""
}
