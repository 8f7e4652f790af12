package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/persistence"
)

// The hosted approval page (issue 15): the e-mailed link of a HITL request
// shows a signed-in approver the agent, what it wants (the call itself,
// issue 39) and why, and the time left, with Approve and Deny. The person's SSO session (the hosted
// sign-in's) says who they are; the form carries a CSRF token bound to the
// browser and the request.

const approvalPagePattern = hitl.ApprovalPath + "{requestId}"

var (
	errSignInToApprove = extensions.NewError(http.StatusUnauthorized, "login_required",
		"Sign in to identityd in this browser, then open the link from your e-mail again.", nil)
	errNoSuchApproval = extensions.NewError(http.StatusNotFound, "not_found", "There is no such request.", nil)
	errNotYours       = extensions.NewError(http.StatusForbidden, "not_approver", "You are not an approver of this request.", nil)
)

// approvalRoutes adds the page: its reads count as public reads per
// address, its posts as sign-in form posts.
func (a *api) approvalRoutes(r *mux.Router, rl RateLimits) {
	if a.hitl == nil || a.signin == nil {
		return
	}
	r.HandleFunc(approvalPagePattern, a.limited("public", rl.Public, byIP, a.approvalPage)).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(approvalPagePattern, a.signinLimited(a.approvalDecide)).Methods(http.MethodPost)
}

func approvalPurpose(id string) string { return "approval:" + id }

// approvalCaller is the signed-in person and the request, when they may
// decide it; else it renders the refusal.
func (a *api) approvalCaller(w http.ResponseWriter, r *http.Request) (hitl.Approver, *persistence.HITLRequest, bool) {
	ctx := r.Context()
	ss, user, err := a.signin.Live(ctx, a.cookies.Session(r))
	if err != nil {
		a.pageError(w, r, "Approval", err)
		return hitl.Approver{}, nil, false
	}
	if ss == nil || user == nil {
		a.sendToSignIn(w, r, "Sign in required") // and back here (account.go)
		return hitl.Approver{}, nil, false
	}
	req, err := a.hitl.Peek(ctx, mux.Vars(r)["requestId"])
	if errors.Is(err, persistence.ErrNotFound) {
		err = errNoSuchApproval
	}
	if err != nil {
		a.pageError(w, r, "Approval", err)
		return hitl.Approver{}, nil, false
	}
	who := hitl.Approver{Actor: persistence.Actor{Subject: user.ID, SessionID: ss.ID}, UserID: user.ID}
	if err := a.hitl.MayDecide(ctx, who, req); err != nil {
		if errors.Is(err, hitl.ErrNotApprover) {
			err = errNotYours
		}
		a.pageError(w, r, "Approval", err)
		return hitl.Approver{}, nil, false
	}
	return who, req, true
}

// GET /approvals/{requestId}
func (a *api) approvalPage(w http.ResponseWriter, r *http.Request) {
	_, req, ok := a.approvalCaller(w, r)
	if !ok {
		return
	}
	a.renderApproval(w, r, http.StatusOK, req, "", "", "")
}

// renderApproval shows the request, with the form while it is pending.
func (a *api) renderApproval(w http.ResponseWriter, r *http.Request, status int, req *persistence.HITLRequest, message, problem, reason string) {
	ctx := r.Context()
	name, typ, trust := req.ClientID, "", ""
	if ag, err := a.agents.Get(ctx, req.AgentID); err == nil {
		name, typ, trust = ag.Name, ag.Type, ag.TrustLevel
	}
	now := extensions.Now()
	st := hitl.Status(req, now)
	left := "none: the request has timed out"
	if d := req.ExpiresAt.Sub(now); d > 0 {
		left = fmt.Sprintf("%d min %02d s", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	p := pages.Page{Title: "Approve an agent's action", Message: message, Error: problem, Detail: reason,
		Approval: &pages.Approval{AgentName: name, AgentType: typ, TrustLevel: trust, Action: req.Action, Resource: req.Resource,
			Context: hitl.PrettyJSON(req.Context), Method: req.CallMethod, Path: req.CallPath, Body: hitl.PrettyBody(req.CallBody),
			Status: st, ExpiresAt: isoTime(req.ExpiresAt), TimeLeft: left}}
	if st == persistence.HITLPending {
		browser := a.ensureBrowser(w, r)
		p.Action = hitl.ApprovalPath + req.ID
		p.Hidden = []pages.Field{{Name: "csrf_token", Value: a.csrf.Token(browser, approvalPurpose(req.ID))}}
	}
	pages.Render(w, status, "approval", p)
}

// POST /approvals/{requestId} (csrf_token, decision approve|deny, reason)
func (a *api) approvalDecide(w http.ResponseWriter, r *http.Request) {
	if !a.readPageForm(w, r) {
		return
	}
	if !a.csrf.Valid(a.cookies.Browser(r), approvalPurpose(mux.Vars(r)["requestId"]), r.PostForm.Get("csrf_token")) {
		a.pageError(w, r, "Approval", errCSRF)
		return
	}
	who, req, ok := a.approvalCaller(w, r)
	if !ok {
		return
	}
	decision, reason := r.PostForm.Get("decision"), r.PostForm.Get("reason")
	if decision != "approve" && decision != "deny" {
		a.pageError(w, r, "Approval", extensions.NewError(http.StatusBadRequest, "invalid_request", "Choose Approve or Deny.", nil))
		return
	}
	done, err := a.hitl.Decide(r.Context(), who, req.ID, decision == "approve", reason)
	var ve *extensions.ValidationError
	var refusal *extensions.Error
	switch {
	case errors.As(err, &ve):
		msg := "The reason is not valid."
		if m, ok := ve.Fields["reason"]; ok {
			msg = "Reason: " + m + "."
		}
		a.renderApproval(w, r, http.StatusBadRequest, req, "", msg, reason)
	case errors.As(err, &refusal) && refusal.Status == http.StatusConflict:
		if cur, perr := a.hitl.Peek(r.Context(), req.ID); perr == nil {
			req = cur
		}
		a.renderApproval(w, r, http.StatusConflict, req, refusal.Message, "", "")
	case err != nil:
		a.pageError(w, r, "Approval", err)
	default:
		msg := "Approved. The agent may go ahead."
		if decision == "deny" {
			msg = "Denied. The agent has been told."
		}
		a.renderApproval(w, r, http.StatusOK, done, msg, "", "")
	}
}
