package mail

import (
	"strings"
	"testing"
	"time"
)

// Every change renders, names the application, what changed, when and
// from where; a name's format characters are shown, never applied, and
// markup in it is text.
func TestNoticeMessage(t *testing.T) {
	at := time.Date(2026, 11, 28, 17, 5, 0, 0, time.UTC)
	for c := range noticeTexts {
		m := NoticeMessage("ada@example.com", Notice{Change: c, AppName: "Acme", Detail: "Key <b>\u202e", At: at, IP: "192.0.2.7", Extra: "More."})
		if m.To != "ada@example.com" || !strings.Contains(m.Subject, "Acme") || !strings.Contains(m.Text, "2026-11-28 17:05 UTC") ||
			!strings.Contains(m.Text, "From: 192.0.2.7") || !strings.Contains(m.Text, "More.") || !strings.Contains(m.HTML, "192.0.2.7") {
			t.Errorf("%s: %+v", c, m)
		}
		if strings.ContainsRune(m.Text+m.HTML+m.Subject, '\u202e') || strings.Contains(m.HTML, "<b>") {
			t.Errorf("%s: a name applied: %+v", c, m)
		}
	}
	if m := NoticeMessage("ada@example.com", Notice{Change: PasskeyAdded, Detail: "Laptop", At: at}); !strings.Contains(m.Subject, "identityd") ||
		!strings.Contains(m.Text, `"Laptop"`) || strings.Contains(m.Text, "From:") {
		t.Errorf("no application, no address: %+v", m)
	}
	if m := NoticeMessage("ada@example.com", Notice{Change: "unknown"}); m.To != "" {
		t.Errorf("an unknown change rendered: %+v", m)
	}
}
