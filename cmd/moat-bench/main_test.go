package main

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNoTestHarnessLinked: moat-bench runs against clusters and servers
// that exist; the throw-away ones come from the tests (make bench-k8s),
// so it links no test harness: not the testing package, envtest (which
// writes a cache directory in its init), k8stest or testutil itself (its
// fixture packages, the loopback registry and the busybox rootfs, are
// what the in-process server benchmarks use).
func TestNoTestHarnessLinked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/moat-sandbox/moat/internal/bench/benchcli") {
		t.Fatalf("go list -deps lists no benchcli: %q", deps)
	}
	for _, pkg := range deps {
		if pkg == "testing" || pkg == "github.com/moat-sandbox/moat/internal/testutil" || slices.ContainsFunc([]string{"sigs.k8s.io/controller-runtime/pkg/envtest", "/internal/testutil/k8stest"},
			func(s string) bool { return strings.Contains(pkg, s) }) {
			t.Errorf("moat-bench links %s", pkg)
		}
	}
}
