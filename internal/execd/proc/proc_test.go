package proc

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReaperDispatch checks the per-process mode directly; the reap-all
// mode is covered by TestAgentPID1Reaping (it must own all children of its
// process, so it runs in a separate agent process).
func TestReaperDispatch(t *testing.T) {
	r := NewReaper(false, nil)
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	for _, code := range []int{0, 1, 42} {
		p, err := r.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", fmt.Sprintf("exit %d", code)},
			Files: []*os.File{devnull, devnull, devnull}, Sys: &syscall.SysProcAttr{Setpgid: true}})
		if err != nil {
			t.Fatal(err)
		}
		ws, err := p.Wait(context.Background())
		if err != nil || ExitCode(ws) != code {
			t.Fatalf("exit %d: got %v %v", code, ws, err)
		}
	}
	if _, err := r.Start(Spec{Path: "/nonexistent", Args: []string{"x"}}); err == nil {
		t.Fatal("start of a missing binary succeeded")
	}
}

func TestExpandPath(t *testing.T) {
	env := []string{"HOME=/home/u", "W=/work"}
	for i, tc := range []struct{ in, want string }{
		0: {"~/x", "/home/u/x"},
		1: {"$HOME/y", "/home/u/y"},
		2: {"${W}/z", "/work/z"},
		3: {"/a/../b", "/b"},
		4: {"~", "/home/u"},
	} {
		if got := ExpandPath(tc.in, env); got != tc.want {
			t.Errorf("%d: ExpandPath(%q) = %q, want %q", i, tc.in, got, tc.want)
		}
	}
}
