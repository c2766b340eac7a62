package oci

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestKillInCgroupOnlyKillsMembers: a pid listed for a sandbox that has
// since been reused by a process outside the sandbox's cgroups must not
// be killed (the chaos test lost fresh sandboxes' agents this way).
func TestKillInCgroupOnlyKillsMembers(t *testing.T) {
	testutil.RequiresRoot(t)
	outsider := exec.Command("sleep", "30")
	if err := outsider.Start(); err != nil {
		t.Fatal(err)
	}
	defer outsider.Process.Kill()
	killInCgroup(outsider.Process.Pid, "/moat/kill-test-sandbox")
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat("/proc/" + strconv.Itoa(outsider.Process.Pid) + "/stat"); err != nil {
		t.Fatalf("process outside the sandbox's cgroup was killed")
	}
	if st, _ := readProcStat(outsider.Process.Pid); st.state == 'Z' {
		t.Fatalf("process outside the sandbox's cgroup was killed")
	}

	// A member of the sandbox's cgroup is killed.
	// Its pids cgroup (v1), or its cgroup (v2).
	dir := cgroupDir("pids", "/moat/kill-test-sandbox")
	if _, err := os.Stat(filepath.Dir(filepath.Dir(dir))); err != nil {
		t.Fatalf("no pids cgroup hierarchy: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(dir)
	member := exec.Command("sleep", "30")
	if err := member.Start(); err != nil {
		t.Fatal(err)
	}
	defer member.Process.Kill()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(member.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	killInCgroup(member.Process.Pid, "/moat/kill-test-sandbox")
	done := make(chan error, 1)
	go func() { done <- member.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("member of the sandbox's cgroup survived")
	}
}
