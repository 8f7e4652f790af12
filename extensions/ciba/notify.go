package ciba

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"slices"
	"strings"
	"time"

	"github.com/identityd/identityd/extensions/mail"
	"github.com/identityd/identityd/persistence"
)

// notify records, in ctx's transaction, the e-mail that asks the person
// (the outbox delivers it after the commit).
func (s *Service) notify(ctx context.Context, d *persistence.Delegation, u *persistence.User, client *persistence.Client, agentName string) error {
	if s.outbox == nil {
		return nil
	}
	return s.outbox.Queue(ctx, s.store, consentMessage(u.Email, s.issuer+ConsentPath+d.ID, agentName, client.Agent.TrustLevel, d))
}

// consentMessage is the e-mail that asks a person to decide: who asks,
// for what, the binding message, and the link. What the agent wrote is
// escaped in the HTML part.
func consentMessage(to, link, agent, trust string, d *persistence.Delegation) mail.Message {
	scopes := strings.Join(d.Scopes, " ")
	msg := ""
	if d.BindingMessage != "" {
		msg = fmt.Sprintf("\nIt shows this message, which should match what the agent shows you: %q\n", d.BindingMessage)
	}
	lifetime := duration(time.Duration(d.LifetimeSeconds) * time.Second)
	text := fmt.Sprintf("The agent %q (trust level %s) asks to act for you with: %s, for %s after you approve (you can revoke it sooner).\n%s\n"+
		"The request expires at %s (UTC). Review it and approve or deny it here (you will be asked to sign in):\n%s\n",
		agent, trust, scopes, lifetime, msg, d.ExpiresAt.UTC().Format("2006-01-02 15:04:05"), link)
	e := html.EscapeString
	body := fmt.Sprintf(`<p>The agent <strong>%s</strong> (trust level %s) asks to act for you with <code>%s</code>, for <strong>%s</strong> after you approve (you can revoke it sooner).</p>`,
		e(agent), e(trust), e(scopes), e(lifetime))
	if d.BindingMessage != "" {
		body += fmt.Sprintf(`<p>It shows this message, which should match what the agent shows you: <strong>%s</strong></p>`, e(d.BindingMessage))
	}
	body += fmt.Sprintf(`<p>The request expires at %s (UTC).</p><p><a href="%s">Review the request</a></p>`,
		d.ExpiresAt.UTC().Format("2006-01-02 15:04:05"), e(link))
	return mail.Message{To: to, Subject: "An agent asks to act for you: " + oneLine(agent), Text: text, HTML: body}
}

// oneLine keeps a subject on one line, at most 120 characters.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 120 {
		s = string(r[:120]) + "…"
	}
	return s
}

// Described is what the consent page shows of a delegation, in words.
type Described struct {
	Scopes   []string // one sentence per scope
	Details  []string // one line per authorization_details entry
	Lifetime string   // how long it lasts once approved
}

// scopeWords says what each scope lets the agent do for the person, in
// words without brackets (Describe adds the scope's name in brackets).
var scopeWords = map[string]string{
	"openid":         "Know who you are by your user id",
	"profile":        "See your name",
	"email":          "See your e-mail address and whether it is verified",
	"roles":          "See your roles",
	"users:read":     "Read the user directory",
	"users:write":    "Create and change users in the directory",
	"users:invite":   "Invite people",
	"users:admin":    "Manage users' sessions and delete users",
	"orgs:read":      "Read organizations",
	"orgs:write":     "Create and change organizations",
	"roles:read":     "Read roles",
	"roles:manage":   "Create, assign and remove roles",
	"analytics:read": "Read analytics",
	"authz:check":    "Check authorizations",
	"authz:write":    "Change authorization rules",
}

// Describe puts a delegation in words for the page.
func Describe(d *persistence.Delegation) Described {
	var out Described
	for _, sc := range d.Scopes {
		// The words, then the scope's name once, in brackets: the words
		// themselves hold none, so a line never reads "(…) (…)".
		line := "Use the permission " + sc
		if w, ok := scopeWords[sc]; ok {
			line = w + " (" + sc + ")"
		}
		out.Scopes = append(out.Scopes, line)
	}
	if d.AuthorizationDetails != nil {
		var entries []map[string]any
		if json.Unmarshal([]byte(*d.AuthorizationDetails), &entries) == nil {
			for _, e := range entries {
				out.Details = append(out.Details, describeEntry(e))
			}
		}
	}
	out.Lifetime = duration(time.Duration(d.LifetimeSeconds) * time.Second)
	return out
}

// describeEntry says an authorization_details entry in a line: its type,
// actions, locations and any other member, as text (escaped by the page).
func describeEntry(e map[string]any) string {
	typ, _ := e["type"].(string)
	line := typ
	list := func(k string) string {
		xs, _ := e[k].([]any)
		parts := make([]string, 0, len(xs))
		for _, x := range xs {
			parts = append(parts, fmt.Sprint(x))
		}
		return strings.Join(parts, ", ")
	}
	if a := list("actions"); a != "" {
		line += ": " + a
	} else {
		line += ": every action"
	}
	if l := list("locations"); l != "" {
		line += " at " + l
	}
	var rest []string
	for k, v := range e {
		if k == "type" || k == "actions" || k == "locations" {
			continue
		}
		b, _ := json.Marshal(v)
		rest = append(rest, k+" "+string(b))
	}
	if len(rest) > 0 {
		slices.Sort(rest)
		line += " (" + strings.Join(rest, "; ") + ")"
	}
	return line
}

// duration says a lifetime in words: "1 hour", "90 minutes", "2 days".
func duration(d time.Duration) string {
	plural := func(n int64, unit string) string {
		if n == 1 {
			return "1 " + unit
		}
		return fmt.Sprintf("%d %ss", n, unit)
	}
	switch {
	case d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return plural(int64(d/(24*time.Hour)), "day")
	case d >= time.Hour && d%time.Hour == 0:
		return plural(int64(d/time.Hour), "hour")
	case d >= time.Minute && d%time.Minute == 0:
		return plural(int64(d/time.Minute), "minute")
	}
	return plural(int64(d/time.Second), "second")
}
