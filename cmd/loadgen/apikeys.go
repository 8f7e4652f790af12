package main

import (
	"context"
	"fmt"
	"net/http"
)

// apiKeyResults is the API-key phase (issue 18): validations through the
// API, from the cache, of keys spread over one application.
type apiKeyResults struct {
	validations phaseResult
}

// apiKeysIssued is how many keys the phase validates, round robin.
const apiKeysIssued = 500

// runAPIKeys makes an application, a person and a backend account granted
// the application, issues keys to the person, then measures validations
// (every one must answer valid).
func runAPIKeys(ctx context.Context, cfg config, c *client, pid int, admin string) (r apiKeyResults, err error) {
	var sa, app, user map[string]any
	if err := c.postJSONStatus(ctx, "/api/v1/service-accounts", admin, http.StatusCreated,
		map[string]any{"name": "bench-keys", "tier": "enterprise", "scopes": []string{"api-keys:issue", "api-keys:read"}}, &sa); err != nil {
		return r, fmt.Errorf("account: %w", err)
	}
	if err := c.postJSONStatus(ctx, "/api/v1/applications", admin, http.StatusCreated,
		map[string]any{"name": "bench keys app", "redirectUris": []string{"https://bench.example/cb"}}, &app); err != nil {
		return r, fmt.Errorf("application: %w", err)
	}
	if err := c.postJSONStatus(ctx, "/api/v1/m2m/users", admin, http.StatusCreated,
		map[string]any{"email": "bench-keys@example.com", "name": "Bench"}, &user); err != nil {
		return r, fmt.Errorf("person: %w", err)
	}
	appID := app["id"].(string)
	if err := c.jsonCall(ctx, http.MethodPut, "/api/v1/applications/"+appID+"/service-accounts/"+sa["id"].(string), admin, http.StatusOK, nil); err != nil {
		return r, fmt.Errorf("grant: %w", err)
	}
	tok, err := c.token(ctx, newAccount(sa["clientId"].(string), sa["clientSecret"].(string)))
	if err != nil {
		return r, err
	}
	keys := make([]string, apiKeysIssued)
	for i := range keys {
		var out map[string]any
		if err := c.postJSONStatus(ctx, "/api/v1/m2m/applications/"+appID+"/api-keys", tok, http.StatusCreated,
			map[string]any{"name": fmt.Sprintf("key %d", i), "scopes": []string{"orders:read"}, "owner": map[string]any{"type": "user", "id": user["id"]}}, &out); err != nil {
			return r, fmt.Errorf("issue: %w", err)
		}
		keys[i] = out["key"].(string)
	}
	r.validations, err = runPhase(ctx, "API-key validations", cfg, pid, func(ctx context.Context, n uint64) error {
		var out struct {
			Valid bool `json:"valid"`
		}
		if err := c.postJSON(ctx, "/api/v1/m2m/api-keys/validate", tok, map[string]any{"key": keys[n%apiKeysIssued]}, &out); err != nil {
			return err
		}
		if !out.Valid {
			return fmt.Errorf("key %d: not valid", n%apiKeysIssued)
		}
		return nil
	})
	return r, err
}
