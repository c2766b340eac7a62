package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestNothingWrittenAtStart: starting moat writes no file anywhere (no
// package init side effects): the chart runs `moat controller` on a
// read-only root filesystem. controller-runtime's envtest, which the test
// harness uses, makes a cache directory in its init, so the binary must
// not link it.
func TestNothingWrittenAtStart(t *testing.T) {
	bin := testutil.MoatBinary(t)
	home, cache, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	for _, args := range [][]string{{"--help"}, {"controller", "--help"}, {"bench", "k8s", "--help"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CACHE_HOME="+cache, "TMPDIR="+tmp)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("moat %v: %v\n%s", args, err, out)
		}
		for _, d := range []string{home, cache, tmp} {
			if ents, _ := os.ReadDir(d); len(ents) > 0 {
				t.Errorf("moat %v wrote %s/%s at start", args, d, ents[0].Name())
			}
		}
	}
}

// TestNoTestHarnessLinked: the production binary links no test harness
// (the testing package, envtest, moat's k8stest and testutil).
func TestNoTestHarnessLinked(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || slices.ContainsFunc([]string{"sigs.k8s.io/controller-runtime/pkg/envtest", "/internal/testutil/k8stest", "/internal/testutil"},
			func(s string) bool { return strings.Contains(pkg, s) }) {
			t.Errorf("moat links %s", pkg)
		}
	}
}
