package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/identityd/identityd/persistence/dbtest"
)

// approvalToken asks for a client-credentials token that redeems the
// approval of request id.
func (s *server) approvalToken(clientID, secret, id string) *response {
	s.t.Helper()
	text, _ := json.Marshal([]any{map[string]any{"type": "hitl_approval", "requestId": id}})
	return s.do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "authorization_details": {string(text)}}, basic(clientID, secret)...)
}

// An approval bound to a token: the M2M route a policy matches answers 403
// approval_required with a request; once approved, the agent redeems it,
// once, for a token that carries what was approved, lives no longer than
// the approval, shows it at introspection and passes the route.
func TestHITLTokens(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := start(t, dbURL)
		e := newHITLEnv(t, s)
		e.policy(t, securityPolicy("sync", 600, true)) // the route never waits: it answers at once
		// An agent allowed to delete users (privileged, manage_sessions).
		ag := s.createAgent(e.super, map[string]any{"name": "deleter", "type": "service", "capabilities": []string{"read_users", "manage_sessions"}})
		for _, level := range []string{"registered", "verified", "privileged"} {
			mustOK(t, s.changeTrust(e.super, ag.ID, level, "deletes users"))
		}
		tok := decodeToken(t, s.agentToken(ag.ClientID, ag.ClientSecret, "")).AccessToken
		admin := s.token(s.AdminID, s.AdminSecret, "admin users:write users:read")
		victim := func(email string) string {
			r := s.do(http.MethodPost, inviteUsers, map[string]any{"email": email, "name": email}, bearer(admin)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create user: %s", describe(r))
			}
			return r.JSON(t)["id"].(string)
		}
		v1, v2 := victim("v1@example.com"), victim("v2@example.com")

		// The built-in type is advertised, and no RAR type may take its name.
		md := mustOK(t, s.do(http.MethodGet, "/.well-known/oauth-authorization-server", nil))
		if !slices.Contains(strs(md["authorization_details_types_supported"]), "hitl_approval") {
			t.Fatalf("discovery: %v", md["authorization_details_types_supported"])
		}
		expectFields(t, s.do(http.MethodPost, rarTypesPath, map[string]any{"type": "hitl_approval", "schema": map[string]any{"type": "object"}}, bearer(e.super)...), "type")

		// Gated: 403 approval_required with a new request.
		d := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(tok)...), http.StatusForbidden, "approval_required")
		id, _ := d["requestId"].(string)
		if id == "" || d["action"] != "delete_user" || d["resource"] != "users/"+v1 || d["status"] != "pending_approval" {
			t.Fatalf("approval_required details: %v", d)
		}
		// Called again: the same request stands for the call (no new one).
		if again := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(tok)...), http.StatusForbidden, "approval_required"); again["requestId"] != id {
			t.Fatalf("a second refusal made another request: %v, first %s", again, id)
		}
		// A service account is not gated (policies are for agents): read is fine.
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+v1, nil, bearer(admin)...); r.Status != http.StatusOK {
			t.Fatalf("service account read: %s", describe(r))
		}
		// Not approved yet: nothing to redeem.
		expectRFC6749(t, s.approvalToken(ag.ClientID, ag.ClientSecret, id), http.StatusBadRequest, "invalid_authorization_details")
		mustOK(t, e.decide(t, e.patTok, id, "approve", "offboarding"))
		// Approved, not redeemed: the refusal points at it.
		if again := expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(tok)...), http.StatusForbidden, "approval_required"); again["requestId"] != id || again["status"] != "approved" {
			t.Fatalf("refusal after the approval: %v", again)
		}
		// Only its agent redeems it; a malformed entry is refused.
		expectRFC6749(t, s.approvalToken(e.other.ClientID, e.other.ClientSecret, id), http.StatusBadRequest, "invalid_authorization_details")
		expectRFC6749(t, s.approvalToken(ag.ClientID, ag.ClientSecret, ""), http.StatusBadRequest, "invalid_authorization_details")
		// A refused token request spends nothing (unknown scope).
		text, _ := json.Marshal([]any{map[string]any{"type": "hitl_approval", "requestId": id}})
		r := s.do(http.MethodPost, tokenPath, url.Values{"grant_type": {"client_credentials"}, "scope": {"admin"}, "authorization_details": {string(text)}}, basic(ag.ClientID, ag.ClientSecret)...)
		if r.Status < 400 {
			t.Fatalf("a token with the admin scope: %s", describe(r))
		}

		r = s.approvalToken(ag.ClientID, ag.ClientSecret, id)
		if r.Status != http.StatusOK {
			t.Fatalf("redeem: %s", describe(r))
		}
		answer := r.JSON(t)
		granted, _ := answer["authorization_details"].([]any)
		if len(granted) != 1 {
			t.Fatalf("authorization_details: %v", answer)
		}
		entry := granted[0].(map[string]any)
		if entry["type"] != "hitl_approval" || entry["requestId"] != id || entry["action"] != "delete_user" || entry["resource"] != "users/"+v1 {
			t.Fatalf("granted entry: %v", entry)
		}
		// Lives no longer than the approval (600 s), not the usual hour.
		if exp := answer["expires_in"].(float64); exp > 600 || exp < 1 {
			t.Fatalf("expires_in %v, want at most the approval's 600 s", exp)
		}
		approved := answer["access_token"].(string)
		// Once, never twice.
		expectRFC6749(t, s.approvalToken(ag.ClientID, ag.ClientSecret, id), http.StatusBadRequest, "invalid_authorization_details")
		// Resource servers see it at introspection.
		in := s.introspect(t, approved, s.AdminID, s.AdminSecret)
		if in["active"] != true {
			t.Fatalf("introspection: %v", in)
		}
		seen, _ := in["authorization_details"].([]any)
		if len(seen) != 1 || seen[0].(map[string]any)["requestId"] != id {
			t.Fatalf("introspected authorization_details: %v", in)
		}
		// The approved call passes; another resource is still gated.
		if r := s.do(http.MethodDelete, "/api/v1/m2m/users/"+v1, nil, bearer(approved)...); r.Status != http.StatusNoContent {
			t.Fatalf("approved delete: %s", describe(r))
		}
		expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v2, nil, bearer(approved)...), http.StatusForbidden, "approval_required")
		// Reads are not matched by the policy.
		if r := s.do(http.MethodGet, "/api/v1/m2m/users/"+v2, nil, bearer(tok)...); r.Status != http.StatusOK {
			t.Fatalf("ungated read: %s", describe(r))
		}

		// Two redemptions at once: one token.
		d = expectError(t, s.do(http.MethodDelete, "/api/v1/m2m/users/"+v2, nil, bearer(tok)...), http.StatusForbidden, "approval_required")
		id2 := d["requestId"].(string)
		mustOK(t, e.decide(t, e.super, id2, "approve", ""))
		var wg sync.WaitGroup
		codes := make([]int, 3)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				text, _ := json.Marshal([]any{map[string]any{"type": "hitl_approval", "requestId": id2}})
				form := url.Values{"grant_type": {"client_credentials"}, "authorization_details": {string(text)}}
				r, err := send(http.MethodPost, s.URL+tokenPath, strings.NewReader(form.Encode()),
					append(basic(ag.ClientID, ag.ClientSecret), "Content-Type", "application/x-www-form-urlencoded")...)
				if err != nil {
					t.Error(err)
					return
				}
				codes[i] = r.Status
			}()
		}
		wg.Wait()
		slices.Sort(codes)
		if !slices.Equal(codes, []int{http.StatusOK, http.StatusBadRequest, http.StatusBadRequest}) {
			t.Fatalf("three redemptions at once: %v", codes)
		}
		// The trail tells the redemption.
		m := mustOK(t, s.do(http.MethodGet, agentsPath+"/"+ag.ID+"/audit?action=hitl_redeemed", nil, bearer(e.super)...))
		if m["total"] != 2.0 {
			t.Fatalf("redemptions on the trail: %v", m)
		}
	})
}
