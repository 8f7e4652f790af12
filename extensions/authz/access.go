package authz

import (
	"context"
	"net/http"

	"github.com/identityd/identityd/extensions"
)

// Caller is who calls a per-application M2M route, as the guard sees it.
type Caller struct {
	ServiceAccountID string // the service account holding the token; "" for an agent or a person
	Admin            bool   // the token grants the admin scope
}

// Admit decides a call to an application's per-application routes (spec,
// Authentication 3). A service account needs the admin's grant; one whose
// token grants admin passes without one, since it could make the grant
// itself (docs/decisions.md). Agents and people are not service accounts,
// so no grant can name them: they are refused the same way.
func (e *Engine) Admit(ctx context.Context, appID string, c Caller) error {
	if c.Admin {
		return nil
	}
	if c.ServiceAccountID != "" {
		ok, err := e.Granted(ctx, appID, c.ServiceAccountID)
		if err != nil || ok {
			return err
		}
	}
	return NotGranted(appID)
}

// NotGranted is the spec's 403: the service account is not registered to
// the application.
func NotGranted(appID string) error {
	return extensions.NewError(http.StatusForbidden, "application_not_granted",
		"The service account is not registered to this application: an admin must grant it access (PUT /api/v1/applications/{id}/service-accounts/{serviceAccountId}).",
		map[string]any{"applicationId": appID})
}
