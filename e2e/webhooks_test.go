package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

const webhooksPath = "/api/v1/webhooks"

// hookReceiver is a product's webhook endpoint: it records what it is
// sent, and fails the requests it is told to.
type hookReceiver struct {
	mu   sync.Mutex
	got  []hookMessage
	fail int // answer 503 to this many requests, then 204
}

type hookMessage struct {
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	status  int
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	status := http.StatusNoContent
	if h.fail > 0 {
		h.fail--
		status = http.StatusServiceUnavailable
	}
	h.got = append(h.got, hookMessage{Headers: map[string]string{
		"webhook-id": r.Header.Get("webhook-id"), "webhook-timestamp": r.Header.Get("webhook-timestamp"),
		"webhook-signature": r.Header.Get("webhook-signature")}, Body: string(body), status: status})
	h.mu.Unlock()
	w.WriteHeader(status)
}

func (h *hookReceiver) failNext(n int) {
	h.mu.Lock()
	h.fail = n
	h.mu.Unlock()
}

func (h *hookReceiver) messages() []hookMessage {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookMessage(nil), h.got...)
}

// waitMessages waits until the receiver holds n messages (the dispatcher
// looks every 200 ms; a retry is due 5 s after a failure).
func (h *hookReceiver) waitMessages(t *testing.T, n int) []hookMessage {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := h.messages()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint got %d messages, want %d", len(got), n)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (m hookMessage) payload(t *testing.T) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal([]byte(m.Body), &p); err != nil {
		t.Fatalf("payload %q: %v", m.Body, err)
	}
	return p
}

// verifyWithNode checks messages with the Standard Webhooks library for
// Node (e2e/node/webhooks.verify.mjs): ok[i] tells whether message i
// verifies under secrets[i].
func verifyWithNode(t *testing.T, secrets []string, msgs []hookMessage) []bool {
	t.Helper()
	type item struct {
		Secret string `json:"secret"`
		hookMessage
	}
	in := make([]item, len(msgs))
	for i := range msgs {
		in[i] = item{secrets[i], msgs[i]}
	}
	b, _ := json.Marshal(in)
	cmd := exec.Command("node", "webhooks.verify.mjs")
	cmd.Dir = "node"
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the Node verifier failed: %v\n%s", err, stderr.String())
	}
	var res []struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(msgs) {
		t.Fatalf("the Node verifier answered %s: %v", out, err)
	}
	ok := make([]bool, len(res))
	for i, r := range res {
		ok[i] = r.OK
	}
	return ok
}

// TestWebhooks: a product's endpoint receives signed messages of the
// events it asked for, verified by another implementation of Standard
// Webhooks; retried after it fails; in order while it answers; redelivered
// on request; signed with both secrets during a rotation; and the
// endpoint's deliveries are listed. On both dialects.
func TestWebhooks(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_WEBHOOK_ALLOW_PRIVATE=true")
		admin := s.adminToken()
		recv := &hookReceiver{}
		srv := httptest.NewServer(recv)
		t.Cleanup(srv.Close)

		// Bad input first: the envelope, nothing created.
		for _, body := range []any{
			map[string]any{"url": "ftp://x.example/", "eventTypes": []string{"user.created"}},
			map[string]any{"url": srv.URL, "eventTypes": []string{}},
			map[string]any{"url": srv.URL, "eventTypes": []string{"user.created\x00"}},
			map[string]any{"url": srv.URL, "eventTypes": "user.created"},
			map[string]any{"url": srv.URL + "/\x00", "eventTypes": []string{"user.created"}},
			map[string]any{"url": srv.URL, "eventTypes": []string{"user.created"}, "secret": "mine"},
		} {
			r := s.do(http.MethodPost, webhooksPath, body, bearer(admin)...)
			if r.Status != http.StatusBadRequest {
				t.Fatalf("%v: %s", body, describe(r))
			}
			expectError(t, r, http.StatusBadRequest, r.JSON(t)["error"].(string))
		}
		// A numeric host in a form other than dotted quad or brackets is
		// never reached: refused, though private addresses are allowed.
		for _, u := range []string{"https://2130706433/in", "https://127.1/in", "https://0x7f000001/in", "https://0177.0.0.1/in", "https://127.0.0.1./in"} {
			r := s.do(http.MethodPost, webhooksPath, map[string]any{"url": u, "eventTypes": []string{"user.created"}}, bearer(admin)...)
			if expectError(t, r, http.StatusBadRequest, "invalid_request"); !strings.Contains(string(r.Body), "dotted-quad") {
				t.Fatalf("%s: %s", u, describe(r))
			}
		}
		r := s.raw(t, http.MethodPost, webhooksPath, []byte(`{"url":"`+srv.URL+`","eventTypes":["\xff"]}`), false, append(bearer(admin), "Content-Type", "application/json")...)
		if r.Status != http.StatusBadRequest {
			t.Fatalf("invalid UTF-8: %s", describe(r))
		}
		expectPart(t, badJSON(t, s, http.MethodPost, webhooksPath, admin, `{"url":"`+srv.URL+`","description":"a\u0000b","eventTypes":["user.created"]}`), "body")
		expectError(t, badJSON(t, s, http.MethodPost, webhooksPath, admin, strings.Repeat("[", 100000)), http.StatusBadRequest, "invalid_json")
		expectError(t, badJSON(t, s, http.MethodPost, webhooksPath, admin, `{"url":"`+srv.URL+`","description":"`+strings.Repeat("x", 2<<20)+`"}`),
			http.StatusRequestEntityTooLarge, "payload_too_large")
		expectPart(t, s.as(t).do(http.MethodGet, webhooksPath+"/%FF", nil, bearer(admin)...), "path")
		expectPart(t, s.as(t).do(http.MethodGet, webhooksPath+"/"+"01a215c6-4a1b-71d8-a857-c5d9ed60b33b/deliveries?status=%00", nil, bearer(admin)...), "query")
		if r := s.do(http.MethodGet, webhooksPath, nil, bearer(s.token(s.AdminID, s.AdminSecret, "users:read"))...); r.Status != http.StatusForbidden {
			t.Fatalf("without admin: %s", describe(r))
		}
		if r := s.do(http.MethodGet, webhooksPath+"/not-an-id", nil, bearer(admin)...); r.Status != http.StatusNotFound {
			t.Fatalf("a malformed id: %s", describe(r))
		}

		created := s.do(http.MethodPost, webhooksPath, map[string]any{"url": srv.URL + "/hooks", "description": "CRM",
			"eventTypes": []string{"user.created", "user.deleted", "agent.killed", "agent.recovered"}}, bearer(admin)...)
		if created.Status != http.StatusCreated {
			t.Fatalf("create: %s", describe(created))
		}
		hook := created.JSON(t)
		id, secret := hook["id"].(string), hook["secret"].(string)
		if !strings.HasPrefix(secret, "whsec_") {
			t.Fatalf("secret %q", secret)
		}
		if got := s.do(http.MethodGet, webhooksPath+"/"+id, nil, bearer(admin)...).JSON(t); got["secret"] != nil || got["enabled"] != true {
			t.Fatalf("read back: %v", got)
		}
		if r := s.do(http.MethodPatch, webhooksPath+"/"+id, map[string]any{"url": "https://127.1/hooks"}, bearer(admin)...); r.Status != http.StatusBadRequest {
			t.Fatalf("a numeric host by PATCH: %s", describe(r))
		}

		// Events, while the endpoint answers: in order.
		acct := s.createAccount(admin, map[string]any{"name": "hooks-e2e", "scopes": []string{"users:read", "users:write", "users:admin"}, "redirectUris": []string{}})
		users := s.token(acct.ClientID, acct.ClientSecret, "")
		var ids []string
		for i := range 5 {
			r := s.do(http.MethodPost, dirUsersPath, map[string]any{"email": "hook" + string(rune('a'+i)) + "@example.com", "name": "Hook"}, bearer(users)...)
			if r.Status != http.StatusCreated {
				t.Fatalf("create user: %s", describe(r))
			}
			ids = append(ids, r.JSON(t)["id"].(string))
		}
		got := recv.waitMessages(t, 5)
		for i, m := range got[:5] {
			p := m.payload(t)
			data, _ := p["data"].(map[string]any)
			if p["type"] != "user.created" || data["userId"] != ids[i] {
				t.Fatalf("message %d: %v (want user %s)", i, p, ids[i])
			}
			if _, err := time.Parse(time.RFC3339, p["timestamp"].(string)); err != nil {
				t.Fatalf("timestamp %v", p["timestamp"])
			}
		}
		secrets := make([]string, 5)
		for i := range secrets {
			secrets[i] = secret
		}
		for i, ok := range verifyWithNode(t, secrets, got[:5]) {
			if !ok {
				t.Fatalf("message %d does not verify with the Node library", i)
			}
		}
		// A wrong secret, or a changed body, does not verify.
		tampered := got[0]
		tampered.Body = strings.Replace(tampered.Body, "user.created", "user.deleted", 1)
		other := "whsec_" + strings.Repeat("A", 43) + "="
		if ok := verifyWithNode(t, []string{other, secret}, []hookMessage{got[0], tampered}); ok[0] || ok[1] {
			t.Fatalf("a wrong secret or a changed body verified: %v", ok)
		}

		// The endpoint fails: the message is retried (5 s later), and arrives.
		recv.failNext(1)
		if r := s.do(http.MethodDelete, dirUsersPath+"/"+ids[0], nil, bearer(users)...); r.Status != http.StatusNoContent {
			t.Fatalf("delete user: %s", describe(r))
		}
		got = recv.waitMessages(t, 7)
		if got[5].status != http.StatusServiceUnavailable || got[6].status != http.StatusNoContent ||
			got[5].Headers["webhook-id"] != got[6].Headers["webhook-id"] || got[6].payload(t)["type"] != "user.deleted" {
			t.Fatalf("retry: %+v %+v", got[5], got[6])
		}
		// The endpoint answered before the server recorded it: wait for the record.
		var list, last map[string]any
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(25 * time.Millisecond) {
			list = s.do(http.MethodGet, webhooksPath+"/"+id+"/deliveries?limit=1", nil, bearer(admin)...).JSON(t)
			last = list["deliveries"].([]any)[0].(map[string]any)
			if last["status"] == "delivered" || time.Now().After(deadline) {
				break
			}
		}
		if list["total"] != float64(6) || last["status"] != "delivered" || last["attempts"] != float64(2) || last["lastResponseStatus"] != float64(204) ||
			last["messageId"] != got[6].Headers["webhook-id"] {
			t.Fatalf("deliveries: %v", list)
		}

		// Redelivery: the same message, under the same webhook-id.
		if r := s.do(http.MethodPost, webhooksPath+"/"+id+"/deliveries/"+last["id"].(string)+"/redeliver", nil, bearer(admin)...); r.Status != http.StatusAccepted {
			t.Fatalf("redeliver: %s", describe(r))
		}
		got = recv.waitMessages(t, 8)
		if got[7].Headers["webhook-id"] != got[6].Headers["webhook-id"] || got[7].Body != got[6].Body {
			t.Fatalf("redelivered %+v", got[7])
		}

		// Agent events reach it too.
		full := s.token(s.AdminID, s.AdminSecret, "") // every scope the admin has, agents:* too
		ag := s.createAgent(full, map[string]any{"name": "hooked", "type": "autonomous"})
		if r := s.killAgent(full, ag.ID, map[string]any{"reason": "leaked key"}); r.Status != http.StatusOK {
			t.Fatalf("kill: %s", describe(r))
		}
		got = recv.waitMessages(t, 9)
		if p := got[8].payload(t); p["type"] != "agent.killed" || p["data"].(map[string]any)["agentId"] != ag.ID {
			t.Fatalf("kill message %v", p)
		}

		// A rotation: during the grace both secrets verify the next message.
		rotated := s.do(http.MethodPost, webhooksPath+"/"+id+"/rotate-secret", nil, bearer(admin)...)
		if rotated.Status != http.StatusOK {
			t.Fatalf("rotate: %s", describe(rotated))
		}
		fresh := rotated.JSON(t)["secret"].(string)
		if fresh == secret || rotated.JSON(t)["previousSecretExpiresAt"] == nil {
			t.Fatalf("rotation %v", rotated.JSON(t))
		}
		if r := s.recoverAgent(full, ag.ID); r.Status != http.StatusOK {
			t.Fatalf("recover: %s", describe(r))
		}
		got = recv.waitMessages(t, 10)
		if ok := verifyWithNode(t, []string{secret, fresh, other}, []hookMessage{got[9], got[9], got[9]}); !ok[0] || !ok[1] || ok[2] {
			t.Fatalf("during the grace: %v (signature %s)", ok, got[9].Headers["webhook-signature"])
		}

		// A test message; an unsubscribed event sends nothing.
		if r := s.do(http.MethodPost, webhooksPath+"/"+id+"/test", nil, bearer(admin)...); r.Status != http.StatusAccepted {
			t.Fatalf("test: %s", describe(r))
		}
		if r := s.do(http.MethodPatch, dirUsersPath+"/"+ids[1], map[string]any{"name": "Renamed"}, bearer(users)...); r.Status != http.StatusOK {
			t.Fatalf("update user: %s", describe(r))
		}
		got = recv.waitMessages(t, 11)
		if p := got[10].payload(t); p["type"] != "webhook.test" {
			t.Fatalf("test message %v", p)
		}
		time.Sleep(500 * time.Millisecond)
		if n := len(recv.messages()); n != 11 {
			t.Fatalf("an unsubscribed event was sent: %d messages", n)
		}

		// Disabled: messages wait; enabled again, they arrive.
		if r := s.do(http.MethodPatch, webhooksPath+"/"+id, map[string]any{"enabled": false}, bearer(admin)...); r.Status != http.StatusOK || r.JSON(t)["disabledReason"] != "disabled" {
			t.Fatalf("disable: %s", describe(r))
		}
		if r := s.do(http.MethodDelete, dirUsersPath+"/"+ids[1], nil, bearer(users)...); r.Status != http.StatusNoContent {
			t.Fatalf("delete user: %s", describe(r))
		}
		time.Sleep(500 * time.Millisecond)
		if n := len(recv.messages()); n != 11 {
			t.Fatalf("a disabled endpoint was sent a message: %d", n)
		}
		if r := s.do(http.MethodPatch, webhooksPath+"/"+id, map[string]any{"enabled": true}, bearer(admin)...); r.Status != http.StatusOK {
			t.Fatalf("enable: %s", describe(r))
		}
		got = recv.waitMessages(t, 12)
		if p := got[11].payload(t); p["type"] != "user.deleted" || p["data"].(map[string]any)["userId"] != ids[1] {
			t.Fatalf("after enabling: %v", p)
		}
		if r := s.do(http.MethodDelete, webhooksPath+"/"+id, nil, bearer(admin)...); r.Status != http.StatusNoContent {
			t.Fatalf("delete: %s", describe(r))
		}
		if r := s.do(http.MethodGet, webhooksPath+"/"+id+"/deliveries", nil, bearer(admin)...); r.Status != http.StatusNotFound {
			t.Fatalf("deliveries of a deleted endpoint: %s", describe(r))
		}
	})
}

// TestWebhookSSRF: by default an endpoint on the server's own network is
// refused: http, and URLs naming loopback, private or link-local
// addresses, at creation; a name that resolves to one, when dialled. The
// receiver is never reached.
func TestWebhookSSRF(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.LookupHost(host)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("this machine's name %q does not resolve (%v): the test needs a name of this machine", host, err)
	}
	if a, err := netip.ParseAddr(addrs[0]); err != nil || a.IsGlobalUnicast() && !a.IsPrivate() {
		t.Fatalf("this machine's name %q resolves to %v, a public address: the test needs a private one", host, addrs)
	}
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL)
		admin := s.adminToken()
		recv := &hookReceiver{}
		ln, err := net.Listen("tcp", net.JoinHostPort(addrs[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: recv}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		port := srv.Listener.Addr().(*net.TCPAddr).Port
		for _, u := range []string{
			"http://hooks.example.com/in",
			"https://127.0.0.1:" + strconv.Itoa(port) + "/in",
			"https://[::1]/in",
			"https://169.254.169.254/latest/meta-data",
			"https://10.0.0.7/in",
			"https://localhost:" + strconv.Itoa(port) + "/in",
		} {
			r := s.do(http.MethodPost, webhooksPath, map[string]any{"url": u, "eventTypes": []string{"user.created"}}, bearer(admin)...)
			expectError(t, r, http.StatusBadRequest, "invalid_request")
		}
		r := s.do(http.MethodPost, webhooksPath, map[string]any{"url": "https://" + host + ":" + strconv.Itoa(port) + "/in", "eventTypes": []string{"user.created"}}, bearer(admin)...)
		if r.Status != http.StatusCreated {
			t.Fatalf("a host name: %s", describe(r))
		}
		id := r.JSON(t)["id"].(string)
		test := s.do(http.MethodPost, webhooksPath+"/"+id+"/test", nil, bearer(admin)...).JSON(t)
		deadline := time.Now().Add(10 * time.Second)
		for {
			d := s.do(http.MethodGet, webhooksPath+"/"+id+"/deliveries/"+test["id"].(string), nil, bearer(admin)...).JSON(t)
			if d["attempts"] == float64(1) {
				if d["status"] != "pending" || !strings.HasPrefix(d["lastError"].(string), "refused") || d["lastResponseStatus"] != nil {
					t.Fatalf("delivery %v", d)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no attempt: %v", d)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n := len(recv.messages()); n != 0 {
			t.Fatalf("the private address was reached %d times", n)
		}
	})
}

// TestWebhooksTwoReplicas: two replicas on one PostgreSQL database share
// the outbox; each message reaches the endpoint once, in order, whichever
// replica logged its event; and concurrent rotations leave one secret.
func TestWebhooksTwoReplicas(t *testing.T) {
	a, b := startReplicas(t, "IDENTITYD_WEBHOOK_ALLOW_PRIVATE=true")
	admin := a.adminToken()
	recv := &hookReceiver{}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	r := a.do(http.MethodPost, webhooksPath, map[string]any{"url": srv.URL, "eventTypes": []string{"user.created"}}, bearer(admin)...)
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %s", describe(r))
	}
	id := r.JSON(t)["id"].(string)
	acct := a.createAccount(admin, map[string]any{"name": "hooks-replicas", "scopes": []string{"users:write"}, "redirectUris": []string{}})
	var ids []string
	for i := range 20 {
		s := []*server{a, b}[i%2]
		r := s.do(http.MethodPost, dirUsersPath, map[string]any{"email": "rep" + strconv.Itoa(i) + "@example.com"}, bearer(s.token(acct.ClientID, acct.ClientSecret, "users:write"))...)
		if r.Status != http.StatusCreated {
			t.Fatalf("create user: %s", describe(r))
		}
		ids = append(ids, r.JSON(t)["id"].(string))
	}
	got := recv.waitMessages(t, 20)
	time.Sleep(time.Second) // a duplicate would come within a dispatcher round or two
	got = recv.messages()
	if len(got) != 20 {
		t.Fatalf("%d messages for 20 events", len(got))
	}
	for i, m := range got {
		if user := m.payload(t)["data"].(map[string]any)["userId"]; user != ids[i] {
			t.Fatalf("message %d is for %v, want %s (in order)", i, user, ids[i])
		}
	}
	// Two rotations at once, one on each replica: both answer, and the
	// endpoint keeps one of their secrets (the other is the previous one).
	var wg sync.WaitGroup
	secrets := make([]string, 2)
	for i, s := range []*server{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.do(http.MethodPost, webhooksPath+"/"+id+"/rotate-secret", nil, bearer(admin)...)
			if r.Status == http.StatusOK {
				secrets[i], _ = r.JSON(t)["secret"].(string)
			}
		}()
	}
	wg.Wait()
	if secrets[0] == "" || secrets[1] == "" || secrets[0] == secrets[1] {
		t.Fatalf("rotations: %q %q", secrets[0], secrets[1])
	}
	if r := b.do(http.MethodPost, dirUsersPath, map[string]any{"email": "after@example.com"}, bearer(b.token(acct.ClientID, acct.ClientSecret, "users:write"))...); r.Status != http.StatusCreated {
		t.Fatalf("create user: %s", describe(r))
	}
	m := recv.waitMessages(t, 21)[20]
	ok := verifyWithNode(t, secrets, []hookMessage{m, m})
	if !ok[0] || !ok[1] {
		t.Fatalf("after two rotations both new secrets sign during the grace (one current, one previous): %v", ok)
	}
}
