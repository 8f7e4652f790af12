package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

func TestZZProbe(t *testing.T) {
	for i := 0; i < 40; i++ {
		s := start(t, dbtest.URLs(t)["sqlite"])
		r := s.do(http.MethodPost, "/api/v1/oauth/token", ccForm("admin"), basic(s.AdminID, s.AdminSecret)...)
		if r.Status != 200 {
			time.Sleep(200 * time.Millisecond); t.Fatalf("iteration %d: %s\n%s", i, describe(r), s.logs)
		}
		s.stop()
	}
}
