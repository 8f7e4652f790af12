package handlers

import (
	"context"
	"net/http"
	"time"
)

// GET /health: 200 {"status":"ok","version":"v1","checks":{...}} while the
// database answers and writes succeed; 503 with status "unavailable" and
// the part that fails ("database", "writes") otherwise, or with status
// "draining" once the server is shutting down (load balancers move away
// before connections close).
func (a *api) health(w http.ResponseWriter, r *http.Request) {
	if a.draining != nil && a.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining", "version": "v1"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	h := a.storeHealth(ctx)
	checks := map[string]string{"database": "ok", "writes": "ok"}
	status, code := "ok", http.StatusOK
	if h.Database != nil {
		checks["database"], status, code = "unavailable", "unavailable", http.StatusServiceUnavailable
		logger(r).WarnContext(r.Context(), "health: the database does not answer", "error", h.Database.Error())
	}
	if h.Writes != nil {
		checks["writes"], status, code = "failing since "+isoTime(h.Since), "unavailable", http.StatusServiceUnavailable
		logger(r).WarnContext(r.Context(), "health: writes fail", "error", h.Writes.Error(), "since", isoTime(h.Since))
	}
	writeJSON(w, code, map[string]any{"status": status, "version": "v1", "checks": checks})
}
