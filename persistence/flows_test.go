package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"
	"github.com/ory/fosite/handler/openid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// personSession is a fosite session bound to an SSO session, as
// oauth.Session is.
type personSession struct {
	openid.DefaultSession
	SessionID string `json:"session_id,omitempty"`
}

func (s *personSession) SSOSessionID() string { return s.SessionID }

func (s *personSession) Clone() fosite.Session {
	c := *s
	return &c
}

// flowFixture is an application, a person and their SSO session.
type flowFixture struct {
	s      *persistence.Store
	client *persistence.Client
	user   *persistence.User
	sso    *persistence.SSOSession
}

func newFlowFixture(t testing.TB, dbURL string) *flowFixture {
	t.Helper()
	ctx := context.Background()
	s := openStore(t, dbURL)
	app := newApplication("app_flows")
	user := newUser("ada@example.com")
	if err := s.CreateApplication(ctx, app); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	sso := newSSOSession(user.ID, "cookie-"+user.ID, now())
	if err := s.OpenSession(ctx, persistence.Opening{Session: sso}); err != nil {
		t.Fatal(err)
	}
	c, err := s.GetClient(ctx, app.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	return &flowFixture{s: s, client: c.(*persistence.Client), user: user, sso: sso}
}

// request is a person's authorization request, with every expiry set.
func (f *flowFixture) request(form url.Values) *fosite.Request {
	req := fosite.NewRequest()
	req.ID = uuid.NewString()
	req.RequestedAt = now()
	req.Client = f.client
	req.RequestedScope = fosite.Arguments{"openid", "email", "offline_access"}
	req.GrantedScope = fosite.Arguments{"openid", "offline_access"}
	req.Form = form
	sess := &personSession{SessionID: f.sso.ID}
	sess.Subject = f.user.ID
	for _, kind := range []fosite.TokenType{fosite.AuthorizeCode, fosite.AccessToken, fosite.RefreshToken} {
		sess.SetExpiresAt(kind, time.Now().Add(time.Hour))
	}
	req.Session = sess
	return req
}

func TestAuthorizationCodes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		req := f.request(url.Values{"redirect_uri": {"https://app.example.com/callback"}})

		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-code", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("unknown code: %v", err)
		}
		if err := s.CreatePKCERequestSession(ctx, "sig-code", req); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("PKCE before its code: %v", err)
		}
		if err := s.CreateAuthorizeCodeSession(ctx, "sig-code", req); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetAuthorizeCodeSession(ctx, "sig-code", &personSession{})
		if err != nil {
			t.Fatal(err)
		}
		sess := got.GetSession().(*personSession)
		if got.GetID() != req.ID || got.GetClient().GetID() != "app_flows" || !slices.Equal(got.GetGrantedScopes(), req.GrantedScope) ||
			!slices.Equal(got.GetRequestedScopes(), req.RequestedScope) || got.GetRequestForm().Get("redirect_uri") != "https://app.example.com/callback" ||
			sess.Subject != f.user.ID || sess.SessionID != f.sso.ID {
			t.Fatalf("read back %+v, session %+v", got, sess)
		}

		// PKCE and OpenID Connect requests ride on the code, each with its form.
		pkceReq := f.request(url.Values{"code_challenge": {"abc"}, "code_challenge_method": {"S256"}})
		if err := s.CreatePKCERequestSession(ctx, "sig-code", pkceReq); err != nil {
			t.Fatal(err)
		}
		oidcReq := f.request(url.Values{"nonce": {"n-0123456789"}})
		if err := s.CreateOpenIDConnectSession(ctx, "sig-code", oidcReq); err != nil {
			t.Fatal(err)
		}
		if p, err := s.GetPKCERequestSession(ctx, "sig-code", &personSession{}); err != nil || p.GetRequestForm().Get("code_challenge") != "abc" || p.GetID() != req.ID {
			t.Fatalf("PKCE: %+v %v", p, err)
		}
		if err := s.DeletePKCERequestSession(ctx, "sig-code"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetPKCERequestSession(ctx, "sig-code", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("PKCE after delete: %v", err)
		}

		// Single use: a used code still answers its request, with the error.
		if err := s.InvalidateAuthorizeCodeSession(ctx, "sig-code"); err != nil {
			t.Fatal(err)
		}
		if err := s.InvalidateAuthorizeCodeSession(ctx, "sig-code"); !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
			t.Fatalf("used twice: %v", err)
		}
		got, err = s.GetAuthorizeCodeSession(ctx, "sig-code", &personSession{})
		if !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) || got == nil || got.GetID() != req.ID {
			t.Fatalf("used code: %v %v", got, err)
		}
		// The OpenID Connect request is read after the code is used.
		o, err := s.GetOpenIDConnectSession(ctx, "sig-code", fosite.NewAccessRequest(&personSession{}))
		if err != nil || o.GetRequestForm().Get("nonce") != "n-0123456789" || o.GetSession().(*personSession).Subject != f.user.ID {
			t.Fatalf("OpenID Connect request: %+v %v", o, err)
		}
		if err := s.DeleteOpenIDConnectSession(ctx, "sig-code"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetOpenIDConnectSession(ctx, "sig-code", fosite.NewAccessRequest(&personSession{})); !errors.Is(err, openid.ErrNoSessionFound) {
			t.Fatalf("OpenID Connect request after delete: %v", err)
		}

		// A code lives no longer than its SSO session.
		live := f.request(nil)
		if err := s.CreateAuthorizeCodeSession(ctx, "sig-live", live); err != nil {
			t.Fatal(err)
		}
		if err := s.EndSSOSession(ctx, f.sso.ID, persistence.AuthEvent{Reason: persistence.SessionEndLogout}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-live", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("code after its session ended: %v", err)
		}
	})
}

// issue stores an access and a refresh token of req's family as fosite's
// code exchange does: in one unit of work, after the code's use.
func issue(t *testing.T, s *persistence.Store, req *fosite.Request, access, refresh string) {
	t.Helper()
	err := s.InTx(context.Background(), func(ctx context.Context) error {
		if err := s.CreateAccessTokenSession(ctx, access, req); err != nil {
			return err
		}
		if refresh == "" {
			return nil
		}
		return s.CreateRefreshTokenSession(ctx, refresh, access, req)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRefreshTokens(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		req := f.request(nil)
		at0, at1 := persistence.TokenKeyPrefix(time.Now())+"access-0", persistence.TokenKeyPrefix(time.Now())+"access-1"
		issue(t, s, req, at0, "refresh-0")

		got, err := s.GetRefreshTokenSession(ctx, "refresh-0", &personSession{})
		if err != nil || got.GetID() != req.ID || got.GetSession().(*personSession).SessionID != f.sso.ID || !slices.Equal(got.GetGrantedScopes(), req.GrantedScope) {
			t.Fatalf("read back %+v %v", got, err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh-none", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("unknown: %v", err)
		}

		// Rotation: the used token turns inactive, the refresh is logged.
		err = s.InTx(ctx, func(ctx context.Context) error {
			if err := s.RotateRefreshToken(ctx, req.ID, "refresh-0"); err != nil {
				return err
			}
			if err := s.CreateAccessTokenSession(ctx, at1, req); err != nil {
				return err
			}
			return s.CreateRefreshTokenSession(ctx, "refresh-1", at1, req)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RotateRefreshToken(ctx, req.ID, "refresh-0"); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Fatalf("rotated twice: %v", err)
		}
		old, err := s.GetRefreshTokenSession(ctx, "refresh-0", &personSession{})
		if !errors.Is(err, fosite.ErrInactiveToken) || old == nil || old.GetID() != req.ID {
			t.Fatalf("rotated token: %v %v", old, err)
		}
		if _, err := s.GetAccessTokenSession(ctx, at0, &personSession{}); err != nil {
			t.Fatalf("the access token issued before the rotation lives on: %v", err)
		}

		// Reuse: fosite deletes the rotated token; its family goes with it.
		if err := s.DeleteRefreshTokenSession(ctx, "refresh-0"); err != nil {
			t.Fatal(err)
		}
		for _, sig := range []string{"refresh-0", "refresh-1"} {
			if _, err := s.GetRefreshTokenSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("%s after reuse: %v", sig, err)
			}
		}
		for _, sig := range []string{at0, at1} {
			if _, err := s.GetAccessTokenSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("%s after reuse: %v", sig, err)
			}
		}
		if got := authEventTypes(t, s, f.user.ID); !slices.Equal(got, []string{"token_refreshed/", "refresh_reused/"}) {
			t.Fatalf("events: %v", got)
		}
		// Revocation by family, for the revocation endpoint and code replay.
		other := f.request(nil)
		at2 := persistence.TokenKeyPrefix(time.Now()) + "access-2"
		issue(t, s, other, at2, "refresh-2")
		if err := s.RevokeAccessToken(ctx, other.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, at2, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("access token after RevokeAccessToken: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh-2", &personSession{}); err != nil {
			t.Fatalf("refresh token after RevokeAccessToken: %v", err)
		}
		if err := s.RevokeRefreshToken(ctx, other.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh-2", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("refresh token after RevokeRefreshToken: %v", err)
		}
	})
}

// rotate runs a refresh's writes as fosite's refresh grant handler does,
// through the grouped store: rotation, new access and refresh tokens, commit.
func rotate(s *persistence.Store, req *fosite.Request, used, access, refresh string) error {
	return rotateIn(s.Grouped(), req, used, access, refresh)
}

// rotateIn is rotate through r.
func rotateIn(r persistence.Grouped, req *fosite.Request, used, access, refresh string) error {
	ctx, err := r.BeginTX(context.Background())
	if err != nil {
		return err
	}
	err = r.RotateRefreshToken(ctx, req.ID, used)
	if err == nil {
		err = r.CreateAccessTokenSession(ctx, access, req)
	}
	if err == nil {
		err = r.CreateRefreshTokenSession(ctx, refresh, access, req)
	}
	if err != nil {
		_ = r.Rollback(ctx)
		return err
	}
	return r.Commit(ctx)
}

// Refreshes committed together by the group commit: each rotation is
// checked on its own in the shared commit, so of concurrent refreshes with
// one token exactly one wins, and a lost one writes nothing, while the
// others' (distinct tokens) all commit.
func TestGroupedRotations(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		const families, racers = 8, 4
		reqs := make([]*fosite.Request, families)
		prefix := persistence.TokenKeyPrefix(time.Now())
		for i := range reqs {
			reqs[i] = f.request(nil)
			issue(t, s, reqs[i], prefix+"access-"+reqs[i].ID, "refresh-"+reqs[i].ID)
		}
		type result struct {
			family, racer int
			err           error
		}
		results := make(chan result, families*racers)
		for i, req := range reqs {
			for j := range racers {
				go func() {
					tag := req.ID + "-" + string(rune('a'+j))
					results <- result{i, j, rotate(s, req, "refresh-"+req.ID, prefix+"access-"+tag, "refresh-"+tag)}
				}()
			}
		}
		won, winner := make([]int, families), make([]string, families)
		for range families * racers {
			r := <-results
			tag := reqs[r.family].ID + "-" + string(rune('a'+r.racer))
			_, rerr := s.GetRefreshTokenSession(ctx, "refresh-"+tag, &personSession{})
			_, aerr := s.GetAccessTokenSession(ctx, prefix+"access-"+tag, &personSession{})
			switch {
			case r.err == nil:
				won[r.family]++
				winner[r.family] = "refresh-" + tag
				if rerr != nil || aerr != nil {
					t.Errorf("a winner's tokens: %v %v", rerr, aerr)
				}
			case errors.Is(r.err, fosite.ErrInactiveToken):
				if !errors.Is(rerr, fosite.ErrNotFound) || !errors.Is(aerr, fosite.ErrNotFound) {
					t.Errorf("a lost rotation wrote its tokens: %v %v", rerr, aerr)
				}
			default:
				t.Errorf("rotation: %v", r.err)
			}
		}
		for i, n := range won {
			if n != 1 {
				t.Errorf("family %d: %d rotations of one token won", i, n)
			}
			if _, err := s.GetRefreshTokenSession(ctx, "refresh-"+reqs[i].ID, &personSession{}); !errors.Is(err, fosite.ErrInactiveToken) {
				t.Errorf("the used token: %v", err)
			}
		}
		refreshed := 0
		for _, e := range authEventTypes(t, s, f.user.ID) {
			if e == "token_refreshed/" {
				refreshed++
			}
		}
		if refreshed != families {
			t.Errorf("%d token_refreshed events, want %d", refreshed, families)
		}
		// A token of another request, or not stored, does not rotate.
		if err := rotate(s, f.request(nil), winner[0], prefix+"access-x", "refresh-x"); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Errorf("another request's token: %v", err)
		}
		if err := rotate(s, reqs[0], "refresh-none", prefix+"access-y", "refresh-y"); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Errorf("a token not stored: %v", err)
		}
	})
}

// A refresh token used again within the reuse grace window (an answer lost,
// a concurrent refresh) refreshes again, sequentially or concurrently, and
// revokes nothing; after the window its reuse is reuse. The window runs
// from the token's first use.
func TestRefreshReuseGrace(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		prefix := persistence.TokenKeyPrefix(time.Now())
		grace := s.Grouped().WithReuseGrace(time.Minute)

		// Sequential: the retry reads as active and rotates again.
		req := f.request(nil)
		issue(t, s, req, prefix+"access-0", "refresh-0")
		if err := rotateIn(grace, req, "refresh-0", prefix+"access-1", "refresh-1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh-0", &personSession{}); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Fatalf("without the window, the used token: %v", err)
		}
		if _, err := grace.GetRefreshTokenSession(ctx, "refresh-0", &personSession{}); err != nil {
			t.Fatalf("within the window, the used token: %v", err)
		}
		if err := rotateIn(grace, req, "refresh-0", prefix+"access-2", "refresh-2"); err != nil {
			t.Fatalf("the retry: %v", err)
		}
		for _, sig := range []string{"refresh-1", "refresh-2"} {
			if _, err := s.GetRefreshTokenSession(ctx, sig, &personSession{}); err != nil {
				t.Errorf("%s: %v", sig, err)
			}
		}

		// Concurrent: every racer with one token wins.
		const racers = 10
		req = f.request(nil)
		issue(t, s, req, prefix+"access-c", "refresh-c")
		errs := make(chan error, racers)
		for i := range racers {
			go func() {
				errs <- rotateIn(grace, req, "refresh-c", fmt.Sprintf("%saccess-c%d", prefix, i), fmt.Sprintf("refresh-c%d", i))
			}()
		}
		for range racers {
			if err := <-errs; err != nil {
				t.Errorf("a concurrent refresh within the window: %v", err)
			}
		}
		for i := range racers {
			if _, err := s.GetAccessTokenSession(ctx, fmt.Sprintf("%saccess-c%d", prefix, i), &personSession{}); err != nil {
				t.Errorf("access token %d: %v", i, err)
			}
		}

		// After the window, counted from the first use: reuse.
		short := s.Grouped().WithReuseGrace(time.Second)
		req = f.request(nil)
		issue(t, s, req, prefix+"access-s", "refresh-s")
		if err := rotateIn(short, req, "refresh-s", prefix+"access-s1", "refresh-s1"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond)
		if err := rotateIn(short, req, "refresh-s", prefix+"access-s2", "refresh-s2"); err != nil {
			t.Fatalf("within the window: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
		if _, err := short.GetRefreshTokenSession(ctx, "refresh-s", &personSession{}); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Fatalf("after the window: %v", err)
		}
		if err := rotateIn(short, req, "refresh-s", prefix+"access-s3", "refresh-s3"); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Fatalf("a rotation after the window: %v", err)
		}
		// Outside a group commit (a unit of work) alike.
		if err := s.InTx(ctx, func(ctx context.Context) error {
			return grace.RotateRefreshToken(ctx, req.ID, "refresh-s1")
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.InTx(ctx, func(ctx context.Context) error {
			return grace.RotateRefreshToken(ctx, req.ID, "refresh-s1")
		}); err != nil {
			t.Fatalf("again within the window, in a unit of work: %v", err)
		}
		if err := s.InTx(ctx, func(ctx context.Context) error {
			return short.RotateRefreshToken(ctx, req.ID, "refresh-s")
		}); !errors.Is(err, fosite.ErrInactiveToken) {
			t.Fatalf("after the window, in a unit of work: %v", err)
		}
	})
}

// exchange runs a code's exchange as fosite's handlers do in a flow of the
// group commit: the PKCE binding spent, the code used, the tokens issued,
// the OpenID Connect request spent; with refuse, fosite refuses after the
// PKCE check (a wrong verifier) and rolls back.
func exchange(s *persistence.Store, req *fosite.Request, code, access, refresh string, refuse bool) error {
	g := s.Grouped()
	ctx, err := g.BeginTX(context.Background())
	if err != nil {
		return err
	}
	if err := g.DeletePKCERequestSession(ctx, code); err != nil {
		return err
	}
	if refuse {
		return g.Commit(ctx)
	}
	inner, _ := g.BeginTX(ctx) // fosite's own transaction joins the flow
	for _, err := range []error{
		g.InvalidateAuthorizeCodeSession(inner, code),
		g.CreateAccessTokenSession(inner, access, req),
		g.CreateRefreshTokenSession(inner, refresh, access, req),
		g.Commit(inner),
		g.DeleteOpenIDConnectSession(ctx, code),
	} {
		if err != nil {
			return err
		}
	}
	return g.Commit(ctx)
}

// A code's authorization and exchange through the group commit: the code
// with its PKCE and OpenID Connect requests is one row; a refused exchange
// spends the PKCE binding alone; of two exchanges of one code pending at
// once, the second to commit is lost, writes nothing, and revokes what the
// first issued (RFC 6749 §4.1.2).
func TestGroupedCodeExchange(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s, g := f.s, f.s.Grouped()
		req := f.request(url.Values{"redirect_uri": {"https://app.example.com/callback"}, "code_challenge": {"abc"}, "nonce": {"n-0123456789"}})

		actx, err := g.BeginTX(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{
			g.CreateAuthorizeCodeSession(actx, "sig-g", req),
			g.CreatePKCERequestSession(actx, "sig-g", req),
			g.CreateOpenIDConnectSession(actx, "sig-g", req),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-g", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("a code before its flow commits: %v", err)
		}
		if err := g.Commit(actx); err != nil {
			t.Fatal(err)
		}
		if p, err := s.GetPKCERequestSession(ctx, "sig-g", &personSession{}); err != nil || p.GetRequestForm().Get("code_challenge") != "abc" {
			t.Fatalf("PKCE: %v %v", p, err)
		}
		if o, err := s.GetOpenIDConnectSession(ctx, "sig-g", fosite.NewAccessRequest(&personSession{})); err != nil || o.GetRequestForm().Get("nonce") != "n-0123456789" {
			t.Fatalf("OpenID Connect request: %v %v", o, err)
		}

		// Refused: the binding is spent, the code unused.
		prefix := persistence.TokenKeyPrefix(time.Now())
		if err := exchange(s, req, "sig-g", prefix+"at-refused", "rt-refused", true); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetPKCERequestSession(ctx, "sig-g", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("PKCE after a refused exchange: %v", err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-g", &personSession{}); err != nil {
			t.Fatalf("code after a refused exchange: %v", err)
		}

		// Two exchanges pending at once: the first wins, the second is lost.
		req2 := f.request(nil)
		if err := s.CreateAuthorizeCodeSession(ctx, "sig-h", req2); err != nil {
			t.Fatal(err)
		}
		first, second := req2, f.request(nil)
		second.ID = req2.ID
		ctx1, _ := g.BeginTX(ctx)
		ctx2, _ := g.BeginTX(ctx)
		for i, c := range []context.Context{ctx1, ctx2} {
			r := []*fosite.Request{first, second}[i]
			tag := string(rune('1' + i))
			for _, err := range []error{
				g.InvalidateAuthorizeCodeSession(c, "sig-h"),
				g.CreateAccessTokenSession(c, prefix+"at-"+tag, r),
				g.CreateRefreshTokenSession(c, "rt-"+tag, prefix+"at-"+tag, r),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := g.Commit(ctx1); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, prefix+"at-1", &personSession{}); err != nil {
			t.Fatalf("the winner's access token: %v", err)
		}
		if err := g.Commit(ctx2); !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
			t.Fatalf("the second exchange: %v", err)
		}
		for _, sig := range []string{prefix + "at-1", prefix + "at-2"} {
			if _, err := s.GetAccessTokenSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Errorf("access token %s after the code's second use: %v", sig, err)
			}
		}
		for _, sig := range []string{"rt-1", "rt-2"} {
			if _, err := s.GetRefreshTokenSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Errorf("refresh token %s after the code's second use: %v", sig, err)
			}
		}
		// The used code keeps the access token it issued, for later replays.
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-h", &personSession{}); !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
			t.Fatalf("used code: %v", err)
		}
		if err := exchange(s, req2, "sig-h", prefix+"at-3", "rt-3", false); !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
			t.Fatalf("a third exchange: %v", err)
		}
	})
}

// A code's replay finds the access token it issued, refresh token or not.
func TestCodeReplayFindsItsAccessToken(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		req := f.request(nil)
		if err := s.CreateAuthorizeCodeSession(ctx, "sig-code", req); err != nil {
			t.Fatal(err)
		}
		at := persistence.TokenKeyPrefix(time.Now()) + "access"
		err := s.InTx(ctx, func(ctx context.Context) error {
			if err := s.InvalidateAuthorizeCodeSession(ctx, "sig-code"); err != nil {
				return err
			}
			return s.CreateAccessTokenSession(ctx, at, req)
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, at, &personSession{}); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeAccessToken(ctx, req.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, at, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("after the replay's revocation: %v", err)
		}
	})
}

// A person's tokens die with their SSO session: ended, or the person deleted.
func TestPersonTokensLiveWithTheirSession(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		req := f.request(nil)
		at := persistence.TokenKeyPrefix(time.Now()) + "access"
		issue(t, s, req, at, "refresh")
		// Read once, so that the token and the session are cached.
		if _, err := s.GetAccessTokenSession(ctx, at, &personSession{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh", &personSession{}); err != nil {
			t.Fatal(err)
		}
		if err := s.EndSSOSession(ctx, f.sso.ID, persistence.AuthEvent{Reason: persistence.SessionEndAdmin}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, at, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("access token after the session ended: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("refresh token after the session ended: %v", err)
		}

		// Another session, then the person is deleted.
		sso := newSSOSession(f.user.ID, "cookie-two", now())
		if err := s.OpenSession(ctx, persistence.Opening{Session: sso}); err != nil {
			t.Fatal(err)
		}
		f.sso = sso
		req = f.request(nil)
		at = persistence.TokenKeyPrefix(time.Now()) + "access-two"
		issue(t, s, req, at, "refresh-two")
		if _, err := s.GetAccessTokenSession(ctx, at, &personSession{}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteUser(ctx, f.user.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAccessTokenSession(ctx, at, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("access token after the person was deleted: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "refresh-two", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("refresh token after the person was deleted: %v", err)
		}
	})
}

func TestExpiredFlowsAreSwept(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s := f.s
		past, live := f.request(nil), f.request(nil)
		past.Session.SetExpiresAt(fosite.AuthorizeCode, time.Now().Add(-time.Minute))
		past.Session.SetExpiresAt(fosite.RefreshToken, time.Now().Add(-time.Minute))
		for i, req := range []*fosite.Request{past, live} {
			sig := []string{"past", "live"}[i]
			if err := s.CreateAuthorizeCodeSession(ctx, sig, req); err != nil {
				t.Fatal(err)
			}
			issue(t, s, req, persistence.TokenKeyPrefix(time.Now())+sig, sig)
		}
		if n, err := s.DeleteExpiredFlows(ctx, time.Now()); err != nil || n != 2 {
			t.Fatalf("swept %d, %v", n, err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "past", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("expired code: %v", err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "past", &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
			t.Fatalf("expired refresh token: %v", err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "live", &personSession{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetRefreshTokenSession(ctx, "live", &personSession{}); err != nil {
			t.Fatal(err)
		}
	})
}

// Signing keys stay published as long as the longest-lived JWT access token.
func TestLongestJWTAccessTTL(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)
		if d, err := s.LongestJWTAccessTTL(ctx); err != nil || d != 0 {
			t.Fatalf("no applications: %v %v", d, err)
		}
		long, short := 7200, 600
		opaque := newApplication("app_opaque")
		opaque.AccessTokenTTL = &long
		jwtShort, jwtDefault := newApplication("app_jwt_short"), newApplication("app_jwt_default")
		jwtShort.AccessTokenFormat, jwtShort.AccessTokenTTL = "jwt", &short
		jwtDefault.AccessTokenFormat = "jwt"
		for _, a := range []*persistence.Application{opaque, jwtShort, jwtDefault} {
			if err := s.CreateApplication(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		if d, err := s.LongestJWTAccessTTL(ctx); err != nil || d != 10*time.Minute {
			t.Fatalf("longest JWT lifetime %v %v, want 10m (opaque applications do not count)", d, err)
		}
	})
}

// A code issued by this process is answered from the cache the first time
// it is asked for; that answer is the one the database gives afterwards,
// PKCE and OpenID Connect requests included, and a replay after its
// exchange still finds it used.
func TestIssuedCodeFromCache(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		f := newFlowFixture(t, dbURL)
		s, g := f.s, f.s.Grouped()
		req := f.request(url.Values{"redirect_uri": {"https://app.example.com/callback"}, "code_challenge": {"abc"}, "nonce": {"n-0123456789"}})
		req.RequestedAudience = fosite.Arguments{"https://api.example.com"}
		actx, _ := g.BeginTX(ctx)
		for _, err := range []error{
			g.CreateAuthorizeCodeSession(actx, "sig-c", req),
			g.CreatePKCERequestSession(actx, "sig-c", req),
			g.CreateOpenIDConnectSession(actx, "sig-c", req),
			g.Commit(actx),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		// read answers the code, its PKCE and its OpenID Connect request in
		// one flow: the first of the three reads the row.
		type answer struct {
			code, pkce, oidc fosite.Requester
		}
		read := func() answer {
			t.Helper()
			fctx, _ := g.BeginTX(ctx)
			var a answer
			var err error
			if a.code, err = g.GetAuthorizeCodeSession(fctx, "sig-c", &personSession{}); err != nil {
				t.Fatal(err)
			}
			if a.pkce, err = g.GetPKCERequestSession(fctx, "sig-c", &personSession{}); err != nil {
				t.Fatal(err)
			}
			if a.oidc, err = g.GetOpenIDConnectSession(fctx, "sig-c", fosite.NewAccessRequest(&personSession{})); err != nil {
				t.Fatal(err)
			}
			return a
		}
		cached, stored := read(), read()
		same := func(what string, a, b fosite.Requester) {
			t.Helper()
			as, bs := a.GetSession().(*personSession), b.GetSession().(*personSession)
			if a.GetID() != b.GetID() || !a.GetRequestedAt().Equal(b.GetRequestedAt()) || a.GetClient().GetID() != b.GetClient().GetID() ||
				!slices.Equal(a.GetRequestedScopes(), b.GetRequestedScopes()) || !slices.Equal(a.GetGrantedScopes(), b.GetGrantedScopes()) ||
				!slices.Equal(a.GetRequestedAudience(), b.GetRequestedAudience()) || !slices.Equal(a.GetGrantedAudience(), b.GetGrantedAudience()) ||
				a.GetRequestForm().Encode() != b.GetRequestForm().Encode() || as.Subject != bs.Subject || as.SessionID != bs.SessionID ||
				!as.GetExpiresAt(fosite.AuthorizeCode).Equal(bs.GetExpiresAt(fosite.AuthorizeCode)) {
				t.Fatalf("%s from the cache %+v, from the database %+v", what, a, b)
			}
		}
		same("code", cached.code, stored.code)
		same("PKCE request", cached.pkce, stored.pkce)
		same("OpenID Connect request", cached.oidc, stored.oidc)
		if cached.code.GetID() != req.GetID() || cached.pkce.GetRequestForm().Get("code_challenge") != "abc" || cached.oidc.GetRequestForm().Get("nonce") != "n-0123456789" {
			t.Fatalf("cached answers: %+v", cached)
		}

		prefix := persistence.TokenKeyPrefix(time.Now())
		if err := exchange(s, req, "sig-c", prefix+"at-c", "rt-c", false); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAuthorizeCodeSession(ctx, "sig-c", &personSession{}); !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
			t.Fatalf("the code after its exchange: %v", err)
		}
		spent := func(sig string) {
			t.Helper()
			if _, err := s.GetPKCERequestSession(ctx, sig, &personSession{}); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("PKCE request of %s: %v", sig, err)
			}
			if _, err := s.GetOpenIDConnectSession(ctx, sig, fosite.NewAccessRequest(&personSession{})); !errors.Is(err, fosite.ErrNotFound) {
				t.Fatalf("OpenID Connect request of %s: %v", sig, err)
			}
		}
		spent("sig-c") // with the guard, in one statement

		// An exchange that loses (the code used meanwhile, its requests not
		// spent) still spends them.
		for _, err := range []error{
			s.CreateAuthorizeCodeSession(ctx, "sig-d", req),
			s.CreatePKCERequestSession(ctx, "sig-d", req),
			s.CreateOpenIDConnectSession(ctx, "sig-d", req),
			s.InvalidateAuthorizeCodeSession(ctx, "sig-d"),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := exchange(s, req, "sig-d", prefix+"at-d", "rt-d", false); !errors.Is(err, fosite.ErrInvalidatedAuthorizeCode) {
			t.Fatalf("exchange of a used code: %v", err)
		}
		spent("sig-d")
	})
}
