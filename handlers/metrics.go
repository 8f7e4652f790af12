package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/identityd/identityd/extensions/agents"
)

// Metrics are the Prometheus series identityd exports at /metrics.
type Metrics struct {
	registry     *prometheus.Registry
	requests     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	auditFailed  *prometheus.CounterVec
	TokensIssued *prometheus.CounterVec
}

// NewMetrics registers identityd's series and the Go runtime's on a registry
// of their own.
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "identityd_http_requests_total", Help: "HTTP requests by route template, method and status.",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "identityd_http_request_duration_seconds", Help: "HTTP request latency by route template and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route", "method"}),
		auditFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "identityd_audit_failures_total", Help: "Agent audit entries that could not be recorded, by action.",
		}, []string{"action"}),
		TokensIssued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "identityd_tokens_issued_total", Help: "Access tokens issued by grant type.",
		}, []string{"grant_type"}),
	}
	// The actions are there from the start, at 0, so an alert on them
	// need not wait for a first failure.
	m.auditFailed.WithLabelValues(agents.ActionAPICall)
	m.auditFailed.WithLabelValues(agents.ActionTokenRefused)
	m.auditFailed.WithLabelValues(agents.ActionBackchannelRefused)
	m.registry.MustRegister(m.requests, m.latency, m.auditFailed, m.TokensIssued,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// methods are the request methods identityd knows. Any other is answered
// 501 (RFC 9110 §15.6.2) before any work and counted as "other": a method
// is the client's to invent, and a label per invented method would grow
// /metrics without bound.
var methods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// methodLabel is the label a request method is counted under.
func methodLabel(method string) string {
	if methods[method] {
		return method
	}
	return "other"
}

func (m *Metrics) observe(method, route string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues(route, method).Observe(d.Seconds())
}

// AuditFailed counts an agent audit entry (agents.Action*) that could not
// be recorded; the caller logs the cause.
func (m *Metrics) AuditFailed(action string) { m.auditFailed.WithLabelValues(action).Inc() }

func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
