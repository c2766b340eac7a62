package main

import (
	"os"
	"os/exec"
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
	for _, args := range [][]string{{"--help"}, {"controller", "--help"}} {
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
