package trail

import (
	"testing"
)

// BenchmarkAppend is the cost of one command record: what the audit
// trail adds to each command run through the server proxy.
func BenchmarkAppend(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	exit := 0
	d := 3.2
	r := Record{Kind: KindCommand, Action: ActionRun, SandboxID: "sb-0123456789", Tenant: "default",
		Actor: &Actor{KeyID: "k1", Tenant: "default", Role: "admin"}, RequestID: "req-0123456789abcdef",
		TraceID: "0123456789abcdef0123456789abcdef", SpanID: "0123456789abcdef", Status: 200, DurationMS: &d,
		Command: &Command{Line: "true", ExitCode: &exit, Session: "cmd-1"}}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Append(r); err != nil {
			b.Fatal(err)
		}
	}
}
