package handlers

import (
	"context"
	"net/http"
	"time"
)

// GET /health: 200 {"status":"ok","version":"v1"} while the database
// answers, 503 with status "unavailable" while it does not.
func (a *api) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.ping(ctx); err != nil {
		logger(r).WarnContext(r.Context(), "health check failed", "error", err.Error())
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "version": "v1"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": "v1"})
}
