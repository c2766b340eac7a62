package runtimetest

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// exitNoticeTimeout bounds the wait for an exit notification: far below
// the minutes a dead sandbox's TCP connections take to time out, and
// generous for a busy machine.
const exitNoticeTimeout = 20 * time.Second

// exitCase: a sandbox whose init exits is reported with its reason, at
// once (runtime.ExitNotifier): one whose agent shuts down (SIGTERM sent
// from inside) as Exited, one that runs out of memory with its agent the
// OOM killer's first choice as OOMKilled.
func (s *suite) exitCase(t *testing.T) {
	rt := s.newRuntime(t)
	n, ok := rt.(runtime.ExitNotifier)
	if !ok {
		t.Skipf("the %s backend does not notify exits", rt.Name())
	}
	if s.opts.NoCommands {
		t.Skip("the backend's agents run no commands")
	}
	exits := make(chan runtime.Exit, 64)
	n.NotifyExits(func(e runtime.Exit) {
		select {
		case exits <- e:
		default:
		}
	})
	t.Run("Exited", func(t *testing.T) {
		ctx := s.ctxFor(t)
		id := NewID("exit")
		s.create(t, ctx, rt, id)
		WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
		// The agent ends on SIGTERM once the entrypoint (which gets it
		// too) has ended; the command's own stream dies with it.
		execAsync(t, rt, id, "kill -TERM 1")
		e := awaitExit(t, exits, id)
		if e.Reason != runtime.ExitReasonExited {
			t.Errorf("exit %+v: reason %q, want %q", e, e.Reason, runtime.ExitReasonExited)
		}
		if st := WaitState(t, ctx, rt, id, runtime.StateStopped, 10*time.Second); e.ExitCode >= 0 && st.ExitCode != e.ExitCode {
			t.Errorf("Status exit code %d, notified %d", st.ExitCode, e.ExitCode)
		}
	})
	t.Run("OOMKilled", func(t *testing.T) {
		ctx := s.ctxFor(t)
		id := NewID("oom")
		sp := s.spec(id)
		sp.Resources.MemoryBytes = 64 << 20
		if _, err := rt.Create(ctx, sp); err != nil {
			t.Fatalf("Create(%s): %v", id, err)
		}
		t.Cleanup(func() { rt.Delete(context.Background(), id) })
		WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
		// Five dd fill a 20 MiB block each: 100 MiB in all. The agent's
		// oom_score_adj makes it the victim on a kernel sandbox (no dd
		// alone outscores it); gVisor's Sentry, the sandbox itself, is
		// the victim in any case.
		execAsync(t, rt, id, "echo 1000 >/proc/1/oom_score_adj; for i in 1 2 3 4 5; do dd if=/dev/zero of=/dev/null bs=20M count=1000 & done; wait")
		e := awaitExit(t, exits, id)
		if e.Reason != runtime.ExitReasonOOMKilled {
			t.Errorf("exit %+v: reason %q, want %q", e, e.Reason, runtime.ExitReasonOOMKilled)
		}
		WaitState(t, ctx, rt, id, runtime.StateStopped, 10*time.Second)
	})
}

// execAsync runs command in sandbox id without waiting for it: a command
// that ends its sandbox may not see its stream end for a long time.
func execAsync(t *testing.T, rt runtime.Runtime, id, command string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Exec(ctx, rt, id, command)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// awaitExit waits for the exit notification of sandbox id.
func awaitExit(t *testing.T, exits <-chan runtime.Exit, id string) runtime.Exit {
	t.Helper()
	timeout := time.After(exitNoticeTimeout)
	for {
		select {
		case e := <-exits:
			if e.ID == id {
				return e
			}
		case <-timeout:
			t.Fatalf("sandbox %s: no exit notified within %v", id, exitNoticeTimeout)
		}
	}
}
