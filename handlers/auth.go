package handlers

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/ory/fosite"

	"github.com/identityd/identityd/oauth"
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
func (a *api) authenticated(scope, capability string, next http.HandlerFunc) http.HandlerFunc {
	accepted := strings.Split(scope, "|") // once per route, not per request
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="identityd"`)
			writeError(w, r, newError(http.StatusUnauthorized, "unauthorized", "An access token is required (Authorization: Bearer).", nil))
			return
		}
		p, err := a.provider.Authenticate(r.Context(), token)
		if errors.Is(err, fosite.ErrServerError) {
			writeError(w, r, err)
			return
		} else if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="invalid_token", error_description="The access token is unknown, expired or revoked."`)
			writeError(w, r, newError(http.StatusUnauthorized, "invalid_token", "The access token is unknown, expired or revoked.", nil))
			return
		}
		if info := infoFrom(r.Context()); info != nil {
			info.principal = p.ClientID()
			if p.Agent != nil {
				info.agent = p
			}
			// Checked once the caller is known, so that an agent's refused
			// call is still on its audit trail.
			if info.intentErr != nil {
				writeError(w, r, info.intentErr)
				return
			}
		}
		if scope != "" && !slices.ContainsFunc(accepted, p.HasScope) {
			details := map[string]any{"requiredScope": accepted[0]}
			if len(accepted) > 1 {
				details["acceptedScopes"] = accepted
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="identityd", error="insufficient_scope", scope="`+accepted[0]+`"`)
			writeError(w, r, newError(http.StatusForbidden, "insufficient_scope", "The access token lacks the scope this call needs.", details))
			return
		}
		if capability != "" && p.Agent != nil && !p.HasCapability(capability) {
			writeError(w, r, newError(http.StatusForbidden, "insufficient_capability", "The agent lacks the capability this call needs.", map[string]any{"requiredCapability": capability}))
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}
