package alloc_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

var env *k8stest.Env

func TestMain(m *testing.M) { k8stest.Main(m, &env, k8stest.Options{Nodes: 2}) }

var nsSeq atomic.Int32

// process is one allocating process: its own client (with its own write
// counter), its own informers and its own Allocator, as in another
// replica.
type process struct {
	a      *alloc.Allocator
	writes *k8stest.WriteCounter
}

func newProcess(t *testing.T, ns string) *process {
	t.Helper()
	w := &k8stest.WriteCounter{}
	cfg := w.Wrap(env.Config)
	c, err := client.New(cfg, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	inf := newCache(t, env.Config, ns)
	a, err := alloc.New(context.Background(), alloc.Options{Client: c, Informers: inf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); inf.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := a.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return &process{a: a, writes: w}
}

func newCache(t *testing.T, cfg *rest.Config, ns string) cache.Cache {
	t.Helper()
	hasPool, _ := labels.Parse(sbv1.LabelPool)
	inf, err := cache.New(cfg, cache.Options{
		Scheme:            kclient.Scheme(),
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:    {Label: hasPool},
			&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{alloc.LabelTable: "true"})},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return inf
}

// poolPods makes n running pods of pool in a new namespace.
func poolPods(t *testing.T, pool string, n int) (string, client.Client) {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := fmt.Sprintf("alloc%d", nsSeq.Add(1))
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%03d", pool, i),
				Labels: map[string]string{sbv1.LabelPool: pool, sbv1.LabelManaged: sbv1.ManagedBy}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:test"}}},
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var list corev1.PodList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				running++
			}
		}
		if running == n {
			return ns, c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods running", running, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFree waits until p sees want free pods in pool.
func waitFree(t *testing.T, p *process, pool types.NamespacedName, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.a.Count(pool).Free != want {
		if time.Now().After(deadline) {
			t.Fatalf("free = %d, want %d", p.a.Count(pool).Free, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrentAllocators claims every pod of a pool from two processes
// at once, in single claims and small batches, and from more claims than
// there are pods: each pod goes to exactly one owner, the table records
// exactly what the claims were told, and concurrent claims share writes.
func TestConcurrentAllocators(t *testing.T) {
	k8stest.Require(t, env)
	const pods = 120
	ns, c := poolPods(t, "warm", pods)
	pool := types.NamespacedName{Namespace: ns, Name: "warm"}
	procs := []*process{newProcess(t, ns), newProcess(t, ns)}
	for _, p := range procs {
		waitFree(t, p, pool, pods)
	}
	var (
		mu    sync.Mutex
		given = map[string]string{} // pod -> owner
		dups  []string
		total int
		wg    sync.WaitGroup
	)
	// Eight claimers per process claim until the pool is empty: one pod
	// at a time, and every tenth claim five.
	var claims atomic.Int32
	for i := range 16 {
		p := procs[i%2]
		wg.Go(func() {
			for j := 0; ; j++ {
				want := 1
				if j%10 == 9 {
					want = 5
				}
				owner := fmt.Sprintf("moat/test/sb%02d-%03d", i, j)
				claims.Add(1)
				res, err := p.a.Apply(context.Background(), pool, alloc.Change{Owner: owner, Want: want})
				if err != nil {
					t.Errorf("claim %s: %v", owner, err)
					return
				}
				mu.Lock()
				total += len(res.Pods)
				for _, pod := range res.Pods {
					if prev, ok := given[pod]; ok {
						dups = append(dups, fmt.Sprintf("%s to %s and %s", pod, prev, owner))
					}
					given[pod] = owner
				}
				mu.Unlock()
				if len(res.Pods) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(dups) > 0 {
		t.Fatalf("pods handed out twice: %v", dups)
	}
	if total != pods {
		t.Errorf("%d pods handed out, want all %d", total, pods)
	}
	tbl, err := alloc.ReadTable(context.Background(), c, pool)
	if err != nil {
		t.Fatal(err)
	}
	recorded := 0
	for owner, own := range tbl.Owners {
		for _, pod := range own.Pods {
			recorded++
			if given[pod] != owner {
				t.Errorf("table gives %s to %s, the claim was told %q", pod, owner, given[pod])
			}
		}
	}
	if recorded != pods {
		t.Errorf("table records %d pods, want %d", recorded, pods)
	}
	writes := k8stest.Total(procs[0].writes.Snapshot()) + k8stest.Total(procs[1].writes.Snapshot())
	t.Logf("%d claims, %d table writes (conflicts included)", claims.Load(), writes)
	if writes >= int(claims.Load()) {
		t.Errorf("%d writes for %d claims: concurrent claims were not grouped", writes, claims.Load())
	}
}

// TestRetireRacesClaims retires free pods from one process (the pool
// controller deleting surplus pods) while the other claims: no pod ends
// up both retired and owned, and a released pod is never handed out again.
func TestRetireRacesClaims(t *testing.T) {
	k8stest.Require(t, env)
	const pods = 60
	ns, _ := poolPods(t, "shrink", pods)
	pool := types.NamespacedName{Namespace: ns, Name: "shrink"}
	claimer, ctl := newProcess(t, ns), newProcess(t, ns)
	waitFree(t, claimer, pool, pods)
	waitFree(t, ctl, pool, pods)
	var all []string
	for i := range pods {
		all = append(all, fmt.Sprintf("shrink-%03d", i))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	owned := map[string]bool{}
	retired := map[string]bool{}
	for i := range 30 {
		wg.Go(func() {
			res, err := claimer.a.Apply(context.Background(), pool, alloc.Change{Owner: fmt.Sprintf("moat/t/%d", i), Want: 1})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, p := range res.Pods {
				owned[p] = true
			}
			mu.Unlock()
		})
	}
	for i := range 6 {
		wg.Go(func() {
			res, err := ctl.a.Apply(context.Background(), pool, alloc.Change{Retire: all[i*10 : i*10+10]})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, p := range res.Retired {
				retired[p] = true
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for p := range owned {
		if retired[p] {
			t.Errorf("pod %s both claimed and retired", p)
		}
	}
	if len(owned)+len(retired) != pods {
		t.Errorf("%d claimed + %d retired, want %d", len(owned), len(retired), pods)
	}
	// Release one claim: its pod is retired, and a new claim never gets it.
	var victim string
	for p := range owned {
		victim = p
		break
	}
	owner, _ := claimer.a.Owner(pool, victim)
	if _, err := claimer.a.Apply(context.Background(), pool, alloc.Change{Owner: owner, ReleaseAll: true}); err != nil {
		t.Fatal(err)
	}
	if o, named := ctl.a.Owner(pool, victim); named && o != "" {
		// ctl's informer may lag; the table itself is what counts.
		t.Logf("ctl still sees %s owned by %s", victim, o)
	}
	res, err := ctl.a.Apply(context.Background(), pool, alloc.Change{Owner: "moat/t/late", Want: pods})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 0 {
		t.Errorf("a pool without free pods handed out %v (released %s)", res.Pods, victim)
	}
}
