package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/moat-sandbox/moat/internal/audit/trail"
)

// BenchmarkCommand is what moat's telemetry adds to one command run
// through the server proxy: the request's span (which is the command's),
// and the audit record as a log and into the execd counters, exported in the
// background to an OTLP receiver that discards what it gets.
func BenchmarkCommand(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	tel, err := New(context.Background(), Options{Getenv: os.Getenv})
	if err != nil {
		b.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The command's span is its request's (internal/httpapi/trail.go).
		span := trace.SpanFromContext(r.Context())
		span.SetName("execd command run")
		span.SetAttributes(attribute.String("osbx.id", "abcdefghij0123456789"), attribute.Int("process.exit.code", 0))
		code := 0
		d := 1.5
		tel.Record(trail.Record{SandboxID: "abcdefghij0123456789", Kind: trail.KindCommand, Action: trail.ActionRun, Time: time.Now(),
			Status: 200, DurationMS: &d, Tenant: "default", RequestID: "req-1",
			Actor:   &trail.Actor{KeyID: "k1", Tenant: "default", Role: "admin"},
			Command: &trail.Command{Line: "true", Cwd: "/", ExitCode: &code},
			TraceID: span.SpanContext().TraceID().String(), SpanID: span.SpanContext().SpanID().String()})
	})
	h := tel.Middleware(func(*http.Request) string { return "/sandboxes/{id}/proxy/{port}/command" }, inner)
	req := httptest.NewRequest("POST", "/sandboxes/abc/proxy/44772/command", nil)
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
}
