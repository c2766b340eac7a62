// Package telemetry exports moat's traces, audit records (as logs) and
// metrics over OTLP/HTTP, configured the usual way (OTEL_EXPORTER_OTLP_*
// environment variables). Without an OTLP endpoint it builds nothing and
// costs nothing: New returns nil and every method of a nil *Telemetry is
// a no-op. It lives in the server only (the in-sandbox agent stays lean).
//
// Traces: a span per API request (joining the caller's W3C traceparent),
// child spans of a create's phases and of each command run through the
// agent. Logs: every audit trail record, with its trace and span ids.
// Metrics: the Prometheus registry's metrics (through the Prometheus
// bridge), plus OSEP-0010's execd.* and egress.* instruments, counted
// from the audit trail.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	promclient "github.com/prometheus/client_golang/prometheus"
	promotel "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Options configure New.
type Options struct {
	// Service and Version name the resource (service.name defaults to
	// "moat"; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES apply).
	Service, Version string
	// Gatherer is the Prometheus registry whose metrics are exported over
	// OTLP too (nil: none).
	Gatherer promclient.Gatherer
	// Getenv reads the environment (default: none set, so tests pass it).
	Getenv func(string) string
	Log    *slog.Logger
}

// Telemetry is the OTLP exporters and the instruments.
type Telemetry struct {
	tp     *sdktrace.TracerProvider
	lp     *sdklog.LoggerProvider
	mp     *sdkmetric.MeterProvider
	tracer trace.Tracer
	logger otellog.Logger
	prop   propagation.TextMapPropagator
	inst   instruments
}

// signal reports whether env configures OTLP export of one signal
// (traces, logs, metrics): an endpoint for it or for all, and its
// OTEL_<SIGNAL>_EXPORTER not "none".
func signal(env func(string) string, name string) bool {
	up := strings.ToUpper(name)
	if v := env("OTEL_" + up + "_EXPORTER"); v != "" && v != "otlp" {
		return false
	}
	return env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_"+up+"_ENDPOINT") != ""
}

// Enabled reports whether env configures any OTLP export.
func Enabled(env func(string) string) bool {
	if env == nil || strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	return signal(env, "traces") || signal(env, "logs") || signal(env, "metrics")
}

// New builds the exporters env configures; nil (and no error) when it
// configures none. Only http/protobuf is supported.
func New(ctx context.Context, opt Options) (*Telemetry, error) {
	env := opt.Getenv
	if !Enabled(env) {
		return nil, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"} {
		if v := env(k); v != "" && v != "http/protobuf" {
			return nil, fmt.Errorf("%s=%s: moat exports OTLP over http/protobuf only", k, v)
		}
	}
	if opt.Service == "" {
		opt.Service = "moat"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(opt.Service), semconv.ServiceVersion(opt.Version)))
	if err != nil {
		return nil, err
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win (resource.Default
	// reads them from the process environment).
	res, _ = resource.Merge(res, resource.Environment())
	t := &Telemetry{prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	if signal(env, "traces") {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp traces: %w", err)
		}
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	}
	if signal(env, "logs") {
		exp, err := otlploghttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp logs: %w", err)
		}
		t.lp = sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(exp)), sdklog.WithResource(res), sdklog.WithAllowKeyDuplication())
		t.logger = t.lp.Logger("moat/audit")
	}
	if signal(env, "metrics") {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp metrics: %w", err)
		}
		ropts := []sdkmetric.PeriodicReaderOption{}
		if opt.Gatherer != nil {
			ropts = append(ropts, sdkmetric.WithProducer(promotel.NewMetricProducer(promotel.WithGatherer(opt.Gatherer))))
		}
		t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, ropts...)), sdkmetric.WithResource(res))
		if t.inst, err = newInstruments(t.mp.Meter("moat")); err != nil {
			return nil, err
		}
	}
	if t.tp != nil {
		t.tracer = t.tp.Tracer("moat/httpapi")
	} else {
		t.tracer = noop.NewTracerProvider().Tracer("")
	}
	return t, nil
}

// Shutdown flushes and stops the exporters.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.lp != nil {
		errs = append(errs, t.lp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// Middleware starts a span per request (a child of the caller's W3C
// traceparent, if any), named by its route, and ends it with the status.
// route names the matched route pattern (bounded, as metric labels).
func (t *Telemetry) Middleware(route func(*http.Request) string, next http.Handler) http.Handler {
	if t == nil || t.tp == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		rt := route(r)
		ctx, span := t.tracer.Start(ctx, rt, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPRoute(rt), semconv.URLPath(r.URL.Path)))
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			st := sw.status
			if st == 0 {
				st = http.StatusOK
			}
			span.SetAttributes(semconv.HTTPResponseStatusCode(st))
			if st >= 500 {
				span.SetStatus(2, http.StatusText(st)) // codes.Error
			}
			span.End()
		}()
		next.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// statusWriter records the status code (and keeps Flush and Hijack
// reachable through Unwrap).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instruments are OSEP-0010's metric instruments moat can count.
type instruments struct {
	execCount, fsCount, egressEval, egressDenied metric.Int64Counter
	execDur, fsDur                               metric.Float64Histogram
	// The attribute sets of every command and egress record, built once.
	success, failure, allow, deny metric.MeasurementOption
}

func newInstruments(m metric.Meter) (instruments, error) {
	in := instruments{
		success: metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "success"))),
		failure: metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "failure"))),
		allow:   metric.WithAttributeSet(attribute.NewSet(attribute.String("action", "allow"))),
		deny:    metric.WithAttributeSet(attribute.NewSet(attribute.String("action", "deny"))),
	}
	var errs [6]error
	in.execCount, errs[0] = m.Int64Counter("execd.execution.count", metric.WithDescription("Commands and code run through the agent, by result"))
	in.execDur, errs[1] = m.Float64Histogram("execd.execution.duration", metric.WithUnit("ms"), metric.WithDescription("Duration of a command or code run"))
	in.fsCount, errs[2] = m.Int64Counter("execd.filesystem.operations.count", metric.WithDescription("File operations through the agent, by operation"))
	in.fsDur, errs[3] = m.Float64Histogram("execd.filesystem.operations.duration", metric.WithUnit("ms"), metric.WithDescription("Duration of a file operation"))
	in.egressEval, errs[4] = m.Int64Counter("egress.policy.evaluations.count", metric.WithDescription("Egress policy evaluations, by action"))
	in.egressDenied, errs[5] = m.Int64Counter("egress.policy.denied_total", metric.WithDescription("Egress policy denials"))
	return in, errors.Join(errs[:]...)
}
