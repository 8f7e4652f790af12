package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// authzResults are the fine-grained authorization phases (issue 17):
// checks through the HTTP API against the embedded OpenFGA.
type authzResults struct {
	direct, threeHop phaseResult
}

// authzModel: a direct relation (viewer) and one three hops away (a user
// in a group that owns a folder that contains the document).
const authzModel = `model
  schema 1.1

type user

type group
  relations
    define member: [user]

type folder
  relations
    define owner: [group#member]

type document
  relations
    define parent: [folder]
    define viewer: [user] or owner from parent
    define direct: [user]
`

// authzObjects is how many documents, users and groups the phases spread
// their checks over.
const authzObjects = 1000

// runAuthz writes the model and the tuples, then measures allowed checks of
// a direct relation and of the three-hop one.
func runAuthz(ctx context.Context, cfg config, c *client, pid int, admin string) (r authzResults, err error) {
	sa, err := c.create(ctx, admin, "/api/v1/service-accounts", map[string]any{"name": "bench-authz", "scopes": []string{"authz:write", "authz:check"}})
	if err != nil {
		return r, err
	}
	tok, err := c.token(ctx, sa)
	if err != nil {
		return r, err
	}
	if err := c.jsonCall(ctx, http.MethodPut, "/api/v1/m2m/authz/model", tok, http.StatusCreated, map[string]any{"dsl": authzModel}); err != nil {
		return r, fmt.Errorf("model: %w", err)
	}
	var batch []map[string]any
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := c.jsonCall(ctx, http.MethodPost, "/api/v1/m2m/authz/tuples", tok, http.StatusOK, map[string]any{"writes": batch})
		batch = batch[:0]
		return err
	}
	for i := range authzObjects {
		batch = append(batch,
			map[string]any{"user": fmt.Sprintf("user:u%d", i), "relation": "direct", "object": fmt.Sprintf("document:d%d", i)},
			map[string]any{"user": fmt.Sprintf("user:u%d", i), "relation": "member", "object": fmt.Sprintf("group:g%d", i%100)},
			map[string]any{"user": fmt.Sprintf("folder:f%d", i%100), "relation": "parent", "object": fmt.Sprintf("document:d%d", i)},
		)
		if i < 100 {
			batch = append(batch, map[string]any{"user": fmt.Sprintf("group:g%d#member", i), "relation": "owner", "object": fmt.Sprintf("folder:f%d", i)})
		}
		if len(batch) >= 96 {
			if err := flush(); err != nil {
				return r, fmt.Errorf("tuples: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		return r, fmt.Errorf("tuples: %w", err)
	}
	check := func(relation string, doc func(i int) int) func(context.Context, uint64) error {
		return func(ctx context.Context, n uint64) error {
			i := int(n % authzObjects)
			var out struct {
				Allowed bool `json:"allowed"`
			}
			if err := c.postJSON(ctx, "/api/v1/m2m/authz/check", tok, map[string]any{"user": fmt.Sprintf("user:u%d", i), "relation": relation, "object": fmt.Sprintf("document:d%d", doc(i))}, &out); err != nil {
				return err
			}
			if !out.Allowed {
				return fmt.Errorf("check %s of u%d: not allowed", relation, i)
			}
			return nil
		}
	}
	if r.direct, err = runPhase(ctx, "authz check, direct", cfg, pid, check("direct", func(i int) int { return i })); err != nil {
		return r, err
	}
	// u_i is in g_(i%100), which owns f_(i%100), the parent of every d_j
	// with j%100 == i%100: another document than its own, three hops away.
	r.threeHop, err = runPhase(ctx, "authz check, 3 hops", cfg, pid, check("viewer", func(i int) int { return (i + 100) % authzObjects }))
	return r, err
}

// jsonCall sends a JSON body with a bearer token and insists on the status.
func (c *client) jsonCall(ctx context.Context, method, path, token string, want int, body any) error {
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	var out map[string]any // read and dropped
	return c.do(req, want, &out)
}
