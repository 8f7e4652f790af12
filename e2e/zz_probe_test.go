package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/identityd/identityd/persistence/dbtest"
)

func TestZZProbe(t *testing.T) {
	for i := 0; i < 20; i++ {
		s := start(t, dbtest.URLs(t)["sqlite"])
		var wg sync.WaitGroup
		var mu sync.Mutex
		var bad []string
		for range 30 {
			wg.Go(func() {
				r, err := send(http.MethodPost, s.URL+"/api/v1/oauth/token", strings.NewReader(ccForm("admin").Encode()), append([]string{"Content-Type", "application/x-www-form-urlencoded"}, basic(s.AdminID, s.AdminSecret)...)...)
				if err != nil || r.Status != 200 {
					mu.Lock()
					bad = append(bad, describe(r))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(bad) > 0 {
			time.Sleep(300 * time.Millisecond)
			t.Fatalf("iteration %d: %d failures %v\n%s", i, len(bad), bad[0], s.logs)
		}
		s.stop()
	}
}
