package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/gorilla/mux"
	"github.com/ulule/limiter/v3"

	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/oauth"
)

// Options is everything the HTTP layer is built from.
type Options struct {
	Provider        *oauth.Provider
	ServiceAccounts *serviceaccounts.Service
	Ping            func(ctx context.Context) error
	Logger          *slog.Logger
	Metrics         *Metrics
	RateLimits      RateLimits
	LimitStore      limiter.Store // nil turns rate limits off
}

type api struct {
	provider        *oauth.Provider
	serviceAccounts *serviceaccounts.Service
	ping            func(ctx context.Context) error
	log             *slog.Logger
	metrics         *Metrics
	limitStore      limiter.Store
	metadataJSON    []byte
}

// New builds the server's handler. Every route is listed here with the scope
// it needs and the limit it counts against; grep a path to find its handler.
func New(o Options) http.Handler {
	a := &api{
		provider: o.Provider, serviceAccounts: o.ServiceAccounts, ping: o.Ping, log: o.Logger,
		metrics: o.Metrics, limitStore: o.LimitStore, metadataJSON: buildMetadata(o.Provider),
	}
	rl := o.RateLimits
	r := mux.NewRouter()
	r.Use(routeName)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, newError(http.StatusNotFound, "not_found", "No such route.", map[string]any{"path": r.URL.Path}))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		allowed := allowedMethods(r, req)
		w.Header().Set("Allow", strings.Join(allowed, ", ")) // RFC 9110 §15.5.6
		writeError(w, req, newError(http.StatusMethodNotAllowed, "method_not_allowed", "The route does not accept this method.",
			map[string]any{"method": req.Method, "allowed": allowed}))
	})

	// Public.
	r.HandleFunc("/health", a.health).Methods(http.MethodGet)
	r.Handle("/metrics", a.metrics.handler()).Methods(http.MethodGet)
	r.HandleFunc("/.well-known/oauth-authorization-server", a.metadata).Methods(http.MethodGet)
	r.HandleFunc("/.well-known/openid-configuration", a.metadata).Methods(http.MethodGet)
	r.HandleFunc(oauth.JWKSPath, a.jwks).Methods(http.MethodGet)

	// OAuth endpoints: the client authenticates in the request itself.
	token := oauthForm(a.limited("token", rl.Token, byClaimedClient, a.token))
	r.HandleFunc(oauth.TokenPath, token).Methods(http.MethodPost)
	r.HandleFunc("/oauth/token", token).Methods(http.MethodPost)
	r.HandleFunc(oauth.IntrospectPath, oauthForm(a.limited("introspect", rl.Introspect, byClaimedClient, a.introspect))).Methods(http.MethodPost)
	r.HandleFunc(oauth.RevokePath, oauthForm(a.limited("introspect", rl.Introspect, byClaimedClient, a.revoke))).Methods(http.MethodPost)

	// Admin API: an admin token.
	admin := func(h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(oauth.ScopeAdmin, a.limited("admin", rl.Admin, byPrincipal, h))
	}
	r.HandleFunc("/api/v1/service-accounts", admin(a.createServiceAccount)).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/service-accounts", admin(a.listServiceAccounts)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/service-accounts/{id}", admin(a.getServiceAccount)).Methods(http.MethodGet)
	r.HandleFunc("/api/v1/service-accounts/{id}", admin(a.updateServiceAccount)).Methods(http.MethodPatch)
	r.HandleFunc("/api/v1/service-accounts/{id}", admin(a.deleteServiceAccount)).Methods(http.MethodDelete)
	r.HandleFunc("/api/v1/service-accounts/{id}/rotate", admin(a.rotateServiceAccount)).Methods(http.MethodPost)

	// M2M API: the scope each route names ("" is any valid token).
	m2mRead := func(scope string, h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated(scope, a.limited("m2m-read", rl.M2MRead, byPrincipal, h))
	}
	r.HandleFunc("/api/v1/m2m/whoami", m2mRead("", a.whoami)).Methods(http.MethodGet)

	return a.outer(r)
}

// allowedMethods lists the methods some route accepts for the request's path.
func allowedMethods(router *mux.Router, req *http.Request) []string {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := req.Clone(req.Context())
		probe.Method = m
		var match mux.RouteMatch
		if router.Match(probe, &match) && match.MatchErr == nil {
			allowed = append(allowed, m)
		}
	}
	return allowed
}
