package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

var env *k8stest.Env

func TestMain(m *testing.M) { k8stest.Main(m, &env, k8stest.Options{}) }

var nsSeq atomic.Int32

// setup returns an admin client and a fresh namespace.
func setup(t *testing.T) (client.Client, string) {
	t.Helper()
	k8stest.Require(t, env)
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
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
	return startControllerWith(t, controller.Options{AgentImage: "moat:test", Namespace: ns})
}

func startControllerWith(t *testing.T, opts controller.Options) (*k8stest.WriteCounter, func()) {
	t.Helper()
	w := &k8stest.WriteCounter{}
	mgr, err := controller.New(w.Wrap(env.Config), opts)
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

func template() *corev1.PodTemplateSpec {
	return &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "main", Image: "busybox:test", Command: []string{"sleep", "infinity"}, Env: []corev1.EnvVar{{Name: "A", Value: "1"}},
	}}}}
}

func capacity(bufMin, bufMax, poolMin, poolMax int32) sbv1.CapacitySpec {
	return sbv1.CapacitySpec{BufferMin: bufMin, BufferMax: bufMax, PoolMin: poolMin, PoolMax: poolMax}
}

func ptr[T any](v T) *T { return &v }

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
		return p.Status.Available == free && p.Status.Total == p.Status.Available+p.Status.Allocated, fmt.Sprintf("%+v", p.Status)
	})
}

func waitBatch(t *testing.T, c client.Client, ns, name string) *sbv1.BatchSandbox {
	t.Helper()
	var b sbv1.BatchSandbox
	eventually(t, 60*time.Second, "batch running", func() (bool, string) {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
			return false, err.Error()
		}
		return b.Status.Phase == sbv1.PhaseSucceed, fmt.Sprintf("phase %q ready %d/%d %+v", b.Status.Phase, b.Status.Ready, b.GetReplicas(), b.Status.Conditions)
	})
	return &b
}

func newBatch(ns, name, pool string, n int32) *sbv1.BatchSandbox {
	return &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sbv1.BatchSandboxSpec{Replicas: &n, PoolRef: pool},
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

// allocation reads a batch's alloc-status and endpoints annotations, as
// OpenSandbox's clients do.
func allocation(t *testing.T, b *sbv1.BatchSandbox) (pods, ips []string, pool map[int]bool) {
	t.Helper()
	var st struct {
		Pods []string `json:"pods"`
		Pool []int    `json:"pool"`
	}
	if err := json.Unmarshal([]byte(b.Annotations[sbv1.AnnoAllocStatus]), &st); err != nil {
		t.Fatalf("alloc-status %q: %v", b.Annotations[sbv1.AnnoAllocStatus], err)
	}
	if err := json.Unmarshal([]byte(b.Annotations[sbv1.AnnoEndpoints]), &ips); err != nil {
		t.Fatalf("endpoints %q: %v", b.Annotations[sbv1.AnnoEndpoints], err)
	}
	pool = map[int]bool{}
	for _, i := range st.Pool {
		pool[i] = true
	}
	return st.Pods, ips, pool
}

func claimPods(t *testing.T, b *sbv1.BatchSandbox) []string {
	pods, _, _ := allocation(t, b)
	return pods
}

func TestPoolWarmsToMin(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	pool := &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(2, 5, 5, 10)}}
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
			p.Spec.Volumes[0].EmptyDir == nil || p.Spec.Containers[0].Command[0] != "/opt/moat/moat-agent" ||
			p.Spec.Containers[0].Command[1] != "execd" || p.Spec.Containers[0].Image != "busybox:test" ||
			!slices.Equal(p.Spec.Containers[0].Command[4:], []string{"--", "sleep", "infinity"}) {
			t.Errorf("pod %s spec: init %+v main %+v", p.Name, p.Spec.InitContainers, p.Spec.Containers[0])
		}
	}
	// Raising the buffer grows the pool; poolMax caps it.
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.CapacitySpec = capacity(8, 20, 5, 10)
	if err := c.Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "warm", 10)
	// Lowering it shrinks the pool.
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.CapacitySpec = capacity(0, 0, 3, 3)
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

// TestWarmBatchOneShard: a batch that one shard of the pool's table can
// serve comes from one shard: one table write.
func TestWarmBatchOneShard(t *testing.T) {
	c, ns := setup(t)
	w, _ := startController(t, ns)
	ctx := context.Background()
	const n, batch = 48, 4
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, n, n)}}); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "p", n)
	time.Sleep(200 * time.Millisecond) // let the pool's own status writes settle
	before := w.Snapshot()
	if err := c.Create(ctx, newBatch(ns, "b", "p", batch)); err != nil {
		t.Fatal(err)
	}
	b := waitBatch(t, c, ns, "b")
	time.Sleep(500 * time.Millisecond)
	writes := w.Since(before)
	names, _, warm := allocation(t, b)
	shards := map[int]bool{}
	for i, p := range names {
		if !warm[i] {
			t.Errorf("claim %d (%s) is not warm", i, p)
		}
		shards[alloc.ShardOf(p, alloc.MinShards)] = true
	}
	if len(shards) != 1 || writes["PUT secrets"] != 1 {
		t.Errorf("a batch of %d from a pool of %d came from shards %v with table writes %v, want one shard, one write", batch, n, shards, writes)
	}
}

// TestWarmBatchWrites: a batch of N from a warm pool is recorded with O(1)
// writes: one write of each shard of the pool's allocation table its pods
// are in (the fence shared with moat servers; the whole pool here, so
// every shard with a pod), one annotation write (the record) and one
// status write, no pod writes.
func TestWarmBatchWrites(t *testing.T) {
	c, ns := setup(t)
	w, _ := startController(t, ns)
	ctx := context.Background()
	const n = 40
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, n, n)}}); err != nil {
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
	if got := writes["PUT batchsandboxes"]; got != 1 {
		t.Errorf("batch record writes = %d, want 1 (%v)", got, writes)
	}
	if got := writes["PUT batchsandboxes/status"]; got != 1 {
		t.Errorf("batch status writes = %d, want 1 (%v)", got, writes)
	}
	// The pool's fill made the table: the delivery updates it, one write
	// per shard.
	shards := map[int]bool{}
	for p := range poolPods {
		shards[alloc.ShardOf(p, alloc.MinShards)] = true
	}
	if got := writes["PUT secrets"]; got != len(shards) || writes["POST secrets"] != 0 {
		t.Errorf("allocation table writes = %d updates, %d creates, want %d updates (%v)", got, writes["POST secrets"], len(shards), writes)
	}
	if got := writes["POST pods"] + writes["DELETE pods"] + writes["PATCH pods"] + writes["PUT pods"]; got != 0 {
		t.Errorf("pod writes = %d, want 0 (%v)", got, writes)
	}
	// Besides the delivery (table, record, status), the pool's status
	// shows the pods allocated: one write.
	if got := writes["PUT pools/status"]; got > 1 {
		t.Errorf("pool status writes = %d, want <= 1 (%v)", got, writes)
	}
	if total := k8stest.Total(writes); total > 3+len(shards) {
		t.Errorf("total writes = %d, want <= %d (%v)", total, 3+len(shards), writes)
	}
	names, ips, warm := allocation(t, b)
	seen := map[string]bool{}
	for i, pod := range names {
		if !warm[i] || ips[i] == "" || poolPods[pod] == nil || ips[i] != poolPods[pod].Status.PodIP {
			t.Errorf("claim %d: pod %s ip %q warm %v", i, pod, ips[i], warm[i])
		}
		if seen[pod] {
			t.Errorf("pod %s allocated twice", pod)
		}
		seen[pod] = true
	}
	if len(names) != n || b.Status.Ready != n || b.Status.Replicas != n || b.Annotations[sbv1.AnnoPoolName] != "p" {
		t.Errorf("allocated %d, status %+v, want %d", len(names), b.Status, n)
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
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, 10, 10)}}); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "p", 10)
	if err := c.Create(ctx, newBatch(ns, "a", "p", 4)); err != nil {
		t.Fatal(err)
	}
	a := waitBatch(t, c, ns, "a")
	aPods := claimPods(t, a)
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
		pods, _, warm := allocation(t, b)
		for i, pod := range pods {
			if prev, dup := owner[pod]; dup {
				t.Errorf("pod %s allocated to %s and %s", pod, prev, name)
			}
			owner[pod] = name
			if warm[i] {
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
		return p.Status.Allocated == 10 && p.Status.Available == 0, fmt.Sprintf("%+v", p.Status)
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
// its shard patch applied; deleting the batch removes them with one write.
func TestColdBatch(t *testing.T) {
	c, ns := setup(t)
	w, _ := startController(t, ns)
	ctx := context.Background()
	const n = 12
	b := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cold"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(n)), Template: template(), ShardPatches: []runtime.RawExtension{
			{Raw: []byte(`{"metadata":{"labels":{"claim":"zero"}},"spec":{"containers":[{"name":"main","env":[{"name":"A","value":"patched"},{"name":"B","value":"2"}]}]}}`)},
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
	names, ips, _ := allocation(t, b)
	p0 := ps[names[0]]
	if p0 == nil || p0.Labels["claim"] != "zero" || p0.Labels[sbv1.LabelPodIndex] != "0" {
		t.Fatalf("claim 0 pod %v lacks its patch labels", p0)
	}
	env := map[string]string{}
	for _, e := range p0.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["A"] != "patched" || env["B"] != "2" {
		t.Errorf("claim 0 env = %v", env)
	}
	if p1 := ps[names[1]]; len(p1.Spec.Containers[0].Env) != 1 || p1.Spec.Containers[0].Env[0].Value != "1" {
		t.Errorf("claim 1 env = %v (patch leaked)", p1.Spec.Containers[0].Env)
	}
	if !slices.Equal(slices.Sorted(maps.Keys(ps)), slices.Sorted(slices.Values(names))) {
		t.Errorf("pods %v, claims %v", slices.Collect(maps.Keys(ps)), names)
	}
	for i, ip := range ips {
		if ip == "" || ip != ps[names[i]].Status.PodIP {
			t.Errorf("endpoint %d = %q, pod IP %q", i, ip, ps[names[i]].Status.PodIP)
		}
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

// TestDeletedPodIsReplaced: a claim whose pod is deleted gets a new pod
// (warm from the pool when it can), and the old one is never handed out
// again (OpenSandbox's #954 left the claim empty).
func TestDeletedPodIsReplaced(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, 4, 4)}}); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "p", 4)
	if err := c.Create(ctx, newBatch(ns, "b", "p", 2)); err != nil {
		t.Fatal(err)
	}
	b := waitBatch(t, c, ns, "b")
	first := claimPods(t, b)
	victim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first[1]}}
	if err := c.Delete(ctx, victim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "claim 1 replaced", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			return false, err.Error()
		}
		pods, ips, _ := allocation(t, b)
		return pods[0] == first[0] && pods[1] != "" && pods[1] != first[1] && ips[1] != "" && b.Status.Ready == 2,
			fmt.Sprintf("pods %v ips %v status %+v", pods, ips, b.Status)
	})
	var rel struct{ Pods []string }
	if err := json.Unmarshal([]byte(b.Annotations[sbv1.AnnoAllocRelease]), &rel); err != nil || !slices.Contains(rel.Pods, first[1]) {
		t.Errorf("alloc-release %q lacks %s", b.Annotations[sbv1.AnnoAllocRelease], first[1])
	}
}

func TestExpiryAndScaleToZero(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	exp := metav1.NewTime(time.Now().Add(2 * time.Second))
	b := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "exp"},
		Spec:       sbv1.BatchSandboxSpec{Replicas: ptr(int32(2)), Template: template(), ExpireTime: &exp},
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
		Spec:       sbv1.BatchSandboxSpec{Replicas: ptr(int32(2)), Template: template()},
	}
	if err := c.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	s = waitBatch(t, c, ns, "stop")
	s.Spec.Replicas = ptr(int32(0))
	if err := c.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "batch scaled to zero", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return false, err.Error()
		}
		n := len(pods(t, c, ns, client.MatchingLabels{sbv1.LabelBatch: "stop"}))
		return s.Status.Replicas == 0 && s.Status.ObservedGeneration == s.Generation && n == 0, fmt.Sprintf("%+v, %d pods", s.Status, n)
	})
}

// TestBadManifests: what the schema can refuse is refused at the API; the
// rest gets a clear status condition, never a crash loop.
func TestBadManifests(t *testing.T) {
	c, ns := setup(t)
	w, _ := startController(t, ns)
	ctx := context.Background()
	if err := c.Create(ctx, &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "neg"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(-1)), Template: template()}}); !apierrors.IsInvalid(err) {
		t.Errorf("replicas -1: create = %v, want Invalid", err)
	}
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inv"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(5, 2, 0, 10)}}); !apierrors.IsInvalid(err) {
		t.Errorf("pool bufferMin > bufferMax: create = %v, want Invalid", err)
	}
	noImage := template()
	noImage.Spec.Containers[0].Image = ""
	for _, tc := range []struct {
		name   string
		spec   sbv1.BatchSandboxSpec
		reason string
	}{
		{"nopool", sbv1.BatchSandboxSpec{Replicas: ptr(int32(2)), PoolRef: "missing"}, sbv1.ReasonPoolNotFound},
		{"noimage", sbv1.BatchSandboxSpec{Replicas: ptr(int32(2)), Template: noImage}, sbv1.ReasonInvalidTemplate},
		{"nothing", sbv1.BatchSandboxSpec{Replicas: ptr(int32(1))}, sbv1.ReasonInvalidTemplate},
		{"badpatch", sbv1.BatchSandboxSpec{Replicas: ptr(int32(1)), Template: template(),
			ShardPatches: []runtime.RawExtension{{Raw: []byte(`{"spec":{"containers":[{"name":"main","image":""}]}}`)}}}, sbv1.ReasonInvalidTemplate},
	} {
		b := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name}, Spec: tc.spec}
		if err := c.Create(ctx, b); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		eventually(t, 30*time.Second, tc.name+" condition", func() (bool, string) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
				return false, err.Error()
			}
			for _, cd := range b.Status.Conditions {
				if cd.Type == sbv1.ConditionReady && cd.Status == "False" && cd.Reason == tc.reason && cd.Message != "" {
					return b.Status.Phase == sbv1.PhaseFailed, fmt.Sprintf("%+v", b.Status)
				}
			}
			return false, fmt.Sprintf("%+v", b.Status)
		})
	}
	pool := &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "noimage"},
		Spec: sbv1.PoolSpec{Template: noImage, CapacitySpec: capacity(0, 0, 3, 3)}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "pool condition", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return false, err.Error()
		}
		for _, cd := range pool.Status.Conditions {
			if cd.Type == "Ready" && cd.Status == metav1.ConditionFalse && cd.Reason == sbv1.ReasonInvalidTemplate {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", pool.Status)
	})
	// No crash loop: the bad objects settle and cost no further writes.
	time.Sleep(time.Second)
	before := w.Snapshot()
	time.Sleep(2 * time.Second)
	if writes := w.Since(before); k8stest.Total(writes) != 0 {
		t.Errorf("bad manifests keep the controller writing: %v", writes)
	}
	if n := len(pods(t, c, ns, client.MatchingLabels{})); n != 0 {
		t.Errorf("%d pods made from bad manifests", n)
	}
	// A pool that appears later serves the waiting batch.
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "missing"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, 2, 2)}}); err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, ns, "nopool")
}

// TestSnapshotAnswered: without a snapshot registry a SandboxSnapshot
// gets a clear answer (Unsupported) instead of hanging.
func TestSnapshotAnswered(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	b := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(1)), Template: template()}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, ns, "p")
	snap := &sbv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s"}, Spec: sbv1.SandboxSnapshotSpec{SandboxName: "p"}}
	if err := c.Create(ctx, snap); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "snapshot failed", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(snap), snap); err != nil {
			return false, err.Error()
		}
		return snap.Status.Phase == sbv1.SnapshotFailed && snap.Status.Message != "", fmt.Sprintf("%+v", snap.Status)
	})
}

// TestOpenSandboxManifests: OpenSandbox's own sample manifests apply
// unchanged (strict field validation, as kubectl does) and are served.
func TestOpenSandboxManifests(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	for _, f := range []string{"sandbox_v1alpha1_pool.yaml", "sandbox_v1alpha1_batchsandbox.yaml", "sandbox_v1alpha1_batchsandbox-pooled.yaml"} {
		objs := k8stest.ReadManifests(t, filepath.Join("..", "..", "..", "config", "samples", f))
		for _, o := range objs {
			o.SetNamespace(ns)
			if err := c.Create(ctx, o, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("%s: %s: %v", f, o.GetName(), err)
			}
		}
	}
	for _, name := range []string{"batchsandbox-sample", "batchsandbox-pooled-sample"} {
		b := waitBatch(t, c, ns, name)
		if pods, ips, _ := allocation(t, b); len(pods) != int(b.GetReplicas()) || slices.Contains(ips, "") {
			t.Errorf("%s: pods %v endpoints %v", name, pods, ips)
		}
	}
}
