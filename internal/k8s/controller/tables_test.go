package controller_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
)

// serverAllocator is an allocator of its own process-like kind: what a
// moat server claims pool pods with.
func serverAllocator(t *testing.T, ns string) *alloc.Allocator {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	hasPool, _ := labels.Parse(sbv1.LabelPool)
	inf, err := cache.New(env.Config, cache.Options{
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
	return a
}

func readTable(t *testing.T, c client.Client, ns, pool string) alloc.Table {
	t.Helper()
	tbl, err := alloc.ReadTable(context.Background(), c, types.NamespacedName{Namespace: ns, Name: pool})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// TestServerClaimsRespected: pods a moat server claimed through the pool's
// table count as allocated, are never handed to a batch, and survive the
// pool shrinking to nothing; each pool pod has a token of its own.
func TestServerClaimsRespected(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	pool := &sbv1.Pool{}
	pool.Namespace, pool.Name = ns, "p"
	pool.Spec = sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, 10, 10)}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "p", 10)

	// Per-pod tokens: every pod reads its own key of the pool's Secret.
	var sec corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: alloc.TokenSecretName("p")}, &sec); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]bool{}
	for name, p := range pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "p"}) {
		var ref *corev1.SecretKeySelector
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == alloc.TokenEnv && e.ValueFrom != nil {
				ref = e.ValueFrom.SecretKeyRef
			}
		}
		if ref == nil || ref.Name != sec.Name || ref.Key != name || len(sec.Data[name]) < 32 {
			t.Fatalf("pod %s token ref %+v (secret keys %d)", name, ref, len(sec.Data))
		}
		if tokens[string(sec.Data[name])] {
			t.Fatalf("pod %s shares its token", name)
		}
		tokens[string(sec.Data[name])] = true
	}

	srv := serverAllocator(t, ns)
	key := types.NamespacedName{Namespace: ns, Name: "p"}
	eventually(t, 30*time.Second, "server sees the pool", func() (bool, string) {
		n := srv.Count(key).Free
		return n == 10, fmt.Sprint(n)
	})
	res, err := srv.Apply(ctx, key, alloc.Change{Owner: alloc.SandboxOwner("s", "one"), Want: 4})
	if err != nil || len(res.Pods) != 4 {
		t.Fatalf("server claim: %+v %v", res, err)
	}
	eventually(t, 30*time.Second, "pool counts the server's claim", func() (bool, string) {
		var p sbv1.Pool
		c.Get(ctx, key, &p)
		return p.Status.Allocated == 4 && p.Status.Available == 6, fmt.Sprintf("%+v", p.Status)
	})
	if err := c.Create(ctx, newBatch(ns, "b", "p", 8)); err != nil {
		t.Fatal(err)
	}
	b := waitBatch(t, c, ns, "b")
	names, _, warm := allocation(t, b)
	nwarm := 0
	for i, pod := range names {
		for _, s := range res.Pods {
			if pod == s {
				t.Errorf("batch claim %d got %s, which the server holds", i, pod)
			}
		}
		if warm[i] {
			nwarm++
		}
	}
	if nwarm != 6 {
		t.Errorf("%d warm claims, want the 6 free pods", nwarm)
	}
	tbl := readTable(t, c, ns, "p")
	if got := len(tbl.Owners[alloc.BatchOwner("b")].Pods); got != 6 {
		t.Errorf("table gives the batch %d pods, want 6: %+v", got, tbl.Owners)
	}

	// Shrink the pool to nothing: the claimed pods stay.
	if err := c.Get(ctx, key, pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.CapacitySpec = capacity(0, 0, 0, 0)
	if err := c.Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	left := pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "p"})
	for _, p := range res.Pods {
		if left[p] == nil {
			t.Errorf("server-claimed pod %s deleted by the pool", p)
		}
	}
	// Deleting the batch releases its pool pods in the table.
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "batch pods retired", func() (bool, string) {
		tbl := readTable(t, c, ns, "p")
		_, still := tbl.Owners[alloc.BatchOwner("b")]
		return !still && len(tbl.Retired) >= 6, fmt.Sprintf("%+v", tbl)
	})

	// Deleting the pool keeps its table and token Secret while pods it
	// made are claimed; they go with its last pod.
	if err := c.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "pool gone", func() (bool, string) {
		err := c.Get(ctx, key, &sbv1.Pool{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	tableObjects := func() (left []string) {
		names := []string{alloc.TokenSecretName("p")}
		for n := range alloc.MinShards {
			names = append(names, alloc.ShardName("p", n))
		}
		for _, name := range names {
			if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.Secret{}); err == nil {
				left = append(left, name)
			} else if !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		return left
	}
	time.Sleep(time.Second)
	if left := tableObjects(); len(left) != 1+alloc.MinShards {
		t.Fatalf("a deleted pool with claimed pods lost its table or tokens: only %v left", left)
	}
	if _, err := srv.Apply(ctx, key, alloc.Change{Owner: alloc.SandboxOwner("s", "one"), ReleaseAll: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Pods {
		if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p}}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "table and token Secret deleted with the pool's last pod", func() (bool, string) {
		left := tableObjects()
		return len(left) == 0, fmt.Sprint(left, " pods ", len(pods(t, c, ns, client.MatchingLabels{sbv1.LabelPool: "p"})))
	})
}

// TestBatchesRaceServerClaims: batches allocated by the controller and
// claims of a server allocator race for one pool; no pod ends up in two
// places, and the table records exactly what each side holds.
func TestBatchesRaceServerClaims(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	const size = 60
	pool := &sbv1.Pool{}
	pool.Namespace, pool.Name = ns, "race"
	pool.Spec = sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(0, 0, size, size)}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitPoolFree(t, c, ns, "race", size)
	srv := serverAllocator(t, ns)
	key := types.NamespacedName{Namespace: ns, Name: "race"}
	eventually(t, 30*time.Second, "server sees the pool", func() (bool, string) {
		n := srv.Count(key).Free
		return n == size, fmt.Sprint(n)
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	server := map[string]string{}
	for i := range 6 {
		wg.Go(func() {
			b := newBatch(ns, fmt.Sprintf("b%d", i), "race", 5)
			if err := c.Create(ctx, b); err != nil {
				t.Error(err)
			}
		})
	}
	for i := range 30 {
		wg.Go(func() {
			owner := alloc.SandboxOwner("s", fmt.Sprintf("sb%d", i))
			res, err := srv.Apply(ctx, key, alloc.Change{Owner: owner, Want: 1})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, p := range res.Pods {
				server[p] = owner
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for i := range 6 {
		waitBatch(t, c, ns, fmt.Sprintf("b%d", i))
	}
	tbl := readTable(t, c, ns, "race")
	where := map[string]string{}
	for i := range 6 {
		var b sbv1.BatchSandbox
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("b%d", i)}, &b); err != nil {
			t.Fatal(err)
		}
		names, _, warm := allocation(t, &b)
		for j, p := range names {
			if !warm[j] {
				continue
			}
			if prev, ok := where[p]; ok {
				t.Errorf("pod %s in %s and %s", p, prev, b.Name)
			}
			where[p] = b.Name
			if s, ok := server[p]; ok {
				t.Errorf("pod %s in batch %s and claimed by %s", p, b.Name, s)
			}
			if o := indexOf(tbl)[p]; o != alloc.BatchOwner(b.Name) {
				t.Errorf("table gives %s to %q, batch %s holds it", p, o, b.Name)
			}
		}
	}
	for p, owner := range server {
		if o := indexOf(tbl)[p]; o != owner {
			t.Errorf("table gives %s to %q, the server was told %s", p, o, owner)
		}
	}
	t.Logf("%d pods to batches warm, %d to server claims", len(where), len(server))
	if len(server) == 0 || len(where) == 0 {
		t.Errorf("no race: %d pods to batches, %d to the server", len(where), len(server))
	}
}

func indexOf(t alloc.Table) map[string]string { return t.Index() }

// TestTableSizedByPool: the controller makes a pool's table with one
// shard per alloc.PodsPerShard pods of its PoolMax (16 for 2,000), every
// shard recording the count; a moat server's allocator adopts it; the
// shards go with the deleted pool.
func TestTableSizedByPool(t *testing.T) {
	c, ns := setup(t)
	startController(t, ns)
	ctx := context.Background()
	pool := &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
		Spec: sbv1.PoolSpec{Template: template(), CapacitySpec: capacity(2, 2, 0, 2000)}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: ns, Name: "big"}
	const want = 16
	if alloc.ShardsFor(2000) != want {
		t.Fatalf("ShardsFor(2000) = %d", alloc.ShardsFor(2000))
	}
	eventually(t, 30*time.Second, "16 table shards", func() (bool, string) {
		shards, err := alloc.ReadShards(ctx, c, key)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range shards {
			if s.Count != want {
				return false, fmt.Sprintf("shard %d records %d shards", s.Index, s.Count)
			}
		}
		return len(shards) == want, fmt.Sprintf("%d shards", len(shards))
	})
	waitPoolFree(t, c, ns, "big", 2)
	srv := serverAllocator(t, ns)
	res, err := srv.Apply(ctx, key, alloc.Change{Owner: alloc.SandboxOwner("s", "one"), Want: 1})
	if err != nil || len(res.Pods) != 1 {
		t.Fatalf("claim from a pool of 16 shards: %v %v", res.Pods, err)
	}
	if n := srv.ShardCount(key); n != want {
		t.Errorf("the server's allocator uses %d shards, want %d", n, want)
	}
	tbl := readTable(t, c, ns, "big")
	if got := tbl.Owners[alloc.SandboxOwner("s", "one")].Pods; len(got) != 1 || got[0] != res.Pods[0] {
		t.Errorf("the table gives the claim %v, it was told %v", got, res.Pods)
	}
	// Given up as a server does: retired, then deleted.
	if _, err := srv.Apply(ctx, key, alloc.Change{Owner: alloc.SandboxOwner("s", "one"), ReleaseAll: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: res.Pods[0]}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "table gone with the pool", func() (bool, string) {
		shards, err := alloc.ReadShards(ctx, c, key)
		return err == nil && len(shards) == 0, fmt.Sprintf("%d shards left, %v", len(shards), err)
	})
}
