package controller_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/node"
	"github.com/moat-sandbox/moat/internal/k8s/podfreeze"
)

// fakeTasks is a node's container runtime: the frozen containers by ID.
type fakeTasks struct {
	mu       sync.Mutex
	frozen   map[string]bool
	failWith error // Pause fails with it when set
}

func (f *fakeTasks) Frozen(_ context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen[id], nil
}

func (f *fakeTasks) Pause(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failWith != nil {
		return f.failWith
	}
	f.frozen[id] = true
	return nil
}

func (f *fakeTasks) Resume(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.frozen, id)
	return nil
}

func (f *fakeTasks) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.frozen)
}

func (f *fakeTasks) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failWith = err
}

// startNodes runs `moat node` (package node) for every fake node, over
// tasks; the returned function stops them.
func startNodes(t *testing.T, tasks *fakeTasks) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range env.Nodes {
		mgr, err := node.New(env.Config, node.Options{NodeName: name, Tasks: tasks, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); mgr.Start(ctx) }()
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
	}
	t.Cleanup(stop)
	return stop
}

// setPause sets the batch's spec.pause and returns its new generation.
func setPause(t *testing.T, c client.Client, b *sbv1.BatchSandbox, pause *bool) int64 {
	t.Helper()
	orig := b.DeepCopy()
	b.Spec.Pause = pause
	if err := c.Patch(context.Background(), b, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	return b.Generation
}

// waitAnswered waits until the batch's status answers generation gen and
// check accepts it.
func waitAnswered(t *testing.T, c client.Client, b *sbv1.BatchSandbox, gen int64, what string, check func(st sbv1.BatchSandboxStatus) bool) {
	t.Helper()
	eventually(t, 30*time.Second, what, func() (bool, string) {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(b), b); err != nil {
			return false, err.Error()
		}
		return b.Status.PauseObservedGeneration == gen && check(b.Status), fmt.Sprintf("gen %d: %+v", b.Generation, b.Status)
	})
}

func cond(st sbv1.BatchSandboxStatus, t sbv1.BatchSandboxConditionType) sbv1.BatchSandboxCondition {
	c, _ := st.Condition(t)
	return c
}

// TestPause: spec.pause freezes a batch's pods through the node component
// (package node, over a fake container runtime) and false thaws them; a
// pause no node confirms is undone within the budget (PauseFailed
// NodeTimeout, an event, the batch running and its pods asked to run), a
// node that cannot freeze answers PauseFailed NodeFailed, and a paused
// batch stays paused across a restart of the controller and resumes.
func TestPause(t *testing.T) {
	c, ns := setup(t)
	opts := controller.Options{AgentImage: "moat:test", Namespace: ns, PauseTimeout: 2 * time.Second}
	_, stopCtl := startControllerWith(t, opts)
	tasks := &fakeTasks{frozen: map[string]bool{}}
	stopNodes := startNodes(t, tasks)
	ctx := context.Background()
	b := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(2)), Template: template()}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	b = waitBatch(t, c, ns, "p")
	pods, _, _ := allocation(t, b)

	gen := setPause(t, c, b, ptr(true))
	waitAnswered(t, c, b, gen, "paused", func(st sbv1.BatchSandboxStatus) bool {
		return st.Phase == sbv1.PhasePaused && cond(st, sbv1.ConditionPaused).Status == "True"
	})
	if n := tasks.count(); n != 2 {
		t.Errorf("%d containers frozen, want 2", n)
	}
	for _, name := range pods {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		if a := podfreeze.AnswerOf(&p); !a.Frozen || a.Token != fmt.Sprint(gen) {
			t.Errorf("pod %s: answer %+v", name, a)
		}
		if !podReadyCond(&p) {
			t.Errorf("pod %s lost its Ready condition", name)
		}
	}

	// The controller restarts: the batch stays paused, and resumes.
	stopCtl()
	startControllerWith(t, opts)
	gen = setPause(t, c, b, ptr(false))
	waitAnswered(t, c, b, gen, "resumed", func(st sbv1.BatchSandboxStatus) bool {
		return st.Phase == sbv1.PhaseSucceed && cond(st, sbv1.ConditionPaused).Status == "False"
	})
	if n := tasks.count(); n != 0 {
		t.Errorf("%d containers still frozen", n)
	}

	// No node answers: the pause is undone within the budget.
	stopNodes()
	start := time.Now()
	gen = setPause(t, c, b, ptr(true))
	waitAnswered(t, c, b, gen, "PauseFailed", func(st sbv1.BatchSandboxStatus) bool {
		f := cond(st, sbv1.ConditionPauseFailed)
		return f.Status == "True" && f.Reason == "NodeTimeout" && st.Phase == sbv1.PhaseSucceed
	})
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("PauseFailed after %v, before the 2s budget", d)
	}
	if m := cond(b.Status, sbv1.ConditionPauseFailed).Message; !strings.Contains(m, "moat node") {
		t.Errorf("PauseFailed message %q does not name moat node", m)
	}
	eventually(t, 10*time.Second, "pods asked to run", func() (bool, string) {
		for _, name := range pods {
			var p corev1.Pod
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
				return false, err.Error()
			}
			if w, _ := podfreeze.WantOf(&p); w.Paused {
				return false, fmt.Sprintf("pod %s wants %s", name, w)
			}
		}
		return true, ""
	})
	eventually(t, 10*time.Second, "PauseFailed event", func() (bool, string) {
		var evs corev1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "p" && e.Reason == "PauseFailed" && e.Type == corev1.EventTypeWarning {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items))
	})

	// A node that cannot freeze says why; the batch keeps running.
	tasks.fail(errors.New("the shim refused"))
	startNodes(t, tasks)
	setPause(t, c, b, nil)
	gen = setPause(t, c, b, ptr(true))
	waitAnswered(t, c, b, gen, "PauseFailed NodeFailed", func(st sbv1.BatchSandboxStatus) bool {
		f := cond(st, sbv1.ConditionPauseFailed)
		return f.Status == "True" && f.Reason == "NodeFailed" && strings.Contains(f.Message, "the shim refused") && st.Phase == sbv1.PhaseSucceed
	})
	if n := tasks.count(); n != 0 {
		t.Errorf("%d containers frozen after a failed pause", n)
	}
}

func podReadyCond(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
