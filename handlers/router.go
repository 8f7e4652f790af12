package handlers

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/analytics"
	"github.com/identityd/identityd/extensions/apikeys"
	"github.com/identityd/identityd/extensions/applications"
	"github.com/identityd/identityd/extensions/authz"
	"github.com/identityd/identityd/extensions/ciba"
	"github.com/identityd/identityd/extensions/directory"
	"github.com/identityd/identityd/extensions/hitl"
	"github.com/identityd/identityd/extensions/invites"
	"github.com/identityd/identityd/extensions/jit"
	"github.com/identityd/identityd/extensions/mfa"
	"github.com/identityd/identityd/extensions/passkeys"
	"github.com/identityd/identityd/extensions/rar"
	"github.com/identityd/identityd/extensions/reset"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/extensions/signin"
	"github.com/identityd/identityd/extensions/upstream"
	"github.com/identityd/identityd/extensions/usage"
	"github.com/identityd/identityd/extensions/webhooks"
	"github.com/identityd/identityd/extensions/workload"
	"github.com/identityd/identityd/handlers/pages"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Options is everything the HTTP layer is built from.
type Options struct {
	Provider        *oauth.Provider
	ServiceAccounts *serviceaccounts.Service
	Applications    *applications.Service
	Agents          *agents.Service
	RAR             *rar.Service
	Workload        *workload.Service
	Directory       *directory.Service
	Invites         *invites.Service
	SignIn          *signin.Service
	MFA             *mfa.Service                                                        // a person's second factor; nil: its routes are not served
	Reset           *reset.Service                                                      // password reset; nil: its routes are not served
	Upstream        *upstream.Service                                                   // upstream sign-in providers; nil: their routes are not served
	Passkeys        *passkeys.Service                                                   // passkeys; nil: their routes are not served
	HITL            *hitl.Service                                                       // human-in-the-loop approvals; nil: their routes are not served
	JIT             *jit.Service                                                        // just-in-time grants; nil: their routes are not served
	Webhooks        *webhooks.Service                                                   // webhook endpoints; nil: their routes are not served
	Authz           *authz.Engine                                                       // fine-grained authorization (OpenFGA); nil: its routes are not served
	Analytics       *analytics.Service                                                  // authentication analytics; nil: their routes are not served
	APIKeys         *apikeys.Service                                                    // end-user API keys; nil (or no Authz): their routes are not served
	Usage           *usage.Counter                                                      // usage counts; nil: not counted, no report
	Tiers           []usage.Tier                                                        // the tiers' numbers (usage.Tiers when nil)
	CSRF            *pages.CSRF                                                         // the hosted pages' form tokens
	AccountSealer   *oauth.Sealer                                                       // seals own-pages sign-in state (PurposeAccountState); nil: those pages do not sign people in
	CIBA            *ciba.Service                                                       // CIBA delegations; nil: their routes are not served
	Health          func(ctx context.Context) persistence.Health                        // the storage's health (persistence.Store.Health)
	Draining        *atomic.Bool                                                        // set when the server begins to shut down
	Units           func(ctx context.Context, fn func(ctx context.Context) error) error // runs fn as one unit of work (persistence.Store.InTx)
	Logger          *slog.Logger
	Metrics         *Metrics
	RateLimits      RateLimits
	LimitStore      limiter.Store // nil turns rate limits off

	// PrivilegedMaxAge is how recent a sign-in a credential change needs
	// (recent.go); 0: DefaultPrivilegedMaxAge.
	PrivilegedMaxAge time.Duration
}

type api struct {
	routes          *mux.Router
	provider        *oauth.Provider
	serviceAccounts *serviceaccounts.Service
	applications    *applications.Service
	agents          *agents.Service
	rar             *rar.Service
	workload        *workload.Service
	directory       *directory.Service
	invites         *invites.Service
	signin          *signin.Service
	mfa             *mfa.Service
	csrf            *pages.CSRF
	cookies         pages.Cookies
	storeHealth     func(ctx context.Context) persistence.Health
	draining        *atomic.Bool
	units           func(ctx context.Context, fn func(ctx context.Context) error) error
	log             *slog.Logger
	metrics         *Metrics
	limitStore      limiter.Store
	tokenLimit      *clientLimit     // token requests of authenticated clients
	introspectLimit *clientLimit     // introspections and revocations of authenticated clients
	authFailures    *failureLimit    // failed client authentications at the OAuth endpoints
	bearerFailures  *failureLimit    // failed bearer authentications on the API
	metadata        map[string]any   // what discovery says, but for the registered RAR types
	refusals        *budget          // unauthenticated token refusals audited, per address
	flows           *budget          // sign-in flows begun, per address
	signinLimit     *limiter.Limiter // posts of the sign-in forms, per address; nil: off
	signinFailures  *failureLimit    // failed sign-ins, per address and per e-mail
	sends           *failureLimit    // e-mailed codes and links, per address and per e-mail
	links           *failureLimit    // account linking, per address and per e-mail
	embeddedLimit   *limiter.Limiter // the embedded sign-in API, per address; nil: off
	upstream        *upstream.Service
	passkeys        *passkeys.Service
	hitl            *hitl.Service
	jit             *jit.Service
	webhooks        *webhooks.Service
	reset           *reset.Service
	accountSealer   *oauth.Sealer
	ciba            *ciba.Service
	backchannel     *clientLimit     // backchannel requests, per authenticated agent
	backchannelAsks *limiter.Limiter // backchannel requests, per agent and person asked; nil: off
	resetRequests   *failureLimit    // forgot-password requests, per address and per e-mail address
	resetTokens     *limiter.Limiter // reset token checks, per address; nil: off
	authz           *authz.Engine
	analytics       *analytics.Service
	apiKeys         *apikeys.Service
	usage           *usage.Counter
	tiers           map[string]*tierLimit // nil when rate limits are off
	tierList        []usage.Tier

	privilegedMaxAge time.Duration // how recent a sign-in a credential change needs (recent.go)
}

// New builds the server's handler: newRouter's routes inside the outer
// middleware (request id, body limit, recovery, log line, metrics).
func New(o Options) http.Handler {
	a, r := newRouter(o)
	return a.outer(r)
}

// newRouter builds the router. Every route is listed here with the scope
// it needs and the limit it counts against; grep a path to find its handler.
// Tests walk it to check that openapi.json documents every route.
func newRouter(o Options) (*api, *mux.Router) {
	a := &api{
		provider: o.Provider, serviceAccounts: o.ServiceAccounts, applications: o.Applications, agents: o.Agents, rar: o.RAR, workload: o.Workload, directory: o.Directory, invites: o.Invites, storeHealth: o.Health, draining: o.Draining, units: o.Units, log: o.Logger,
		metrics: o.Metrics, limitStore: o.LimitStore, metadata: buildMetadata(o.Provider), refusals: newBudget(refusalAudit),
		signin: o.SignIn, mfa: o.MFA, reset: o.Reset, csrf: o.CSRF, upstream: o.Upstream, passkeys: o.Passkeys, hitl: o.HITL, jit: o.JIT, webhooks: o.Webhooks, authz: o.Authz, analytics: o.Analytics, cookies: pages.NewCookies(o.Provider.Issuer), flows: newBudget(flowsPerMinute),
		accountSealer: o.AccountSealer, ciba: o.CIBA, apiKeys: o.APIKeys, usage: o.Usage, tierList: o.Tiers,
		privilegedMaxAge: cmp.Or(o.PrivilegedMaxAge, DefaultPrivilegedMaxAge),
	}
	if a.tierList == nil {
		a.tierList = usage.Tiers()
	}
	a.tiers = a.newTierLimits(a.tierList)
	if a.ciba != nil { // CIBA Core §4
		a.metadata["backchannel_authentication_endpoint"] = strings.TrimSuffix(o.Provider.Issuer, "/") + BackchannelPath
		a.metadata["backchannel_token_delivery_modes_supported"] = []string{"poll"}
		a.metadata["backchannel_user_code_parameter_supported"] = false
	}
	rl := o.RateLimits
	a.tokenLimit, a.introspectLimit = a.newClientLimit("token", rl.Token), a.newClientLimit("introspect", rl.Introspect)
	a.backchannel = a.newClientLimit("backchannel", rl.Backchannel)
	a.authFailures, a.bearerFailures = a.newFailureLimit("auth-failure", rl.AuthFailures, claimedClientID), a.newFailureLimit("bearer-failure", rl.AuthFailures, nil)
	if a.limitStore != nil {
		a.signinLimit = limiter.New(a.limitStore, rl.SignIn)
		a.signinFailures = a.newFailureLimit("signin-failure", rl.SignIn, nil)
		a.signinFailures.claims = limiter.New(a.limitStore, rl.SignInEmail)
		a.sends = a.newFailureLimit("send", rl.Send, nil)
		a.links = a.newFailureLimit("link", rl.Link, nil)
		a.links.claims = limiter.New(a.limitStore, rl.LinkEmail)
		a.sends.claims = limiter.New(a.limitStore, rl.SendEmail)
		a.embeddedLimit = limiter.New(a.limitStore, rl.Embedded)
		a.backchannelAsks = limiter.New(a.limitStore, rl.BackchannelPerson)
	}
	r := mux.NewRouter()
	a.routes = r // hitl.go matches the call an approval names against it
	r.Use(routeName)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, newError(http.StatusNotFound, "not_found", "No such route.", map[string]any{"path": loggablePath(r.URL.Path)}))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		allowed := allowedMethods(r, req)
		w.Header().Set("Allow", strings.Join(allowed, ", ")) // RFC 9110 §15.5.6
		if oauthPaths[req.URL.Path] {
			writeOAuthError(w, http.StatusMethodNotAllowed, "invalid_request", "The endpoint accepts POST only.")
			return
		}
		writeError(w, req, newError(http.StatusMethodNotAllowed, "method_not_allowed", "The route does not accept this method.",
			map[string]any{"method": req.Method, "allowed": allowed}))
	})

	// Public. Public reads answer HEAD as GET (net/http sends no body):
	// link checkers and previews send HEAD to e-mailed links.
	r.HandleFunc("/health", a.health).Methods(http.MethodGet, http.MethodHead)
	r.Handle("/metrics", a.metrics.handler()).Methods(http.MethodGet)
	r.HandleFunc("/.well-known/oauth-authorization-server", a.discovery).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/.well-known/openid-configuration", a.discovery).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(oauth.JWKSPath, a.jwks).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/api/v1/openapi.json", a.openAPI).Methods(http.MethodGet, http.MethodHead)

	// OAuth endpoints: the client authenticates in the request itself. Its
	// failures count per address and per claimed client (a.authFailures);
	// an authenticated client's requests count against rl.Token (token) or
	// rl.Introspect (introspection, revocation): see ratelimit.go.
	r.HandleFunc(oauth.TokenPath, oauthForm(a.token)).Methods(http.MethodPost)
	r.HandleFunc("/oauth/token", oauthForm(a.token)).Methods(http.MethodPost)
	r.HandleFunc(oauth.IntrospectPath, oauthForm(a.introspect)).Methods(http.MethodPost)
	// Userinfo: a person's access token (Bearer), failures per address.
	r.HandleFunc(oauth.UserinfoPath, a.userinfo).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc(oauth.RevokePath, oauthForm(a.revoke)).Methods(http.MethodPost)

	// The authorization endpoint and RP-initiated logout (authorize.go),
	// and the hosted sign-in pages (signin.go): browsers, not API clients.
	// Sign-in form posts count against rl.SignIn per address; failed
	// sign-ins against rl.SignInEmail per e-mail address (signinPassword).
	r.HandleFunc(oauth.AuthorizePath, a.authorize).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc("/oauth/authorize", a.authorize).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc(oauth.EndSessionPath, a.endSession).Methods(http.MethodGet, http.MethodPost)
	r.HandleFunc(signoutPath, a.signOut).Methods(http.MethodPost)
	r.PathPrefix(pages.AssetsPath+"/").Handler(pages.Assets()).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(signinPath, a.signinPage).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(signinEmailPath, a.signinLimited(a.signinEmail)).Methods(http.MethodPost)
	r.HandleFunc(signinPasswordPath, a.signinLimited(a.signinPassword)).Methods(http.MethodPost)
	r.HandleFunc(signinRestartPath, a.signinLimited(a.signinRestart)).Methods(http.MethodPost)
	r.HandleFunc(signinResumePath, a.signinResume).Methods(http.MethodGet)
	// E-mailed codes and links (passwordless.go): sends count against
	// rl.Send per address and rl.SendEmail per e-mail address; wrong codes
	// as wrong passwords. A magic link's GET only shows a button.
	r.HandleFunc(signinMethodPath, a.signinLimited(a.signinMethod)).Methods(http.MethodPost)
	r.HandleFunc(signinOTPPath, a.signinLimited(a.signinOTP)).Methods(http.MethodPost)
	r.HandleFunc(signinMFAPath, a.signinLimited(a.signinMFA)).Methods(http.MethodPost)
	// Passkeys on the hosted page (passkeypage.go): both posts count as
	// sign-in form posts; refused passkeys as wrong passwords, per person.
	if a.passkeys != nil {
		r.HandleFunc(signinPasskeyOptionsPath, a.signinLimited(a.signinPasskeyOptions)).Methods(http.MethodPost)
		r.HandleFunc(signinPasskeyPath, a.signinLimited(a.signinPasskey)).Methods(http.MethodPost)
	}
	r.HandleFunc(signin.MagicLinkPath, a.magicLinkPage).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(signin.MagicLinkPath, a.signinLimited(a.magicLinkConfirm)).Methods(http.MethodPost)
	// The embedded sign-in API (embedded.go): every call counts against
	// rl.Embedded per address; failures share rl.SignInEmail with the
	// hosted page; sends count as the hosted page's do.
	a.embeddedRoutes(r)
	// Upstream sign-in providers (upstream.go): the "Continue with …"
	// button and the callback count as sign-in form posts (rl.SignIn), the
	// embedded start route as an embedded call.
	a.upstreamRoutes(r)
	// Password reset (reset.go): forgot-password requests count against
	// rl.ResetRequest per address and rl.ResetRequestEmail per e-mail
	// address; token checks against rl.ResetToken per address.
	a.resetRoutes(r, rl)
	// Account linking (linking.go).
	a.linkRoutes(r, rl)
	// The HITL approval page (approvalpage.go).
	a.approvalRoutes(r, rl)
	// Sign-in for identityd's own pages (account.go): the callback counts
	// as a sign-in form post per address.
	if a.accountSealer != nil && a.signin != nil {
		r.HandleFunc(applications.AccountCallbackPath, a.signinLimited(a.accountCallback)).Methods(http.MethodGet)
	}
	// CIBA: the backchannel endpoint, the consent page and the delegation
	// routes (ciba.go).
	a.cibaRoutes(r, rl)

	// Every route below names the scope its token needs and, for agents, the
	// capability ("" for none), and the limit it counts against.
	guarded := a.guarded
	admin := func(h http.HandlerFunc) http.HandlerFunc { return guarded(oauth.ScopeAdmin, "", "admin", rl.Admin, h) }

	r.HandleFunc("/api/v1/service-accounts", admin(a.createServiceAccount)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/service-accounts", admin(a.listServiceAccounts)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/service-accounts/{id}", admin(a.getServiceAccount)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/service-accounts/{id}", admin(a.updateServiceAccount)).Methods(http.MethodPatch)
	r.HandleFunc("/api/v1/service-accounts/{id}", admin(a.deleteServiceAccount)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/service-accounts/{id}/rotate", admin(a.rotateServiceAccount)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/service-accounts/{id}/limits/reset", admin(a.resetServiceAccountLimits)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/applications", admin(a.createApplication)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/applications", admin(a.listApplications)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/applications/{id}", admin(a.getApplication)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/applications/{id}", admin(a.updateApplication)).Methods(http.MethodPatch)
	r.HandleFunc("/api/v1/applications/{id}", admin(a.deleteApplication)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/applications/{id}/rotate", admin(a.rotateApplication)).Methods(http.MethodPost)
	if a.upstream != nil {
		r.HandleFunc(identityProvidersPath, admin(a.createIdentityProvider)).Methods(http.MethodPost)
		r.HandleFunc(identityProvidersPath, admin(a.listIdentityProviders)).Methods(http.MethodGet)
		r.HandleFunc(identityProvidersPath+"/{id}", admin(a.getIdentityProvider)).Methods(http.MethodGet)
		r.HandleFunc(identityProvidersPath+"/{id}", admin(a.updateIdentityProvider)).Methods(http.MethodPatch)
		r.HandleFunc(identityProvidersPath+"/{id}", admin(a.deleteIdentityProvider)).Methods(http.MethodDelete)
	}
	r.HandleFunc("/api/v1/keys", admin(a.listKeys)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/keys/rotate", admin(a.rotateKeys)).Methods(http.MethodPost)

	// Human-in-the-loop approvals (hitl.go), before /agents/{id}.
	a.hitlRoutes(r, rl)
	// Just-in-time privileges (jit.go).
	a.jitRoutes(r, rl)
	// Webhook endpoints and their deliveries (webhooks.go).
	a.webhookRoutes(r, rl)

	agentsRead := func(h http.HandlerFunc) http.HandlerFunc { return guarded("agents:read", "", "admin", rl.Admin, h) }
	agentsWrite := func(h http.HandlerFunc) http.HandlerFunc { return guarded("agents:write", "", "admin", rl.Admin, h) }
	r.HandleFunc("/api/v1/agents", agentsWrite(a.createAgent)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/agents", agentsRead(a.listAgents)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/agents/{id}", agentsRead(a.getAgent)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/agents/{id}", agentsWrite(a.updateAgent)).Methods(http.MethodPatch)
	r.HandleFunc("/api/v1/agents/{id}", agentsWrite(a.deleteAgent)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/agents/{id}/capabilities", agentsRead(a.getAgentCapabilities)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/agents/{id}/capabilities", agentsWrite(a.setAgentCapabilities)).Methods(http.MethodPut)
	r.HandleFunc("/api/v1/agents/{id}/audit", agentsRead(a.agentAudit)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/agents/{id}/trust", admin(a.changeAgentTrust)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/agents/{id}/kill", admin(a.killAgent)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/agents/{id}/recover", admin(a.recoverAgent)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/agents/{id}/kill-events", admin(a.agentKillEvents)).Methods(http.MethodGet)

	r.HandleFunc("/api/v1/audit/intent/tasks/{taskId}", admin(a.intentTask)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/audit/intent/chains/{chainId}", admin(a.intentChain)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/audit/intent/chains/{chainId}/trace", admin(a.intentChain)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/audit/intent/search", admin(a.intentSearch)).Methods(http.MethodGet)

	// Any valid token may read the RAR registry and dry-run details; only
	// admins change it.
	anyToken := func(h http.HandlerFunc) http.HandlerFunc { return guarded("", "", "m2m-read", rl.M2MRead, h) }
	r.HandleFunc("/api/v1/rar/types", admin(a.createRARType)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/rar/types", anyToken(a.listRARTypes)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/rar/types/{type}", anyToken(a.getRARType)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/rar/types/{type}", admin(a.replaceRARType)).Methods(http.MethodPut)
	r.HandleFunc("/api/v1/rar/types/{type}", admin(a.deleteRARType)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/rar/validate", anyToken(a.validateRAR)).Methods(http.MethodPost)

	const issuers, mappings = "/api/v1/workload-identity/issuers", "/api/v1/workload-identity/mappings"
	r.HandleFunc(issuers, admin(a.createIssuer)).Methods(http.MethodPost)
	r.HandleFunc(issuers, admin(a.listIssuers)).Methods(http.MethodGet)
	r.HandleFunc(issuers+"/{id}", admin(a.getIssuer)).Methods(http.MethodGet)
	r.HandleFunc(issuers+"/{id}", admin(a.updateIssuer)).Methods(http.MethodPatch)
	r.HandleFunc(issuers+"/{id}", admin(a.deleteIssuer)).Methods(http.MethodDelete)
	r.HandleFunc(mappings, admin(a.createMapping)).Methods(http.MethodPost)
	r.HandleFunc(mappings, admin(a.listMappings)).Methods(http.MethodGet)
	r.HandleFunc(mappings+"/{id}", admin(a.getMapping)).Methods(http.MethodGet)
	r.HandleFunc(mappings+"/{id}", admin(a.deleteMapping)).Methods(http.MethodDelete)

	r.HandleFunc("/api/v1/m2m/whoami", anyToken(a.whoami)).Methods(http.MethodGet)

	// The directory over the M2M API: reads, writes and deletes count
	// against the spec's three M2M limits; user routes also check an
	// agent's capability at the call (spec: Agent).
	// An agent's call that a HITL policy matches needs a token redeemed
	// from an approval (hitl.go: gated, m2mActions).
	m2m := func(scope, capability, class string, rate Rate, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, capability, a.limited(class, rate, byPrincipal, a.gated(a.committed(h))))
	}
	read := func(scope, capability string, h http.HandlerFunc) http.HandlerFunc {
		return m2m(scope, capability, "m2m-read", rl.M2MRead, h)
	}
	write := func(scope, capability string, h http.HandlerFunc) http.HandlerFunc {
		return m2m(scope, capability, "m2m-write", rl.M2MWrite, h)
	}
	del := func(scope, capability string, h http.HandlerFunc) http.HandlerFunc {
		return m2m(scope, capability, "m2m-delete", rl.M2MDelete, h)
	}
	r.HandleFunc("/api/v1/m2m/users", read("users:read", agents.ReadUsers, a.listUsers)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/users", write("users:write", agents.WriteUsers, a.createUser)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/m2m/users/invite", write("users:invite", "", a.createInvite)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/m2m/users/{id}", read("users:read", agents.ReadUsers, a.getUser)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/users/{id}", write("users:write", agents.WriteUsers, a.updateUser)).Methods(http.MethodPatch)
	r.HandleFunc("/api/v1/m2m/users/{id}", del("users:admin", agents.ManageSessions, a.deleteUser)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/users/{id}/sessions", read("users:admin", agents.ManageSessions, a.listUserSessions)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/users/{id}/sessions", del("users:admin", agents.ManageSessions, a.endUserSessions)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/users/{id}/roles", read("roles:read|roles:manage", "", a.userRoles)).Methods(http.MethodGet)
	// Console administration: the admin's only, never a directory role
	// (DESIGN: admin token).
	r.HandleFunc("/api/v1/m2m/users/{id}/console-admin", admin(a.setConsoleAdmin(true))).Methods(http.MethodPut)
	r.HandleFunc("/api/v1/m2m/users/{id}/console-admin", admin(a.setConsoleAdmin(false))).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/orgs", read("orgs:read", "", a.listOrgs)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/orgs", write("orgs:write", "", a.createOrg)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/m2m/orgs/{id}", read("orgs:read", "", a.getOrg)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/orgs/{id}", write("orgs:write", "", a.updateOrg)).Methods(http.MethodPatch)
	r.HandleFunc("/api/v1/m2m/orgs/{id}", del("orgs:write", "", a.deleteOrg)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/orgs/{id}/members", read("orgs:read", "", a.listMembers)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/orgs/{id}/members", write("orgs:write", "", a.addMember)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/m2m/orgs/{id}/members/{userId}", del("orgs:write", "", a.removeMember)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/roles", read("roles:read|roles:manage", "", a.listRoles)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/m2m/roles", write("roles:manage", "", a.createRole)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/m2m/roles/assign", write("roles:manage", "", a.changeRole(true))).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/m2m/roles/remove", del("roles:manage", "", a.changeRole(false))).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/roles/{name}", del("roles:manage", "", a.deleteRole)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/m2m/invites/{token}/accept", write("users:invite", "", a.acceptInvite)).Methods(http.MethodPost)

	// Authentication analytics (analytics.go): reads of the event log.
	if a.analytics != nil {
		r.HandleFunc("/api/v1/m2m/analytics/overview", read("analytics:read", agents.ReadAnalytics, a.analyticsOverview)).Methods(http.MethodGet)
		r.HandleFunc("/api/v1/m2m/analytics/events", read("analytics:read", agents.ReadAnalytics, a.analyticsEvents)).Methods(http.MethodGet)
		r.HandleFunc("/api/v1/m2m/analytics/users/active", read("analytics:read", agents.ReadAnalytics, a.analyticsActiveUsers)).Methods(http.MethodGet)
	}
	// Fine-grained authorization, the grants of applications to service
	// accounts and the per-application M2M routes (authz.go).
	a.authzRoutes(r, rl)
	// End-user API keys of applications (apikeys.go), and usage reports
	// (usage.go): an admin reads any account's, analytics:read one's own.
	a.apiKeyRoutes(r, rl)
	if a.usage != nil {
		r.HandleFunc("/api/v1/m2m/usage", read("analytics:read|"+oauth.ScopeAdmin, agents.ReadAnalytics, a.usageReport)).Methods(http.MethodGet)
	}

	// A person's own second factor (mfa.go): user tokens only.
	a.mfaRoutes(r, rl)
	// Passkeys (passkeys.go).
	a.passkeyRoutes(r, rl)

	// Invite links and status: public, limited per address.
	public := func(h http.HandlerFunc) http.HandlerFunc { return a.limited("public", rl.Public, byIP, h) }
	r.HandleFunc("/api/v1/invites/{token}", public(a.inviteStatus)).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc(invites.FollowPath+"{token}", public(a.followInvite)).Methods(http.MethodGet, http.MethodHead)

	return a, r
}

// allowedMethods lists the methods some route accepts for the request's path.
func allowedMethods(router *mux.Router, req *http.Request) []string {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := req.Clone(req.Context())
		probe.Method = m
		var match mux.RouteMatch
		if router.Match(probe, &match) && match.MatchErr == nil {
			allowed = append(allowed, m)
		}
	}
	return allowed
}

// guarded is a route that needs a token with scope and, for agents, the
// capability ("" for none), and counts against class's rate per principal.
func (a *api) guarded(scope, capability, class string, rate Rate, h http.HandlerFunc) http.HandlerFunc {
	return a.authenticated(scope, capability, a.limited(class, rate, byPrincipal, a.committed(h)))
}
