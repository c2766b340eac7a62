// Package metrics is moat's Prometheus instrumentation: one registry per
// server (no package-level collectors), with
//
//   - moat_sandboxes{state}: sandboxes by lifecycle state, computed at
//     scrape time from a callback;
//   - moat_sandbox_create_seconds: histogram of successful create latency;
//   - moat_pool_claims_total{result="hit|miss"}: pool claims served by an
//     idle sandbox (hit) or by a cold create (miss);
//   - moat_http_requests_total{route,code}: API requests by ServeMux
//     pattern and status code;
//   - moat_idle_pauses_total{action}: sandboxes paused by their idle
//     policy;
//   - moat_idle_wakes_total{result="ok|failed|timeout"}: wakes of
//     idle-paused sandboxes (timeout: a request that stopped waiting),
//     and moat_idle_wake_seconds, how long the resumes took.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moat-sandbox/moat/internal/web"
)

// StateCounts returns the number of sandboxes in each state. It is called
// on every scrape, so it must be cheap and safe for concurrent use. States
// absent from the map are reported as 0 if they are listed in Options.States.
type StateCounts func() map[string]int

// Options configures a Registry.
type Options struct {
	// States is called at scrape time for moat_sandboxes; nil omits it.
	States StateCounts
	// KnownStates are always exported (as 0 when absent), so that a state
	// that empties out does not vanish from the series.
	KnownStates []string
}

// CreateBuckets returns the moat_sandbox_create_seconds bucket bounds:
// 5 ms to 30 s.
func CreateBuckets() []float64 {
	return []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
}

// Registry holds moat's collectors. It is safe for concurrent use.
type Registry struct {
	reg      *prometheus.Registry
	create   prometheus.Histogram
	claims   *prometheus.CounterVec
	requests *prometheus.CounterVec
	pauses   *prometheus.CounterVec
	wakes    *prometheus.CounterVec
	wake     prometheus.Histogram
}

// New returns a registry with moat's collectors registered.
func New(opts Options) *Registry {
	r := &Registry{
		reg: prometheus.NewRegistry(),
		create: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "moat_sandbox_create_seconds", Help: "Latency of successful sandbox creates, in seconds.",
			Buckets: CreateBuckets(),
		}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_pool_claims_total", Help: "Sandboxes requested from a pool, by result: hit (an idle sandbox) or miss (created cold).",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_http_requests_total", Help: "Lifecycle API requests, by route pattern and status code.",
		}, []string{"route", "code"}),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_idle_pauses_total", Help: "Sandboxes paused by their idle policy, by action.",
		}, []string{"action"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_idle_wakes_total", Help: "Wakes of idle-paused sandboxes by result: ok, failed, or timeout (a request stopped waiting).",
		}, []string{"result"}),
		wake: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "moat_idle_wake_seconds", Help: "Latency of the resumes of idle-paused sandboxes, in seconds.",
			Buckets: CreateBuckets(),
		}),
	}
	// Both results exist from the start, so rate() works before the first miss.
	r.claims.WithLabelValues("hit")
	r.claims.WithLabelValues("miss")
	r.pauses.WithLabelValues("pause")
	for _, res := range []string{"ok", "failed", "timeout"} {
		r.wakes.WithLabelValues(res)
	}
	r.reg.MustRegister(r.create, r.claims, r.requests, r.pauses, r.wakes, r.wake,
		// The server's own health: goroutines, memory, open files (what
		// `moat bench load` watches for leaks over a soak).
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if opts.States != nil {
		r.reg.MustRegister(&stateCollector{counts: opts.States, known: opts.KnownStates,
			desc: prometheus.NewDesc("moat_sandboxes", "Sandboxes by lifecycle state.", []string{"state"}, nil)})
	}
	return r
}

// Gatherer returns the underlying registry, e.g. to add collectors.
func (r *Registry) Gatherer() *prometheus.Registry { return r.reg }

// ObserveCreate records one successful create that took d.
func (r *Registry) ObserveCreate(d time.Duration) { r.create.Observe(d.Seconds()) }

// ObservePoolClaim records a pool claim of hits idle and misses cold
// sandboxes.
func (r *Registry) ObservePoolClaim(hits, misses int) {
	if hits > 0 {
		r.claims.WithLabelValues("hit").Add(float64(hits))
	}
	if misses > 0 {
		r.claims.WithLabelValues("miss").Add(float64(misses))
	}
}

// ObserveIdlePause records a sandbox paused by its idle policy.
func (r *Registry) ObserveIdlePause(action string) { r.pauses.WithLabelValues(action).Inc() }

// ObserveWake records a wake's outcome and, unless it is "timeout", how
// long the resume took.
func (r *Registry) ObserveWake(outcome string, d time.Duration) {
	r.wakes.WithLabelValues(outcome).Inc()
	if outcome != "timeout" {
		r.wake.Observe(d.Seconds())
	}
}

// Handler serves the registry in the Prometheus exposition format.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

// Instrument counts the requests next serves. route names a request's
// route, normally its ServeMux pattern; it must return a bounded set of
// values (never the raw path). "" is counted as "unmatched".
func (r *Registry) Instrument(route func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		name := route(req)
		if name == "" {
			name = "unmatched"
		}
		sw := &web.StatusWriter{ResponseWriter: w}
		panicked := true
		defer func() {
			// A panic past any recoverer aborts the connection: count a 500
			// unless a status was already sent, and let it propagate.
			code := sw.Status()
			switch {
			case code == 0 && panicked:
				code = http.StatusInternalServerError
			case code == 0:
				code = http.StatusOK // nothing written: net/http sends 200
			}
			r.requests.WithLabelValues(name, strconv.Itoa(code)).Inc()
		}()
		next.ServeHTTP(sw, req)
		panicked = false
	})
}

// stateCollector reports moat_sandboxes from the callback at scrape time.
type stateCollector struct {
	counts StateCounts
	known  []string
	desc   *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.counts()
	for _, st := range c.known {
		if _, ok := counts[st]; !ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 0, st)
		}
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), st)
	}
}
