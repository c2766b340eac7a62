package e2e

import (
	"bytes"
	"flag"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

var e2bBench = flag.Bool("e2b.bench", false, "run TestE2BSDKBench: time to interactive through E2B's SDK (make bench-e2b)")

// TestE2BSDKBench measures time to interactive through E2B's SDK,
// unchanged, in domain mode on loopback (test/compat/e2b/bench.mjs):
// Sandbox.create then the first commands.run, cold on crun and claimed
// from a template with a warm pool, and a burst of 100 cold ones. It is
// a measurement, not a test (figures in docs/BENCHMARKS.md): it runs
// only with -e2b.bench.
func TestE2BSDKBench(t *testing.T) {
	if !*e2bBench {
		t.Skip("a measurement: run with -e2b.bench (make bench-e2b)")
	}
	e := startE2B(t, "--runtime-class", "crun")
	e.template(t, map[string]any{"id": "bench-cold", "image": e.ref, "user": "root", "workdir": "/root"})
	const warm = 20
	code, out, _ := e.srv.do("POST", "/v1/pools", map[string]any{
		"name":         "bench-warm",
		"template":     map[string]any{"image": map[string]string{"uri": e.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}},
		"capacitySpec": map[string]int{"bufferMin": warm, "bufferMax": warm, "poolMin": 0, "poolMax": 2 * warm},
	}, "OPEN-SANDBOX-API-KEY", e.key)
	if code != 201 {
		t.Fatalf("create pool: %d %s", code, out)
	}
	e.template(t, map[string]any{"id": "bench-warm", "pool": "bench-warm"})
	waitWarm := func() {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			code, out, _ := e.srv.do("GET", "/v1/pools/bench-warm", nil, "OPEN-SANDBOX-API-KEY", e.key)
			if code == 200 && bytes.Contains(out, []byte(fmt.Sprintf(`"available":%d`, warm))) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool not filled: %d %s", code, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	load := func() string {
		b, _ := exec.Command("uptime").Output()
		return strings.TrimSpace(string(b))
	}
	t.Logf("load before: %s", load())
	t.Logf("cold (crun), 50 sequential + burst of 100: %s", e.node(t, 20*time.Minute, "bench.mjs", "bench-cold", "50", "100"))
	t.Logf("load: %s", load())
	waitWarm()
	// Sequential claims, at most the warm buffer: each finds an idle one.
	t.Logf("warm (pool of %d), %d sequential: %s", warm, warm-2, e.node(t, 10*time.Minute, "bench.mjs", "bench-warm", fmt.Sprint(warm-2)))
	t.Logf("load after: %s", load())
}
