package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

// The hosted password reset in Chromium (e2e/node/reset.browser.mjs): the
// password step's "Forgot password?", the forgot page and its neutral
// answer, the e-mailed link (read from the SMTP server of the test and
// handed to the browser by a small mailbox endpoint), the reset page with
// a mismatch and a weak password, the new password signing in; keyboard
// only; without JavaScript; a forged form. With IDENTITYD_SCREENS=1 (make
// screens) the SQLite run saves screenshots, desktop and phone, into
// docs/screens.
func TestBrowserPasswordReset(t *testing.T) {
	needBrowser(t)
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		box := startMail(t, "", "")
		s := start(t, dbURL, box.env("IDENTITYD_RISK_DISABLED=all")...)
		port := freePort(t)
		redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", port)
		env := []string{
			"IDENTITYD_ISSUER=" + s.URL, "CHROMIUM=" + chromiumPath, "CALLBACK_PORT=" + fmt.Sprint(port), "REDIRECT_URI=" + redirect,
			"CLIENT_ID=" + s.createApp(t, "Acme Notes", []string{redirect}, nil), "PASSWORD=" + resetPassword,
			"MAILBOX=" + startMailbox(t, box, s.URL+resetPagePrefix),
		}
		admin := s.token(s.AdminID, s.AdminSecret, "users:write")
		for _, who := range []string{"desktop", "phone", "weak", "keys", "nojs"} {
			email := who + "@example.com"
			s.createPerson(t, admin, email, resetPassword, "")
			env = append(env, "EMAIL_"+strings.ToUpper(who)+"="+email)
		}
		runBrowserSuite(t, dbURL, "reset.browser.mjs", env...)
	})
}

// startMailbox serves, on 127.0.0.1, the reset links of box's messages:
// GET ?to=ADDRESS&after=N answers {"link": …} of the message after the
// first N to ADDRESS (links beginning with prefix), or 404 while there is
// none. Answers its URL.
func startMailbox(t *testing.T, box *mailServer, prefix string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		to := r.URL.Query().Get("to")
		n, _ := strconv.Atoi(r.URL.Query().Get("after"))
		msgs := box.to(to)
		if len(msgs) <= n {
			http.NotFound(w, r)
			return
		}
		m, err := parseSent(msgs[n].Raw)
		link := linkPattern(prefix).FindString(m.Text)
		if err != nil || link == "" {
			http.Error(w, "no reset link in the message", http.StatusConflict)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"link": link})
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String() + "/"
}
