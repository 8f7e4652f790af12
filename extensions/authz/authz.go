// Package authz is fine-grained authorization: OpenFGA, embedded as a
// library in this process (its pkg/server, called directly: no gRPC, no
// second service), over a datastore persistence opens on identityd's own
// database. Nothing here decides a relationship; the engine does. This
// package keeps the two stores a deployment has (the customer's and
// identityd's own, see Own), turns the API's shapes into the engine's, and
// its refusals into ours.
package authz

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	openfgav1 "github.com/openfga/api/proto/openfga/v1"
	"github.com/openfga/language/pkg/go/transformer"
	"github.com/openfga/openfga/pkg/server"
	"github.com/openfga/openfga/pkg/storage"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/identityd/identityd/extensions"
	"github.com/identityd/identityd/persistence"
)

// Settings is where the ids of the two stores are kept, so that every
// replica and every restart uses the same ones (persistence.Store).
type Settings interface {
	Setting(ctx context.Context, key string) (string, error)
	SetSettingOnce(ctx context.Context, key, value string) (string, error)
}

// Setting keys of the store ids.
const (
	customerStoreKey = "fga_store"
	ownStoreKey      = "fga_own_store"
)

// Limits the API sets on what it passes to the engine (the engine's own
// limits apply too: 100 tuples per write, 50 checks per batch).
const (
	MaxTupleChanges    = 100 // writes and deletes in one call, as OpenFGA's default
	MaxContextual      = 100 // contextual tuples in one check, as OpenFGA's
	MaxBatch           = 50  // checks in one batch, as OpenFGA's default
	MaxPageSize        = 100 // tuples per page, as OpenFGA's Read
	DefaultPageSize    = 50
	MaxModelBytes      = 256 << 10 // a model's JSON or DSL text, as OpenFGA's default
	maxListObjectsSeen = 1000      // OpenFGA's default listObjectsMaxResults
)

// Engine is the embedded OpenFGA server with the deployment's stores.
type Engine struct {
	srv      *server.Server
	store    string     // the customer's store: their model and tuples
	own      string     // identityd's store: its own model and the grants
	ownModel string     // the id of identityd's model in its store
	grants   GrantCache // nil: every Granted asks the engine

	mu       sync.Mutex
	latestID string    // the customer's newest model, as last read
	latestAt time.Time // when it was read
}

// LatestModelLease is how long a server uses the id of the newest model it
// read before it reads it again. Without one OpenFGA looks the newest model
// up in the datastore at every check (an eighth of a check's CPU). A model
// written through this server is used at once; one written through another
// replica within the lease (docs/decisions.md).
const LatestModelLease = time.Second

// latestModel is the id of the customer's newest model ("" when none is
// written: the engine then refuses the call itself).
func (e *Engine) latestModel(ctx context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.latestID != "" && time.Since(e.latestAt) < LatestModelLease {
		return e.latestID, nil
	}
	m, err := e.latest(ctx, e.store)
	if errors.Is(err, errNoModel) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	e.latestID, e.latestAt = m.GetId(), time.Now()
	return e.latestID, nil
}

// New starts the engine on ds and makes (or finds) the deployment's two
// stores and identityd's model in its own. Replicas starting together make
// one store each at most; the one whose id is stored first wins and the
// others delete theirs.
func New(ctx context.Context, ds storage.OpenFGADatastore, settings Settings) (*Engine, error) {
	srv, err := server.NewServerWithOpts(
		server.WithDatastore(ds),
		server.WithContext(ctx),
		// Checks read what was written last: a grant withdrawn, a tuple
		// deleted, bites at the next call. The check cache stays off.
		server.WithCheckQueryCacheEnabled(false),
		server.WithMaxAuthorizationModelSizeInBytes(MaxModelBytes),
	)
	if err != nil {
		return nil, fmt.Errorf("start OpenFGA: %w", err)
	}
	e := &Engine{srv: srv}
	if e.store, err = e.ensureStore(ctx, settings, customerStoreKey, "identityd"); err == nil {
		e.own, err = e.ensureStore(ctx, settings, ownStoreKey, "identityd-internal")
	}
	if err == nil {
		e.ownModel, err = e.ensureOwnModel(ctx)
	}
	if err != nil {
		srv.Close()
		return nil, err
	}
	return e, nil
}

// Close stops the engine and closes its datastore.
func (e *Engine) Close() { e.srv.Close() }

func (e *Engine) ensureStore(ctx context.Context, settings Settings, key, name string) (string, error) {
	id, err := settings.Setting(ctx, key)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, persistence.ErrNotFound) {
		return "", err
	}
	made, err := e.srv.CreateStore(ctx, &openfgav1.CreateStoreRequest{Name: name})
	if err != nil {
		return "", fmt.Errorf("create OpenFGA store: %w", err)
	}
	id, err = settings.SetSettingOnce(ctx, key, made.GetId())
	if err != nil {
		return "", err
	}
	if id != made.GetId() { // another replica's was stored first
		_, _ = e.srv.DeleteStore(ctx, &openfgav1.DeleteStoreRequest{StoreId: made.GetId()})
	}
	return id, nil
}

// ensureOwnModel writes identityd's model to its store unless the latest
// version there is it already, and returns the id of that version.
func (e *Engine) ensureOwnModel(ctx context.Context) (string, error) {
	want, err := transformer.TransformDSLToProto(OwnModel)
	if err != nil {
		return "", fmt.Errorf("identityd's authorization model: %w", err)
	}
	latest, err := e.latest(ctx, e.own)
	if err == nil && sameModel(latest, want) {
		return latest.GetId(), nil
	}
	if err != nil && !errors.Is(err, errNoModel) {
		return "", err
	}
	res, err := e.srv.WriteAuthorizationModel(ctx, &openfgav1.WriteAuthorizationModelRequest{
		StoreId: e.own, SchemaVersion: want.GetSchemaVersion(), TypeDefinitions: want.GetTypeDefinitions(), Conditions: want.GetConditions()})
	if err != nil {
		return "", fmt.Errorf("write identityd's authorization model: %w", err)
	}
	return res.GetAuthorizationModelId(), nil
}

func sameModel(a, b *openfgav1.AuthorizationModel) bool {
	if a.GetSchemaVersion() != b.GetSchemaVersion() || len(a.GetTypeDefinitions()) != len(b.GetTypeDefinitions()) || len(a.GetConditions()) != len(b.GetConditions()) {
		return false
	}
	for i, td := range a.GetTypeDefinitions() {
		if !proto.Equal(td, b.GetTypeDefinitions()[i]) {
			return false
		}
	}
	for k, c := range a.GetConditions() {
		if !proto.Equal(c, b.GetConditions()[k]) {
			return false
		}
	}
	return true
}

var errNoModel = errors.New("no authorization model")

// latest is the newest model of a store (OpenFGA lists newest first).
func (e *Engine) latest(ctx context.Context, store string) (*openfgav1.AuthorizationModel, error) {
	res, err := e.srv.ReadAuthorizationModels(ctx, &openfgav1.ReadAuthorizationModelsRequest{StoreId: store, PageSize: wrapperspb.Int32(1)})
	if err != nil {
		return nil, engineError(err)
	}
	if len(res.GetAuthorizationModels()) == 0 {
		return nil, errNoModel
	}
	return res.GetAuthorizationModels()[0], nil
}

// ErrNoModel answers a read of the model, or a check, before any model
// was written.
var ErrNoModel = extensions.NewError(http.StatusNotFound, "model_not_found", "No authorization model has been written yet: PUT /api/v1/m2m/authz/model first.", nil)

// WriteModel stores a new version of the customer's model (OpenFGA keeps
// every version; checks use the newest) and returns it as stored.
func (e *Engine) WriteModel(ctx context.Context, m *openfgav1.AuthorizationModel) (*openfgav1.AuthorizationModel, error) {
	res, err := e.srv.WriteAuthorizationModel(ctx, &openfgav1.WriteAuthorizationModelRequest{
		StoreId: e.store, SchemaVersion: m.GetSchemaVersion(), TypeDefinitions: m.GetTypeDefinitions(), Conditions: m.GetConditions()})
	if err != nil {
		return nil, engineError(err)
	}
	e.mu.Lock()
	e.latestID, e.latestAt = res.GetAuthorizationModelId(), time.Now()
	e.mu.Unlock()
	return e.Model(ctx, res.GetAuthorizationModelId())
}

// Model is a version of the customer's model by id, or the newest ("").
func (e *Engine) Model(ctx context.Context, id string) (*openfgav1.AuthorizationModel, error) {
	if id == "" {
		m, err := e.latest(ctx, e.store)
		if errors.Is(err, errNoModel) {
			return nil, ErrNoModel
		}
		return m, err
	}
	res, err := e.srv.ReadAuthorizationModel(ctx, &openfgav1.ReadAuthorizationModelRequest{StoreId: e.store, Id: id})
	if status.Code(err) == codes.Code(openfgav1.ErrorCode_authorization_model_not_found) || status.Code(err) == codes.InvalidArgument {
		return nil, extensions.NewError(http.StatusNotFound, "model_not_found", "No authorization model has that id.", nil)
	}
	if err != nil {
		return nil, engineError(err)
	}
	return res.GetAuthorizationModel(), nil
}

// Tuple is one relationship: user has relation to object. Condition names
// a condition of the model, with the context it is written with.
type Tuple struct {
	User      string          `json:"user"`
	Relation  string          `json:"relation"`
	Object    string          `json:"object"`
	Condition *TupleCondition `json:"condition,omitempty"`
}

// TupleCondition is a tuple's condition (OpenFGA's RelationshipCondition).
type TupleCondition struct {
	Name    string         `json:"name"`
	Context map[string]any `json:"context,omitempty"`
}

func (t Tuple) key() (*openfgav1.TupleKey, error) {
	k := &openfgav1.TupleKey{User: t.User, Relation: t.Relation, Object: t.Object}
	if c := t.Condition; c != nil {
		ctx, err := structOf(c.Context)
		if err != nil {
			return nil, err
		}
		k.Condition = &openfgav1.RelationshipCondition{Name: c.Name, Context: ctx}
	}
	return k, nil
}

// MaxContextDepth bounds the nesting of a context object: the engine's
// conditions read flat parameters, and a deep value only costs.
const MaxContextDepth = 16

func depth(v any) int {
	d := 0
	switch v := v.(type) {
	case map[string]any:
		for _, c := range v {
			d = max(d, depth(c))
		}
		return d + 1
	case []any:
		for _, c := range v {
			d = max(d, depth(c))
		}
		return d + 1
	}
	return 0
}

func structOf(m map[string]any) (*structpb.Struct, error) {
	if m == nil {
		return nil, nil
	}
	if depth(m) > MaxContextDepth {
		return nil, extensions.NewError(http.StatusBadRequest, "invalid_request", fmt.Sprintf("A context may nest at most %d levels.", MaxContextDepth), nil)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, extensions.NewError(http.StatusBadRequest, "invalid_request", "A context must be a JSON object of JSON values.", nil)
	}
	return s, nil
}

// CheckTuples refuses a list of tuples the API cannot pass on: too many, or
// fields missing. What the model allows is the engine's to say.
func CheckTuples(field string, list []Tuple, max int, v *extensions.ValidationError) {
	if len(list) > max {
		v.Add(field, "must hold at most %d tuples", max)
		return
	}
	for i, t := range list {
		f := field + "[" + strconv.Itoa(i) + "]"
		switch {
		case t.User == "":
			v.Add(f+".user", "is required")
		case t.Relation == "":
			v.Add(f+".relation", "is required")
		case t.Object == "":
			v.Add(f+".object", "is required")
		case t.Condition != nil && t.Condition.Name == "":
			v.Add(f+".condition.name", "is required")
		}
	}
}

// WriteTuples writes and deletes tuples in one transaction of the engine's:
// all of them or, when the model refuses one, none.
func (e *Engine) WriteTuples(ctx context.Context, writes, deletes []Tuple) error {
	var v extensions.ValidationError
	CheckTuples("writes", writes, MaxTupleChanges, &v)
	CheckTuples("deletes", deletes, MaxTupleChanges, &v)
	if len(writes)+len(deletes) == 0 {
		v.Add("writes", "writes or deletes must hold at least one tuple")
	} else if len(writes)+len(deletes) > MaxTupleChanges {
		v.Add("writes", "writes and deletes together must hold at most %d tuples", MaxTupleChanges)
	}
	for i, d := range deletes {
		if d.Condition != nil {
			v.Add("deletes["+strconv.Itoa(i)+"].condition", "is not part of a deletion: a tuple is deleted by user, relation and object")
		}
	}
	if err := v.Err(); err != nil {
		return err
	}
	model, err := e.latestModel(ctx)
	if err != nil {
		return err
	}
	req := &openfgav1.WriteRequest{StoreId: e.store, AuthorizationModelId: model}
	if len(writes) > 0 {
		req.Writes = &openfgav1.WriteRequestWrites{}
		for _, t := range writes {
			k, err := t.key()
			if err != nil {
				return err
			}
			req.Writes.TupleKeys = append(req.Writes.TupleKeys, k)
		}
	}
	if len(deletes) > 0 {
		req.Deletes = &openfgav1.WriteRequestDeletes{}
		for _, t := range deletes {
			req.Deletes.TupleKeys = append(req.Deletes.TupleKeys, &openfgav1.TupleKeyWithoutCondition{User: t.User, Relation: t.Relation, Object: t.Object})
		}
	}
	if _, err := e.srv.Write(ctx, req); err != nil {
		return engineError(err)
	}
	return nil
}

// StoredTuple is a tuple as read back, with when it was written.
type StoredTuple struct {
	Tuple
	WrittenAt string `json:"writtenAt"`
}

// ReadTuples reads one page of the customer's tuples matching the filter
// (empty fields match anything; OpenFGA wants an object type when a user
// is given). cursor is the engine's continuation token, opaque to callers.
func (e *Engine) ReadTuples(ctx context.Context, filter Tuple, pageSize int, cursor string) ([]StoredTuple, string, error) {
	req := &openfgav1.ReadRequest{StoreId: e.store, PageSize: wrapperspb.Int32(int32(pageSize)), ContinuationToken: cursor}
	if filter.User != "" || filter.Relation != "" || filter.Object != "" {
		req.TupleKey = &openfgav1.ReadRequestTupleKey{User: filter.User, Relation: filter.Relation, Object: filter.Object}
	}
	res, err := e.srv.Read(ctx, req)
	if err != nil {
		return nil, "", engineError(err)
	}
	out := make([]StoredTuple, 0, len(res.GetTuples()))
	for _, t := range res.GetTuples() {
		k := t.GetKey()
		st := StoredTuple{Tuple: Tuple{User: k.GetUser(), Relation: k.GetRelation(), Object: k.GetObject()}, WrittenAt: t.GetTimestamp().AsTime().UTC().Format("2006-01-02T15:04:05.999999999Z07:00")}
		if c := k.GetCondition(); c != nil {
			st.Condition = &TupleCondition{Name: c.GetName(), Context: c.GetContext().AsMap()}
		}
		out = append(out, st)
	}
	return out, res.GetContinuationToken(), nil
}

// Check is one question: may user have relation to object, given the
// stored tuples, the contextual ones (considered for this check only) and
// the context the model's conditions read.
type Check struct {
	User             string         `json:"user"`
	Relation         string         `json:"relation"`
	Object           string         `json:"object"`
	ContextualTuples []Tuple        `json:"contextualTuples"`
	Context          map[string]any `json:"context"`
}

// Valid refuses a check the API cannot pass on, naming fields under prefix.
func (c Check) Valid(prefix string, v *extensions.ValidationError) {
	if c.User == "" {
		v.Add(prefix+"user", "is required")
	}
	if c.Relation == "" {
		v.Add(prefix+"relation", "is required")
	}
	if c.Object == "" {
		v.Add(prefix+"object", "is required")
	}
	CheckTuples(prefix+"contextualTuples", c.ContextualTuples, MaxContextual, v)
}

func contextual(list []Tuple) (*openfgav1.ContextualTupleKeys, error) {
	if len(list) == 0 {
		return nil, nil
	}
	out := &openfgav1.ContextualTupleKeys{}
	for _, t := range list {
		k, err := t.key()
		if err != nil {
			return nil, err
		}
		out.TupleKeys = append(out.TupleKeys, k)
	}
	return out, nil
}

// Check answers one check against the customer's newest model.
func (e *Engine) Check(ctx context.Context, c Check) (bool, error) {
	var v extensions.ValidationError
	c.Valid("", &v)
	if err := v.Err(); err != nil {
		return false, err
	}
	model, err := e.latestModel(ctx)
	if err != nil {
		return false, err
	}
	return e.check(ctx, e.store, model, c)
}

func (e *Engine) check(ctx context.Context, store, model string, c Check) (bool, error) {
	ct, err := contextual(c.ContextualTuples)
	if err != nil {
		return false, err
	}
	cx, err := structOf(c.Context)
	if err != nil {
		return false, err
	}
	res, err := e.srv.Check(ctx, &openfgav1.CheckRequest{StoreId: store, AuthorizationModelId: model,
		TupleKey: &openfgav1.CheckRequestTupleKey{User: c.User, Relation: c.Relation, Object: c.Object}, ContextualTuples: ct, Context: cx})
	if err != nil {
		return false, engineError(err)
	}
	return res.GetAllowed(), nil
}

// Result is one answer of a batch: allowed, or the engine's refusal of
// that check alone.
type Result struct {
	Allowed bool         `json:"allowed"`
	Error   *ResultError `json:"error,omitempty"`
}

// ResultError is why one check of a batch was not answered.
type ResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// BatchCheck answers up to MaxBatch checks, in their order; a check the
// engine refuses has its error in its place, the others are answered.
func (e *Engine) BatchCheck(ctx context.Context, checks []Check) ([]Result, error) {
	var v extensions.ValidationError
	if len(checks) == 0 {
		v.Add("checks", "must hold at least one check")
	} else if len(checks) > MaxBatch {
		v.Add("checks", "must hold at most %d checks", MaxBatch)
	}
	for i, c := range checks {
		c.Valid("checks["+strconv.Itoa(i)+"].", &v)
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	model, err := e.latestModel(ctx)
	if err != nil {
		return nil, err
	}
	req := &openfgav1.BatchCheckRequest{StoreId: e.store, AuthorizationModelId: model}
	for i, c := range checks {
		ct, err := contextual(c.ContextualTuples)
		if err != nil {
			return nil, err
		}
		cx, err := structOf(c.Context)
		if err != nil {
			return nil, err
		}
		req.Checks = append(req.Checks, &openfgav1.BatchCheckItem{CorrelationId: strconv.Itoa(i), ContextualTuples: ct, Context: cx,
			TupleKey: &openfgav1.CheckRequestTupleKey{User: c.User, Relation: c.Relation, Object: c.Object}})
	}
	res, err := e.srv.BatchCheck(ctx, req)
	if err != nil {
		return nil, engineError(err)
	}
	out := make([]Result, len(checks))
	for i := range checks {
		r := res.GetResult()[strconv.Itoa(i)]
		switch {
		case r == nil:
			out[i].Error = &ResultError{Code: "not_answered", Message: "The engine gave no answer for this check."}
		case r.GetError() != nil:
			out[i].Error = &ResultError{Code: batchErrorCode(r.GetError()), Message: r.GetError().GetMessage()}
		default:
			out[i].Allowed = r.GetAllowed()
		}
	}
	return out, nil
}

func batchErrorCode(e *openfgav1.CheckError) string {
	if c := e.GetInputError(); c != 0 {
		return c.String()
	}
	if c := e.GetInternalError(); c != 0 {
		return c.String()
	}
	return "error"
}

// ListObjects lists the objects of a type to which user has relation (at
// most the engine's limit, 1,000; which ones when there are more is the
// engine's choice).
func (e *Engine) ListObjects(ctx context.Context, user, relation, typ string, ctxTuples []Tuple, cx map[string]any) ([]string, error) {
	var v extensions.ValidationError
	(Check{User: user, Relation: relation, Object: typ, ContextualTuples: ctxTuples}).Valid("", &v)
	if _, ok := v.Fields["object"]; ok {
		delete(v.Fields, "object")
		v.Add("type", "is required")
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	ct, err := contextual(ctxTuples)
	if err != nil {
		return nil, err
	}
	s, err := structOf(cx)
	if err != nil {
		return nil, err
	}
	model, err := e.latestModel(ctx)
	if err != nil {
		return nil, err
	}
	res, err := e.srv.ListObjects(ctx, &openfgav1.ListObjectsRequest{StoreId: e.store, AuthorizationModelId: model, User: user, Relation: relation, Type: typ, ContextualTuples: ct, Context: s})
	if err != nil {
		return nil, engineError(err)
	}
	objects := res.GetObjects()
	if objects == nil {
		objects = []string{}
	}
	return objects, nil
}

// engineError turns the engine's refusal into ours: a request the model or
// the engine's rules refuse is a 400 with the engine's reason; anything
// else (the datastore down, a deadline) is not the caller's fault.
func engineError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	code := int(st.Code())
	name := ""
	if n, ok := openfgav1.ErrorCode_name[int32(code)]; ok {
		name = n
	}
	switch {
	case st.Code() == codes.Aborted:
		// Another transaction wrote or deleted one of these tuples first
		// (OpenFGA's gateway answers 409 too). Nothing of this call stands.
		return extensions.NewError(http.StatusConflict, "authz_conflict", "A concurrent write changed one of these tuples first; nothing of this call was written. Read them again and retry.",
			map[string]any{"reason": st.Message()})
	case name == "invalid_continuation_token":
		return extensions.NewError(http.StatusBadRequest, "invalid_cursor", "The cursor is not one a previous page gave.", map[string]any{"field": "cursor"})
	case st.Code() == codes.InvalidArgument, code >= 2000 && code < 3000:
		if name == "" {
			name = "validation_error"
		}
		return extensions.NewError(http.StatusBadRequest, "authz_invalid_request", "The authorization engine refused the request: "+st.Message(),
			map[string]any{"reason": st.Message(), "engineCode": name})
	case code >= 3500 && code < 4000, st.Code() == codes.ResourceExhausted, st.Code() == codes.DeadlineExceeded,
		code == int(openfgav1.InternalErrorCode_deadline_exceeded), code == int(openfgav1.ErrorCode_cancelled):
		// Too complex to resolve in time, or throttled: a request the
		// engine may answer when repeated or simplified.
		return extensions.NewError(http.StatusUnprocessableEntity, "authz_unresolved", "The authorization engine could not resolve the request in time: "+st.Message(),
			map[string]any{"reason": st.Message()})
	default:
		return fmt.Errorf("OpenFGA: %w", err)
	}
}
