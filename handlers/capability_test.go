package handlers

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/identityd/identityd/extensions/agents"
	"github.com/identityd/identityd/extensions/serviceaccounts"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

// testProvider is a provider on a fresh SQLite store.
func testProvider(t *testing.T) (*persistence.Store, *oauth.Provider) {
	t.Helper()
	store := dbtest.Store(t, dbtest.URLs(t)["sqlite"])
	keys, err := oauth.LoadKeys(context.Background(), store, []byte("a system secret for this test only"))
	if err != nil {
		t.Fatal(err)
	}
	return store, oauth.NewProvider(oauth.Config{Issuer: "http://test", AccessTokenTTL: time.Hour, SystemSecret: []byte("a system secret for this test only")}, store, keys)
}

// A route that needs a capability refuses an agent without it, at once and
// whatever its token says, and admits service accounts on scope alone.
func TestCapabilityChecks(t *testing.T) {
	ctx := context.Background()
	store, provider := testProvider(t)
	svc := agents.New(store, provider.Hasher)
	a := &api{provider: provider, agents: svc, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: NewMetrics()}
	router := New(Options{Provider: provider, Agents: svc, ServiceAccounts: serviceaccounts.New(store, provider.Hasher),
		Health: store.Health, Logger: a.log, Metrics: a.metrics, RateLimits: DefaultRateLimits()})

	token := func(clientID, secret string) string {
		form := url.Values{"grant_type": {"client_credentials"}, "client_id": {clientID}, "client_secret": {secret}}
		req := httptest.NewRequest(http.MethodPost, oauth.TokenPath, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		router.ServeHTTP(rec, req)
		var out struct {
			AccessToken string `json:"access_token"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.AccessToken == "" {
			t.Fatalf("token: %d %s", rec.Code, rec.Body)
		}
		return out.AccessToken
	}
	tickets := a.authenticated("", agents.ReadTickets, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	call := func(tok string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/tickets", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		tickets(rec, req)
		return rec
	}

	ag, secret, err := svc.Create(ctx, persistence.Actor{ClientID: "test"}, agents.AnyScope, agents.Input{Name: "helpdesk", Type: "autonomous", Capabilities: []string{agents.ReadTickets}})
	if err != nil {
		t.Fatal(err)
	}
	tok := token(ag.ClientID, secret)
	if rec := call(tok); rec.Code != http.StatusNoContent {
		t.Fatalf("agent with the capability: %d %s", rec.Code, rec.Body)
	}
	if _, err := svc.SetCapabilities(ctx, persistence.Actor{ClientID: "test"}, agents.AnyScope, ag.ID, []string{agents.ReadUsers}); err != nil {
		t.Fatal(err)
	}
	rec := call(tok)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), `"error":"insufficient_capability"`) ||
		!strings.Contains(rec.Body.String(), `"requiredCapability":"read_tickets"`) {
		t.Fatalf("agent without the capability: %d %s", rec.Code, rec.Body)
	}

	sa, saSecret, err := serviceaccounts.New(store, provider.Hasher).Create(ctx, serviceaccounts.Input{Name: "backend"})
	if err != nil {
		t.Fatal(err)
	}
	if rec := call(token(sa.ClientID, saSecret)); rec.Code != http.StatusNoContent {
		t.Fatalf("service account: %d %s", rec.Code, rec.Body)
	}
}
