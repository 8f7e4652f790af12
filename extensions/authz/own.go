package authz

import (
	"context"
	"strings"

	openfgav1 "github.com/openfga/api/proto/openfga/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// OwnModel is identityd's own authorization model. It lives in a store of
// its own, beside the customer's: the customer's model may name its types
// as it likes (even application or user) and a customer's tuple can never
// grant anything here, nor ours show up in their reads.
//
// A service account may call an application's per-application M2M routes
// when it has m2m_access to the application; today that is exactly the
// admin's grant (client). m2m_access is computed so that later ways in
// (a grant to an organization's accounts, say) extend it without changing
// the guard. owner and the organization types are the places such rules
// will hang from; no route writes them yet.
const OwnModel = `model
  schema 1.1

type user

type service_account

type organization
  relations
    define admin: [user]
    define member: [user, service_account] or admin

type application
  relations
    define organization: [organization]
    define owner: [user] or admin from organization
    define client: [service_account]
    define m2m_access: client
`

// Relations and types of OwnModel the code uses.
const (
	relClient    = "client"
	relM2MAccess = "m2m_access"
)

func appObject(appID string) string { return "application:" + appID }
func saUser(saID string) string     { return "service_account:" + saID }

// Grant lets a service account call the application's per-application
// M2M routes. Granting twice is one grant.
func (e *Engine) Grant(ctx context.Context, appID, serviceAccountID string) error {
	err := e.ownWrite(ctx, &openfgav1.WriteRequest{StoreId: e.own, AuthorizationModelId: e.ownModel, Writes: &openfgav1.WriteRequestWrites{
		OnDuplicate: "ignore", TupleKeys: []*openfgav1.TupleKey{{User: saUser(serviceAccountID), Relation: relClient, Object: appObject(appID)}}}})
	return e.grantChanged(ctx, appID, serviceAccountID, err)
}

// GrantCache keeps the engine's answers to Granted on the hot path of
// API-key validation (persistence.Store: leases, NOTIFY, a commit wait).
type GrantCache interface {
	CachedGrant(ctx context.Context, appID, serviceAccountID string, read func(context.Context) (bool, error)) (bool, error)
	GrantChanged(ctx context.Context, appID, serviceAccountID string) error
}

// CacheGrants makes Granted answer from c, and grants and withdrawals
// evict from it (on every replica) before they return. Call before serving.
func (e *Engine) CacheGrants(c GrantCache) { e.grants = c }

// grantChanged evicts a changed grant once the engine has written it (err
// nil): the write is answered only when no replica's cache holds the old
// answer.
func (e *Engine) grantChanged(ctx context.Context, appID, serviceAccountID string, err error) error {
	if err != nil || e.grants == nil {
		return err
	}
	return e.grants.GrantChanged(ctx, appID, serviceAccountID)
}

// ownWrite writes to identityd's store. Its writes are idempotent, so one
// that lost a race with the same write elsewhere (PostgreSQL's unique index:
// the engine's Aborted) is simply tried again.
func (e *Engine) ownWrite(ctx context.Context, req *openfgav1.WriteRequest) error {
	var err error
	for range 3 {
		if _, err = e.srv.Write(ctx, req); status.Code(err) != codes.Aborted {
			break
		}
	}
	return engineError(err)
}

// Withdraw ends a grant; withdrawing one that does not exist does nothing.
func (e *Engine) Withdraw(ctx context.Context, appID, serviceAccountID string) error {
	err := e.ownWrite(ctx, &openfgav1.WriteRequest{StoreId: e.own, AuthorizationModelId: e.ownModel, Deletes: &openfgav1.WriteRequestDeletes{
		OnMissing: "ignore", TupleKeys: []*openfgav1.TupleKeyWithoutCondition{{User: saUser(serviceAccountID), Relation: relClient, Object: appObject(appID)}}}})
	return e.grantChanged(ctx, appID, serviceAccountID, err)
}

// Granted tells whether the service account may call the application's
// per-application routes.
func (e *Engine) Granted(ctx context.Context, appID, serviceAccountID string) (bool, error) {
	if e.grants != nil {
		return e.grants.CachedGrant(ctx, appID, serviceAccountID, func(ctx context.Context) (bool, error) { return e.granted(ctx, appID, serviceAccountID) })
	}
	return e.granted(ctx, appID, serviceAccountID)
}

func (e *Engine) granted(ctx context.Context, appID, serviceAccountID string) (bool, error) {
	return e.check(ctx, e.own, e.ownModel, Check{User: saUser(serviceAccountID), Relation: relM2MAccess, Object: appObject(appID)})
}

// AppGrant is one service account granted an application.
type AppGrant struct {
	ServiceAccountID string `json:"serviceAccountId"`
	GrantedAt        string `json:"grantedAt"`
}

// Grants lists one page of the service accounts granted an application.
func (e *Engine) Grants(ctx context.Context, appID string, pageSize int, cursor string) ([]AppGrant, string, error) {
	res, err := e.srv.Read(ctx, &openfgav1.ReadRequest{StoreId: e.own, PageSize: wrapperspb.Int32(int32(pageSize)), ContinuationToken: cursor,
		TupleKey: &openfgav1.ReadRequestTupleKey{Relation: relClient, Object: appObject(appID)}})
	if err != nil {
		return nil, "", engineError(err)
	}
	out := make([]AppGrant, 0, len(res.GetTuples()))
	for _, t := range res.GetTuples() {
		out = append(out, AppGrant{ServiceAccountID: strings.TrimPrefix(t.GetKey().GetUser(), "service_account:"),
			GrantedAt: t.GetTimestamp().AsTime().UTC().Format("2006-01-02T15:04:05.999999999Z07:00")})
	}
	return out, res.GetContinuationToken(), nil
}
