package mail

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	htmltemplate "html/template"
	texttemplate "text/template"
	"time"

	"github.com/identityd/identityd/persistence"
)

// Change is a credential added to or removed from a person's account. Each
// one is e-mailed to the person, committed with the change (NIST SP
// 800-63B §6.1: the subscriber is told when an authenticator is bound or
// removed), so that a change they did not make does not go unseen.
type Change string

// The changes a person is told of.
const (
	PasskeyAdded     Change = "passkey_added"
	PasskeyRemoved   Change = "passkey_removed"
	TOTPEnabled      Change = "totp_enabled"
	TOTPDisabled     Change = "totp_disabled"
	IdentityUnlinked Change = "identity_unlinked"
	PasswordChanged  Change = "password_changed"
)

// noticeTexts are each change's subject and first sentence: %[1]s the
// application's name, %[2]q the passkey's name or the sign-in method.
var noticeTexts = map[Change][2]string{
	PasskeyAdded:     {"A passkey was added to your %[1]s account", "A passkey, %[2]q, was added to your %[1]s account. It signs in without your password."},
	PasskeyRemoved:   {"A passkey was removed from your %[1]s account", "The passkey %[2]q was removed from your %[1]s account."},
	TOTPEnabled:      {"Two-step verification was turned on for your %[1]s account", "Two-step verification with an authenticator app was turned on for your %[1]s account."},
	TOTPDisabled:     {"Two-step verification was turned off for your %[1]s account", "Two-step verification with an authenticator app was turned off for your %[1]s account."},
	IdentityUnlinked: {"A sign-in method was removed from your %[1]s account", "The sign-in method %[2]q was removed from your %[1]s account."},
	PasswordChanged:  {"The password of your %[1]s account was changed", "The password of your %[1]s account was changed with a reset link sent to this address."},
}

// Notice is one change as its e-mail tells it.
type Notice struct {
	Change  Change
	AppName string    // the application it was made through ("": identityd)
	Detail  string    // the passkey's name, or the sign-in method
	At      time.Time // when
	IP      string    // from where, if known
	Extra   string    // a further paragraph, if any
}

//go:embed templates
var templates embed.FS

var (
	textTemplates = texttemplate.Must(texttemplate.ParseFS(templates, "templates/*.txt"))
	htmlTemplates = htmltemplate.Must(htmltemplate.ParseFS(templates, "templates/*.html"))
)

// NoticeMessage renders n to the address to; a zero Message if the change
// is unknown or the templates fail (they are the binary's own).
func NoticeMessage(to string, n Notice) Message {
	texts, ok := noticeTexts[n.Change]
	if !ok || to == "" {
		return Message{}
	}
	if n.AppName == "" {
		n.AppName = "identityd"
	}
	data := map[string]any{
		"Sentence": fmt.Sprintf(texts[1], n.AppName, n.Detail), "At": n.At.UTC().Format("2006-01-02 15:04 MST"),
		"IP": n.IP, "Extra": n.Extra,
	}
	var text, html bytes.Buffer
	if textTemplates.ExecuteTemplate(&text, "notice.txt", data) != nil || htmlTemplates.ExecuteTemplate(&html, "notice.html", data) != nil {
		return Message{}
	}
	return Message{To: to, Subject: fmt.Sprintf(texts[0], n.AppName), Text: text.String(), HTML: html.String()}
}

// Queuer is the storage a notice is queued in: the caller's, whose unit
// of work in ctx commits it with the change.
type Queuer interface {
	QueueMail(ctx context.Context, m *persistence.Mail) error
	AfterCommit(ctx context.Context, fn func())
}

// Notify queues the notice of a change to the address to, in the unit of
// work of ctx (call it inside the change's transaction), and wakes the
// outbox once that commits. A nil outbox sends nothing.
func (o *Outbox) Notify(ctx context.Context, q Queuer, to string, n Notice) error {
	if o == nil {
		return nil
	}
	msg := NoticeMessage(to, n)
	if msg.To == "" {
		return fmt.Errorf("rendering the notice %q failed", n.Change)
	}
	return o.Queue(ctx, q, msg)
}

// Queue seals msg into q in the unit of work of ctx and wakes the outbox
// once that commits: the message goes out only if the change it tells of
// was made.
func (o *Outbox) Queue(ctx context.Context, q Queuer, msg Message) error {
	record, err := o.Record(msg)
	if err != nil {
		return err
	}
	if err := q.QueueMail(ctx, record); err != nil {
		return err
	}
	q.AfterCommit(ctx, o.Kick)
	return nil
}
