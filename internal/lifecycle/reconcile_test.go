package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// blindRuntime answers every List and Status with StateUnknown, as the OCI
// backend does when its runtime CLI fails.
type blindRuntime struct{ runtime.Runtime }

func (b blindRuntime) List(ctx context.Context) ([]runtime.Status, error) {
	l, err := b.Runtime.List(ctx)
	for i := range l {
		l[i].State, l[i].Message = runtime.StateUnknown, "runc list: exit status 1"
	}
	return l, err
}

func (b blindRuntime) Status(ctx context.Context, id string) (runtime.Status, error) {
	st, err := b.Runtime.Status(ctx, id)
	st.State = runtime.StateUnknown
	return st, err
}

// A runtime that cannot tell must not get live sandboxes destroyed, at
// recovery or by the liveness check (chaos test finding: one failed
// `runc list` after a crash marked every sandbox Failed and deleted it).
func TestUnknownRuntimeStateKeepsSandboxes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, _ := h.svc.Create(ctx, req(time.Hour))
	b, _ := h.svc.Create(ctx, req(time.Hour))
	svc, err := New(Config{}, Deps{Store: h.db, Runtime: blindRuntime{h.rt}, Images: fakeImages{}, Now: h.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	svc.checkLiveness(ctx)
	for _, id := range []string{a.ID, b.ID} {
		got, err := svc.Get(ctx, id)
		if err != nil || got.Status.State != StateRunning {
			t.Fatalf("%s after an unknown runtime answer: %+v %v", id, got.Status, err)
		}
		if st, err := h.rt.Status(ctx, id); err != nil || st.State != runtime.StateRunning {
			t.Fatalf("%s was torn down in the runtime: %+v %v", id, st, err)
		}
	}
	// A real exit is still noticed.
	if err := h.rt.Stop(ctx, a.ID, 0); err != nil {
		t.Fatal(err)
	}
	svc.deps.Runtime = h.rt
	svc.checkLiveness(ctx)
	if got, _ := svc.Get(ctx, a.ID); got.Status.State != StateFailed || got.Status.Reason != ReasonAgentExited {
		t.Fatalf("exited sandbox: %+v", got.Status)
	}
}

// staleListRuntime's List reports stale[id] as stopped and gone, as a List
// that read a sandbox's record after asking its OCI runtime does when the
// sandbox's create finishes in between; Status tells the truth.
type staleListRuntime struct {
	runtime.Runtime
	stale map[string]bool
}

func (s staleListRuntime) List(ctx context.Context) ([]runtime.Status, error) {
	l, err := s.Runtime.List(ctx)
	for i := range l {
		if s.stale[l[i].ID] {
			l[i].State, l[i].Pid, l[i].Message = runtime.StateStopped, 0, "container is gone from the OCI runtime"
		}
	}
	return l, err
}

// A stale List answer must not get a live sandbox killed: the liveness
// check confirms a stop with Status before it tears anything down (chaos
// finding: a sandbox created while the check's List ran was found
// "stopped", deleted, and reported Failed "agent exited (code 0)").
func TestLivenessConfirmsStopBeforeTeardown(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, _ := h.svc.Create(ctx, req(time.Hour))
	b, _ := h.svc.Create(ctx, req(time.Hour))
	real := h.svc.deps.Runtime
	h.svc.deps.Runtime = staleListRuntime{real, map[string]bool{a.ID: true, b.ID: true}}
	if err := real.Stop(ctx, b.ID, 0); err != nil {
		t.Fatal(err)
	}
	h.svc.checkLiveness(ctx)
	if got, err := h.svc.Get(ctx, a.ID); err != nil || got.Status.State != StateRunning {
		t.Fatalf("live sandbox after a stale list: %+v %v", got.Status, err)
	}
	if st, err := real.Status(ctx, a.ID); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("live sandbox was torn down in the runtime: %+v %v", st, err)
	}
	// A sandbox that really stopped is still noticed.
	if got, _ := h.svc.Get(ctx, b.ID); got.Status.State != StateFailed || got.Status.Reason != ReasonAgentExited {
		t.Fatalf("stopped sandbox: %+v", got.Status)
	}
}

// endedRuntime reports the sandboxes of ended as stopped, with the
// runtime's word on how (the kubernetes runtime's eviction message).
type endedRuntime struct {
	runtime.Runtime
	ended map[string]string
}

func (e endedRuntime) List(ctx context.Context) ([]runtime.Status, error) {
	l, err := e.Runtime.List(ctx)
	for i := range l {
		if msg, ok := e.ended[l[i].ID]; ok {
			l[i].State, l[i].Pid, l[i].Message = runtime.StateStopped, 0, msg
		}
	}
	return l, err
}

func (e endedRuntime) Status(ctx context.Context, id string) (runtime.Status, error) {
	st, err := e.Runtime.Status(ctx, id)
	if msg, ok := e.ended[id]; ok && err == nil {
		st.State, st.Pid, st.Message = runtime.StateStopped, 0, msg
	}
	return st, err
}

// A sandbox the runtime ended (the kubelet evicted its pod over the disk
// quota) is Failed with the runtime's message, not only "agent exited".
func TestExitedSandboxKeepsRuntimeMessage(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, _ := h.svc.Create(ctx, req(time.Hour))
	const evicted = "1 sandbox pods ended; pod x: Evicted: Pod ephemeral local storage usage exceeds the total limit of containers 64Mi."
	svc, err := New(Config{}, Deps{Store: h.db, Runtime: endedRuntime{h.rt, map[string]string{a.ID: evicted}}, Images: fakeImages{}, Now: h.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	svc.checkLiveness(ctx)
	got, err := svc.Get(ctx, a.ID)
	if err != nil || got.Status.State != StateFailed || got.Status.Reason != ReasonAgentExited || !strings.Contains(got.Status.Message, evicted) {
		t.Fatalf("ended sandbox: %+v %v, want Failed %s with the runtime's message", got.Status, err, ReasonAgentExited)
	}
}
