package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The approval page in Chromium (e2e/node/approval.browser.mjs): the
// approver is e-mailed a link (read from the test's SMTP server), opens it
// signed in through the hosted sign-in, sees the agent, the action, the
// resource, the context (escaped) and the time left, and approves one
// request and denies another with a reason; a browser without a session,
// a person who is not an approver, and a forged form are refused.
func TestHITLApprovalPageBrowser(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("async", 600, true))
		ask := func(resource string) string {
			r := s.do(http.MethodPost, hitlRequests, map[string]any{"action": "delete_user", "resource": resource,
				"context": map[string]any{"why": "<script>alert(1)</script> & <b>cleanup</b>"}}, bearer(e.agTok)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("request: %s", describe(r))
			}
			return r.JSON(t)["requestId"].(string)
		}
		approveID, denyID := ask("users/1"), ask("users/2")
		port := freePort(t)
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", port)
		runBrowserSuite(t, dbURL, "approval.browser.mjs",
			"IDENTITYD_ISSUER="+s.URL, "CHROMIUM="+chromiumPath, "CALLBACK_PORT="+fmt.Sprint(port), "REDIRECT_URI="+redirect,
			"CLIENT_ID="+s.createApp(t, "Acme Console", []string{redirect}, nil), "PASSWORD=a long and private passphrase",
			"EMAIL_APPROVER=pat@example.com", "EMAIL_OTHER=kim@example.com", "AGENT_NAME="+e.ag.Name,
			"APPROVE_ID="+approveID, "DENY_ID="+denyID, "MAILBOX="+startMailbox(t, box, s.URL+"/approvals/"))

		// What the browser did is what the agent sees, decided by Pat.
		if m := e.status(t, approveID); m["status"] != "approved" || m["reason"] != "checked the ticket" {
			t.Fatalf("approved in the browser: %v", m)
		}
		if m := e.status(t, denyID); m["status"] != "denied" || m["reason"] != "not during the freeze" {
			t.Fatalf("denied in the browser: %v", m)
		}
		for _, x := range e.audit(t, "hitl_approved,hitl_denied") {
			if a, _ := x["actor"].(map[string]any); a["sub"] != e.patID || a["sessionId"] == nil {
				t.Fatalf("decision not by Pat's session: %v", x)
			}
		}
		if n := len(box.to("kim@example.com")); n != 0 {
			t.Fatalf("%d messages to Kim, who holds no role", n)
		}
	})
}
