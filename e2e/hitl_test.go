package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// Human-in-the-loop approvals over real HTTP (issue 15): policies, agents'
// requests, approvers' decisions (a named person, a role holder, an admin;
// never the wrong person or the agent), timeouts, the sync wait released by
// a decision on another replica, and the audit trail of every step.

const (
	hitlPolicies = "/api/v1/agents/hitl/policies"
	hitlRequests = "/api/v1/agents/hitl/request"
)

// hitlEnv is a server with an admin, an agent, a role "security" held by
// Pat, and Kim who holds no role; Pat and Kim have user tokens from an
// adminConsole application's embedded password sign-in (decisions through
// the API take one, issue 39), and Pat one from an ordinary application.
type hitlEnv struct {
	s               *server
	super           string // the bootstrap admin, every scope
	ag, other       agent
	agTok, otherTok string
	patID, kimID    string
	patTok, kimTok  string
	patAppTok       string // Pat's token from an application that is not adminConsole
}

func newHITLEnv(t *testing.T, s *server) *hitlEnv {
	t.Helper()
	e := &hitlEnv{s: s, super: s.superToken()}
	admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read roles:manage")
	redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
	app := newHostedApp(t, s, admin, "Approvals", redirect, map[string]any{"signInMethods": []string{"password"}, "adminConsole": true})
	shop := newHostedApp(t, s, admin, "Shop", redirect, map[string]any{"signInMethods": []string{"password"}})
	const password = "a long and private passphrase"
	signIn := func(app hostedApp, email string) string {
		verifier, challenge := pkce()
		r := s.embed(t, "/password", map[string]any{"clientId": app.id, "email": email, "password": password, "codeChallenge": challenge, "codeChallengeMethod": "S256"})
		if r.Status != http.StatusOK {
			t.Fatalf("password sign-in: %s", describe(r))
		}
		tok, _ := codeExchanged(t, s, app.id, exchangeCode(t, s, app.id, app.secret, r.JSON(t)["code"].(string), verifier))
		return tok
	}
	person := func(email string) (string, string) {
		r := s.as(t).do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": email, "password": password}, bearer(admin)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create person: %s", describe(r))
		}
		id := r.JSON(t)["id"].(string)
		return id, signIn(app, email)
	}
	e.patID, e.patTok = person("pat@example.com")
	e.kimID, e.kimTok = person("kim@example.com")
	e.patAppTok = signIn(shop, "pat@example.com")
	if r := s.as(t).do(http.MethodPost, "/api/v1/m2m/roles", map[string]any{"name": "security"}, bearer(admin)...); r.Status != http.StatusCreated {
		t.Fatalf("create role: %s", describe(r))
	}
	if r := s.as(t).do(http.MethodPost, "/api/v1/m2m/roles/assign", map[string]any{"userId": e.patID, "role": "security"}, bearer(admin)...); r.Status != http.StatusOK {
		t.Fatalf("assign role: %s", describe(r))
	}
	sa := s.as(t)
	e.ag = sa.createAgent(e.super, map[string]any{"name": "cleaner", "type": "autonomous", "capabilities": []string{"read_users"}})
	e.other = sa.createAgent(e.super, map[string]any{"name": "bystander", "type": "autonomous", "capabilities": []string{"read_users"}})
	e.agTok = decodeToken(t, sa.agentToken(e.ag.ClientID, e.ag.ClientSecret, "")).AccessToken
	e.otherTok = decodeToken(t, sa.agentToken(e.other.ClientID, e.other.ClientSecret, "")).AccessToken
	return e
}

// policy creates a policy and answers its id.
func (e *hitlEnv) policy(t *testing.T, body map[string]any) string {
	t.Helper()
	r := e.s.as(t).do(http.MethodPost, hitlPolicies, body, bearer(e.super)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create policy: %s", describe(r))
	}
	return r.JSON(t)["id"].(string)
}

func securityPolicy(mode string, timeout int, autoDeny bool) map[string]any {
	return map[string]any{"name": "deletes need security", "actionPattern": "delete_*", "resourcePattern": "users/*", "approvalMode": mode,
		"timeoutSeconds": timeout, "approverType": "role", "approverId": "security", "autoDenyOnTimeout": autoDeny}
}

// ask is the agent's request.
func (e *hitlEnv) ask(t *testing.T, tok, action, resource string) *response {
	t.Helper()
	return e.s.as(t).do(http.MethodPost, hitlRequests, map[string]any{"action": action, "resource": resource, "context": map[string]any{"why": "<b>cleanup</b>", "n": 3}}, bearer(tok)...)
}

func (e *hitlEnv) decide(t *testing.T, tok, id, verb, reason string) *response {
	t.Helper()
	var body any
	if reason != "" {
		body = map[string]any{"reason": reason}
	}
	return e.s.as(t).do(http.MethodPost, hitlRequests+"/"+id+"/"+verb, body, bearer(tok)...)
}

func (e *hitlEnv) status(t *testing.T, id string) map[string]any {
	t.Helper()
	return mustOK(t, e.s.as(t).do(http.MethodGet, hitlRequests+"/"+id, nil, bearer(e.agTok)...))
}

// audit is the agent's trail of these actions, oldest first.
func (e *hitlEnv) audit(t *testing.T, actions string) []map[string]any {
	t.Helper()
	m := mustOK(t, e.s.as(t).do(http.MethodGet, agentsPath+"/"+e.ag.ID+"/audit?action="+actions, nil, bearer(e.super)...))
	var out []map[string]any
	for _, x := range m["entries"].([]any) {
		out = append(out, x.(map[string]any))
	}
	slices.Reverse(out)
	return out
}

func TestHITLPolicies(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)

		// Validation names every bad field.
		expectFields(t, s.do(http.MethodPost, hitlPolicies, map[string]any{}, bearer(e.super)...),
			"name", "actionPattern", "resourcePattern", "approvalMode", "timeoutSeconds", "approverType", "approverId")
		good := securityPolicy("async", 600, true)
		with := func(k string, v any) map[string]any {
			b := map[string]any{}
			for x, y := range good {
				b[x] = y
			}
			b[k] = v
			return b
		}
		for _, c := range []struct {
			field string
			value any
		}{
			{"actionPattern", `delete_\`}, {"actionPattern", `delete_\x`}, {"resourcePattern", ""}, {"approvalMode", "later"},
			{"timeoutSeconds", 0}, {"timeoutSeconds", 3601}, {"approverType", "group"}, {"approverId", "nobody"},
			{"name", "bad\tname\x01"}, {"name", strings.Repeat("n", 201)},
			{"actionPattern", "delete_\u202e*"}, {"resourcePattern", "users/\u200b*"}, {"approverId", "secu\u2066rity"},
		} {
			expectFields(t, s.do(http.MethodPost, hitlPolicies, with(c.field, c.value), bearer(e.super)...), c.field)
		}
		// Wrong types, unknown fields and NUL bytes are refused before the rules.
		for _, b := range []map[string]any{with("name", "bad\x00name"), with("timeoutSeconds", 1.5), with("timeoutSeconds", "60"), with("priority", "high"),
			with("autoDenyOnTimeout", "yes"), with("extra", 1)} {
			if r := s.do(http.MethodPost, hitlPolicies, b, bearer(e.super)...); r.Status != http.StatusBadRequest || r.JSON(t)["error"] == "" {
				t.Fatalf("%v: %s", b, describe(r))
			}
		}
		// A user approver must exist.
		u := with("approverType", "user")
		u["approverId"] = "0190b2a0-0000-7000-8000-000000000000"
		expectFields(t, s.do(http.MethodPost, hitlPolicies, u, bearer(e.super)...), "approverId")
		// Least privilege: policies are the admin's; people and agents are refused.
		for _, tok := range []string{e.patTok, e.agTok} {
			expectError(t, s.do(http.MethodPost, hitlPolicies, good, bearer(tok)...), http.StatusForbidden, "insufficient_scope")
			expectError(t, s.do(http.MethodGet, hitlPolicies, nil, bearer(tok)...), http.StatusForbidden, "insufficient_scope")
		}

		// Evaluation: higher priority first, ties by creation order.
		low := e.policy(t, with("priority", 1))
		first := e.policy(t, with("priority", 5))
		second := e.policy(t, with("priority", 5))
		list := mustOK(t, s.do(http.MethodGet, hitlPolicies, nil, bearer(e.super)...))
		var ids []string
		for _, p := range list["policies"].([]any) {
			ids = append(ids, p.(map[string]any)["id"].(string))
		}
		if !slices.Equal(ids, []string{first, second, low}) || list["total"] != 3.0 {
			t.Fatalf("order %v, want %v", ids, []string{first, second, low})
		}
		matched := func() any {
			r := e.ask(t, e.agTok, "delete_user", "users/42")
			if r.Status != http.StatusCreated {
				t.Fatalf("request: %s", describe(r))
			}
			return r.JSON(t)["policyId"]
		}
		if got := matched(); got != first {
			t.Fatalf("matched %v, want the first of the two highest %s", got, first)
		}
		if r := s.do(http.MethodDelete, hitlPolicies+"/"+first, nil, bearer(e.super)...); r.Status != http.StatusNoContent {
			t.Fatalf("delete: %s", describe(r))
		}
		if got := matched(); got != second {
			t.Fatalf("matched %v, want %s", got, second)
		}
		// A patch changes what it sends, and is checked whole.
		r := s.do(http.MethodPatch, hitlPolicies+"/"+low, map[string]any{"priority": 9, "name": "now first"}, bearer(e.super)...)
		p := mustOK(t, r)
		if p["priority"] != 9.0 || p["name"] != "now first" || p["timeoutSeconds"] != 600.0 || p["approverId"] != "security" {
			t.Fatalf("patched: %v", p)
		}
		if got := matched(); got != low {
			t.Fatalf("matched %v after the patch, want %s", got, low)
		}
		expectFields(t, s.do(http.MethodPatch, hitlPolicies+"/"+low, map[string]any{"approverType": "user"}, bearer(e.super)...), "approverId")
		expectFields(t, s.do(http.MethodPatch, hitlPolicies+"/"+low, map[string]any{"timeoutSeconds": 0}, bearer(e.super)...), "timeoutSeconds")
		if p := mustOK(t, s.do(http.MethodGet, hitlPolicies+"/"+low, nil, bearer(e.super)...)); p["timeoutSeconds"] != 600.0 || p["approverType"] != "role" {
			t.Fatalf("a refused patch changed the policy: %v", p)
		}
		for _, id := range []string{first, "not-a-uuid"} {
			expectError(t, s.do(http.MethodPatch, hitlPolicies+"/"+id, map[string]any{"priority": 1}, bearer(e.super)...), http.StatusNotFound, "not_found")
			expectError(t, s.do(http.MethodDelete, hitlPolicies+"/"+id, nil, bearer(e.super)...), http.StatusNotFound, "not_found")
		}
		// No match: no approval needed.
		r = e.ask(t, e.agTok, "read_user", "users/42")
		if m := mustOK(t, r); m["status"] != "approved" || m["policyId"] != nil || m["requestId"] != nil {
			t.Fatalf("no match: %v", m)
		}
	})
}

func TestHITLDecisions(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("async", 600, true))
		named := securityPolicy("async", 600, false)
		named["actionPattern"], named["approverType"], named["approverId"] = "rotate_*", "user", e.kimID
		e.policy(t, named)

		before := time.Now()
		r := e.ask(t, e.agTok, "delete_user", "users/42")
		if r.Status != http.StatusCreated {
			t.Fatalf("request: %s", describe(r))
		}
		req := r.JSON(t)
		id := req["requestId"].(string)
		if req["status"] != "pending_approval" || r.Header.Get("Location") != hitlRequests+"/"+id {
			t.Fatalf("request answer: %v %v", req, r.Header)
		}
		if exp := isoZ(t, req["expiresAt"]); exp.Before(before.Add(599*time.Second)) || exp.After(time.Now().Add(601*time.Second)) {
			t.Fatalf("expiresAt %v, want about ten minutes from %v", exp, before)
		}
		if got := e.status(t, id); got["status"] != "pending_approval" || got["context"].(map[string]any)["why"] != "<b>cleanup</b>" {
			t.Fatalf("poll: %v", got)
		}
		// Only the requesting agent reads it.
		expectError(t, s.do(http.MethodGet, hitlRequests+"/"+id, nil, bearer(e.otherTok)...), http.StatusNotFound, "not_found")
		expectError(t, s.do(http.MethodGet, hitlRequests+"/"+id, nil, bearer(e.super)...), http.StatusForbidden, "agent_token_required")
		expectError(t, s.do(http.MethodPost, hitlRequests, map[string]any{"action": "delete_user", "resource": "users/1"}, bearer(e.patTok)...), http.StatusForbidden, "agent_token_required")

		// Through the API a decision takes an admin token or a token of an
		// adminConsole application (issue 39): the approver's own token from
		// an ordinary application (scope openid), or a service account's
		// without admin, is refused, and decides nothing.
		for _, tok := range []string{e.patAppTok, s.token(s.AdminID, s.AdminSecret, "users:read")} {
			for _, verb := range []string{"approve", "deny"} {
				r := e.decide(t, tok, id, verb, "not through this token")
				if d := expectError(t, r, http.StatusForbidden, "insufficient_scope"); d["requiredScope"] != "admin" ||
					!strings.Contains(r.Header.Get("WWW-Authenticate"), `error="insufficient_scope"`) {
					t.Fatalf("%s with a token that may not decide: %v %v", verb, d, r.Header)
				}
			}
		}
		if got := e.status(t, id); got["status"] != "pending_approval" {
			t.Fatalf("a refused decision decided: %v", got)
		}
		// The wrong people: no role, the agent itself, another agent.
		expectError(t, e.decide(t, e.kimTok, id, "approve", ""), http.StatusForbidden, "not_approver")
		expectError(t, e.decide(t, e.agTok, id, "approve", ""), http.StatusForbidden, "self_approval")
		expectError(t, e.decide(t, e.otherTok, id, "deny", "no"), http.StatusForbidden, "not_approver")
		expectError(t, e.decide(t, e.super, "not-a-uuid", "approve", ""), http.StatusNotFound, "not_found")
		// A role holder approves; a second decision, even an admin's, is refused.
		d := mustOK(t, e.decide(t, e.patTok, id, "approve", "looks right"))
		if d["status"] != "approved" || d["reason"] != "looks right" {
			t.Fatalf("approve: %v", d)
		}
		expectError(t, e.decide(t, e.super, id, "deny", "too late"), http.StatusConflict, "already_decided")
		if got := e.status(t, id); got["status"] != "approved" {
			t.Fatalf("poll after approval: %v", got)
		}

		// An admin denies, with a reason (required to deny).
		id2 := e.ask(t, e.agTok, "delete_session", "users/7").JSON(t)["requestId"].(string)
		expectFields(t, e.decide(t, e.super, id2, "deny", ""), "reason")
		if d := mustOK(t, e.decide(t, e.super, id2, "deny", "not today")); d["status"] != "denied" {
			t.Fatalf("deny: %v", d)
		}

		// A named person: Kim decides, Pat (a role holder, not named) cannot.
		id3 := e.ask(t, e.agTok, "rotate_key", "users/9").JSON(t)["requestId"].(string)
		expectError(t, e.decide(t, e.patTok, id3, "approve", ""), http.StatusForbidden, "not_approver")
		mustOK(t, e.decide(t, e.kimTok, id3, "approve", ""))

		// Two decisions at once: exactly one wins.
		id4 := e.ask(t, e.agTok, "delete_user", "users/8").JSON(t)["requestId"].(string)
		var wg sync.WaitGroup
		codes := make([]int, 2)
		for i, verb := range []string{"approve", "deny"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, _ := json.Marshal(map[string]any{"reason": "race"})
				r, err := send(http.MethodPost, s.URL+hitlRequests+"/"+id4+"/"+verb, strings.NewReader(string(b)), append(bearer(e.super), "Content-Type", "application/json")...)
				if err != nil {
					t.Error(err)
					return
				}
				codes[i] = r.Status
			}()
		}
		wg.Wait()
		slices.Sort(codes)
		if !slices.Equal(codes, []int{http.StatusOK, http.StatusConflict}) {
			t.Fatalf("two decisions at once: %v", codes)
		}

		// Bad input: the envelope, never a request.
		for _, body := range []any{
			map[string]any{"action": "delete_user"},
			map[string]any{"action": "delete\x00user", "resource": "users/1"},
			map[string]any{"action": "delete_user", "resource": "users/1", "context": []any{1}},
			map[string]any{"action": "delete_user", "resource": "users/1", "context": map[string]any{"big": strings.Repeat("x", 17<<10)}},
			map[string]any{"action": 7, "resource": "users/1"},
			`{"action": "delete_user", "resource": "users/\xff"}`,
			`{"action": "delete_user", "resource": "users/1", "context": ` + strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200) + `}`,
		} {
			r := s.do(http.MethodPost, hitlRequests, body, append(bearer(e.agTok), "Content-Type", "application/json")...)
			if r.Status < 400 || r.Status >= 500 || r.JSON(t)["error"] == "" {
				t.Fatalf("%.80v: %s", body, describe(r))
			}
		}
		// Control and format characters in what an approver reads to decide
		// (issue 39): "users/\u202e24" would show as users/42.
		for field, body := range map[string]map[string]any{
			"resource": {"action": "delete_user", "resource": "users/\u202e24"},
			"action":   {"action": "delete\u200b_user", "resource": "users/1"},
			"path":     {"action": "delete_user", "resource": "users/1", "method": "DELETE", "path": "/api/v1/m2m/users/\u202e24"},
		} {
			expectFields(t, s.do(http.MethodPost, hitlRequests, body, bearer(e.agTok)...), field)
		}
		for field, body := range map[string]map[string]any{
			"method": {"action": "delete_user", "resource": "users/1", "method": "TRACE", "path": "/api/v1/m2m/users/1"},
			"path":   {"action": "delete_user", "resource": "users/1", "method": "DELETE", "path": "https://elsewhere.example/api/v1/m2m/users/1"},
			// The call and what the approver reads of it agree.
			"action":   {"action": "read_user", "resource": "users/1", "method": "DELETE", "path": "/api/v1/m2m/users/1"},
			"resource": {"action": "delete_user", "resource": "users/2", "method": "DELETE", "path": "/api/v1/m2m/users/1"},
		} {
			expectFields(t, s.do(http.MethodPost, hitlRequests, body, bearer(e.agTok)...), field)
		}
		expectFields(t, s.do(http.MethodPost, hitlRequests, map[string]any{"action": "delete_user", "resource": "users/1", "body": map[string]any{"a": 1}}, bearer(e.agTok)...), "method", "path")
		big := `{"action": "delete_user", "resource": "` + strings.Repeat("x", 2<<20) + `"}`
		if r := s.do(http.MethodPost, hitlRequests, big, append(bearer(e.agTok), "Content-Type", "application/json")...); r.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("a huge body: %d", r.Status)
		}
		expectError(t, e.s.do(http.MethodPost, hitlRequests+"/"+id4+"/approve", `{"reason": 5}`, append(bearer(e.super), "Content-Type", "application/json")...), http.StatusBadRequest, "invalid_request")

		// Every step is on the agent's trail, with the approver and reason.
		var seen []string
		for _, x := range e.audit(t, "hitl_requested,hitl_approved,hitl_denied") {
			d := x["details"].(map[string]any)
			if d["requestId"] == id {
				seen = append(seen, x["action"].(string))
				if x["action"] == "hitl_approved" && (d["reason"] != "looks right" || actorOf(x) == "") {
					t.Fatalf("approval entry: %v", x)
				}
			}
		}
		if !slices.Equal(seen, []string{"hitl_requested", "hitl_approved"}) {
			t.Fatalf("trail of %s: %v", id, seen)
		}
	})
}

// Timeouts: denied with autoDenyOnTimeout, expired without; a decision
// after either is refused; a sync call ends at the timeout.
func TestHITLTimeout(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)
		deny := securityPolicy("async", 1, true)
		e.policy(t, deny)
		lapse := securityPolicy("async", 1, false)
		lapse["actionPattern"] = "purge_*"
		e.policy(t, lapse)
		syncDeny := securityPolicy("sync", 1, true)
		syncDeny["actionPattern"] = "wipe_*"
		e.policy(t, syncDeny)

		a := e.ask(t, e.agTok, "delete_user", "users/1").JSON(t)
		b := e.ask(t, e.agTok, "purge_user", "users/1").JSON(t)
		for _, req := range []map[string]any{a, b} {
			time.Sleep(time.Until(isoZ(t, req["expiresAt"]))) // past the timeout, then read
		}
		if got := e.status(t, a["requestId"].(string)); got["status"] != "denied" || got["reason"] != nil {
			t.Fatalf("auto-denied: %v", got)
		}
		if got := e.status(t, b["requestId"].(string)); got["status"] != "expired" {
			t.Fatalf("expired: %v", got)
		}
		for _, req := range []map[string]any{a, b} {
			expectError(t, e.decide(t, e.super, req["requestId"].(string), "approve", ""), http.StatusConflict, "request_expired")
		}
		// Sync: the call ends at the timeout, denied.
		c := e.ask(t, e.agTok, "wipe_user", "users/1")
		if c.Status != http.StatusCreated || c.JSON(t)["status"] != "denied" {
			t.Fatalf("sync past its timeout: %s", describe(c))
		}
		timedOut := 0
		for _, x := range e.audit(t, "hitl_timed_out") {
			if x["actor"] == nil {
				timedOut++
			}
		}
		if timedOut != 3 {
			t.Fatalf("%d timeouts on the trail, want 3", timedOut)
		}
	})
}

// A sync request holds the agent's call until a decision.
func TestHITLSync(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("sync", 600, true))
		for _, verb := range []string{"approve", "deny"} {
			answer := e.waitingAsk(t, s)
			id := e.pendingID(t, s)
			mustOK(t, e.decide(t, e.patTok, id, verb, "decided"))
			r := <-answer
			if r == nil {
				t.FailNow()
			}
			want := map[string]string{"approve": "approved", "deny": "denied"}[verb]
			if m := r.JSON(t); r.Status != http.StatusCreated || m["status"] != want || m["requestId"] != id {
				t.Fatalf("sync answer after %s: %s", verb, describe(r))
			}
		}
	})
}

// waitingAsk sends the agent's sync request to s from a goroutine.
func (e *hitlEnv) waitingAsk(t *testing.T, s *server) <-chan *response {
	answer := make(chan *response, 1)
	go func() {
		r, err := send(http.MethodPost, s.URL+hitlRequests, strings.NewReader(`{"action": "delete_user", "resource": "users/42"}`),
			append(bearer(e.agTok), "Content-Type", "application/json")...)
		if err != nil {
			t.Error(err)
		}
		answer <- r
	}()
	return answer
}

// pendingID finds the newest request on the agent's trail that s has no
// decision for yet, as an approver would from the e-mail.
func (e *hitlEnv) pendingID(t *testing.T, s *server) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		decided := map[any]bool{}
		entries := e.audit(t, "hitl_requested,hitl_approved,hitl_denied")
		for _, x := range entries {
			if x["action"] != "hitl_requested" {
				decided[x["details"].(map[string]any)["requestId"]] = true
			}
		}
		for _, x := range slices.Backward(entries) {
			if id := x["details"].(map[string]any)["requestId"]; x["action"] == "hitl_requested" && !decided[id] {
				return id.(string)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no pending request appeared on the trail")
	return ""
}

// Two replicas on PostgreSQL: a sync wait on one is released by a decision
// on the other (NOTIFY), long before its bound.
func TestHITLSyncAcrossReplicas(t *testing.T) {
	t.Parallel()
	one, two := startReplicas(t)
	e := newHITLEnv(t, one)
	e.policy(t, securityPolicy("sync", 600, true))
	for i := range 3 {
		answer := e.waitingAsk(t, two)
		id := e.pendingID(t, one)
		mustOK(t, e.decide(t, e.patTok, id, "approve", fmt.Sprint("round ", i)))
		r := <-answer
		if r == nil {
			t.FailNow()
		}
		// Released by the decision, not by the 25-second bound (which
		// would answer pending_approval).
		if m := r.JSON(t); r.Status != http.StatusCreated || m["status"] != "approved" || m["requestId"] != id {
			t.Fatalf("round %d: the wait on two after an approval on one: %s", i, describe(r))
		}
	}
}

// A kill denies the agent's pending requests, recorded with it.
func TestHITLKill(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("async", 600, false))
		id := e.ask(t, e.agTok, "delete_user", "users/1").JSON(t)["requestId"].(string)
		mustOK(t, s.killAgent(e.super, e.ag.ID, map[string]any{"reason": "rogue"}))
		expectError(t, e.decide(t, e.patTok, id, "approve", ""), http.StatusConflict, "already_decided")
		var found bool
		for _, x := range e.audit(t, "hitl_denied") {
			d := x["details"].(map[string]any)
			found = found || (d["requestId"] == id && d["killed"] == true && d["reason"] == "agent killed: rogue")
		}
		if !found {
			t.Fatalf("no denial with the kill on the trail: %v", e.audit(t, "hitl_denied,killed"))
		}
	})
}
