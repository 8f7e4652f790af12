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
// resource, the call (method, path, body pretty-printed), the context
// (escaped, its format characters shown) and the time left, and approves
// one request and denies another with a reason; a browser without a
// session, a person who is not an approver, and a forged form are refused.
// axe-core finds no WCAG 2.1 AA violation in light or dark.
func TestHITLApprovalPageBrowser(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("async", 600, true))
		changes := securityPolicy("async", 600, true)
		changes["actionPattern"] = "update_*"
		e.policy(t, changes)
		// Each asks for one call (issue 39); the page shows it. The context
		// carries markup and a bidi override (U+202E), shown, never applied.
		ask := func(action, method, resource string, body any) string {
			r := s.do(http.MethodPost, hitlRequests, map[string]any{"action": action, "resource": resource, "method": method, "path": "/api/v1/m2m/" + resource, "body": body,
				"context": map[string]any{"why": "<script>alert(1)</script> & <b>cleanup</b>", "ticket": "OPS-\u202e24"}}, bearer(e.agTok)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("request: %s", describe(r))
			}
			return r.JSON(t)["requestId"].(string)
		}
		approveID := ask("update_user", http.MethodPatch, "users/1", map[string]any{"name": "Ann Lee", "email": "ann@example.com", "metadata": map[string]any{"team": "ops", "level": 2}})
		denyID := ask("delete_user", http.MethodDelete, "users/2", nil)
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
