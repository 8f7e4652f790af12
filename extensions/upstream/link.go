package upstream

import (
	"context"
	"errors"

	"github.com/identityd/identityd/persistence"
)

// PendingLink reads the upstream identity a sign-in left waiting to be
// linked, by the handle it answered (LinkRequiredError.Handle); nil for an
// unknown handle. The linking step checks its use, lifetime, account and
// application (signin.InitiateLink).
func (s *Service) PendingLink(ctx context.Context, handle string) (*persistence.UpstreamLink, error) {
	if handle == "" || len(handle) > 128 {
		return nil, nil
	}
	l, err := s.store.UpstreamLinkByHash(ctx, s.LinkHandleHash(handle))
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil
	}
	return l, err
}
