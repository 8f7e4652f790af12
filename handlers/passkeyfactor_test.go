package handlers

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// A passkey is offered as the second factor only where its ceremony can
// run: on the embedded API (a web origin on the rpId), not on a hosted
// page whose origin is not on it (here 127.0.0.1, the rpId localhost),
// where the person gets an e-mailed code instead of a step they cannot
// finish.
func TestPasskeyFactorWhereItRuns(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := newPasskeyServer(t, dbURL, nil)
		s.register(t, newPasskeyCredential())
		s.setApp(t, func(a *persistence.Application) {
			a.MFA = persistence.JSONObject{"policy": "required", "factors": []any{"passkey", "otp"}}
		})
		status, _, out := s.embed(t, "/password", map[string]any{"clientId": s.app, "email": s.user.Email, "password": testPassword,
			"codeChallenge": oauth2.S256ChallengeFromVerifier(testVerifier), "codeChallengeMethod": "S256"})
		if status != http.StatusOK || out["mfaRequired"] != true || !slices.Equal(toStrings(out["methods"]), []string{"passkey"}) {
			t.Fatalf("embedded step-up: %d %v", status, out)
		}
		page := s.browser(t).passwordThenMFA()
		if !strings.Contains(page.body, "emailed a 6-digit code") || strings.Contains(page.body, "Use a passkey") {
			t.Fatalf("the hosted step-up offers a passkey it cannot run: %s", page.body)
		}
	})
}
