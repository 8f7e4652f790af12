package persistence_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/identityd/identityd/persistence"
	"github.com/identityd/identityd/persistence/dbtest"
)

func webhookEndpoint(url string, types []string, at time.Time) *persistence.WebhookEndpoint {
	return &persistence.WebhookEndpoint{ID: uuid.Must(uuid.NewV7()).String(), URL: url, EventTypes: types, Enabled: true,
		Secret: []byte("sealed"), LeaseUntil: time.Unix(0, 0), CreatedAt: at, UpdatedAt: at}
}

// Logged events reach the outbox of the endpoints that want them, in the
// transaction that logs them (a rolled-back one leaves neither); the
// subscriptions follow endpoint changes at once; the dispatcher's claims,
// order, attempts, disabling and redelivery.
func TestWebhookStore(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		s := dbtest.Store(t, dbURL)
		t0 := now()
		signIn := func(at time.Time) persistence.AuthEvent {
			return persistence.AuthEvent{ID: uuid.Must(uuid.NewV7()).String(), Type: persistence.EventSignIn, ClientID: "app_x", IP: "192.0.2.1", CreatedAt: at}
		}
		count := func(id string) int {
			t.Helper()
			_, total, err := s.ListWebhookDeliveries(ctx, persistence.WebhookFilter{EndpointID: id}, persistence.Page{Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			return total
		}

		// Before routes are set, nothing is published.
		a := webhookEndpoint("https://a.example/hook", []string{"user.signed_in"}, t0)
		if err := s.CreateWebhookEndpoint(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendAuthEvents(ctx, signIn(t0)); err != nil {
			t.Fatal(err)
		}
		if n := count(a.ID); n != 0 {
			t.Fatalf("published without routes: %d", n)
		}
		s.RouteWebhooks(map[string]string{"auth:" + persistence.EventSignIn: "user.signed_in", "auth:" + persistence.EventLogout: "session.ended"})

		first := signIn(t0.Add(time.Second))
		if err := s.AppendAuthEvents(ctx, first, persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventLogout, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if n := count(a.ID); n != 1 {
			t.Fatalf("deliveries %d, want 1 (the logout is not subscribed)", n)
		}
		list, _, err := s.ListWebhookDeliveries(ctx, persistence.WebhookFilter{EndpointID: a.ID}, persistence.Page{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		d := list[0]
		var body struct {
			Type      string         `json:"type"`
			Timestamp string         `json:"timestamp"`
			Data      map[string]any `json:"data"`
		}
		if err := json.Unmarshal([]byte(d.Payload), &body); err != nil || body.Type != "user.signed_in" || body.Data["eventId"] != first.ID ||
			body.Data["ip"] != "192.0.2.1" || d.MessageID != "msg_"+first.ID || d.Status != persistence.DeliveryPending {
			t.Fatalf("delivery %+v, payload %+v, %v", d, body, err)
		}

		// A rolled-back transaction publishes nothing.
		rollback := errors.New("rolled back")
		err = s.InTx(ctx, func(ctx context.Context) error {
			if err := s.AppendAuthEvents(ctx, signIn(t0)); err != nil {
				return err
			}
			return rollback
		})
		if !errors.Is(err, rollback) || count(a.ID) != 1 {
			t.Fatalf("after a rollback: %v, %d deliveries", err, count(a.ID))
		}

		// A new endpoint, and a changed subscription, count from the next event.
		b := webhookEndpoint("https://b.example/hook", []string{"session.ended"}, t0.Add(time.Millisecond))
		if err := s.CreateWebhookEndpoint(ctx, b); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateWebhookEndpoint(ctx, a.ID, t0, func(e *persistence.WebhookEndpoint) error {
			e.EventTypes = persistence.StringList{"user.signed_in", "session.ended"}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendAuthEvents(ctx, persistence.AuthEvent{ID: uuid.NewString(), Type: persistence.EventLogout, CreatedAt: t0.Add(2 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		if count(a.ID) != 2 || count(b.ID) != 1 {
			t.Fatalf("after the change: a %d, b %d", count(a.ID), count(b.ID))
		}

		// The dispatcher's view: a's two messages due, in the order of their events.
		at := t0.Add(time.Minute)
		due, err := s.DueWebhookEndpoints(ctx, at, 10)
		if err != nil || len(due) != 2 {
			t.Fatalf("due endpoints %v %v", due, err)
		}
		if ok, err := s.ClaimWebhookEndpoint(ctx, a.ID, at, at.Add(time.Minute)); err != nil || !ok {
			t.Fatalf("claim %v %v", ok, err)
		}
		if ok, _ := s.ClaimWebhookEndpoint(ctx, a.ID, at, at.Add(time.Minute)); ok {
			t.Fatal("claimed twice")
		}
		if due, _ := s.DueWebhookEndpoints(ctx, at, 10); len(due) != 1 || due[0] != b.ID {
			t.Fatalf("a claimed endpoint is still due: %v", due)
		}
		msgs, err := s.DueWebhooks(ctx, a.ID, at, 10)
		if err != nil || len(msgs) != 2 || msgs[0].EventType != "user.signed_in" || msgs[1].EventType != "session.ended" {
			t.Fatalf("due messages %+v %v", msgs, err)
		}
		// A failure schedules the next attempt and marks the endpoint failing.
		status := 500
		next := at.Add(5 * time.Second)
		disabled, err := s.RecordWebhookAttempt(ctx, &msgs[0], persistence.Attempt{At: at, Status: &status, Error: "HTTP 500", Next: &next, DisableAfter: at.Add(-24 * time.Hour)})
		if err != nil || disabled {
			t.Fatalf("failure: %v %v", disabled, err)
		}
		got, _ := s.GetWebhookDelivery(ctx, a.ID, msgs[0].ID)
		if got.Attempts != 1 || got.Status != persistence.DeliveryPending || !got.NextAttemptAt.Equal(next) || got.LastError != "HTTP 500" || *got.LastStatus != 500 {
			t.Fatalf("after a failure: %+v", got)
		}
		if e, _ := s.GetWebhookEndpoint(ctx, a.ID); e.FailingSince == nil || !e.FailingSince.Equal(at) {
			t.Fatalf("failing since %v", e.FailingSince)
		}
		// A success clears it.
		status = 204
		if _, err := s.RecordWebhookAttempt(ctx, &msgs[1], persistence.Attempt{At: at, Status: &status}); err != nil {
			t.Fatal(err)
		}
		if e, _ := s.GetWebhookEndpoint(ctx, a.ID); e.FailingSince != nil {
			t.Fatalf("still failing since %v", e.FailingSince)
		}
		if got, _ := s.GetWebhookDelivery(ctx, a.ID, msgs[1].ID); got.Status != persistence.DeliveryDelivered || got.DeliveredAt == nil {
			t.Fatalf("delivered: %+v", got)
		}
		if err := s.ReleaseWebhookEndpoint(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		// Failing for longer than DisableAfter disables, once; the last attempt fails the message.
		later := at.Add(25 * time.Hour)
		status = 503
		if disabled, err := s.RecordWebhookAttempt(ctx, &msgs[0], persistence.Attempt{At: at, Status: &status, Error: "HTTP 503", Next: &next, DisableAfter: at.Add(-24 * time.Hour)}); err != nil || disabled {
			t.Fatalf("first failure again: %v %v", disabled, err)
		}
		disabled, err = s.RecordWebhookAttempt(ctx, &msgs[0], persistence.Attempt{At: later, Status: &status, Error: "HTTP 503", DisableAfter: later.Add(-24 * time.Hour)})
		if err != nil || !disabled {
			t.Fatalf("not disabled: %v %v", disabled, err)
		}
		e, _ := s.GetWebhookEndpoint(ctx, a.ID)
		if e.Enabled || e.DisabledReason != "failing" {
			t.Fatalf("endpoint %+v", e)
		}
		if got, _ := s.GetWebhookDelivery(ctx, a.ID, msgs[0].ID); got.Status != persistence.DeliveryFailed || got.Attempts != 3 {
			t.Fatalf("failed message %+v", got)
		}
		if due, _ := s.DueWebhookEndpoints(ctx, later, 10); len(due) != 1 || due[0] != b.ID {
			t.Fatalf("a disabled endpoint is due: %v", due)
		}
		// Disabled, it still collects messages; enabled again, they are due at once.
		if err := s.AppendAuthEvents(ctx, signIn(later)); err != nil {
			t.Fatal(err)
		}
		if count(a.ID) != 3 {
			t.Fatalf("a disabled endpoint lost a message: %d", count(a.ID))
		}
		if _, err := s.UpdateWebhookEndpoint(ctx, a.ID, later, func(e *persistence.WebhookEndpoint) error { e.Enabled = true; return nil }); err != nil {
			t.Fatal(err)
		}
		if msgs, _ := s.DueWebhooks(ctx, a.ID, later, 10); len(msgs) != 1 {
			t.Fatalf("due after enabling: %+v", msgs)
		}
		// A redelivery makes the failed message pending again, schedule reset.
		again, err := s.RedeliverWebhook(ctx, a.ID, msgs[0].ID, later)
		if err != nil || again.Status != persistence.DeliveryPending || again.Attempts != 0 || !again.NextAttemptAt.Equal(later) {
			t.Fatalf("redelivery %+v %v", again, err)
		}
		if _, err := s.RedeliverWebhook(ctx, b.ID, msgs[0].ID, later); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("another endpoint's message: %v", err)
		}
		pending, total, err := s.ListWebhookDeliveries(ctx, persistence.WebhookFilter{EndpointID: a.ID, Status: persistence.DeliveryPending}, persistence.Page{Limit: 10})
		if err != nil || total != 2 || len(pending) != 2 {
			t.Fatalf("pending %d %v", total, err)
		}
		// Old delivered messages are dropped; deleting an endpoint drops its messages.
		if n, err := s.DeleteDeliveredWebhooks(ctx, later); err != nil || n != 1 {
			t.Fatalf("dropped %d %v", n, err)
		}
		if err := s.DeleteWebhookEndpoint(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteWebhookEndpoint(ctx, a.ID); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if count(a.ID) != 0 {
			t.Fatal("messages outlived their endpoint")
		}
		if err := s.AppendAuthEvents(ctx, signIn(later)); err != nil {
			t.Fatal(err)
		}
		if count(a.ID) != 0 {
			t.Fatal("a deleted endpoint still subscribed")
		}
	})
}
