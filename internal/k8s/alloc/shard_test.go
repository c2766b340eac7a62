package alloc

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// The shard rules are tested here against the controller-runtime fake
// client (which enforces resourceVersion guards like the API server), with
// the pods handed to the allocators directly instead of through
// informers, so that each allocator's view of a shard can be made stale
// on purpose. alloc_test.go runs allocators on a real API server.

// shardWorld is one fake API server with n ready pods of pool "warm".
type shardWorld struct {
	c      client.Client
	writes atomic.Int32
	pool   types.NamespacedName
	pods   []string
}

func newShardWorld(t *testing.T, n int) *shardWorld {
	t.Helper()
	w := &shardWorld{pool: types.NamespacedName{Namespace: "ns", Name: "warm"}}
	count := func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
		w.writes.Add(1)
		return c.Update(ctx, obj, opts...)
	}
	create := func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		w.writes.Add(1)
		return c.Create(ctx, obj, opts...)
	}
	w.c = fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{Update: count, Create: create}).Build()
	for i := range n {
		w.pods = append(w.pods, fmt.Sprintf("warm-%04d", i))
	}
	return w
}

// allocator is one process's allocator of w's pool, its pods known, its
// shards created.
func (w *shardWorld) allocator(t *testing.T) *Allocator {
	t.Helper()
	return w.sized(t, 0)
}

// sized is allocator for an allocator that makes tables for pools of
// poolMax pods.
func (w *shardWorld) sized(t *testing.T, poolMax int) *Allocator {
	t.Helper()
	size := func(types.NamespacedName) int { return poolMax }
	a := &Allocator{o: Options{Client: w.c, Reader: w.c, Size: size}, pools: map[types.NamespacedName]*poolState{}, owners: map[types.NamespacedName]types.NamespacedName{}}
	ps := a.pool(w.pool)
	for _, p := range w.pods {
		ps.pods[p] = PodState{IP: "10.0.0.1", Ready: true}
	}
	if err := a.Ensure(context.Background(), w.pool); err != nil {
		t.Fatal(err)
	}
	w.writes.Store(0)
	return a
}

func (a *Allocator) setCursor(pool types.NamespacedName, s int) {
	ps := a.pool(pool)
	ps.mu.Lock()
	ps.cursor = s
	ps.mu.Unlock()
}

func (a *Allocator) cursorOf(pool types.NamespacedName) int {
	ps := a.pool(pool)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.cursor
}

func shardsOf(pods []string) []int {
	var out []int
	for _, p := range pods {
		if s := ShardOf(p, MinShards); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// TestShardConflictMovesOn: two allocators start at the same shard; the
// second one's copy of it is stale, so its write conflicts: it reads the
// shard again and takes its pod from another shard, never the pod the
// first one took.
func TestShardConflictMovesOn(t *testing.T) {
	w := newShardWorld(t, 80)
	a, b := w.allocator(t), w.allocator(t)
	a.setCursor(w.pool, 2)
	b.setCursor(w.pool, 2)
	ctx := context.Background()
	ra, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/a", Want: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(ra.Pods) != 1 || ShardOf(ra.Pods[0], MinShards) != 2 {
		t.Fatalf("a got %v, want one pod of shard 2", ra.Pods)
	}
	// b has not seen a's write (no informers here).
	w.writes.Store(0)
	var mu sync.Mutex
	var changed []int
	b.o.Changed = func(_ types.NamespacedName, n int) {
		mu.Lock()
		defer mu.Unlock()
		changed = append(changed, n)
	}
	rb, err := b.Apply(ctx, w.pool, Change{Owner: "moat/s/b", Want: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rb.Pods) != 1 || rb.Pods[0] == ra.Pods[0] {
		t.Fatalf("b got %v, a got %v", rb.Pods, ra.Pods)
	}
	if s := ShardOf(rb.Pods[0], MinShards); s == 2 {
		t.Errorf("after a conflict on shard 2 b still took a pod of shard 2 (%s)", rb.Pods[0])
	}
	if c := b.cursorOf(w.pool); c == 2 {
		t.Error("b's cursor stayed on the shard it conflicted on")
	}
	if n := w.writes.Load(); n != 2 {
		t.Errorf("b made %d writes, want 2 (the conflict and the allocation)", n)
	}
	// What b read after the conflict (a's claim, and a's record had it
	// one) is a change of shard 2 to b, as its own write of the other
	// shard is.
	mu.Lock()
	if want := []int{2, ShardOf(rb.Pods[0], MinShards)}; !slices.Equal(changed, want) {
		t.Errorf("b's Changed calls: shards %v, want %v (the shard read after the conflict, the shard written)", changed, want)
	}
	mu.Unlock()
	tbl, err := ReadTable(ctx, w.c, w.pool)
	if err != nil {
		t.Fatal(err)
	}
	if got := tbl.Owners["moat/s/a"].Pods; !slices.Equal(got, ra.Pods) {
		t.Errorf("table gives a %v, a was told %v", got, ra.Pods)
	}
	if got := tbl.Owners["moat/s/b"].Pods; !slices.Equal(got, rb.Pods) {
		t.Errorf("table gives b %v, b was told %v", got, rb.Pods)
	}
}

// TestShardFullMovesOn: once the cursor's shard has no free pod, claims
// are served by the next shard that has one, in one write each.
func TestShardFullMovesOn(t *testing.T) {
	w := newShardWorld(t, 80)
	a := w.allocator(t)
	a.setCursor(w.pool, 5)
	ctx := context.Background()
	in5 := 0
	for _, p := range w.pods {
		if ShardOf(p, MinShards) == 5 {
			in5++
		}
	}
	res, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/all5", Want: in5})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != in5 || !slices.Equal(shardsOf(res.Pods), []int{5}) || w.writes.Load() != 1 {
		t.Fatalf("a batch of shard 5's %d pods got %v (shards %v) in %d writes, want them all from shard 5 in one write",
			in5, res.Pods, shardsOf(res.Pods), w.writes.Load())
	}
	w.writes.Store(0)
	next := 6
	for ; next < 6+MinShards; next++ {
		if slices.ContainsFunc(w.pods, func(p string) bool { return ShardOf(p, MinShards) == next%MinShards }) {
			break
		}
	}
	res, err = a.Apply(ctx, w.pool, Change{Owner: "moat/s/one", Want: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 1 || ShardOf(res.Pods[0], MinShards) != next%MinShards || w.writes.Load() != 1 {
		t.Errorf("with shard 5 full a claim got %v (shard %v) in %d writes, want a pod of shard %d in one write",
			res.Pods, shardsOf(res.Pods), w.writes.Load(), next%MinShards)
	}
}

// TestShardBatch: a batch larger than any shard's free pods takes them
// from several shards, one write each; the owner holds all of them, and
// releasing it retires every one in every shard.
func TestShardBatch(t *testing.T) {
	w := newShardWorld(t, 80)
	a := w.allocator(t)
	ctx := context.Background()
	res, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/batch", Want: 30})
	if err != nil {
		t.Fatal(err)
	}
	shards := shardsOf(res.Pods)
	if len(res.Pods) != 30 || len(shards) < 2 {
		t.Fatalf("a batch of 30 of 80 pods got %d pods from shards %v", len(res.Pods), shards)
	}
	if n := int(w.writes.Load()); n != len(shards) {
		t.Errorf("a batch over shards %v made %d writes, want one per shard", shards, n)
	}
	held := slices.Sorted(slices.Values(res.Held))
	got := slices.Sorted(slices.Values(res.Pods))
	if !slices.Equal(held, got) || len(slices.Compact(slices.Clone(got))) != 30 {
		t.Errorf("held %v, given %v", held, got)
	}
	tbl, err := ReadTable(ctx, w.c, w.pool)
	if err != nil {
		t.Fatal(err)
	}
	if recorded := slices.Sorted(slices.Values(tbl.Owners["moat/s/batch"].Pods)); !slices.Equal(recorded, got) {
		t.Errorf("the table records %v, the batch was told %v", recorded, got)
	}
	if pool, own, ok := a.Find("ns", "moat/s/batch"); !ok || pool != w.pool || len(own.Pods) != 30 {
		t.Errorf("Find = %v %d pods %v", pool, len(own.Pods), ok)
	}
	// A batch that one shard can serve is one write.
	w.writes.Store(0)
	small, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/small", Want: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(small.Pods) != 2 || len(shardsOf(small.Pods)) != 1 || w.writes.Load() != 1 {
		t.Errorf("a batch of 2 got %v (shards %v) in %d writes, want one shard, one write", small.Pods, shardsOf(small.Pods), w.writes.Load())
	}
	// Release the big one: every shard it touched is written.
	w.writes.Store(0)
	if _, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/batch", ReleaseAll: true}); err != nil {
		t.Fatal(err)
	}
	if n := int(w.writes.Load()); n != len(shards) {
		t.Errorf("releasing a batch over shards %v made %d writes", shards, n)
	}
	tbl, err = ReadTable(ctx, w.c, w.pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, still := tbl.Owners["moat/s/batch"]; still {
		t.Error("a released batch is still an owner")
	}
	for _, p := range res.Pods {
		if _, ok := tbl.Retired[p]; !ok {
			t.Errorf("released pod %s not retired", p)
		}
	}
	if _, _, ok := a.Find("ns", "moat/s/batch"); ok {
		t.Error("Find still finds a released batch")
	}
	// Retired pods are never handed out again: what is left is 80-30-2.
	rest, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/rest", Want: 80})
	if err != nil {
		t.Fatal(err)
	}
	if len(rest.Pods) != 48 {
		t.Errorf("the rest of the pool is %d pods, want 48", len(rest.Pods))
	}
	for _, p := range rest.Pods {
		if slices.Contains(res.Pods, p) || slices.Contains(small.Pods, p) {
			t.Errorf("pod %s handed out twice", p)
		}
	}
}

// TestShardCountBySize: a pool of 10,000 pods gets a table of
// ShardsFor(10,000) = 79 shards, so that with every pod claimed by a
// sandbox of its own each shard holds about PodsPerShard pods (a few KB,
// as a table of a small pool: a claim's write does not grow with the
// pool); an allocator of another size that comes later adopts the count
// of the table it finds, and a table that records no count (made before
// counts existed) has MinShards.
func TestShardCountBySize(t *testing.T) {
	const pods = 10000
	w := newShardWorld(t, pods)
	var biggest atomic.Int64
	count := func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
		if cm, ok := obj.(*corev1.Secret); ok {
			if n := int64(len(cm.Data[TableKey])); n > biggest.Load() {
				biggest.Store(n)
			}
		}
		return c.Update(ctx, obj, opts...)
	}
	w.c = fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{Update: count}).Build()
	a := w.sized(t, pods)
	want := ShardsFor(pods)
	if want != 79 || a.ShardCount(w.pool) != want {
		t.Fatalf("ShardsFor(%d) = %d, the allocator made %d shards; want 79", pods, want, a.ShardCount(w.pool))
	}
	ctx := context.Background()
	for i := 0; i < pods; i += 100 {
		chs := make([]Change, 100)
		for k := range chs {
			id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", (i+k)*2654435761, (i+k)%0xffff, (i+k)%0xfff, (i+k)%0xfff, (i+k)*40503)
			chs[k] = Change{Owner: SandboxOwner("moat0", id), Want: 1}
		}
		res, err := a.ApplyAll(ctx, w.pool, chs)
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range res {
			if len(r.Pods) != 1 {
				t.Fatalf("claim %d got %v", i+k, r.Pods)
			}
		}
	}
	shards, err := ReadShards(ctx, w.c, w.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != want {
		t.Fatalf("%d shards stored, want %d", len(shards), want)
	}
	tbl := Merge(func() []Table {
		var ts []Table
		for _, s := range shards {
			ts = append(ts, s.Table)
		}
		return ts
	}()...)
	if len(tbl.Index()) != pods {
		t.Errorf("the table names %d pods, want %d", len(tbl.Index()), pods)
	}
	if whole, _ := json.Marshal(tbl); len(whole) <= 1<<20 {
		t.Errorf("the whole table is %d bytes of JSON: this test no longer shows the 1 MiB cap", len(whole))
	}
	const limit = 32 << 10 // a shard of PodsPerShard claims is ~18 KB
	for _, s := range shards {
		if s.Count != want {
			t.Errorf("shard %d records %d shards, want %d", s.Index, s.Count, want)
		}
		if s.Bytes > limit {
			t.Errorf("shard %d is %d bytes, want under %d", s.Index, s.Bytes, limit)
		}
		if n := len(s.Table.Owners); n < PodsPerShard*2/3 || n > PodsPerShard*3/2 {
			t.Errorf("shard %d holds %d pods, want about %d", s.Index, n, PodsPerShard)
		}
	}
	if b := biggest.Load(); b > limit {
		t.Errorf("the largest write carried %d bytes of table, want under %d", b, limit)
	}

	// Another allocator, sized for a small pool, adopts the table's count.
	small := w.sized(t, 10)
	if n := small.ShardCount(w.pool); n != want {
		t.Errorf("an allocator finding a table of %d shards uses %d", want, n)
	}
	if o, ok := small.Owner(w.pool, w.pods[1234]); !ok || o == "" {
		t.Errorf("the adopting allocator does not see pod %s's owner", w.pods[1234])
	}

	// A table of an older layout, without a count: MinShards.
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: ShardName("old", 0),
		Labels: map[string]string{LabelTable: "true"}, Annotations: map[string]string{AnnoPool: "old", AnnoShard: "0"}}}
	if err := w.c.Create(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	old := types.NamespacedName{Namespace: "ns", Name: "old"}
	la := w.sized(t, pods)
	if err := la.Ensure(ctx, old); err != nil {
		t.Fatal(err)
	}
	if n := la.ShardCount(old); n != MinShards {
		t.Errorf("a table without a recorded count has %d shards, want %d", n, MinShards)
	}
	if olds, err := ReadShards(ctx, w.c, old); err != nil || len(olds) != MinShards {
		t.Errorf("Ensure of an old table: %d shards (%v), want %d", len(olds), err, MinShards)
	}
}

// TestInlineRecord: a claim's record is written in its pod's shard with
// the claim (one write); a drop removes it only if it is still the same
// record, and says so; a release drops it too; a record over
// MaxInlineRecord is not written.
func TestInlineRecord(t *testing.T) {
	w := newShardWorld(t, 16)
	a := w.allocator(t)
	ctx := context.Background()
	rec := func(pod string, _ PodState) []byte { return []byte(`{"pod":"` + pod + `"}`) }
	res, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/a", Want: 1, Record: rec})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Recorded || len(res.Pods) != 1 || w.writes.Load() != 1 {
		t.Fatalf("claim with a record: %+v in %d writes", res, w.writes.Load())
	}
	raw := rec(res.Pods[0], PodState{})
	tbl, err := ReadTable(ctx, w.c, w.pool)
	if err != nil {
		t.Fatal(err)
	}
	if string(tbl.Records["moat/s/a"]) != string(raw) {
		t.Fatalf("the table holds record %s", tbl.Records["moat/s/a"])
	}
	if got := a.InlineRecords("ns", func(string) bool { return true }); len(got) != 1 || !got[0].Mine || got[0].Shard != ShardOf(res.Pods[0], MinShards) {
		t.Errorf("InlineRecords = %+v", got)
	}
	// Another record: not dropped.
	if d, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/a", DropRecord: []byte(`{}`)}); err != nil || d.Dropped {
		t.Errorf("drop of another record: %+v %v", d, err)
	}
	d, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/a", DropRecord: raw})
	if err != nil || !d.Dropped || len(d.Held) != 1 {
		t.Errorf("drop: %+v %v, want dropped with the pod still held", d, err)
	}
	if tbl, _ := ReadTable(ctx, w.c, w.pool); len(tbl.Records) != 0 || len(tbl.Owners["moat/s/a"].Pods) != 1 {
		t.Errorf("after the drop: records %v, owner %v", tbl.Records, tbl.Owners["moat/s/a"])
	}
	// A release takes the record with the claim.
	res, err = a.Apply(ctx, w.pool, Change{Owner: "moat/s/b", Want: 1, Record: rec})
	if err != nil || !res.Recorded {
		t.Fatal(res, err)
	}
	if _, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/b", ReleaseAll: true}); err != nil {
		t.Fatal(err)
	}
	if tbl, _ := ReadTable(ctx, w.c, w.pool); len(tbl.Records) != 0 {
		t.Errorf("a released claim left its record: %v", tbl.Records)
	}
	// Too large: the claim, without the record.
	huge := func(string, PodState) []byte { return make([]byte, MaxInlineRecord+1) }
	res, err = a.Apply(ctx, w.pool, Change{Owner: "moat/s/c", Want: 1, Record: huge})
	if err != nil || res.Recorded || len(res.Pods) != 1 {
		t.Errorf("claim with a huge record: %+v %v", res, err)
	}
	if tbl, _ := ReadTable(ctx, w.c, w.pool); len(tbl.Records) != 0 {
		t.Errorf("a huge record went inline")
	}
}

// TestInlineRecordsCrowded: once the inline records of a shard pass
// InlineRoom together, its oldest are crowded (to be moved out by their
// store) until the rest fit, and only that shard's; below it they all
// stay where they are.
func TestInlineRecordsCrowded(t *testing.T) {
	w := newShardWorld(t, 400)
	a := w.allocator(t)
	ctx := context.Background()
	big := func(pod string, _ PodState) []byte { // MaxInlineRecord bytes of JSON
		return fmt.Appendf(nil, "%q", pod+strings.Repeat("x", MaxInlineRecord-2-len(pod)))
	}
	claim := func(owner string, shard int) {
		t.Helper()
		a.setCursor(w.pool, shard)
		res, err := a.Apply(ctx, w.pool, Change{Owner: owner, Want: 1, Record: big})
		if err != nil || !res.Recorded || len(res.Pods) != 1 || ShardOf(res.Pods[0], MinShards) != shard {
			t.Fatalf("claim %s in shard %d: %+v %v", owner, shard, res, err)
		}
	}
	crowded := func() map[string]bool {
		out := map[string]bool{}
		for _, in := range a.InlineRecords("ns", func(string) bool { return true }) {
			out[in.Owner] = in.Crowded
		}
		return out
	}
	claim("moat/s/other", 1)
	fit := InlineRoom / MaxInlineRecord
	for i := range fit {
		claim(fmt.Sprintf("moat/s/%02d", i), 0)
	}
	for o, c := range crowded() {
		if c {
			t.Errorf("%s crowded with %d records of %d bytes in its shard (room %d)", o, fit, MaxInlineRecord, InlineRoom)
		}
	}
	claim("moat/s/last", 0)
	got := crowded()
	for o, c := range got {
		if c != (o == "moat/s/00") {
			t.Errorf("%s crowded %v with %d records in shard 0, one in shard 1: want the oldest of shard 0 alone", o, c, fit+1)
		}
	}
	if len(got) != fit+2 {
		t.Errorf("%d inline records, want %d", len(got), fit+2)
	}
}

// TestClaimLooksOnce: a warm claim looks at the pool's free pods once
// (Options.Usable is asked once, then once per pod at most), and a claim
// the pool cannot fully serve still ends with what there is.
func TestClaimLooksOnce(t *testing.T) {
	w := newShardWorld(t, 80)
	a := w.allocator(t)
	var looks, asks atomic.Int32
	a.o.Usable = func(types.NamespacedName) func(string) bool {
		looks.Add(1)
		return func(pod string) bool { asks.Add(1); return pod != w.pods[0] }
	}
	ctx := context.Background()
	res, err := a.Apply(ctx, w.pool, Change{Owner: "moat/s/one", Want: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 1 || res.Pods[0] == w.pods[0] {
		t.Fatalf("claim got %v, want one usable pod", res.Pods)
	}
	if l, n := looks.Load(), asks.Load(); l != 1 || n > int32(len(w.pods)) {
		t.Errorf("a warm claim looked at the free pods %d times (%d asks for %d pods), want once", l, n, len(w.pods))
	}
	res, err = a.Apply(ctx, w.pool, Change{Owner: "moat/s/all", Want: len(w.pods)})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(w.pods) - 2; len(res.Pods) != want {
		t.Errorf("a claim of the whole pool got %d pods, want the %d usable free ones", len(res.Pods), want)
	}
	if slices.Contains(res.Pods, w.pods[0]) {
		t.Errorf("a claim got %s, which is not usable", w.pods[0])
	}
}
