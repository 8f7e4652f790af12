package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// hitlResults are the human-in-the-loop phases (issue 15).
type hitlResults struct {
	requests, decisions phaseResult
	release             []time.Duration // a decision on one replica to the sync wait's answer on another (PostgreSQL)
}

// setupHITL makes the approvers' role and two policies: bench_* requests
// wait asynchronously, sync_* ones hold the agent's call.
func setupHITL(ctx context.Context, c *client, admin string) error {
	if err := c.adminJSON(ctx, admin, "/api/v1/m2m/roles", map[string]any{"name": "bench-approvers"}, nil); err != nil {
		return err
	}
	for _, p := range []map[string]any{
		{"name": "bench", "actionPattern": "bench_*", "resourcePattern": "*", "approvalMode": "async", "timeoutSeconds": 3600,
			"approverType": "role", "approverId": "bench-approvers", "autoDenyOnTimeout": true},
		{"name": "bench sync", "actionPattern": "sync_*", "resourcePattern": "users/*", "approvalMode": "sync", "timeoutSeconds": 3600,
			"approverType": "role", "approverId": "bench-approvers"},
	} {
		if err := c.adminJSON(ctx, admin, "/api/v1/agents/hitl/policies", p, nil); err != nil {
			return err
		}
	}
	return nil
}

// runHITL measures requests created (async, so each is one write with its
// audit entry) and then decided by an admin, one request each.
func runHITL(ctx context.Context, cfg config, c *client, pid int, admin string) (r hitlResults, err error) {
	if err := setupHITL(ctx, c, admin); err != nil {
		return r, fmt.Errorf("hitl set-up: %w", err)
	}
	n := min(cfg.accounts, 50)
	tokens := make([]string, n)
	for i := range tokens {
		a, err := c.create(ctx, admin, "/api/v1/agents", map[string]any{"name": fmt.Sprintf("bench-hitl-%d", i+1), "type": "service", "capabilities": []string{"read_users"}})
		if err != nil {
			return r, err
		}
		if tokens[i], err = c.token(ctx, a); err != nil {
			return r, err
		}
	}
	pending := make(chan string, 1<<20)
	r.requests, err = runPhase(ctx, "hitl requests", cfg, pid, func(ctx context.Context, seq uint64) error {
		var out struct {
			RequestID string `json:"requestId"`
			Status    string `json:"status"`
		}
		if err := c.postJSONStatus(ctx, "/api/v1/agents/hitl/request", tokens[seq%uint64(n)], http.StatusCreated,
			map[string]any{"action": "bench_delete", "resource": fmt.Sprintf("users/%d", seq), "context": map[string]any{"ticket": seq}}, &out); err != nil {
			return err
		}
		if out.Status != "pending_approval" {
			return fmt.Errorf("request answered %q", out.Status)
		}
		select {
		case pending <- out.RequestID:
		default:
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	r.decisions, err = runPhase(ctx, "hitl decisions", cfg, pid, func(ctx context.Context, seq uint64) error {
		var id string
		select {
		case id = <-pending:
		default:
			return errPoolEmpty
		}
		var out struct{ Status string }
		return c.postJSONStatus(ctx, "/api/v1/agents/hitl/request/"+id+"/approve", admin, http.StatusOK, map[string]any{"reason": "benchmark"}, &out)
	})
	return r, err
}

// hitlRelease starts a second replica on the same database and, round
// after round, has an agent hold a sync request on it while an admin
// approves the request through the first: the time from sending the
// decision to the second replica's answer to the agent.
func hitlRelease(ctx context.Context, cfg config, c *client, first *server, dbURL, adminID, adminSecret, systemSecret, admin string) ([]time.Duration, error) {
	second, err := startServer(ctx, cfg.server, dbURL, adminID, adminSecret, systemSecret)
	if err != nil {
		return nil, err
	}
	defer second.stop()
	c2 := &client{base: second.base, http: &http.Client{Transport: c.http.Transport, Timeout: 40 * time.Second}}
	var ag struct{ ID, ClientID, ClientSecret string }
	if err := c.adminJSON(ctx, admin, "/api/v1/agents", map[string]any{"name": "bench-waiter", "type": "service", "capabilities": []string{"read_users"}}, &ag); err != nil {
		return nil, err
	}
	token, err := c2.token(ctx, newAccount(ag.ClientID, ag.ClientSecret))
	if err != nil {
		return nil, err
	}
	const rounds = 20
	out := make([]time.Duration, 0, rounds)
	seen := map[string]bool{}
	for i := range rounds {
		type answer struct {
			at     time.Time
			status string
			err    error
		}
		answered := make(chan answer, 1)
		go func() {
			var res struct{ Status string }
			err := c2.postJSONStatus(ctx, "/api/v1/agents/hitl/request", token, http.StatusCreated,
				map[string]any{"action": "sync_delete", "resource": fmt.Sprintf("users/%d", i)}, &res)
			answered <- answer{time.Now(), res.Status, err}
		}()
		id, err := c.newRequest(ctx, admin, ag.ID, seen)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		var decided struct{ Status string }
		if err := c.postJSONStatus(ctx, "/api/v1/agents/hitl/request/"+id+"/approve", admin, http.StatusOK, map[string]any{"reason": "benchmark"}, &decided); err != nil {
			return nil, err
		}
		a := <-answered
		switch {
		case a.err != nil:
			return nil, a.err
		case a.status != "approved":
			return nil, fmt.Errorf("round %d: the wait on the second replica answered %q, not released by the approval", i, a.status)
		}
		out = append(out, a.at.Sub(start))
	}
	return out, nil
}

// newRequest finds the agent's newest request not seen before on its audit
// trail (as an approver would from the e-mail), waiting for it to appear.
func (c *client) newRequest(ctx context.Context, admin, agentID string, seen map[string]bool) (string, error) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/api/v1/agents/"+agentID+"/audit?action=hitl_requested&limit=5", nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		var page struct {
			Entries []struct {
				Details map[string]any `json:"details"`
			} `json:"entries"`
		}
		if err := c.do(req, http.StatusOK, &page); err != nil {
			return "", err
		}
		for _, e := range page.Entries {
			if id, _ := e.Details["requestId"].(string); id != "" && !seen[id] {
				seen[id] = true
				return id, nil
			}
		}
	}
	return "", errors.New("the sync request never appeared on the agent's trail")
}

// postJSONStatus posts body as JSON with a bearer token and decodes an
// answer of status want into out.
func (c *client) postJSONStatus(ctx context.Context, path, token string, want int, body, out any) error {
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, strings.NewReader(string(raw)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	return c.do(req, want, out)
}
