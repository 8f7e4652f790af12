package handlers

import (
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/mux"
)

// TestM2MActions: every M2M route but whoami names its action for the HITL
// policies (m2mActions); a route without one would not be gated.
func TestM2MActions(t *testing.T) {
	o, _ := openAPIOptions(t)
	_, router := newRouter(o)
	seen := map[string]bool{}
	err := router.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil || !strings.HasPrefix(tpl, "/api/v1/m2m/") || tpl == "/api/v1/m2m/whoami" {
			return nil
		}
		methods, _ := route.GetMethods()
		for _, m := range methods {
			if m == http.MethodHead {
				continue
			}
			key := m + " " + tpl
			seen[key] = true
			if m2mActions[key] == "" {
				t.Errorf("%s has no HITL action in m2mActions", key)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key := range m2mActions {
		if !seen[key] {
			t.Errorf("m2mActions names %s, which the router does not have", key)
		}
	}
}
