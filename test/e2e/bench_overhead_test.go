package e2e

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

var (
	overheadBench   = flag.Bool("overhead.bench", false, "run TestAuditOverheadBench: the cost of auditing and tracing (make bench-overhead)")
	overheadCreates = flag.Int("overhead.creates", 100, "TestAuditOverheadBench: timed creates per server")
	overheadExecs   = flag.Int("overhead.execs", 500, "TestAuditOverheadBench: timed exec round trips per server")
	overheadOTLP    = flag.Bool("overhead.otlp", true, "TestAuditOverheadBench: B exports over OTLP (false: B only audits)")
)

// TestAuditOverheadBench measures what the audit trail, the audit log and
// OTLP export cost on create and on the exec round trip: two `moat serve
// --runtime-class crun` on loopback, A with --audit-trail off and
// --audit-log off and no OTLP endpoint, B with both on (their defaults)
// exporting to an OpenTelemetry Collector, measured side by side by
// `moat-bench overhead`. It is a measurement, not a test (figures in
// docs/BENCHMARKS.md): it runs only with -overhead.bench. It checks only
// that the two servers are what they are said to be: A kept no trail and
// no audit log, B kept both and the collector received its export.
func TestAuditOverheadBench(t *testing.T) {
	if !*overheadBench {
		t.Skip("a measurement: run with -overhead.bench (make bench-overhead)")
	}
	col := testutil.OtelCollector(t)
	ref := startRegistry(t)
	bench := testutil.BenchBinary(t)
	// The default log level of a server (the e2e framework's is debug).
	common := []string{"--runtime-class", "crun", "--log-level", "info"}
	a := newServer(t)
	a.start(append(common, "--audit-trail", "off", "--audit-log", "off")...)
	// Only B's environment names the collector (a server reads it at start).
	if *overheadOTLP {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.Endpoint)
	}
	b := newServer(t)
	b.start(common...)

	load := func() string {
		out, _ := exec.Command("uptime").Output()
		return strings.TrimSpace(string(out))
	}
	t.Logf("load before: %s", load())
	var out bytes.Buffer
	cmd := exec.Command(bench, "overhead", "--server-a", "http://"+a.addr, "--api-key-a", a.key,
		"--server-b", "http://"+b.addr, "--api-key-b", b.key, "--image", ref,
		"--creates", strconv.Itoa(*overheadCreates), "--execs", strconv.Itoa(*overheadExecs))
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("moat-bench overhead: %v\n%s", err, out.String())
	}
	t.Logf("load after: %s", load())
	t.Logf("moat-bench overhead:\n%s", out.String())

	// A kept nothing; B kept each sandbox's trail (after its delete) and
	// its audit log.
	for _, p := range []string{"audit", "audit.log"} {
		if _, err := os.Stat(filepath.Join(a.root, p)); !os.IsNotExist(err) {
			t.Errorf("A has %s (%v), want none", p, err)
		}
	}
	trails, _ := filepath.Glob(filepath.Join(b.root, "audit", "*.log"))
	if len(trails) < *overheadCreates {
		t.Errorf("B has %d trails, want one per sandbox (≥ %d)", len(trails), *overheadCreates)
	}
	if _, err := os.Stat(filepath.Join(b.root, "audit.log")); err != nil {
		t.Errorf("B's audit log: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); *overheadOTLP; time.Sleep(500 * time.Millisecond) {
		if raw, _ := os.ReadFile(col.File); bytes.Contains(raw, []byte("moat.audit.command")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the collector received no command record from B")
		}
	}
}
