package handlers

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/analytics"
)

// Authentication analytics over the auth event log (spec: M2M endpoints,
// analytics:read; issue 17). Rules live in extensions/analytics.

// GET /api/v1/m2m/analytics/overview?from=YYYY-MM-DD&to=YYYY-MM-DD
func (a *api) analyticsOverview(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	win, err := analytics.ParseWindow(q.Get("from"), q.Get("to"), analytics.DefaultDays, analytics.MaxDays, extensions.Now())
	if err != nil {
		writeError(w, r, err)
		return
	}
	o, err := a.analytics.Overview(r.Context(), win)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// GET /api/v1/m2m/analytics/users/active?from=&to=: daily, weekly and
// monthly active people for each day of the window.
func (a *api) analyticsActiveUsers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	win, err := analytics.ParseWindow(q.Get("from"), q.Get("to"), analytics.DefaultDays, analytics.MaxSeriesDays, extensions.Now())
	if err != nil {
		writeError(w, r, err)
		return
	}
	series, err := a.analytics.ActiveSeries(r.Context(), win)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"from": series[0].Date, "to": series[len(series)-1].Date, "series": series})
}

// GET /api/v1/m2m/analytics/events?type=&userId=&applicationId=&from=&to=
// &outcome=&limit=&cursor=: the log, newest first, paged by an opaque
// cursor. type may be repeated or comma-separated.
func (a *api) analyticsEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	eq := analytics.EventQuery{UserID: q.Get("userId"), ApplicationID: q.Get("applicationId"), From: q.Get("from"), To: q.Get("to"),
		Outcome: q.Get("outcome"), Limit: 50, Cursor: q.Get("cursor")}
	for _, t := range q["type"] {
		for _, one := range strings.Split(t, ",") {
			if one = strings.TrimSpace(one); one != "" {
				eq.Types = append(eq.Types, one)
			}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "limit must be an integer from 1 to 200.", map[string]any{"field": "limit"}))
			return
		}
		eq.Limit = n
	}
	events, next, err := a.analytics.Events(r.Context(), eq)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := map[string]any{"events": events, "nextCursor": nil}
	if next != "" {
		out["nextCursor"] = next
	}
	writeJSON(w, http.StatusOK, out)
}
