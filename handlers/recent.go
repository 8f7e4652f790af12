package handlers

import (
	"fmt"
	"net/http"
	"time"

	"github.com/identityd/identityd/extensions"
)

// DefaultPrivilegedMaxAge is how recent a person's sign-in must be for a
// credential change when the server is not told otherwise: Ory Kratos's
// privileged session default.
const DefaultPrivilegedMaxAge = 5 * time.Minute

// recent admits a credential change (a passkey added or removed, TOTP
// enrolled, confirmed or turned off, a sign-in method unlinked) only with
// a person's token from a recent sign-in: its auth_time no older than
// a.privilegedMaxAge. A token that leaked, or a device left signed in,
// must not bind a new way into the account. Otherwise 403
// reauthentication_required, with the RFC 9470 step-up challenge: the
// client sends the person through the authorization endpoint with max_age
// (or prompt=login), and the token that answers carries a fresh auth_time.
// It runs after personal: the principal is a person's.
func (a *api) recent(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := principalFrom(r.Context())
		maxAge := a.privilegedMaxAge
		if p.AuthTime.IsZero() || extensions.Now().Sub(p.AuthTime) > maxAge {
			seconds := int64(maxAge / time.Second)
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="identityd", error="insufficient_user_authentication", `+
				`error_description="A more recent authentication is required; sign in again.", max_age=%d`, seconds))
			details := map[string]any{"maxAge": seconds}
			if !p.AuthTime.IsZero() {
				details["authTime"] = isoTime(p.AuthTime)
			}
			writeError(w, r, newError(http.StatusForbidden, "reauthentication_required",
				fmt.Sprintf("This change needs a sign-in from the last %d seconds: sign in again (max_age=%d) and retry with the new token.", seconds, seconds), details))
			return
		}
		next(w, r)
	}
}
