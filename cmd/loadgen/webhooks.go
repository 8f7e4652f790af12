package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// webhookResults: event to delivery latency at a steady event rate (issue
// 18: p99 under 1 s at 100 events/s).
type webhookResults struct {
	rate      int             // events per second asked for
	sent      int             // events made
	latencies []time.Duration // the event's answer to its delivery, per event delivered
}

// webhookRate is the steady rate of the phase's events.
const webhookRate = 100

// runWebhooks subscribes a receiver on 127.0.0.1 to user.created, creates
// users at webhookRate for the phase's duration, and measures from each
// creation's answer (its commit) to the receiver holding its message.
func runWebhooks(ctx context.Context, cfg config, c *client, admin string) (r webhookResults, err error) {
	r.rate = webhookRate
	var mu sync.Mutex
	received := map[string]time.Time{} // user id → when its message arrived
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var msg struct {
			Data struct {
				UserID string `json:"userId"`
			} `json:"data"`
		}
		body, _ := io.ReadAll(req.Body)
		at := time.Now()
		if json.Unmarshal(body, &msg) == nil && msg.Data.UserID != "" {
			mu.Lock()
			if _, seen := received[msg.Data.UserID]; !seen {
				received[msg.Data.UserID] = at
			}
			mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	if err := c.adminJSON(ctx, admin, "/api/v1/webhooks", map[string]any{"url": "http://" + ln.Addr().String() + "/hooks",
		"eventTypes": []string{"user.created"}}, nil); err != nil {
		return r, fmt.Errorf("webhook endpoint: %w", err)
	}

	created := map[string]time.Time{} // user id → when its creation answered
	tick := time.NewTicker(time.Second / webhookRate)
	defer tick.Stop()
	end := time.Now().Add(cfg.duration)
	var wg sync.WaitGroup
	var firstErr error
	for seq := 0; time.Now().Before(end); seq++ {
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-tick.C:
		}
		wg.Add(1)
		go func() { // paced, not waiting: a slow answer must not lower the rate
			defer wg.Done()
			var out struct {
				ID string `json:"id"`
			}
			err := c.adminJSON(ctx, admin, "/api/v1/m2m/users", map[string]any{"email": fmt.Sprintf("hook-%d@bench.example", seq), "name": "Bench"}, &out)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			created[out.ID] = time.Now()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return r, firstErr
	}
	r.sent = len(created)
	// Every message must arrive; wait for the last ones (bounded).
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(received)
		mu.Unlock()
		if n >= r.sent || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, at := range created {
		if got, ok := received[id]; ok {
			r.latencies = append(r.latencies, max(got.Sub(at), 0))
		}
	}
	if len(r.latencies) < r.sent {
		return r, fmt.Errorf("%d of %d webhook messages arrived within 30 s of the last event", len(r.latencies), r.sent)
	}
	return r, nil
}
