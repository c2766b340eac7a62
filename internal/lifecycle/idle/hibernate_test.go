package idle_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// hibernating is the gated fake runtime that hibernates (by pausing) and
// reports a CPU counter the test sets.
type hibernating struct {
	*gated
	hibernations atomic.Int32

	mu  sync.Mutex
	cpu map[string]time.Duration
}

func (r *hibernating) HibernateMode(string) string { return runtime.HibernateMemory }

func (r *hibernating) Hibernate(ctx context.Context, id string) (runtime.Hibernation, error) {
	r.hibernations.Add(1)
	if err := r.gated.Pause(ctx, id); err != nil {
		return runtime.Hibernation{}, err
	}
	return runtime.Hibernation{Mode: runtime.HibernateMemory, FreedBytes: 200 << 20, DiskBytes: 150 << 20}, nil
}

func (r *hibernating) CPUUsage(ctx context.Context, id string) (time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cpu[id], nil
}

// spend adds d to sandbox id's CPU counter.
func (r *hibernating) spend(id string, d time.Duration) {
	r.mu.Lock()
	r.cpu[id] += d
	r.mu.Unlock()
}

func newHibernateHarness(t *testing.T) (*harness, *hibernating) {
	h := newHarness(t, idle.Config{})
	hr := &hibernating{gated: h.rt, cpu: map[string]time.Duration{}}
	h.svc = h.newServiceOn(t, hr)
	return h, hr
}

// An idle policy with action hibernate hibernates the sandbox (Paused,
// reason SANDBOX_IDLE_HIBERNATED, event Hibernated with what was freed),
// and a request wakes it with one resume however many arrive at once.
func TestSweepHibernates(t *testing.T) {
	h, hr := newHibernateHarness(t)
	ctx := context.Background()
	id := h.create(t, map[string]string{idle.ExtTimeout: "60", idle.ExtAction: idle.ActionHibernate})
	h.clk.Add(61 * time.Second)
	h.svc.Sweep(ctx)
	st := h.status(t, id)
	if st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonIdleHibernated || !strings.Contains(st.Message, "200 MiB freed") {
		t.Fatalf("after the idle timeout: %+v", st)
	}
	if ev, ok := h.event(t, id, lifecycle.EventHibernated); !ok || ev.Reason != lifecycle.ReasonIdleHibernated || !strings.Contains(ev.Message, "no activity for 61s") {
		t.Fatalf("Hibernated event: %+v %v", ev, ok)
	}
	if pauses, _ := h.m.get(); len(pauses) != 1 || pauses[0] != idle.ActionHibernate {
		t.Fatalf("pause metrics: %v", pauses)
	}
	if n := hr.hibernations.Load(); n != 1 {
		t.Fatalf("%d hibernations", n)
	}
	release := hr.hold()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			done, err := h.svc.Access(ctx, id, idle.ViaProxy)
			done()
			errs <- err
		})
	}
	<-hr.entered
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("after the wake: %+v", st)
	}
	if n := hr.resumes.Load(); n != 1 {
		t.Fatalf("%d resumes for 8 requests, want 1", n)
	}
}

// With moat.idle.cpuBelow a sandbox busier than the threshold over the
// idle timeout stays Running though nothing reached it; once its use
// drops below, it is paused, and the message says its use.
func TestCPUThreshold(t *testing.T) {
	h, hr := newHibernateHarness(t)
	ctx := context.Background()
	id := h.create(t, map[string]string{idle.ExtTimeout: "10", idle.ExtCPUBelow: "5"})
	// 20% of a core for 30 s, swept every second.
	for range 30 {
		h.clk.Add(time.Second)
		hr.spend(id, 200*time.Millisecond)
		h.svc.Sweep(ctx)
		if st := h.status(t, id); st.State != lifecycle.StateRunning {
			t.Fatalf("a busy sandbox: %+v", st)
		}
	}
	// 1% of a core: paused once the busy time is out of the window.
	paused := 0
	for i := range 15 {
		h.clk.Add(time.Second)
		hr.spend(id, 10*time.Millisecond)
		h.svc.Sweep(ctx)
		if st := h.status(t, id); st.State == lifecycle.StatePaused {
			paused = i + 1
			if !strings.Contains(st.Message, "below 5%") {
				t.Fatalf("status: %+v", st)
			}
			break
		}
	}
	if paused < 7 || paused > 11 {
		t.Fatalf("paused after %d quiet seconds, want about 10", paused)
	}
}

func TestCPUThresholdPolicy(t *testing.T) {
	for _, c := range []struct {
		ext  map[string]string
		want float64
		err  string
	}{
		{map[string]string{idle.ExtTimeout: "60", idle.ExtCPUBelow: "2.5"}, 2.5, ""},
		{map[string]string{idle.ExtTimeout: "60", idle.ExtCPUBelow: "0"}, 0, "above 0"},
		{map[string]string{idle.ExtTimeout: "60", idle.ExtCPUBelow: "x"}, 0, "above 0"},
		{map[string]string{idle.ExtTimeout: "60", idle.ExtCPUBelow: "7000"}, 0, "at most 6400"},
		{map[string]string{idle.ExtCPUBelow: "5"}, 0, "needs extensions[moat.idle.timeout]"},
	} {
		p, err := idle.PolicyOf(c.ext)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err %v, want %q", c.ext, err, c.err)
			}
			continue
		}
		if err != nil || p.CPUBelow != c.want {
			t.Errorf("%v: %+v %v", c.ext, p, err)
		}
	}
}

// A request that reaches a sandbox before any sweep has seen it (right
// after its create) counts: while it is under way the sandbox is not
// idle, however long it takes.
func TestAccessBeforeFirstSweep(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	id := h.create(t, map[string]string{idle.ExtTimeout: "60", idle.ExtAction: idle.ActionPause})
	done, err := h.svc.Access(ctx, id, idle.ViaProxy)
	if err != nil {
		t.Fatal(err)
	}
	h.clk.Add(120 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("with a request under way since before the first sweep: %+v", st)
	}
	done()
	h.clk.Add(61 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StatePaused {
		t.Fatalf("61 s after the request ended: %+v", st)
	}
}
