package hitl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"strings"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
)

// ApprovalPath is the hosted approval page of a request: ApprovalPath + id.
const ApprovalPath = "/approvals/"

// maxApprovers bounds the people one request e-mails (a role's holders).
const maxApprovers = 100

// Notify makes the service e-mail approvers through outbox, with links to
// the approval page under issuer. Call it before serving; without it no
// e-mail is sent.
func (s *Service) Notify(outbox *mail.Outbox, issuer string) { s.outbox, s.issuer = outbox, issuer }

// approvers are the people a request asks: the user named, or every holder
// of the role named (at most maxApprovers), as they are now.
func (s *Service) approvers(ctx context.Context, r *persistence.HITLRequest) ([]persistence.User, error) {
	if r.ApproverType == ApproverRole {
		return s.store.RoleHolders(ctx, r.ApproverID, maxApprovers)
	}
	u, err := s.store.GetUser(ctx, r.ApproverID)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil // deleted since the policy was written: admins decide
	}
	if err != nil {
		return nil, err
	}
	return []persistence.User{*u}, nil
}

// queueMail records, in ctx's transaction, one message per approver of r.
func (s *Service) queueMail(ctx context.Context, r *persistence.HITLRequest) (bool, error) {
	if s.outbox == nil {
		return false, nil
	}
	people, err := s.approvers(ctx, r)
	if err != nil || len(people) == 0 {
		return false, err
	}
	ag, err := s.store.GetAgent(ctx, r.AgentID)
	if err != nil {
		return false, err
	}
	for _, u := range people {
		if u.Status != "" && u.Status != "active" {
			continue
		}
		record, err := s.outbox.Record(approvalMessage(u.Email, s.issuer+ApprovalPath+r.ID, ag, r))
		if err != nil {
			return false, err
		}
		if err := s.store.QueueMail(ctx, record); err != nil {
			return false, err
		}
	}
	return true, nil
}

// approvalMessage is the e-mail that asks a person to decide. It names
// the agent, the action, the resource and the call itself (method, path,
// body pretty-printed), then the agent's context. What the agent wrote is
// escaped in the HTML part, and every control or format character in it is
// shown as an escape (extensions.Visible), never applied.
func approvalMessage(to, link string, ag *persistence.Agent, r *persistence.HITLRequest) mail.Message {
	v := extensions.Visible
	name, typ, trust, action, resource := v(ag.Name), v(ag.Type), v(ag.TrustLevel), v(r.Action), v(r.Resource)
	ctx := v(PrettyJSON(r.Context))
	expires := r.ExpiresAt.UTC().Format("2006-01-02 15:04:05")
	call, callHTML := "", ""
	if r.CallMethod != "" {
		body := v(PrettyBody(r.CallBody))
		call = fmt.Sprintf("The call:\n%s %s\n%s\n\n", v(r.CallMethod), v(r.CallPath), body)
		callHTML = fmt.Sprintf(`<p>The call:</p><pre>%s %s`+"\n"+`%s</pre>`, html.EscapeString(v(r.CallMethod)), html.EscapeString(v(r.CallPath)), html.EscapeString(body))
	}
	text := fmt.Sprintf("The agent %q (%s, trust level %s) asks for approval to %s on %s.\n\n%sContext (the agent's own words):\n%s\n\n"+
		"The request expires at %s (UTC). Review it and approve or deny it here (you will be asked to sign in):\n%s\n",
		name, typ, trust, action, resource, call, ctx, expires, link)
	e := html.EscapeString
	body := fmt.Sprintf(`<p>The agent <strong>%s</strong> (%s, trust level %s) asks for approval to <code>%s</code> on <code>%s</code>.</p>`+
		`%s<p>Context (the agent's own words):</p><pre>%s</pre><p>The request expires at %s (UTC).</p><p><a href="%s">Review the request</a></p>`,
		e(name), e(typ), e(trust), e(action), e(resource), callHTML, e(ctx), expires, e(link))
	subject := "Approval needed: " + oneLine(name) + " wants to " + oneLine(action)
	return mail.Message{To: to, Subject: subject, Text: text, HTML: body}
}

// oneLine keeps a subject on one line, at most 120 characters.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 120 {
		s = string(r[:120]) + "…"
	}
	return s
}

// PrettyJSON is an agent's context as people read it: indented, with its
// characters as written (pages and e-mails escape them for HTML).
func PrettyJSON(v map[string]any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return "{}"
	}
	return strings.TrimSuffix(b.String(), "\n")
}
