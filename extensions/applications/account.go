package applications

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// identityd's own application (issue 16): its hosted pages that need a
// signed-in person (the HITL approval page, the delegation consent page)
// sign people in through the authorization endpoint like any application,
// as this built-in public client with PKCE. Its client id is reserved
// (no generated id has this form: they carry 26 base32 characters) and it
// is made, or set right, at every start.
const (
	AccountClientID     = "app_identityd"
	AccountCallbackPath = "/account/callback"
	accountName         = "identityd"
)

// ErrReserved refuses admin changes to identityd's own application.
var ErrReserved = extensions.Conflict("reserved_application", "This is identityd's own application; it cannot be changed or deleted.", nil)

// Reserved tells whether a is identityd's own application.
func Reserved(a *persistence.Application) bool { return a.ClientID == AccountClientID }

// EnsureAccount makes identityd's own application, or sets its redirect
// URI to issuer's callback when the issuer changed. Replicas starting
// together may both try: the loser reads the winner's.
func (s *Service) EnsureAccount(ctx context.Context, issuer string) (*persistence.Application, error) {
	callback := issuer + AccountCallbackPath
	existing, err := s.store.GetApplicationByClientID(ctx, AccountClientID)
	if err == nil {
		if slices.Equal(existing.RedirectURIs, []string{callback}) {
			return existing, nil
		}
		return s.store.UpdateApplication(ctx, existing.ID, func(a *persistence.Application) error {
			uris := []string{callback}
			return Input{RedirectURIs: &uris}.apply(a, false)
		})
	} else if !errors.Is(err, persistence.ErrNotFound) {
		return nil, err
	}
	name, typ, uris := accountName, persistence.AppPublic, []string{callback}
	a := &persistence.Application{ID: uuid.Must(uuid.NewV7()).String(), ClientID: AccountClientID}
	if err := (Input{Name: &name, Type: &typ, RedirectURIs: &uris}).apply(a, true); err != nil {
		return nil, err // an issuer no redirect URI may have (http off loopback)
	}
	a.CreatedAt = s.now().Truncate(time.Microsecond)
	a.UpdatedAt = a.CreatedAt
	err = s.store.CreateApplication(ctx, a)
	if errors.Is(err, persistence.ErrDuplicate) {
		return s.store.GetApplicationByClientID(ctx, AccountClientID)
	}
	return a, err
}

// refuseReserved is the check of every admin change by record id.
func (s *Service) refuseReserved(ctx context.Context, id string) error {
	a, err := s.store.GetApplication(ctx, id)
	if err != nil {
		return err
	}
	if Reserved(a) {
		return ErrReserved
	}
	return nil
}
