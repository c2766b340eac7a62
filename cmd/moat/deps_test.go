package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

const module = "github.com/moat-sandbox/moat/"

// banned are the packages outside moat's module that the shipped binary
// must not link: the test framework, its HTTP test server, envtest (which
// makes a cache directory in its init).
var banned = []string{"testing", "net/http/httptest", "sigs.k8s.io/controller-runtime/pkg/envtest"}

// lab reports why a package of moat's module is lab code that must stay
// out of the product ("" if it is not): the benchmarks and scale drivers
// (internal/bench, built into moat-bench), the fixtures and harnesses
// (internal/testutil), and test doubles and suites, which live in
// packages whose name ends in "test" (runtimetest, exectest, k8stest ...).
func lab(pkg string) string {
	rel, ok := strings.CutPrefix(pkg, module)
	if !ok {
		return ""
	}
	switch {
	case rel == "internal/bench" || strings.HasPrefix(rel, "internal/bench/"):
		return "a benchmark or scale driver (moat-bench's)"
	case rel == "internal/testutil" || strings.HasPrefix(rel, "internal/testutil/"):
		return "a test fixture or harness"
	case slices.ContainsFunc(strings.Split(rel, "/"), func(e string) bool { return strings.HasSuffix(e, "test") }):
		return "a test double or suite"
	}
	return ""
}

// TestNoLabLinked guards what ships: `go list -deps` of moat for the
// platform it ships on links no benchmark, scale driver, fixture, test
// double or test package (the lab is cmd/moat-bench and the tests).
func TestNoLabLinked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"internal/cli") {
		t.Fatalf("go list -deps lists no %sinternal/cli: %q", module, deps)
	}
	for _, pkg := range deps {
		if slices.Contains(banned, pkg) {
			t.Errorf("moat links %s", pkg)
		}
		if why := lab(pkg); why != "" {
			t.Errorf("moat links %s, %s", pkg, why)
		}
	}
}

// TestLab: the rule of TestNoLabLinked names the lab's packages and none
// of the product's.
func TestLab(t *testing.T) {
	for i, c := range []struct {
		pkg string
		lab bool
	}{
		{module + "internal/bench", true},
		{module + "internal/bench/k8s/scale", true},
		{module + "internal/testutil/localregistry", true},
		{module + "internal/testutil/k8stest", true},
		{module + "internal/runtime/runtimetest", true},
		{module + "internal/execd/exectest", true},
		{module + "internal/runtime/fake", false},
		{module + "internal/benchmark", false},
		{module + "internal/k8s/controller", false},
		{module + "internal/lifecycle", false},
		{"github.com/mdlayher/netlink/nltest", false},
	} {
		if got := lab(c.pkg) != ""; got != c.lab {
			t.Errorf("%d: lab(%s) = %v, want %v", i, c.pkg, got, c.lab)
		}
	}
}
