package handlers

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net/http"
)

// committed runs a handler that may change records as one unit of work
// (persistence: one transaction in the context, committed once, waiting
// one lease), and holds its answer back until the unit has committed: a
// client is never told of a change that was then lost, and a failed commit
// is answered as itself (503 while storage is down). A handler's refusal
// (4xx, 5xx) rolls back whatever it changed.
//
// An agent's call, read or write, is answered only once its api_call
// audit entry is committed, with the change it made when it made one:
// a call that cannot be audited is refused (503), never served unaudited
// (docs/decisions.md, fail-closed).
func (a *api) committed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		info := infoFrom(r.Context())
		agent := info != nil && info.agent != nil
		write := r.Method != http.MethodGet && r.Method != http.MethodHead
		if !agent && !write {
			next(w, r)
			return
		}
		h := &held{header: http.Header{}}
		run := func(ctx context.Context) error {
			next(h, r.WithContext(ctx))
			if h.code() >= 400 {
				return errRefused
			}
			if agent {
				return a.recordCall(ctx, r, info, h.code())
			}
			return nil
		}
		var err error
		if write {
			err = a.transact(r.Context(), run)
		} else {
			err = run(r.Context())
		}
		if errors.Is(err, errRefused) {
			err = nil
			if agent { // the refusal changed nothing; its entry stands alone
				err = a.recordCall(r.Context(), r, info, h.code())
			}
		}
		if err != nil {
			logger(r).ErrorContext(r.Context(), "a request's changes or its audit entry could not be committed; answered as failed", "error", err.Error())
			writeError(w, r, err)
			return
		}
		h.release(w)
	}
}

// errRefused rolls back the unit of a handler that answered an error.
var errRefused = errors.New("the handler refused the request")

// transact runs fn as a unit of work.
func (a *api) transact(ctx context.Context, fn func(ctx context.Context) error) error {
	if a.units == nil {
		return fn(ctx)
	}
	return a.units(ctx, fn)
}

// held is an answer held back: headers, status and body, written out by
// release.
type held struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *held) Header() http.Header { return h.header }

func (h *held) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
}

func (h *held) Write(b []byte) (int, error) {
	h.WriteHeader(http.StatusOK)
	return h.body.Write(b)
}

func (h *held) code() int {
	if h.status == 0 {
		return http.StatusOK
	}
	return h.status
}

func (h *held) release(w http.ResponseWriter) {
	maps.Copy(w.Header(), h.header)
	w.WriteHeader(h.code())
	_, _ = w.Write(h.body.Bytes())
}
