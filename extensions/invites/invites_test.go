package invites

import (
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence"
)

func TestOrigin(t *testing.T) {
	for raw, want := range map[string]string{
		"https://App.Example/callback?x=1": "https://app.example",
		"https://app.example:8443/a":       "https://app.example:8443",
		"http://127.0.0.1:3000/accept":     "http://127.0.0.1:3000",
		"/relative":                        "",
		"app.example/callback":             "",
	} {
		if got := origin(raw); got != want {
			t.Errorf("origin(%q) = %q, want %q", raw, got, want)
		}
	}
}

// The message carries the link in both parts, and what the caller wrote is
// escaped in the HTML part.
func TestMessage(t *testing.T) {
	s := &Service{issuer: "https://id.example"}
	inv := &persistence.Invite{Email: "ada@example.com", ExpiresAt: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)}
	m, err := s.message(inv, Input{AppName: `<script>alert(1)</script>`, FirstName: "Ada"}, "TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	link := "https://id.example/invites/TOKEN"
	if !strings.Contains(m.Text, link) || !strings.Contains(m.HTML, `href="`+link+`"`) || m.To != "ada@example.com" {
		t.Fatalf("message without its link: %+v", m)
	}
	if strings.Contains(m.HTML, "<script>") || !strings.Contains(m.HTML, "&lt;script&gt;") {
		t.Fatalf("app name not escaped in HTML: %s", m.HTML)
	}
	if !strings.Contains(m.Text, "Hello Ada,") || !strings.Contains(m.Text, "25 November 2026") {
		t.Fatalf("text: %s", m.Text)
	}
	if m.Subject != "You are invited to <script>alert(1)</script>" {
		t.Fatalf("subject %q", m.Subject)
	}
	plain, _ := s.message(inv, Input{}, "TOKEN")
	if plain.Subject != "You are invited to your application" || strings.Contains(plain.Text, "Hello ,") {
		t.Fatalf("without names: %+v", plain)
	}
}
