package persistence_test

import (
	"context"
	"net/url"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ory/fosite"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// BenchmarkPasskeySignInWrites measures what a passkey sign-in through the
// embedded API costs the store's writer alone, without HTTP, JSON or the
// assertion's signature: 32 goroutines each write, as one flow of the group
// commit, what the server writes for such a sign-in (the passkey's counter,
// the person's last sign-in, the SSO session, the sign_in event, the
// unlocated risk entry, the code with its PKCE and OpenID Connect parts).
// Two people per goroutine, one at a time per goroutine, so that every
// counter only goes forward. It reports sign-ins per second; on
// SQLite that is the single writer's limit, which bounds loadgen's passkey
// phase (docs/benchmarks.md).
func BenchmarkPasskeySignInWrites(b *testing.B) {
	for name, dbURL := range dbtest.URLs(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			f := newFlowFixture(b, dbtest.Like(b, dbURL)) // b.N grows over runs of one database each
			s, g := f.s, f.s.Grouped()
			type person struct {
				user    *persistence.User
				passkey string
				count   int64
			}
			parallelism := max(1, 32/runtime.GOMAXPROCS(0)) // 32 goroutines on two CPUs, as loadgen's clients
			people := make([]*person, 2*parallelism*runtime.GOMAXPROCS(0))
			for i := range people {
				u := newUser(uuid.NewString() + "@example.com")
				if err := s.CreateUser(ctx, u); err != nil {
					b.Fatal(err)
				}
				p := &persistence.Passkey{ID: uuid.NewString(), CredentialID: []byte(uuid.NewString()), UserID: u.ID, Name: "Laptop",
					PublicKey: make([]byte, 77), AAGUID: make([]byte, 16), Transports: persistence.StringList{"internal"},
					Attachment: "platform", DeviceType: "desktop", Status: persistence.PasskeyActive, CreatedAt: now()}
				if err := s.CreatePasskey(ctx, p); err != nil {
					b.Fatal(err)
				}
				people[i] = &person{user: u, passkey: p.ID}
			}
			const agent = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
			signIn := func(p *person) error {
				at := now()
				ss := newSSOSession(p.user.ID, uuid.NewString(), at)
				ss.ApplicationID, ss.AMR, ss.ACR, ss.IP, ss.UserAgent = &f.client.RecordID, persistence.StringList{"hwk", "user", "mfa"}, "mfa", "127.0.0.1", agent
				signedIn := persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: persistence.EventSignIn, UserID: &p.user.ID,
					ApplicationID: &f.client.RecordID, ClientID: f.client.ID, SessionID: &ss.ID, IP: "127.0.0.1", UserAgent: agent,
					Data: persistence.JSONObject{"method": "hwk", "mfa": true}, CreatedAt: at}
				o := persistence.Opening{Session: ss,
					Events:  []persistence.AuthEvent{signedIn},
					Passkey: &persistence.PasskeyUse{PasskeyID: p.passkey, Seen: p.count, Count: p.count + 1},
					Risk:    &persistence.RiskSignIn{UserID: p.user.ID, Location: persistence.SignInLocation{At: at}, Keep: 20},
				}
				fctx, err := g.BeginTX(ctx)
				if err != nil {
					return err
				}
				if err := s.OpenSession(fctx, o); err != nil {
					return err
				}
				req := f.request(url.Values{"redirect_uri": {"https://app.example.com/callback"}, "code_challenge": {uuid.NewString()}})
				req.Session.(*personSession).SessionID = ss.ID
				req.ID = uuid.Must(uuid.NewV7()).String() // as oauth.Provider makes them
				sig := uuid.NewString()
				for _, create := range []func(context.Context, string, fosite.Requester) error{
					g.CreateAuthorizeCodeSession, g.CreatePKCERequestSession, g.CreateOpenIDConnectSession} {
					if err := create(fctx, sig, req); err != nil {
						return err
					}
				}
				if err := g.Commit(fctx); err != nil {
					return err
				}
				p.count++
				return nil
			}
			var next atomic.Int64
			b.SetParallelism(parallelism)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine takes two people of its own and alternates.
				i := int(next.Add(1) - 1)
				mine := []*person{people[2*i], people[2*i+1]}
				for n := 0; pb.Next(); n++ {
					if err := signIn(mine[n%2]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "sign-ins/s")
		})
	}
}
