package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// requestInfo travels in the context of one request. The outer middleware
// creates it; inner layers (the router, authentication) fill it in, so that
// the single log line and the metrics at the end know the route and the
// principal.
type requestInfo struct {
	id        string
	route     string
	principal string
	agent     *oauth.Principal // set when an agent's token authenticated the call
	audited   bool             // its api_call entry is committed (committed)
	intent    persistence.Intent
	intentErr error        // malformed intent headers, refused by authenticated routes and the token endpoint
	log       *slog.Logger // the server's; see logger()
}

type infoKey struct{}

func infoFrom(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(infoKey{}).(*requestInfo)
	return info
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// validRequestID accepts a caller's X-Request-ID only when it is short and
// plain, so it can go into logs as it is.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// outer wraps the whole server: request id, body limit, panic recovery, one
// structured log line and the request metrics.
func (a *api) outer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-ID")
		if !validRequestID(id) {
			id = newRequestID()
		}
		info := &requestInfo{id: id, route: "unmatched", log: a.log}
		w.Header().Set("X-Request-ID", id)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if a.draining != nil && a.draining.Load() {
			w.Header().Set("Connection", "close") // net/http closes the connection after this answer
		}
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), infoKey{}, info))
		method := methodLabel(r.Method)
		if method != r.Method {
			writeError(sw, r, newError(http.StatusNotImplemented, "not_implemented", "The request method is not known.", nil))
			a.metrics.observe(method, info.route, sw.status, time.Since(start))
			return
		}
		// Bodies are cut at maxBody; the reader that hits the limit answers
		// 413 in its endpoint's error shape (envelope or RFC 6749).
		r.Body = http.MaxBytesReader(sw, r.Body, maxBody)
		if p := requestTextProblem(r); p != nil {
			a.writeTextProblem(sw, r, p)
			a.metrics.observe(method, info.route, sw.status, time.Since(start))
			a.log.LogAttrs(r.Context(), slog.LevelInfo, "request refused: not text", slog.String("request_id", id),
				slog.String("method", r.Method), slog.Any("details", p.Details), slog.String("remote", r.RemoteAddr))
			return
		}
		if info.intent, info.intentErr = parseIntent(r.Header); info.intentErr != nil {
			info.intent = persistence.Intent{} // nothing of a malformed set is stored
		}
		a.serveRecovering(sw, r, next)
		if info.agent != nil && !info.audited {
			a.recordAPICall(sw, r, info)
		}
		if sw.status == 0 {
			sw.status = http.StatusOK // nothing written: net/http answers 200
		}
		elapsed := time.Since(start)
		a.metrics.observe(r.Method, info.route, sw.status, elapsed)
		if a.log.Enabled(r.Context(), slog.LevelInfo) {
			path := loggablePath(r.URL.Path)
			a.log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("request_id", id),
				slog.String("method", r.Method), slog.String("path", path), slog.String("route", info.route),
				slog.Int("status", sw.status), slog.Int("bytes", sw.bytes),
				slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
				slog.String("principal", info.principal), slog.String("remote", r.RemoteAddr))
		}
	})
}

func (a *api) serveRecovering(w *statusWriter, r *http.Request, next http.Handler) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			logger(r).ErrorContext(r.Context(), "panic", "panic", v, "stack", string(debug.Stack()))
			if w.status == 0 {
				writeError(w, r, newError(http.StatusInternalServerError, "internal_error", "An internal error occurred.", nil))
			}
		}
	}()
	next.ServeHTTP(w, r)
}

// recordAPICall writes the api_call audit entry of an agent's call that
// committed did not see through: one refused before its handler (scope,
// capability, rate limit, intent headers), which changed nothing. Its
// answer goes out first; a failure to record it is logged.
func (a *api) recordAPICall(w *statusWriter, r *http.Request, info *requestInfo) {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	if err := a.recordCall(context.WithoutCancel(r.Context()), r, info, status); err != nil {
		logger(r).ErrorContext(r.Context(), "recording an agent API call failed", "error", err.Error())
	}
}

// recordCall commits the api_call audit entry of an agent's call; with a
// unit of work in ctx, as part of it.
func (a *api) recordCall(ctx context.Context, r *http.Request, info *requestInfo, status int) error {
	p := info.agent
	err := a.agents.APICall(ctx, p.Client.RecordID, p.ClientID(), clientIP(r), r.Method+" "+loggablePath(r.URL.Path), status, info.intent)
	info.audited = err == nil
	if err != nil {
		a.metrics.AuditFailed(agents.ActionAPICall)
	}
	return err
}

// loggablePath is a request path fit for logs and answers: cleaned (no
// empty, "." or ".." segments), and the segment after any "invites"
// segment, in any case, reads {token}, whether or not a route matched: a
// HEAD, a stray slash or a mistyped prefix on an e-mailed link must not put
// its token in the log. Cleaning comes first, so that "/invites//T" or
// "//invites/T" are matched as "/invites/T" is.
func loggablePath(p string) string {
	segs := strings.Split(path.Clean("/"+p), "/")
	for i := 1; i+1 < len(segs); i++ {
		if strings.EqualFold(segs[i], "invites") {
			segs[i+1] = "{token}"
		}
	}
	out := strings.Join(segs, "/")
	if strings.HasSuffix(p, "/") && out != "/" {
		out += "/" // as sent
	}
	return out
}

// routeName records the matched route template for logs and metrics.
func routeName(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info := infoFrom(r.Context()); info != nil {
			if t, err := mux.CurrentRoute(r).GetPathTemplate(); err == nil {
				info.route = t
			}
		}
		next.ServeHTTP(w, r)
	})
}
