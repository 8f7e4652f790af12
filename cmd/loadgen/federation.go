package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// federation is a workload identity issuer in miniature: an RSA key, its
// JWKS served on 127.0.0.1 by this process, and one signed Kubernetes-style
// service-account token per agent, each mapped to its agent in identityd.
type federation struct {
	srv   *http.Server
	forms []string // ready token-exchange request bodies
}

func setupFederation(ctx context.Context, c *client, admin string, agents []account) (*federation, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	jwks, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "bench", Algorithm: "RS256", Use: "sig"}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &federation{srv: &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks)
	})}}
	go func() { _ = f.srv.Serve(ln) }()
	issuerURL := "http://" + ln.Addr().String()

	var issuer struct{ ID string }
	if err := c.adminJSON(ctx, admin, "/api/v1/workload-identity/issuers", map[string]any{
		"name": "bench cluster", "issuerUrl": issuerURL, "jwksUri": issuerURL + "/keys", "platform": "kubernetes",
		"allowedAudiences": []string{"identityd"}, "allowedSubjects": []string{"system:serviceaccount:bench:*"},
	}, &issuer); err != nil {
		f.close()
		return nil, fmt.Errorf("register the issuer: %w", err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "bench"))
	if err != nil {
		f.close()
		return nil, err
	}
	now := time.Now()
	for i, a := range agents {
		sub := fmt.Sprintf("system:serviceaccount:bench:agent-%d", i)
		if err := c.adminJSON(ctx, admin, "/api/v1/workload-identity/mappings", map[string]any{
			"issuerId": issuer.ID, "agentClientId": a.id, "subjectPattern": sub, "scopes": []string{"users:read"},
		}, nil); err != nil {
			f.close()
			return nil, fmt.Errorf("map agent %d: %w", i, err)
		}
		payload, _ := json.Marshal(map[string]any{"iss": issuerURL, "sub": sub, "aud": []string{"identityd"},
			"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(),
			"kubernetes.io": map[string]any{"namespace": "bench", "serviceaccount": map[string]any{"name": fmt.Sprintf("agent-%d", i)}}})
		jws, err := signer.Sign(payload)
		if err != nil {
			f.close()
			return nil, err
		}
		token, _ := jws.CompactSerialize()
		f.forms = append(f.forms, url.Values{
			"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"}, "client_id": {a.id},
			"subject_token": {token}, "subject_token_type": {"urn:ietf:params:oauth:token-type:jwt"},
		}.Encode())
	}
	return f, nil
}

func (f *federation) close() { _ = f.srv.Close() }

// exchange runs one federation exchange: no client authentication, the
// platform token is the credential.
func (c *client) exchange(ctx context.Context, form string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/v1/oauth/token", strings.NewReader(form))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	var out struct {
		AccessToken     string `json:"access_token"`
		IssuedTokenType string `json:"issued_token_type"`
	}
	if err := c.do(req, http.StatusOK, &out); err != nil {
		return err
	}
	if out.AccessToken == "" || out.IssuedTokenType == "" {
		return fmt.Errorf("exchange response without access_token or issued_token_type")
	}
	return nil
}

// adminJSON posts a JSON body with an admin token and expects 201.
func (c *client) adminJSON(ctx context.Context, adminToken, path string, body, out any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, strings.NewReader(string(b)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if out == nil {
		out = &map[string]any{}
	}
	return c.do(req, http.StatusCreated, out)
}
