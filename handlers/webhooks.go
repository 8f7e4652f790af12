package handlers

import (
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/extensions/webhooks"
	"github.com/identityd/identityd/oauth"
	"github.com/identityd/identityd/persistence"
)

// Webhooks (issue 18; spec "Events" 4 names them and shows no routes).
// Rules and delivery live in extensions/webhooks; the outbox in
// persistence/webhooks.go.

const webhooksPath = "/api/v1/webhooks"

// webhookRoutes adds the endpoint and delivery routes (admin token).
func (a *api) webhookRoutes(r *mux.Router, rl RateLimits) {
	if a.webhooks == nil {
		return
	}
	admin := func(h http.HandlerFunc) http.HandlerFunc {
		return a.guarded(oauth.ScopeAdmin, "", "admin", rl.Admin, h)
	}
	r.HandleFunc(webhooksPath, admin(a.createWebhook)).Methods(http.MethodPost)
	r.HandleFunc(webhooksPath, admin(a.listWebhooks)).Methods(http.MethodGet)
	r.HandleFunc(webhooksPath+"/event-types", admin(a.webhookEventTypes)).Methods(http.MethodGet)
	r.HandleFunc(webhooksPath+"/{id}", admin(a.getWebhook)).Methods(http.MethodGet)
	r.HandleFunc(webhooksPath+"/{id}", admin(a.updateWebhook)).Methods(http.MethodPatch)
	r.HandleFunc(webhooksPath+"/{id}", admin(a.deleteWebhook)).Methods(http.MethodDelete)
	r.HandleFunc(webhooksPath+"/{id}/rotate-secret", admin(a.rotateWebhookSecret)).Methods(http.MethodPost)
	r.HandleFunc(webhooksPath+"/{id}/test", admin(a.testWebhook)).Methods(http.MethodPost)
	r.HandleFunc(webhooksPath+"/{id}/deliveries", admin(a.listWebhookDeliveries)).Methods(http.MethodGet)
	r.HandleFunc(webhooksPath+"/{id}/deliveries/{deliveryId}", admin(a.getWebhookDelivery)).Methods(http.MethodGet)
	r.HandleFunc(webhooksPath+"/{id}/deliveries/{deliveryId}/redeliver", admin(a.redeliverWebhook)).Methods(http.MethodPost)
}

// webhookJSON is the API shape of an endpoint; the secret only in the
// answers that make one (creation, rotation).
type webhookJSON struct {
	ID             string   `json:"id"`
	URL            string   `json:"url"`
	Description    string   `json:"description"`
	EventTypes     []string `json:"eventTypes"`
	Enabled        bool     `json:"enabled"`
	DisabledReason *string  `json:"disabledReason"`
	FailingSince   *string  `json:"failingSince"`
	CreatedAt      string   `json:"createdAt"`
	UpdatedAt      string   `json:"updatedAt"`
	Secret         string   `json:"secret,omitempty"`
	// During a rotation's grace: when the previous secret stops signing.
	PreviousSecretExpiresAt *string `json:"previousSecretExpiresAt,omitempty"`
}

func toWebhookJSON(e *persistence.WebhookEndpoint) webhookJSON {
	out := webhookJSON{ID: e.ID, URL: e.URL, Description: e.Description, EventTypes: e.EventTypes, Enabled: e.Enabled,
		FailingSince: isoPtr(e.FailingSince), CreatedAt: isoTime(e.CreatedAt), UpdatedAt: isoTime(e.UpdatedAt)}
	if out.EventTypes == nil {
		out.EventTypes = []string{}
	}
	if e.DisabledReason != "" {
		out.DisabledReason = &e.DisabledReason
	}
	if e.OldSecret != nil {
		out.PreviousSecretExpiresAt = isoPtr(e.OldSecretUntil)
	}
	return out
}

// webhookDeliveryJSON is the API shape of a message and its delivery.
type webhookDeliveryJSON struct {
	ID            string         `json:"id"`
	MessageID     string         `json:"messageId"` // the webhook-id header
	EventType     string         `json:"eventType"`
	Status        string         `json:"status"`
	Attempts      int            `json:"attempts"`
	NextAttemptAt *string        `json:"nextAttemptAt"`
	LastAttemptAt *string        `json:"lastAttemptAt"`
	LastStatus    *int           `json:"lastResponseStatus"`
	LastError     *string        `json:"lastError"`
	DeliveredAt   *string        `json:"deliveredAt"`
	CreatedAt     string         `json:"createdAt"`
	Payload       map[string]any `json:"payload"`
}

func toWebhookDeliveryJSON(d *persistence.WebhookDelivery) webhookDeliveryJSON {
	out := webhookDeliveryJSON{ID: d.ID, MessageID: d.MessageID, EventType: d.EventType, Status: d.Status, Attempts: d.Attempts,
		LastAttemptAt: isoPtr(d.LastAttemptAt), LastStatus: d.LastStatus, DeliveredAt: isoPtr(d.DeliveredAt), CreatedAt: isoTime(d.CreatedAt)}
	if d.Status == persistence.DeliveryPending {
		out.NextAttemptAt = isoPtr(&d.NextAttemptAt)
	}
	if d.LastError != "" {
		out.LastError = &d.LastError
	}
	// The payload was written by us as JSON; a row that would not decode
	// is shown without it rather than failing the list.
	_ = json.Unmarshal([]byte(d.Payload), &out.Payload)
	return out
}

// POST /api/v1/webhooks: 201 with the endpoint and its secret (once).
func (a *api) createWebhook(w http.ResponseWriter, r *http.Request) {
	var in webhooks.Input
	if err := decodeJSON(r, &in); err != nil {
		writeError(w, r, err)
		return
	}
	e, secret, err := a.webhooks.Create(r.Context(), in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := toWebhookJSON(e)
	out.Secret = secret
	w.Header().Set("Location", webhooksPath+"/"+e.ID)
	writeJSON(w, http.StatusCreated, out)
}

// GET /api/v1/webhooks
func (a *api) listWebhooks(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.webhooks.List(r.Context(), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "webhooks", list, total, page, toWebhookJSON)
}

// GET /api/v1/webhooks/event-types: the catalog.
func (a *api) webhookEventTypes(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"eventTypes": webhooks.Catalog})
}

// GET /api/v1/webhooks/{id}
func (a *api) getWebhook(w http.ResponseWriter, r *http.Request) {
	e, err := a.webhooks.Get(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(e))
}

// PATCH /api/v1/webhooks/{id}: url, description, eventTypes, enabled.
func (a *api) updateWebhook(w http.ResponseWriter, r *http.Request) {
	var p webhooks.Patch
	if err := decodeJSON(r, &p); err != nil {
		writeError(w, r, err)
		return
	}
	e, err := a.webhooks.Update(r.Context(), mux.Vars(r)["id"], p)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(e))
}

// DELETE /api/v1/webhooks/{id}: 204; its waiting messages go with it.
func (a *api) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	if err := a.webhooks.Delete(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// POST /api/v1/webhooks/{id}/rotate-secret: the new secret (once); the
// previous one signs too until previousSecretExpiresAt.
func (a *api) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) {
	e, secret, err := a.webhooks.RotateSecret(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := toWebhookJSON(e)
	out.Secret = secret
	writeJSON(w, http.StatusOK, out)
}

// POST /api/v1/webhooks/{id}/test: 202 with the queued webhook.test message.
func (a *api) testWebhook(w http.ResponseWriter, r *http.Request) {
	d, err := a.webhooks.Test(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, toWebhookDeliveryJSON(d))
}

// GET /api/v1/webhooks/{id}/deliveries?status=: newest first.
func (a *api) listWebhookDeliveries(w http.ResponseWriter, r *http.Request) {
	page, err := pageFrom(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	list, total, err := a.webhooks.Deliveries(r.Context(), mux.Vars(r)["id"], r.URL.Query().Get("status"), page)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeList(w, "deliveries", list, total, page, toWebhookDeliveryJSON)
}

// GET /api/v1/webhooks/{id}/deliveries/{deliveryId}
func (a *api) getWebhookDelivery(w http.ResponseWriter, r *http.Request) {
	d, err := a.webhooks.Delivery(r.Context(), mux.Vars(r)["id"], mux.Vars(r)["deliveryId"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toWebhookDeliveryJSON(d))
}

// POST /api/v1/webhooks/{id}/deliveries/{deliveryId}/redeliver: 202, the
// message pending again with a new schedule.
func (a *api) redeliverWebhook(w http.ResponseWriter, r *http.Request) {
	d, err := a.webhooks.Redeliver(r.Context(), mux.Vars(r)["id"], mux.Vars(r)["deliveryId"])
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, toWebhookDeliveryJSON(d))
}
