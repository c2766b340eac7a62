package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

func TestSweepBuildsRemovesOnlyDeadProcesses(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(tmp, buildPrefix+strconv.Itoa(done.Process.Pid)+"-1")
	live := filepath.Join(tmp, buildPrefix+"1-2") // PID 1 always exists
	own := filepath.Join(tmp, buildPrefix+strconv.Itoa(os.Getpid())+"-3")
	other := filepath.Join(tmp, buildPrefix+"abc") // not ours to judge
	for _, d := range []string{dead, live, own, other} {
		if err := os.MkdirAll(filepath.Join(d, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sweepBuilds()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the build directory of exited process %d is still there (%v)", done.Process.Pid, err)
	}
	for _, d := range []string{live, own, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
}
