package handlers

import (
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/persistence"
)

// Intent headers (spec: Intent metadata), stored on the audit entries of the
// request that carries them.
const (
	hTaskID     = "X-Service-Task-ID"
	hChainID    = "X-Service-Chain-ID"
	hParentTask = "X-Service-Parent-Task-ID"
	hAction     = "X-Service-Intent-Action"
	hReason     = "X-Service-Intent-Reason"
	hInitiator  = "X-Service-Intent-Initiator"
	hDepth      = "X-Service-Intent-Depth"
	maxDepth    = 1000
)

// idChar is what ids and actions may contain: they are matched exactly in
// queries and shown in traces.
func idChar(r rune) bool {
	return r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_' || r == '.' || r == ':' || r == '/')
}

func textChar(r rune) bool { return !unicode.IsControl(r) }

// parseIntent reads and checks the intent headers; a malformed one is a 400
// that names it.
func parseIntent(h http.Header) (persistence.Intent, error) {
	var in persistence.Intent
	text := func(name string, max int, ok func(rune) bool, dst **string) error {
		vs := h.Values(name)
		switch {
		case len(vs) == 0:
			return nil
		case len(vs) > 1:
			return intentError(name, "must be sent once")
		case vs[0] == "" || len(vs[0]) > max:
			return intentError(name, "must be 1 to "+strconv.Itoa(max)+" characters")
		case !utf8.ValidString(vs[0]):
			return intentError(name, "is not UTF-8 text")
		}
		for _, r := range vs[0] {
			if !ok(r) {
				return intentError(name, "contains a character that is not allowed")
			}
		}
		v := vs[0]
		*dst = &v
		return nil
	}
	for _, f := range []struct {
		name string
		max  int
		ok   func(rune) bool
		dst  **string
	}{
		{hTaskID, 128, idChar, &in.TaskID},
		{hChainID, 128, idChar, &in.ChainID},
		{hParentTask, 128, idChar, &in.ParentTaskID},
		{hAction, 128, idChar, &in.Action},
		{hInitiator, 256, textChar, &in.Initiator},
		{hReason, 1024, textChar, &in.Reason},
	} {
		if err := text(f.name, f.max, f.ok, f.dst); err != nil {
			return in, err
		}
	}
	var depth *string
	if err := text(hDepth, 4, func(r rune) bool { return r >= '0' && r <= '9' }, &depth); err != nil {
		return in, intentError(hDepth, "must be a non-negative integer up to "+strconv.Itoa(maxDepth))
	}
	if depth != nil {
		d, err := strconv.Atoi(*depth)
		if err != nil || d > maxDepth {
			return in, intentError(hDepth, "must be a non-negative integer up to "+strconv.Itoa(maxDepth))
		}
		in.Depth = &d
	}
	return in, nil
}

func intentError(header, problem string) error {
	return newError(http.StatusBadRequest, "invalid_intent_header", header+" "+problem+".", map[string]any{"header": header})
}

// intentOf is the request's intent metadata, parsed by the outer middleware.
func intentOf(r *http.Request) persistence.Intent {
	if info := infoFrom(r.Context()); info != nil {
		return info.intent
	}
	return persistence.Intent{}
}

// intentFields are an entry's intent metadata; absent ones are left out.
type intentFields struct {
	TaskID          *string `json:"taskId,omitempty"`
	ParentTaskID    *string `json:"parentTaskId,omitempty"`
	ChainID         *string `json:"chainId,omitempty"`
	Depth           *int    `json:"depth,omitempty"`
	IntentAction    *string `json:"intentAction,omitempty"`
	IntentReason    *string `json:"intentReason,omitempty"`
	IntentInitiator *string `json:"intentInitiator,omitempty"`
}

func toIntentFields(in persistence.Intent) intentFields {
	return intentFields{TaskID: in.TaskID, ParentTaskID: in.ParentTaskID, ChainID: in.ChainID, Depth: in.Depth,
		IntentAction: in.Action, IntentReason: in.Reason, IntentInitiator: in.Initiator}
}

// intentJSON is an audit entry as the intent queries show it.
type intentJSON struct {
	Timestamp string `json:"timestamp"`
	AgentID   string `json:"agentId"`
	ClientID  string `json:"clientId"`
	Action    string `json:"action"`
	Endpoint  string `json:"endpoint,omitempty"`
	Status    *int   `json:"status,omitempty"`
	IP        string `json:"ip,omitempty"`
	intentFields
	Details map[string]any `json:"details"`
}

func toIntentJSON(e persistence.AuditEntry) intentJSON {
	d := map[string]any(e.Details)
	if d == nil {
		d = map[string]any{}
	}
	return intentJSON{
		Timestamp: isoTime(e.CreatedAt), AgentID: e.AgentID, ClientID: e.ClientID, Action: e.Action, Endpoint: e.Endpoint,
		Status: e.Status, IP: e.IP, intentFields: toIntentFields(e.Intent), Details: d,
	}
}

func intentList(entries []persistence.AuditEntry) []intentJSON {
	out := make([]intentJSON, len(entries))
	for i, e := range entries {
		out[i] = toIntentJSON(e)
	}
	return out
}

// traceLimit bounds the task and chain queries (limit, default and maximum).
const traceLimit = 1000

func traceLimitFrom(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return traceLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > traceLimit {
		return 0, newError(http.StatusBadRequest, "invalid_request", "limit must be an integer from 1 to 1000.", map[string]any{"field": "limit"})
	}
	return n, nil
}

// GET /api/v1/audit/intent/tasks/{taskId}
func (a *api) intentTask(w http.ResponseWriter, r *http.Request) {
	limit, err := traceLimitFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	entries, err := a.agents.IntentByTask(r.Context(), mux.Vars(r)["taskId"], limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"taskId": mux.Vars(r)["taskId"], "entries": intentList(entries), "total": len(entries)})
}

// GET /api/v1/audit/intent/chains/{chainId} and .../trace: every entry of
// a chain; the trace orders them hop by hop (depth, then time).
func (a *api) intentChain(w http.ResponseWriter, r *http.Request) {
	limit, err := traceLimitFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	chainID := mux.Vars(r)["chainId"]
	entries, err := a.agents.IntentByChain(r.Context(), chainID, limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	key := "entries"
	if strings.HasSuffix(r.URL.Path, "/trace") {
		key = "hops"
	}
	writeJSON(w, http.StatusOK, map[string]any{"chainId": chainID, key: intentList(entries), "total": len(entries)})
}

// GET /api/v1/audit/intent/search: agentClientId, intentAction,
// intentInitiator, from and to (YYYY-MM-DD, UTC days; to inclusive), limit,
// offset.
func (a *api) intentSearch(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	f := persistence.IntentFilter{ClientID: q.Get("agentClientId"), Action: q.Get("intentAction"), Initiator: q.Get("intentInitiator")}
	for _, d := range []struct {
		name string
		dst  *time.Time
		days int
	}{{"from", &f.From, 0}, {"to", &f.To, 1}} {
		v := q.Get(d.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.DateOnly, v)
		if err != nil {
			writeError(w, r, newError(http.StatusBadRequest, "invalid_request", d.name+" must be a date, YYYY-MM-DD.", map[string]any{"field": d.name}))
			return
		}
		*d.dst = t.AddDate(0, 0, d.days)
	}
	entries, total, err := a.agents.SearchIntent(r.Context(), f, page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": intentList(entries), "total": total, "limit": page.Limit, "offset": page.Offset})
}
