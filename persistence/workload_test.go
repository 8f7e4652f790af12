package persistence_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func newIssuer(url string) *persistence.WorkloadIssuer {
	n := now()
	return &persistence.WorkloadIssuer{
		ID: uuid.NewString(), Name: "cluster", IssuerURL: url, JWKSURI: url + "/keys", Platform: "kubernetes",
		AllowedAudiences: []string{"identityd"}, AllowedSubjects: []string{"system:serviceaccount:*"}, MaxTokenAgeSeconds: 3600,
		CreatedAt: n, UpdatedAt: n,
	}
}

func TestWorkloadIssuersAndMappings(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := openStore(t, dbURL)

		is := newIssuer("https://k8s.example")
		if err := s.CreateWorkloadIssuer(ctx, is); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateWorkloadIssuer(ctx, newIssuer("https://k8s.example")); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("duplicate issuer URL: %v", err)
		}
		got, err := s.GetWorkloadIssuer(ctx, is.ID)
		if err != nil || got.IssuerURL != is.IssuerURL || !slices.Equal(got.AllowedSubjects, is.AllowedSubjects) || got.MaxTokenAgeSeconds != 3600 {
			t.Fatalf("read back %+v %v", got, err)
		}
		if set, err := s.WorkloadIssuers(ctx); err != nil || set["https://k8s.example"] == nil {
			t.Fatalf("set: %v %v", set, err)
		}
		// An update is seen by the cached set at once.
		if _, err := s.UpdateWorkloadIssuer(ctx, is.ID, func(x *persistence.WorkloadIssuer) error {
			x.IssuerURL = "https://k8s2.example"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if set, _ := s.WorkloadIssuers(ctx); set["https://k8s.example"] != nil || set["https://k8s2.example"] == nil {
			t.Fatalf("set after update: %v", set)
		}

		n := now()
		agent := &persistence.Agent{ID: uuid.NewString(), ClientID: "agt_mapped", SecretHash: []byte("x"), Name: "mapped", Type: "service",
			TrustLevel: "sandboxed", Status: persistence.AgentActive, CreatedAt: n, UpdatedAt: n}
		if err := s.CreateAgent(ctx, agent); err != nil {
			t.Fatal(err)
		}
		m := &persistence.WorkloadMapping{ID: uuid.NewString(), IssuerID: is.ID, AgentClientID: "agt_mapped",
			SubjectPattern: "system:serviceaccount:prod:agent", SubjectMatchType: "exact", Scopes: []string{"users:read"}, CreatedAt: n}
		if err := s.CreateWorkloadMapping(ctx, m); err != nil {
			t.Fatal(err)
		}
		dup := *m
		dup.ID = uuid.NewString()
		if err := s.CreateWorkloadMapping(ctx, &dup); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("same subject mapped twice: %v", err)
		}
		orphan := *m
		orphan.ID, orphan.SubjectPattern, orphan.AgentClientID = uuid.NewString(), "other", "agt_none"
		if err := s.CreateWorkloadMapping(ctx, &orphan); !errors.Is(err, persistence.ErrMissingReference) {
			t.Fatalf("mapping to no agent: %v", err)
		}
		if got, err := s.WorkloadMappingFor(ctx, is.ID, "system:serviceaccount:prod:agent"); err != nil || got.AgentClientID != "agt_mapped" {
			t.Fatalf("mapping for subject: %+v %v", got, err)
		}
		if _, err := s.WorkloadMappingFor(ctx, is.ID, "system:serviceaccount:prod:other"); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("unmapped subject: %v", err)
		}
		if list, total, err := s.ListWorkloadMappings(ctx, is.ID, persistence.Page{Limit: 10}); err != nil || total != 1 || len(list) != 1 {
			t.Fatalf("mappings of the issuer: %v %d %v", list, total, err)
		}

		// An issuer in use stays; a deleted agent takes its mappings along.
		if err := s.DeleteWorkloadIssuer(ctx, is.ID); !errors.Is(err, persistence.ErrInUse) {
			t.Fatalf("delete an issuer in use: %v", err)
		}
		if err := s.DeleteAgent(ctx, agent.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetWorkloadMapping(ctx, m.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("mapping outlived its agent: %v", err)
		}
		// The subject mapped anew (to another agent) reads as such at once,
		// though the old mapping was cached; a deleted mapping is gone at once.
		other := *agent
		other.ID, other.ClientID = uuid.NewString(), "agt_other"
		if err := s.CreateAgent(ctx, &other); err != nil {
			t.Fatal(err)
		}
		again := *m
		again.ID, again.AgentClientID = uuid.NewString(), "agt_other"
		if err := s.CreateWorkloadMapping(ctx, &again); err != nil {
			t.Fatal(err)
		}
		if got, err := s.WorkloadMappingFor(ctx, is.ID, m.SubjectPattern); err != nil || got.AgentClientID != "agt_other" {
			t.Fatalf("remapped subject reads %+v %v", got, err)
		}
		if err := s.DeleteWorkloadMapping(ctx, again.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WorkloadMappingFor(ctx, is.ID, m.SubjectPattern); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("deleted mapping still read: %v", err)
		}
		if err := s.DeleteWorkloadIssuer(ctx, is.ID); err != nil {
			t.Fatal(err)
		}
		if set, _ := s.WorkloadIssuers(ctx); len(set) != 0 {
			t.Fatalf("set after delete: %v", set)
		}
		if err := s.DeleteWorkloadMapping(ctx, m.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("delete a deleted mapping: %v", err)
		}
	})
}
