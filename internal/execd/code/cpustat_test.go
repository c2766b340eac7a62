package code

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReadGroupUsage: the CPU time and run state of a process group, as
// the interrupt gate reads them: a spinning group's CPU time grows and it
// is runnable; a sleeping one's is not; a group with no members reads as
// none.
func TestReadGroupUsage(t *testing.T) {
	start := func(script string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
		})
		return cmd
	}
	spin := start("while :; do :; done")
	sleep := start("exec sleep 60")
	u0 := readGroupUsage(spin.Process.Pid)
	if u0.nmembers != 1 {
		t.Fatalf("spinning group: %+v", u0)
	}
	running := false
	deadline := time.Now().Add(20 * time.Second)
	var u groupUsage
	for time.Now().Before(deadline) {
		u = readGroupUsage(spin.Process.Pid)
		running = running || u.running
		if u.cpu-u0.cpu >= 50*time.Millisecond && running {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if u.cpu-u0.cpu < 50*time.Millisecond || !running {
		t.Fatalf("spinning group: cpu %v -> %v, seen running %v", u0.cpu, u.cpu, running)
	}
	time.Sleep(100 * time.Millisecond)
	if s := readGroupUsage(sleep.Process.Pid); s.nmembers != 1 || s.running || s.cpu > 50*time.Millisecond {
		t.Fatalf("sleeping group: %+v", s)
	}
	if n := readGroupUsage(1 << 30).nmembers; n != 0 {
		t.Fatalf("no such group: %d members", n)
	}
}
