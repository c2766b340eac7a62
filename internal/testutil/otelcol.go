package testutil

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Collector is a running OpenTelemetry Collector (tools/otelcol) with an
// OTLP/HTTP receiver on loopback and a file exporter writing what it
// receives as OTLP JSON lines.
type Collector struct {
	// Endpoint is the receiver's base URL (OTEL_EXPORTER_OTLP_ENDPOINT).
	Endpoint string
	// File receives every exported batch, one OTLP JSON object a line.
	File string
}

// OtelCollector builds (once per version, scripts/build-otelcol.sh) and
// starts the test collector for t; it is stopped at cleanup.
func OtelCollector(t testing.TB) *Collector {
	t.Helper()
	SkipShort(t, "runs an OpenTelemetry Collector")
	script := filepath.Join(RepoRoot(t), "scripts", "build-otelcol.sh")
	if out, err := exec.Command(script).CombinedOutput(); err != nil {
		t.Fatalf("build-otelcol: %v\n%s", err, out)
	}
	out, err := exec.Command(script, "--print").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := strings.TrimSpace(string(out))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	c := &Collector{Endpoint: "http://" + addr, File: filepath.Join(dir, "otlp.jsonl")}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
exporters:
  file:
    path: %s
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces: {receivers: [otlp], exporters: [file]}
    logs: {receivers: [otlp], exporters: [file]}
    metrics: {receivers: [otlp], exporters: [file]}
`, addr, c.File)
	cfgFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "collector.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", "file:"+cfgFile)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("collector log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return c
		}
		select {
		case <-exited:
			t.Fatalf("the collector exited: %v", cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector did not listen on %s", addr)
		}
	}
}

// Lines returns the exported batches received so far, decoded.
func (c *Collector) Lines(t testing.TB) []map[string]any {
	t.Helper()
	f, err := os.Open(c.File)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}
