package handlers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

type principalKey struct{}

func principalFrom(ctx context.Context) *oauth.Principal {
	p, _ := ctx.Value(principalKey{}).(*oauth.Principal)
	return p
}

// bearerToken reads "Authorization: Bearer <token>" (RFC 6750 §2.1; the
// scheme is case-insensitive).
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authenticated admits a request only with a valid access token, and only
// when the token holds scope (unless scope is empty: any valid token; "a|b"
// accepts either, and the first is named when neither is held) and,
// for an agent, its agent holds capability now (unless capability is empty).
// The challenges follow RFC 6750 §3: no error code when no token was sent,
// invalid_token for a bad one, insufficient_scope with the scope needed.
//
// A body is read whole before the handler runs, and the principal checked
// again once it has arrived: a body can take long to trickle in, and a
// kill, revocation, deletion or demotion answered meanwhile must bite
// before the handler changes anything (docs/decisions.md).
func (a *api) authenticated(scope, capability string, next http.HandlerFunc) http.HandlerFunc {
	accepted := strings.Split(scope, "|") // once per route, not per request
	return func(w http.ResponseWriter, r *http.Request) {
		// Failed bearer authentications are limited per address (ratelimit.go).
		if a.bearerFailures.refused(w, r, writeRateLimited) {
			return
		}
		p, err := a.admit(w, r, accepted, capability)
		if err == nil && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			if err = bufferBody(r); err == nil {
				p, err = a.admit(w, r, accepted, capability)
			}
		}
		if err != nil {
			writeError(w, r, err)
			return
		}
		if p.Client.Kind == persistence.KindServiceAccount { // usage tracking: a map increment
			a.usage.Add(persistence.UsageServiceAccount, p.Client.RecordID)
		}
		next(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}

// admit checks the request's bearer token, its scope and the agent's
// capability (see authenticated), setting the challenge of a refusal.
func (a *api) admit(w http.ResponseWriter, r *http.Request, accepted []string, capability string) (*oauth.Principal, error) {
	token, ok := bearerToken(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd"`)
		return nil, newError(http.StatusUnauthorized, "unauthorized", "An access token is required (Authorization: Bearer).", nil)
	}
	p, err := a.provider.Authenticate(r.Context(), token)
	if errors.Is(err, fosite.ErrServerError) {
		return nil, err
	} else if err != nil {
		a.bearerFailures.failed(r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="invalid_token", error_description="The access token is unknown, expired or revoked."`)
		return nil, newError(http.StatusUnauthorized, "invalid_token", "The access token is unknown, expired or revoked.", nil)
	}
	if info := infoFrom(r.Context()); info != nil {
		info.principal = p.ClientID()
		info.agent = nil
		if p.Agent != nil {
			info.agent = p
		}
		// Checked once the caller is known, so that an agent's refused
		// call is still on its audit trail.
		if info.intentErr != nil {
			return nil, info.intentErr
		}
	}
	if accepted[0] != "" && !slices.ContainsFunc(accepted, p.HasScope) && slices.Contains(accepted, oauth.ScopeAdmin) {
		admin, err := a.personIsAdmin(r.Context(), p)
		if err != nil {
			return nil, err
		}
		if admin {
			p.Scopes = append(slices.Clone(p.Scopes), oauth.ScopeAdmin)
		}
	}
	if accepted[0] != "" && !slices.ContainsFunc(accepted, p.HasScope) {
		details := map[string]any{"requiredScope": accepted[0]}
		if len(accepted) > 1 {
			details["acceptedScopes"] = accepted
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="insufficient_scope", scope="`+accepted[0]+`"`)
		return nil, newError(http.StatusForbidden, "insufficient_scope", "The access token lacks the scope this call needs.", details)
	}
	if capability != "" && p.Agent != nil && !p.HasCapability(capability) {
		return nil, newError(http.StatusForbidden, "insufficient_capability", "The agent lacks the capability this call needs.", map[string]any{"requiredCapability": capability})
	}
	return p, nil
}

// bufferBody reads the request body whole (the outer middleware bounds its
// size) and puts it back to be read again from memory.
func bufferBody(r *http.Request) error {
	body, err := io.ReadAll(r.Body)
	var big *http.MaxBytesError
	if errors.As(err, &big) {
		return jsonError(err)
	} else if err != nil {
		return newError(http.StatusBadRequest, "invalid_request", "The request body could not be read.", nil)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return nil
}

// personIsAdmin tells whether p is a person who holds console
// administration now (a flag only an admin gives: directory.SetConsoleAdmin),
// signed in through an application an admin marked adminConsole: such a
// user token acts as an admin token (routes that need the admin scope).
// The flag is read at the call, so taking it bites at once.
func (a *api) personIsAdmin(ctx context.Context, p *oauth.Principal) (bool, error) {
	if p.Client.App == nil || !p.Client.App.AdminConsole || p.SessionID == "" {
		return false, nil
	}
	u, err := a.directory.GetUser(ctx, p.Subject)
	if errors.Is(err, persistence.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return u.ConsoleAdmin, nil
}
