package telemetry

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/moat-sandbox/moat/internal/audit/trail"
)

// receiver is a minimal OTLP/HTTP receiver (protobuf) keeping what it got.
type receiver struct {
	mu      sync.Mutex
	traces  []*coltrace.ExportTraceServiceRequest
	logs    []*collogs.ExportLogsServiceRequest
	metrics []*colmetrics.ExportMetricsServiceRequest
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var err error
	switch r.URL.Path {
	case "/v1/traces":
		m := &coltrace.ExportTraceServiceRequest{}
		err = proto.Unmarshal(b, m)
		rc.traces = append(rc.traces, m)
	case "/v1/logs":
		m := &collogs.ExportLogsServiceRequest{}
		err = proto.Unmarshal(b, m)
		rc.logs = append(rc.logs, m)
	case "/v1/metrics":
		m := &colmetrics.ExportMetricsServiceRequest{}
		err = proto.Unmarshal(b, m)
		rc.metrics = append(rc.metrics, m)
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(nil)
}

func TestOffWithoutEndpoint(t *testing.T) {
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	if tel, err := New(context.Background(), Options{Getenv: get}); tel != nil || err != nil {
		t.Fatalf("no endpoint: %v %v", tel, err)
	}
	// A nil Telemetry is a no-op everywhere.
	var tel *Telemetry
	tel.Record(trail.Record{Kind: trail.KindCommand})
	h := http.NotFoundHandler()
	if tel.Middleware(nil, h) == nil || tel.Shutdown(context.Background()) != nil {
		t.Fatal("nil Telemetry")
	}
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:1"
	env["OTEL_SDK_DISABLED"] = "true"
	if Enabled(get) {
		t.Fatal("OTEL_SDK_DISABLED ignored")
	}
	delete(env, "OTEL_SDK_DISABLED")
	env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
	if _, err := New(context.Background(), Options{Getenv: get}); err == nil {
		t.Fatal("grpc accepted")
	}
}

// A request's span, an audit record it caused and the metrics reach an
// OTLP/HTTP receiver; the log record carries the span's trace id.
func TestExportsLinkedByTrace(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
	t.Setenv("OTEL_BLRP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "moat_test_total", Help: "a test counter"})
	reg.MustRegister(c)
	c.Inc()
	tel, err := New(context.Background(), Options{Getenv: os.Getenv, Gatherer: reg})
	if err != nil || tel == nil {
		t.Fatalf("New: %v %v", tel, err)
	}
	var traceID, spanID string
	h := tel.Middleware(func(*http.Request) string { return "POST /v1/sandboxes" }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := trace.SpanContextFromContext(r.Context())
		traceID, spanID = sc.TraceID().String(), sc.SpanID().String()
		tel.Record(trail.Record{Seq: 1, Time: time.Now(), Kind: trail.KindCommand, Action: trail.ActionRun, SandboxID: "sb1",
			TraceID: traceID, SpanID: spanID, DurationMS: new(float64), Command: &trail.Command{Line: "echo hi", ExitCode: new(int)}})
		tel.Record(trail.Record{Seq: 2, Time: time.Now(), Kind: trail.KindEgress, Action: trail.ActionDeny, SandboxID: "sb1", Count: 3,
			Egress: &trail.Egress{Host: "blocked.test", Rule: "default", Layer: "dns"}})
		w.WriteHeader(202)
	}))
	req := httptest.NewRequest("POST", "/v1/sandboxes", nil)
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if traceID != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("the request's span did not join the caller's trace: %s", traceID)
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var span bool
	for _, tr := range rc.traces {
		for _, rs := range tr.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if hex.EncodeToString(s.TraceId) == traceID && hex.EncodeToString(s.SpanId) == spanID && s.Name == "POST /v1/sandboxes" {
						span = true
					}
				}
			}
		}
	}
	var linked, egress bool
	for _, l := range rc.logs {
		for _, rl := range l.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, lr := range sl.LogRecords {
					if hex.EncodeToString(lr.TraceId) == traceID && hex.EncodeToString(lr.SpanId) == spanID && lr.EventName == "moat.audit.command" {
						linked = true
					}
					if lr.EventName == "moat.audit.egress" {
						egress = true
					}
				}
			}
		}
	}
	names := map[string]bool{}
	for _, m := range rc.metrics {
		for _, rm := range m.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, mt := range sm.Metrics {
					names[mt.Name] = true
				}
			}
		}
	}
	if !span || !linked || !egress {
		t.Fatalf("span %v, log linked to it %v, egress log %v (%d trace, %d log exports)", span, linked, egress, len(rc.traces), len(rc.logs))
	}
	for _, n := range []string{"moat_test_total", "execd.execution.count", "execd.execution.duration", "egress.policy.evaluations.count", "egress.policy.denied_total"} {
		if !names[n] {
			t.Fatalf("metric %s not exported (got %v)", n, names)
		}
	}
}
