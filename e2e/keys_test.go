package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

const keysPath, rotatePath = "/api/v1/keys", "/api/v1/keys/rotate"

// command runs `identityd args...` with s's configuration and reports its
// exit code, stdout and stderr.
func (s *server) command(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), s.env...) // the last value of a variable wins
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), stdout.String(), stderr.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, stdout.String(), stderr.String()
}

// jwks reads the published key ids, checking that no private member is
// published.
func (s *server) jwks(t *testing.T) []string {
	t.Helper()
	r := s.do(http.MethodGet, oauth.JWKSPath, nil)
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(r.Body, &set); r.Status != http.StatusOK || err != nil {
		t.Fatalf("jwks: %s", describe(r))
	}
	var kids []string
	for _, k := range set.Keys {
		for _, private := range []string{"d", "p", "q", "dp", "dq", "qi"} {
			if _, ok := k[private]; ok {
				t.Fatalf("JWKS publishes the private member %q", private)
			}
		}
		kids = append(kids, k["kid"].(string))
	}
	slices.Sort(kids)
	return kids
}

// keyList reads GET /api/v1/keys with a fresh admin token: kid → the
// key's API shape.
func (s *server) keyList(t *testing.T) map[string]map[string]any {
	t.Helper()
	r := s.do(http.MethodGet, keysPath, nil, bearer(s.adminToken())...)
	if r.Status != http.StatusOK {
		t.Fatalf("list keys: %s", describe(r))
	}
	m := r.JSON(t)
	out := map[string]map[string]any{}
	for _, k := range m["keys"].([]any) {
		key := k.(map[string]any)
		for _, private := range []string{"d", "privateKey", "private_der", "n", "x"} {
			if _, ok := key[private]; ok {
				t.Fatalf("the key listing shows %q: %v", private, key)
			}
		}
		out[key["kid"].(string)] = key
	}
	if m["total"] != float64(len(out)) {
		t.Fatalf("list keys: total %v for %d keys", m["total"], len(out))
	}
	return out
}

// eventually polls cond until it holds, failing after bound.
func eventually(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

var rotatedLine = regexp.MustCompile(`(?m)^active\s+(RS256|ES256)\s+(\S+)$`)

// Signing keys rotate through the admin API and the command line: the new
// keys sign (the listing says so), the old stay in JWKS for their window
// (here a 1 s token lifetime plus the 5 s reload interval), then leave it.
func TestKeyRotation(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		s := startLogged(t, dbURL, "IDENTITYD_ACCESS_TOKEN_TTL=1")
		first := s.jwks(t)
		list := s.keyList(t)
		if len(first) != 2 || len(list) != 2 {
			t.Fatalf("a first start publishes one key per algorithm: %v %v", first, list)
		}
		for _, k := range list {
			if k["state"] != "active" || k["retiredAt"] != nil || k["publishedUntil"] != nil {
				t.Fatalf("first keys: %v", list)
			}
		}

		// Only admins. (Tokens live 1 s here: each call gets its own.)
		reader := s.createAccount(s.adminToken(), map[string]any{"name": "key-reader", "scopes": []string{"users:read"}})
		readerToken := func() string { return s.token(reader.ClientID, reader.ClientSecret, "") }
		expectError(t, s.do(http.MethodPost, rotatePath, nil, bearer(readerToken())...), http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodGet, keysPath, nil, bearer(readerToken())...), http.StatusForbidden, "insufficient_scope")
		expectError(t, s.do(http.MethodPost, rotatePath, nil), http.StatusUnauthorized, "unauthorized")

		// Through the API: answered once the new keys sign here.
		r := s.do(http.MethodPost, rotatePath, nil, bearer(s.adminToken())...)
		if r.Status != http.StatusOK {
			t.Fatalf("rotate: %s", describe(r))
		}
		var rotated struct {
			Keys    []map[string]any `json:"keys"`
			Retired []string         `json:"retired"`
		}
		_ = json.Unmarshal(r.Body, &rotated)
		slices.Sort(rotated.Retired)
		if len(rotated.Keys) != 2 || !slices.Equal(rotated.Retired, first) {
			t.Fatalf("rotate answered %s, want two new keys and %v retired", r.Body, first)
		}
		var apiKids []string
		for _, k := range rotated.Keys {
			apiKids = append(apiKids, k["kid"].(string))
		}
		if got := s.jwks(t); len(got) != 4 || !containsAll(got, first...) || !containsAll(got, apiKids...) {
			t.Fatalf("JWKS after rotating: %v, want %v and %v", got, first, apiKids)
		}
		list = s.keyList(t)
		for _, kid := range apiKids {
			if list[kid]["state"] != "active" {
				t.Fatalf("new key %s: %v", kid, list[kid])
			}
		}
		for _, kid := range first {
			k := list[kid]
			if k["state"] != "retired" || k["retiredAt"] == nil || k["publishedUntil"] == nil {
				t.Fatalf("old key %s: %v", kid, k)
			}
			if until := isoZ(t, k["publishedUntil"]).Sub(isoZ(t, k["retiredAt"])); until != 6*time.Second {
				t.Fatalf("old key published %s after its retirement, want 6s (token lifetime 1s + reload 5s)", until)
			}
		}

		// Through the command line, against the database, no server
		// involved: the listing shows the new signers at once, the server
		// publishes them within its reload interval.
		code, out, errOut := s.command(t, "keys", "rotate")
		found := rotatedLine.FindAllStringSubmatch(out, -1)
		if code != 0 || len(found) != 2 {
			t.Fatalf("keys rotate: exit %d\n%s\n%s", code, out, errOut)
		}
		cliKids := []string{found[0][2], found[1][2]}
		list = s.keyList(t)
		for _, kid := range cliKids {
			if list[kid]["state"] != "active" {
				t.Fatalf("key %s from the command: %v", kid, list[kid])
			}
		}
		for _, kid := range apiKids {
			if list[kid]["state"] != "retired" {
				t.Fatalf("key %s after the command: %v", kid, list[kid])
			}
		}
		eventually(t, 3*oauth.KeyReload, "the server does not publish the keys the command made", func() bool {
			return containsAll(s.jwks(t), cliKids...)
		})

		// The first keys leave JWKS and the listing after their window.
		eventually(t, 30*time.Second, "the first keys are still published", func() bool {
			got := s.jwks(t)
			return !slices.Contains(got, first[0]) && !slices.Contains(got, first[1])
		})
		list = s.keyList(t)
		if _, ok := list[first[0]]; ok || len(list) < 2 {
			t.Fatalf("the listing after the window: %v", list)
		}
		for _, kid := range cliKids {
			if list[kid]["state"] != "active" {
				t.Fatalf("the command's key %s: %v", kid, list[kid])
			}
		}
	})
}

// Two replicas on one PostgreSQL: a rotation on one, through the API or the
// command line, and both publish the new keys.
func TestKeyRotationReplicas(t *testing.T) {
	t.Parallel()
	one, two := startReplicas(t)
	admin := one.adminToken()
	if a, b := one.jwks(t), two.jwks(t); !slices.Equal(a, b) || len(a) != 2 {
		t.Fatalf("replicas publish %v and %v", a, b)
	}
	r := one.do(http.MethodPost, rotatePath, nil, bearer(admin)...)
	if r.Status != http.StatusOK {
		t.Fatalf("rotate: %s", describe(r))
	}
	var rotated struct {
		Keys []map[string]any `json:"keys"`
	}
	_ = json.Unmarshal(r.Body, &rotated)
	kids := []string{rotated.Keys[0]["kid"].(string), rotated.Keys[1]["kid"].(string)}
	eventually(t, 3*oauth.KeyReload, "the other replica does not publish the new keys", func() bool {
		return containsAll(two.jwks(t), kids...)
	})
	if list := two.keyList(t); list[kids[0]]["state"] != "active" || list[kids[1]]["state"] != "active" {
		t.Fatalf("the other replica lists %v", list)
	}

	code, out, errOut := two.command(t, "keys", "rotate")
	found := rotatedLine.FindAllStringSubmatch(out, -1)
	if code != 0 || len(found) != 2 {
		t.Fatalf("keys rotate: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, s := range []*server{one, two} {
		eventually(t, 3*oauth.KeyReload, "a replica does not publish the keys the command made", func() bool {
			return containsAll(s.jwks(t), found[0][2], found[1][2], kids[0], kids[1])
		})
	}
}

// A new SQLite database is private: its directory 0700, the file and its
// -wal and -shm files 0600, after a real start; an existing directory keeps
// its mode.
func TestDatabaseFilesPrivate(t *testing.T) {
	t.Parallel()
	existing := filepath.Join(t.TempDir(), "existing")
	if err := os.Mkdir(existing, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(existing, 0o750); err != nil { // whatever the umask did
		t.Fatal(err)
	}
	mode := func(path string) fs.FileMode {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	for dir, want := range map[string]fs.FileMode{filepath.Join(t.TempDir(), "new", "data"): 0o700, existing: 0o750} {
		path := filepath.Join(dir, "identityd.db")
		s := startOn(t, "sqlite://"+path)
		s.createAccount(s.adminToken(), map[string]any{"name": "a write"})
		for _, f := range []string{path, path + "-wal", path + "-shm"} {
			if m := mode(f); m != 0o600 {
				t.Errorf("%s: mode %v, want 0600", filepath.Base(f), m)
			}
		}
		if m := mode(dir); m != want {
			t.Errorf("directory %s: mode %v, want %v", dir, m, want)
		}
	}
}

const blockRule = "======================================================================"

// credentials finds the one credentials block in text and returns it and
// what precedes and follows it.
func credentials(t *testing.T, text string) (before, block, after string) {
	t.Helper()
	if strings.Count(text, blockRule) != 2 {
		t.Fatalf("want one credentials block between two rules:\n%s", text)
	}
	before, rest, _ := strings.Cut(text, blockRule)
	block, after, _ = strings.Cut(rest, blockRule)
	return before, block, after
}

// The generated admin's credentials come first on stderr, in one block
// marked at both ends, before any log line; every other line is JSON.
func TestAdminCredentialsBlock(t *testing.T) {
	t.Parallel()
	s := startLogged(t, dbtest.URLs(t)["sqlite"], "IDENTITYD_ADMIN_CLIENT_ID=", "IDENTITYD_ADMIN_CLIENT_SECRET=")
	s.waitLog(t, "identityd listening")
	before, block, after := credentials(t, s.logs.String())
	if strings.TrimSpace(before) != "" {
		t.Fatalf("output before the credentials block:\n%s", before)
	}
	id, secret := bannerID.FindStringSubmatch(block), bannerSecret.FindStringSubmatch(block)
	if id == nil || secret == nil {
		t.Fatalf("block without credentials:\n%s", block)
	}
	for line := range strings.SplitSeq(block, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "{") {
			t.Fatalf("a block line a log parser could take for JSON: %q", line)
		}
	}
	for line := range strings.SplitSeq(strings.TrimSpace(after), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("after the block, a line that is not a JSON log line: %q", line)
		}
	}
	if strings.Contains(after, secret[1]) {
		t.Fatal("the secret is in the log")
	}
	s.token(id[1], secret[1], "admin")
}

// `identityd admin reset` issues a new secret for a lost admin's account,
// printed once in the credentials block; the old secret stops working,
// without a restart: at once on PostgreSQL, within the epoch check on
// SQLite.
func TestAdminReset(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		sqlite := strings.HasPrefix(dbURL, "sqlite")
		s := startLogged(t, dbURL, "IDENTITYD_ADMIN_CLIENT_ID=", "IDENTITYD_ADMIN_CLIENT_SECRET=")
		s.waitLog(t, "identityd listening")
		_, block, _ := credentials(t, s.logs.String())
		id, lost := bannerID.FindStringSubmatch(block)[1], bannerSecret.FindStringSubmatch(block)[1]
		s.token(id, lost, "admin")

		reset := func() (string, string) {
			t.Helper()
			code, out, errOut := s.command(t, "admin", "reset")
			if code != 0 {
				t.Fatalf("admin reset: exit %d\n%s\n%s", code, out, errOut)
			}
			before, block, _ := credentials(t, out)
			if strings.TrimSpace(before) != "" || bannerID.FindStringSubmatch(block) == nil || bannerSecret.FindStringSubmatch(block) == nil {
				t.Fatalf("admin reset printed:\n%s", out)
			}
			if strings.Contains(block, "refuses the old secret within") != sqlite {
				t.Fatalf("the SQLite note on %s:\n%s", dbURL, block)
			}
			secret := bannerSecret.FindStringSubmatch(block)[1]
			if strings.Contains(errOut, secret) {
				t.Fatal("the new secret is in the log")
			}
			return bannerID.FindStringSubmatch(block)[1], secret
		}
		// refused waits until the running server refuses an old secret: the
		// first answer after a reset on PostgreSQL, the next epoch check on
		// SQLite.
		refused := func(t *testing.T, s *server, id, old string) {
			t.Helper()
			deadline := time.Now().Add(3 * persistence.EpochPoll)
			for {
				r := s.do(http.MethodPost, tokenPath, ccForm(""), basic(id, old)...)
				if r.Status != http.StatusOK {
					expectRFC6749(t, r, http.StatusUnauthorized, "invalid_client")
					return
				}
				if !sqlite || time.Now().After(deadline) {
					t.Fatalf("the old secret still works on %s", dbURL)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
		gotID, fresh := reset()
		if gotID != id || fresh == lost {
			t.Fatalf("reset %s (%s), want a new secret for %s", gotID, fresh, id)
		}
		refused(t, s, id, lost)
		admin := s.token(id, fresh, "admin")
		if l := s.do(http.MethodGet, saPath, nil, bearer(admin)...).JSON(t); l["total"] != float64(1) {
			t.Fatalf("the reset made another account: %v", l)
		}

		// No account holds admin any more: the command makes one.
		other := s.createAccount(admin, map[string]any{"name": "no admin", "scopes": []string{"users:read"}})
		var all map[string]any
		_ = json.Unmarshal(s.do(http.MethodGet, saPath, nil, bearer(admin)...).Body, &all)
		adminAccount := all["serviceAccounts"].([]any)[0].(map[string]any)["id"].(string)
		if d := s.do(http.MethodDelete, saPath+"/"+adminAccount, nil, bearer(admin)...); d.Status != http.StatusNoContent {
			t.Fatal(describe(d))
		}
		newID, newSecret := reset()
		if newID == id || newID == other.ClientID {
			t.Fatalf("reset without an admin gave %s", newID)
		}
		s.token(newID, newSecret, "admin")

		// A configured admin: its secret is reset too, and the command says
		// that the configuration must take it, or the next start restores
		// the configured one.
		c := startLogged(t, dbURL)
		code, out, errOut := c.command(t, "admin", "reset")
		if code != 0 || !strings.Contains(out, "IDENTITYD_ADMIN_CLIENT_SECRET is set") || bannerID.FindStringSubmatch(out)[1] != c.AdminID {
			t.Fatalf("admin reset of a configured admin: exit %d\n%s\n%s", code, out, errOut)
		}
		configured := bannerSecret.FindStringSubmatch(out)[1]
		refused(t, c, c.AdminID, c.AdminSecret)
		c.token(c.AdminID, configured, "admin")
	})
}

// An invite made before invites had a key of their own (hashed with the
// client-secret key, as migration 0007 marks existing rows) still works on
// the real server until it expires; new invites are hashed with the invite
// key.
func TestLegacyInviteToken(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		system := randomString()
		s := startLogged(t, dbURL, "IDENTITYD_SYSTEM_SECRET="+system)
		inv := newInviter(t, s, s.adminToken(), "legacy inviter", "users:invite")

		// Written as the server before the change wrote it.
		ctx := context.Background()
		store := dbtest.Store(t, s.DB)
		token := oauth.NewSecret()
		hash, _ := oauth.NewSecretHasher([]byte(system)).Hash(ctx, []byte(token))
		now := time.Now().UTC().Truncate(time.Microsecond)
		u := &persistence.User{ID: uuid.NewString(), Email: "legacy@example.com", Status: "invited", Metadata: persistence.JSONObject{}, CreatedAt: now, UpdatedAt: now}
		var accounts map[string]any
		_ = json.Unmarshal(s.do(http.MethodGet, saPath+"?limit=200", nil, bearer(s.adminToken())...).Body, &accounts)
		var principal string
		for _, a := range accounts["serviceAccounts"].([]any) {
			if a.(map[string]any)["clientId"] == inv.ClientID {
				principal = a.(map[string]any)["id"].(string)
			}
		}
		row := &persistence.Invite{ID: uuid.NewString(), TokenHash: hash, TokenKey: persistence.LegacyInviteTokenKey, Email: u.Email, UserID: u.ID,
			CreatorClientID: inv.ClientID, CreatorPrincipal: principal, RedirectURI: inviteCallback, AcceptURI: inviteCallback,
			Metadata: persistence.JSONObject{}, Status: persistence.InviteSent, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := store.CreateInvite(ctx, row, u, nil); err != nil {
			t.Fatal(err)
		}
		if r := inviteStatus(t, s, token); r.Status != http.StatusOK {
			t.Fatalf("status of an invite from before: %s", describe(r))
		}
		if r := acceptInvite(t, s, inv.tok, token); r.Status != http.StatusOK {
			t.Fatalf("accepting an invite from before: %s", describe(r))
		}
		if r := inviteStatus(t, s, token); r.Status != http.StatusNotFound {
			t.Fatalf("an accepted invite from before: %s", describe(r))
		}

		// A new invite's token (its e-mail is in the log, without SMTP) is
		// hashed with the invite key.
		mustInvite(t, s, inv.tok, map[string]any{"email": "new@example.com", "redirect_uri": inviteCallback}, false, 72*time.Hour)
		s.waitLog(t, "new@example.com")
		link := regexp.MustCompile(`/invites/([A-Za-z0-9_-]{43})`)
		var newToken string
		eventually(t, 10*time.Second, "no invite link in the log", func() bool {
			m := link.FindStringSubmatch(s.logs.String())
			if m != nil {
				newToken = m[1]
			}
			return m != nil
		})
		hash, _ = oauth.NewHasher([]byte(system), oauth.PurposeInviteToken).Hash(ctx, []byte(newToken))
		if got, err := store.InviteByToken(ctx, hash, persistence.InviteTokenKey); err != nil || got.Email != "new@example.com" {
			t.Fatalf("a new invite is not hashed with the invite key: %+v %v", got, err)
		}
	})
}
