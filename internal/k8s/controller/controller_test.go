package controller_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/k8stest"
)

var env *k8stest.Env

func TestMain(m *testing.M) { k8stest.Main(m, &env, k8stest.Options{}) }

var nsSeq atomic.Int32

// setup returns an admin client and a fresh namespace.
func setup(t *testing.T) (client.Client, string) {
	t.Helper()
	k8stest.Require(t, env)
	c, err := client.New(env.Config, client.Options{Scheme: controller.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	if len(ns) > 60 {
		ns = ns[:60]
	}
	ns = strings.TrimRight(ns, "-")
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return c, ns
}

// startController runs a controller manager (counting its writes) until
// the returned stop function is called or the test ends.
func startController(t *testing.T, ns string) (*k8stest.WriteCounter, func()) {
	t.Helper()
	w := &k8stest.WriteCounter{}
	mgr, err := controller.New(w.Wrap(env.Config), controller.Options{AgentImage: "moat:test", Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
	t.Cleanup(stop)
	return w, stop
}

func template() sbv1.SandboxTemplate {
	return sbv1.SandboxTemplate{Image: "busybox:test", Entrypoint: []string{"sleep", "infinity"}, Env: map[string]string{"A": "1"}}
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, last)
}

func waitPoolFree(t *testing.T, c client.Client, ns, name string, free int32) {
	t.Helper()
	eventually(t, 60*time.Second, "pool free", func() (bool, string) {
		var p sbv1.Pool
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return false, err.Error()
		}
		return p.Status.Free == free && p.Status.Pending == 0, fmt.Sprintf("%+v", p.Status)
	})
}

func waitBatch(t *testing.T, c client.Client, ns, name string) *sbv1.BatchSandbox {
	t.Helper()
	var b sbv1.BatchSandbox
	eventually(t, 60*time.Second, "batch running", func() (bool, string) {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
			return false, err.Error()
		}
		return b.Status.Phase == sbv1.BatchRunning, fmt.Sprintf("phase %q ready %d/%d %s", b.Status.Phase, b.Status.Ready, b.Spec.Replicas, b.Status.Message)
	})
	return &b
}

func newBatch(ns, name, pool string, n int32) *sbv1.BatchSandbox {
	return &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{sbv1.FinalizerRelease}},
		Spec:       sbv1.BatchSandboxSpec{Replicas: n, PoolRef: pool},
	}
}

func pods(t *testing.T, c client.Client, ns string, sel client.MatchingLabels) map[string]*corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := c.List(context.Background(), &list, client.InNamespace(ns), sel); err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			out[list.Items[i].Name] = &list.Items[i]
		}
	}
	return out
}

func claimPods(b *sbv1.BatchSandbox) []string {
	var out []string
	for _, s := range b.Status.Sandboxes {
		out = append(out, s.Pod)
	}
	return out
}

func TestPoolWarmsToMin(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	pool := &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: sbv1.PoolSpec{Template: template(), Min: 5, Buffer: 2, Max: 10}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "warm", 5)
	ps := pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "warm"})
	if len(ps) != 5 {
		t.Fatalf("pool has %d pods, want 5", len(ps))
	}
	for _, p := range ps {
		if p.Status.Phase != corev1.PodRunning || p.Spec.NodeName == "" {
			t.Errorf("pod %s: phase %s node %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		}
		// The agent travels in an emptyDir filled by the init container.
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != "moat:test" ||
			p.Spec.Volumes[0].EmptyDir == nil || p.Spec.Containers[0].Command[0] != "/opt/moat/moat" ||
			p.Spec.Containers[0].Command[1] != "execd" || p.Spec.Containers[0].Image != "busybox:test" {
			t.Errorf("pod %s spec: init %+v main %+v", p.Name, p.Spec.InitContainers, p.Spec.Containers[0])
		}
	}
	// Raising the buffer grows the pool; max caps it.
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Buffer = 20
	if err := c.Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "warm", 10)
	// Lowering it shrinks the pool.
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Min, pool.Spec.Buffer, pool.Spec.Max = 3, 0, 0
	if err := c.Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "warm", 3)
	eventually(t, 30*time.Second, "pool pods 3", func() (bool, string) {
		n := len(pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "warm"}))
		return n == 3, fmt.Sprint(n)
	})
	// Deleting the pool deletes its free pods, then the pool itself.
	if err := c.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "pool and its pods gone", func() (bool, string) {
		n := len(pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "warm"}))
		err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool)
		return n == 0 && apierrors.IsNotFound(err), fmt.Sprintf("%d pods, get: %v", n, err)
	})
}

// TestWarmBatchWrites: a batch of N from a warm pool is recorded with O(1)
// writes: one status update, no pod writes.
func TestWarmBatchWrites(t *testing.T) {
	c, ns := setup(t)
	w, _ := startController(t, ns)
	ctx := context.Background()
	const n = 40
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.PoolSpec{Template: template(), Min: n}}); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "p", n)
	poolPods := pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "p"})
	time.Sleep(200 * time.Millisecond) // let the pool's own status writes settle
	before := w.Snapshot()
	if err := c.Create(ctx, newBatch(ns, "b", "p", n)); err != nil {
		t.Fatal(err)
	}
	b := waitBatch(t, c, ns, "b")
	time.Sleep(500 * time.Millisecond) // writes that would follow the allocation
	writes := w.Since(before)
	t.Logf("writes for a warm batch of %d: %v", n, writes)
	if got := writes["PUT batchsandboxes/status"]; got != 1 {
		t.Errorf("batch status writes = %d, want 1 (%v)", got, writes)
	}
	if got := writes["POST pods"] + writes["DELETE pods"] + writes["PATCH pods"] + writes["PUT pods"]; got != 0 {
		t.Errorf("pod writes = %d, want 0 (%v)", got, writes)
	}
	if total := k8stest.Total(writes); total > 3 {
		t.Errorf("total writes = %d, want <= 3 (%v)", total, writes)
	}
	names := claimPods(b)
	seen := map[string]bool{}
	for i, s := range b.Status.Sandboxes {
		if s.Source != sbv1.SourcePool || !s.Ready || s.IP == "" || s.Index != int32(i) {
			t.Errorf("claim %d: %+v", i, s)
		}
		if poolPods[s.Pod] == nil {
			t.Errorf("claim %d: pod %s is not a pool pod", i, s.Pod)
		}
		if seen[s.Pod] {
			t.Errorf("pod %s allocated twice", s.Pod)
		}
		seen[s.Pod] = true
	}
	if len(names) != n || b.Status.Ready != n {
		t.Errorf("allocated %d, ready %d, want %d", len(names), b.Status.Ready, n)
	}

	// Deleting the batch deletes its pods; the pool refills to min.
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "batch gone", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKeyFromObject(b), b)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	waitPoolFree(t, c, ns, "p", n)
	for name := range pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "p"}) {
		if seen[name] {
			t.Errorf("released pod %s is back in the pool", name)
		}
	}
}

// TestNoDoubleAllocationAcrossRestart: a new controller process rebuilds
// its ledger from the batch statuses and hands out only free pods.
func TestNoDoubleAllocationAcrossRestart(t *testing.T) {
	c, ns := setup(t)
	ctx := context.Background()
	_, stop := startController(t, ns)
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.PoolSpec{Template: template(), Min: 10}}); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "p", 10)
	if err := c.Create(ctx, newBatch(ns, "a", "p", 4)); err != nil {
		t.Fatal(err)
	}
	a := waitBatch(t, c, ns, "a")
	aPods := claimPods(a)
	stop()

	_, stop2 := startController(t, ns)
	// Several batches at once race for the 6 free pods.
	for _, name := range []string{"b1", "b2", "b3"} {
		if err := c.Create(ctx, newBatch(ns, name, "p", 3)); err != nil {
			t.Fatal(err)
		}
	}
	owner := map[string]string{}
	for _, x := range aPods {
		owner[x] = "a"
	}
	pool, cold := 0, 0
	for _, name := range []string{"b1", "b2", "b3"} {
		b := waitBatch(t, c, ns, name)
		for _, s := range b.Status.Sandboxes {
			if prev, dup := owner[s.Pod]; dup {
				t.Errorf("pod %s allocated to %s and %s", s.Pod, prev, name)
			}
			owner[s.Pod] = name
			if s.Source == sbv1.SourcePool {
				pool++
			} else {
				cold++
			}
		}
	}
	// The pool holds 10: 4 went to a, so 6 of the 9 claims are warm and
	// 3 cold (from the pool's template).
	if pool != 6 || cold != 3 {
		t.Errorf("warm claims %d, cold %d; want 6 and 3 (%v)", pool, cold, owner)
	}
	// Every pool pod is accounted for exactly once.
	var p sbv1.Pool
	eventually(t, 30*time.Second, "pool status", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "p"}, &p); err != nil {
			return false, err.Error()
		}
		return p.Status.Allocated == 10 && p.Status.Free == 0, fmt.Sprintf("%+v", p.Status)
	})

	// A batch deleted while no controller runs keeps its pods (finalizer)
	// until the next controller releases them; they never rejoin the pool.
	stop2()
	if err := c.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil || a.DeletionTimestamp == nil {
		t.Fatalf("batch a without a controller: %v (deletion %v)", err, a.DeletionTimestamp)
	}
	startController(t, ns)
	eventually(t, 30*time.Second, "batch a released", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKeyFromObject(a), a)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	// The pool refills to min with new pods only.
	waitPoolFree(t, c, ns, "p", 4)
	live := pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "p"})
	for _, x := range aPods {
		if live[x] != nil {
			t.Errorf("released pod %s still live", x)
		}
	}
}

// TestColdBatch: without a pool every claim gets a pod of its own, with
// its patch applied; deleting the batch removes them with one write.
func TestColdBatch(t *testing.T) {
	c, ns := setup(t)
	w, _ := startController(t, ns)
	ctx := context.Background()
	const n = 12
	tpl := template()
	b := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cold", Finalizers: []string{sbv1.FinalizerRelease}},
		Spec: sbv1.BatchSandboxSpec{Replicas: n, Template: &tpl, Patches: []sbv1.SandboxPatch{
			{Env: map[string]string{"A": "patched", "B": "2"}, Labels: map[string]string{"claim": "zero"}},
		}},
	}
	before := w.Snapshot()
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	b = waitBatch(t, c, ns, "cold")
	writes := w.Since(before)
	t.Logf("writes for a cold batch of %d: %v", n, writes)
	if got := writes["POST pods"]; got != n {
		t.Errorf("pod creates = %d, want %d", got, n)
	}
	if got := writes["PUT batchsandboxes/status"]; got < 1 || got > n {
		t.Errorf("status writes = %d, want 1..%d", got, n)
	}
	ps := pods(t, c, ns, client.MatchingLabels{sbv1.LabelBatch: "cold"})
	if len(ps) != n {
		t.Fatalf("%d pods, want %d", len(ps), n)
	}
	p0 := ps[b.Status.Sandboxes[0].Pod]
	if p0 == nil || p0.Labels["claim"] != "zero" {
		t.Fatalf("claim 0 pod %v lacks its patch labels", p0)
	}
	env := map[string]string{}
	for _, e := range p0.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["A"] != "patched" || env["B"] != "2" {
		t.Errorf("claim 0 env = %v", env)
	}
	if p1 := ps[b.Status.Sandboxes[1].Pod]; p1.Spec.Containers[0].Env[0].Value != "1" {
		t.Errorf("claim 1 env = %v (patch leaked)", p1.Spec.Containers[0].Env)
	}
	if !slices.Equal(slices.Sorted(maps.Keys(ps)), slices.Sorted(slices.Values(claimPods(b)))) {
		t.Errorf("pods %v, claims %v", slices.Collect(maps.Keys(ps)), claimPods(b))
	}

	before = w.Snapshot()
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "batch gone", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKeyFromObject(b), b)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	writes = w.Since(before)
	if got := writes["DELETE pods"]; got != 1 {
		t.Errorf("pod deletes = %d, want 1 delete-collection (%v)", got, writes)
	}
	eventually(t, 30*time.Second, "pods gone", func() (bool, string) {
		n := len(pods(t, c, ns, client.MatchingLabels{sbv1.LabelBatch: "cold"}))
		return n == 0, fmt.Sprint(n)
	})
}

func TestExpiryAndStop(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	tpl := template()
	exp := metav1.NewTime(time.Now().Add(2 * time.Second))
	b := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "exp"},
		Spec:       sbv1.BatchSandboxSpec{Replicas: 2, Template: &tpl, ExpireTime: &exp},
	}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, ns, "exp")
	eventually(t, 30*time.Second, "expired batch deleted", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKeyFromObject(b), b)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	s := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stop"},
		Spec:       sbv1.BatchSandboxSpec{Replicas: 2, Template: &tpl},
	}
	if err := c.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	s = waitBatch(t, c, ns, "stop")
	s.Spec.Stopped = true
	if err := c.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "batch stopped", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return false, err.Error()
		}
		n := len(pods(t, c, ns, client.MatchingLabels{sbv1.LabelBatch: "stop"}))
		return s.Status.Phase == sbv1.BatchStopped && n == 0, fmt.Sprintf("%s, %d pods", s.Status.Phase, n)
	})
}

func TestValidation(t *testing.T) {
	c, ns := setup(t)
	ctx := context.Background()
	for i, b := range []sbv1.BatchSandboxSpec{
		{Replicas: 1},               // neither pool nor template
		{Replicas: 0, PoolRef: "p"}, // no replicas
		{Replicas: 1, PoolRef: "p", Patches: make([]sbv1.SandboxPatch, 2)},
	} {
		obj := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("bad%d", i)}, Spec: b}
		if err := c.Create(ctx, obj); !apierrors.IsInvalid(err) {
			t.Errorf("%d: create = %v, want Invalid", i, err)
		}
	}
	p := &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad"}, Spec: sbv1.PoolSpec{Template: template(), Min: 5, Max: 2}}
	if err := c.Create(ctx, p); !apierrors.IsInvalid(err) {
		t.Errorf("pool min > max: create = %v, want Invalid", err)
	}
}
