package telemetry

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	otellog "go.opentelemetry.io/otel/log"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/moat-sandbox/moat/internal/audit/trail"
)

// Record exports one audit trail record: as an OTLP log record carrying
// the trace and span ids of what caused it, and into OSEP-0010's
// counters. It does not block (the log processor batches).
func (t *Telemetry) Record(r trail.Record) {
	if t == nil {
		return
	}
	n := int64(max(r.Count, 1))
	ctx := context.Background()
	if t.mp != nil {
		t.count(ctx, r, n)
	}
	if t.logger == nil {
		return
	}
	if tid, err := trace.TraceIDFromHex(r.TraceID); err == nil {
		sid, _ := trace.SpanIDFromHex(r.SpanID)
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	}
	var lr otellog.Record
	lr.SetTimestamp(r.Time)
	lr.SetObservedTimestamp(r.Time)
	lr.SetEventName("moat.audit." + string(r.Kind))
	sev := otellog.SeverityInfo
	if r.Action == trail.ActionDeny || r.Action == trail.ActionWithheld || r.Status >= 400 {
		sev = otellog.SeverityWarn
	}
	lr.SetSeverity(sev)
	lr.SetSeverityText(strings.ToUpper(sev.String()))
	lr.SetBody(attribute.StringValue(string(r.Kind) + " " + r.Action))
	lr.AddAttributes(logAttrs(r)...)
	t.logger.Emit(ctx, lr)
}

// count adds a record to OSEP-0010's instruments.
func (t *Telemetry) count(ctx context.Context, r trail.Record, n int64) {
	in := t.inst
	switch r.Kind {
	case trail.KindCommand:
		if r.Action == trail.ActionRun || r.Action == "code" {
			result := "success"
			if r.Status >= 400 || r.Command != nil && (r.Command.Error != "" || r.Command.ExitCode != nil && *r.Command.ExitCode != 0) {
				result = "failure"
			}
			opt := in.success
			if result == "failure" {
				opt = in.failure
			}
			in.execCount.Add(ctx, n, opt)
			if r.DurationMS != nil {
				in.execDur.Record(ctx, *r.DurationMS, opt)
			}
		}
	case trail.KindFile:
		op := metric.WithAttributes(attribute.String("operation", r.Action))
		in.fsCount.Add(ctx, n, op)
		if r.DurationMS != nil {
			in.fsDur.Record(ctx, *r.DurationMS, op)
		}
	case trail.KindEgress:
		opt := in.allow
		if r.Action == trail.ActionDeny {
			opt = in.deny
			in.egressDenied.Add(ctx, n)
		}
		in.egressEval.Add(ctx, n, opt)
	}
}

// logAttrs are a record's fields as log attributes (osbx.id is
// OSEP-0010's sandbox key). Their keys are unique: the logger provider
// skips deduplication (WithAllowKeyDuplication), which costs more than
// the rest of a record.
func logAttrs(r trail.Record) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String("osbx.id", r.SandboxID),
		attribute.String("moat.audit.kind", string(r.Kind)),
		attribute.String("moat.audit.action", r.Action),
		attribute.Int64("moat.audit.seq", int64(r.Seq)),
	}
	str := func(k, v string) {
		if v != "" {
			kv = append(kv, attribute.String(k, v))
		}
	}
	str("moat.tenant", r.Tenant)
	str("moat.request_id", r.RequestID)
	if a := r.Actor; a != nil {
		str("moat.actor.key_id", a.KeyID)
		str("moat.actor.tenant", a.Tenant)
		str("moat.actor.role", a.Role)
	}
	if r.Status != 0 {
		kv = append(kv, attribute.Int("http.response.status_code", r.Status))
	}
	if r.DurationMS != nil {
		kv = append(kv, attribute.Float64("moat.duration_ms", *r.DurationMS))
	}
	if r.Count > 1 {
		kv = append(kv, attribute.Int("moat.audit.count", r.Count))
	}
	if c := r.Command; c != nil {
		str("process.command_line", c.Line)
		str("process.working_directory", c.Cwd)
		str("moat.session", c.Session)
		str("error.message", c.Error)
		if c.UID != nil {
			kv = append(kv, attribute.Int("process.user.id", *c.UID))
		}
		if c.ExitCode != nil {
			kv = append(kv, attribute.Int("process.exit.code", *c.ExitCode))
		}
	}
	if len(r.Files) > 0 {
		paths := make([]string, len(r.Files))
		for i, f := range r.Files {
			paths[i] = f.Path
		}
		kv = append(kv, attribute.StringSlice("file.paths", paths))
	}
	if e := r.Egress; e != nil {
		kv = append(kv, attribute.String("osbx.event", "egress.outbound"), attribute.String("server.address", e.Host),
			attribute.Bool("moat.egress.allowed", e.Allowed), attribute.String("moat.egress.rule", e.Rule), attribute.String("moat.egress.layer", e.Layer))
		if e.Port > 0 {
			kv = append(kv, attribute.Int("server.port", e.Port))
		}
	}
	if c := r.Credential; c != nil {
		kv = append(kv, attribute.String("moat.credential.binding", c.Binding), attribute.Bool("moat.credential.injected", c.Injected))
		if r.Egress == nil {
			kv = append(kv, attribute.String("server.address", c.Host))
		}
	}
	return kv
}

// TracerProvider is the provider of the API's spans (a no-op one when
// traces are not exported).
func (t *Telemetry) TracerProvider() trace.TracerProvider {
	if t == nil || t.tp == nil {
		return noop.NewTracerProvider()
	}
	return t.tp
}
