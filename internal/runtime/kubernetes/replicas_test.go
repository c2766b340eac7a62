package kubernetes_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	moat "github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kstore"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
	"github.com/moat-sandbox/moat/internal/server"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// TestReplicasShareEverything: two servers on one namespace and scope
// (two replicas of a stateless server) serve the same pools and
// sandboxes: what is made through one is read, changed and deleted
// through the other, and neither keeps a state file.
func TestReplicasShareEverything(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	a, b := startServer(t, ns, "shared"), startServer(t, ns, "shared")
	ctx := context.Background()
	if _, err := a.cl.CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: 2, BufferMax: 4, PoolMax: 20}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "pool warm on the other replica", func() (bool, string) {
		p, err := b.cl.GetPool(ctx, "warm")
		return err == nil && p.Status.Available == 4, fmt.Sprintf("%+v %v", p, err)
	})
	time.Sleep(300 * time.Millisecond) // the agents come up on the pod IPs
	sb, err := a.cl.CreateSandbox(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"},
		Metadata: map[string]string{"made": "on-a"}, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var got *moat.Sandbox
	waitFor(t, 30*time.Second, "the other replica serves the sandbox", func() (bool, string) {
		got, err = b.cl.GetSandbox(ctx, sb.ID)
		return err == nil && got.Status.State == moat.StateRunning, fmt.Sprint(err)
	})
	if got.Metadata["made"] != "on-a" || got.ExpiresAt == nil || !got.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Errorf("replica b sees %+v, a made %+v", got, sb)
	}
	epA, err := a.cl.Endpoint(ctx, sb.ID, 44772, false)
	if err != nil {
		t.Fatal(err)
	}
	epB, err := b.cl.Endpoint(ctx, sb.ID, 44772, false)
	if err != nil || epB.Address != epA.Address || epB.Headers["X-EXECD-ACCESS-TOKEN"] != epA.Headers["X-EXECD-ACCESS-TOKEN"] {
		t.Errorf("endpoints differ: a %+v, b %+v (%v)", epA, epB, err)
	}
	// A renewal on b is seen on a.
	exp, err := b.cl.Renew(ctx, sb.ID, time.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a sees b's renewal", func() (bool, string) {
		got, err := a.cl.GetSandbox(ctx, sb.ID)
		return err == nil && got.ExpiresAt != nil && got.ExpiresAt.Equal(exp), fmt.Sprintf("%v %v", got.ExpiresAt, exp)
	})
	// A list on either replica shows it.
	for _, r := range []*testServer{a, b} {
		list, err := r.cl.ListSandboxes(ctx, moat.ListOptions{})
		if err != nil || len(list.Items) != 1 || list.Items[0].ID != sb.ID {
			t.Errorf("list: %+v %v", list, err)
		}
	}
	// The record is a Secret of the scope.
	c := adminClient(t)
	if n := len(recordSecrets(t, c, ns, "shared")); n != 1 {
		t.Errorf("%d record Secrets, want 1", n)
	}
	// Deleted through b: gone on a, and so is its record.
	if err := b.cl.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a forgets the deleted sandbox", func() (bool, string) {
		_, err := a.cl.GetSandbox(ctx, sb.ID)
		return err != nil, fmt.Sprint(err)
	})
	if n := len(recordSecrets(t, c, ns, "shared")); n != 0 {
		t.Errorf("%d record Secrets left, want none", n)
	}
	for _, r := range []*testServer{a, b} {
		if r.stateFile() {
			t.Errorf("a replica wrote a state file")
		}
	}
}

// TestReplicasNeverDoubleAllocate: two replicas claim from one pool at
// once (single creates and batches, through the Lifecycle API) while the
// controller serves a BatchSandbox created with the Kubernetes API from
// the same pool: no pod is handed out twice, every claim is in the table
// under its own owner, and every sandbox answers on an address of its
// own. Deleting them through the other replica retires their pods.
func TestReplicasNeverDoubleAllocate(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	a, b := startServer(t, ns, "race"), startServer(t, ns, "race")
	ctx := context.Background()
	c := adminClient(t)
	const warm = 40
	if _, err := a.cl.CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: warm, BufferMax: warm, PoolMax: warm}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 120*time.Second, "pool warm", func() (bool, string) {
		p, err := b.cl.GetPool(ctx, "warm")
		return err == nil && p.Status.Available == warm, fmt.Sprintf("%+v %v", p, err)
	})
	time.Sleep(300 * time.Millisecond) // the agents come up on the pod IPs

	// 30 claims through the two replicas and a BatchSandbox of 10 through
	// the controller, all at once: 40 pods for 40 claims.
	var (
		mu  sync.Mutex
		ids []string
		wg  sync.WaitGroup
	)
	claim := func(r *testServer, n int) {
		req := moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}, Timeout: 10 * time.Minute}
		var got []moat.Sandbox
		var err error
		if n == 1 {
			var sb *moat.Sandbox
			if sb, err = r.cl.CreateSandbox(ctx, req); err == nil {
				got = []moat.Sandbox{*sb}
			}
		} else {
			got, err = r.cl.CreateBatch(ctx, req, n)
		}
		if err != nil {
			t.Errorf("claim %d: %v", n, err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, sb := range got {
			ids = append(ids, sb.ID)
		}
	}
	for i := range 5 {
		wg.Go(func() { claim(a, 1) })
		wg.Go(func() { claim(b, 1) })
		if i < 2 {
			wg.Go(func() { claim(a, 5) })
			wg.Go(func() { claim(b, 5) })
		}
	}
	replicas := int32(10)
	wg.Go(func() {
		bs := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubectl"},
			Spec: sbv1.BatchSandboxSpec{Replicas: &replicas, PoolRef: "warm"}}
		if err := c.Create(ctx, bs); err != nil {
			t.Error(err)
		}
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(ids) != 30 {
		t.Fatalf("%d sandboxes claimed, want 30", len(ids))
	}
	waitFor(t, 60*time.Second, "the BatchSandbox allocated", func() (bool, string) {
		var bs sbv1.BatchSandbox
		err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kubectl"}, &bs)
		return err == nil && bs.Status.Allocated == replicas, fmt.Sprintf("%+v %v", bs.Status, err)
	})

	// The table: every pod has one owner; each sandbox owns one pod.
	tbl := table(t, c, ns, "warm")
	owner := map[string]string{}
	for o, own := range tbl.Owners {
		for _, p := range own.Pods {
			if prev, dup := owner[p]; dup {
				t.Errorf("pod %s allocated to %s and %s", p, prev, o)
			}
			owner[p] = o
		}
	}
	if n := len(tbl.Owners[alloc.BatchOwner("kubectl")].Pods); n != int(replicas) {
		t.Errorf("the BatchSandbox holds %d pool pods in the table, want %d", n, replicas)
	}
	addrs := map[string]string{}
	for _, id := range ids {
		own := tbl.Owners[alloc.SandboxOwner("race", id)]
		if len(own.Pods) != 1 {
			t.Errorf("sandbox %s owns pods %v in the table", id, own.Pods)
		}
		// Served by either replica, each on an address of its own.
		for _, r := range []*testServer{a, b} {
			var ep *moat.Endpoint
			var err error
			waitFor(t, 30*time.Second, "endpoint of "+id, func() (bool, string) {
				ep, err = r.cl.Endpoint(ctx, id, 44772, false)
				return err == nil, fmt.Sprint(err)
			})
			if r == a {
				if prev, dup := addrs[ep.Address]; dup {
					t.Errorf("sandboxes %s and %s answer on %s", prev, id, ep.Address)
				}
				addrs[ep.Address] = id
			} else if addrs[ep.Address] != id {
				t.Errorf("replica b gives sandbox %s address %s, a gave it to %s", id, ep.Address, addrs[ep.Address])
			}
		}
	}
	if t.Failed() {
		return
	}

	// Deleted through the other replica than the one that made them
	// (either, for those): their pods are retired, never handed out again.
	for i, id := range ids {
		r := a
		if i%2 == 1 {
			r = b
		}
		if err := r.cl.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	tbl = table(t, c, ns, "warm")
	for _, id := range ids {
		if own, still := tbl.Owners[alloc.SandboxOwner("race", id)]; still {
			t.Errorf("deleted sandbox %s still owns %v", id, own.Pods)
		}
	}
	for p, o := range owner {
		if _, isBatch := alloc.BatchOf(o); isBatch {
			continue
		}
		if _, retired := tbl.Retired[p]; !retired {
			t.Errorf("pod %s of deleted %s not retired", p, o)
		}
	}
}

// TestLeaderDeletesOrphans: a replica that dies after making a sandbox
// (a cold BatchSandbox, or a warm pod taken in the table) and before
// recording it leaves an orphan; one replica of the survivors, the
// leader, deletes it once it is older than the grace period, and leaves
// the recorded sandboxes alone.
func TestLeaderDeletesOrphans(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	grace := func(cfg *server.Config) { cfg.Kubernetes.OrphanGrace = 3 * time.Second }
	a, b := startServerWith(t, ns, "orph", grace), startServerWith(t, ns, "orph", grace)
	ctx := context.Background()
	if _, err := a.cl.CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: 2, BufferMax: 2, PoolMax: 10}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "pool warm", func() (bool, string) {
		p, err := b.cl.GetPool(ctx, "warm")
		return err == nil && p.Status.Available == 2, fmt.Sprintf("%+v %v", p, err)
	})
	time.Sleep(300 * time.Millisecond) // the agents come up on the pod IPs
	kept, err := b.cl.CreateSandbox(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// The dead replica's work: the same runtime, no record.
	rt, err := kubernetes.New(env.Config, kubernetes.Config{Namespace: ns, Scope: "orph"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.Create(ctx, runtime.Spec{ID: "orphan-cold", Image: "busybox:test", AgentToken: "tok", Entrypoint: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := rt.Claim(ctx, "warm", []string{"orphan-warm"}, nil)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	waitFor(t, 90*time.Second, "the orphans deleted", func() (bool, string) {
		live, err := rt.List(ctx)
		if err != nil {
			return false, err.Error()
		}
		var ids []string
		for _, st := range live {
			ids = append(ids, st.ID)
		}
		return len(live) == 1 && live[0].ID == kept.ID, fmt.Sprint(ids)
	})
	for _, r := range []*testServer{a, b} {
		if got, err := r.cl.GetSandbox(ctx, kept.ID); err != nil || got.Status.State != moat.StateRunning {
			t.Errorf("the recorded sandbox: %+v %v", got, err)
		}
	}
	c := adminClient(t)
	if _, owned := table(t, c, ns, "warm").Owners[alloc.SandboxOwner("orph", "orphan-warm")]; owned {
		t.Errorf("the orphan's pod is still owned in the table")
	}
}

// recordSecrets lists the record Secrets of scope (the store's own, not
// the tables' inline records).
func recordSecrets(t *testing.T, c client.Client, ns, scope string) []corev1.Secret {
	t.Helper()
	var secs corev1.SecretList
	if err := c.List(context.Background(), &secs, client.InNamespace(ns), client.MatchingLabels{kstore.LabelStore: scope}); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Secret
	for _, s := range secs.Items {
		if s.Labels[kstore.LabelBucket] != "" {
			out = append(out, s)
		}
	}
	return out
}

// warmPool makes pool "warm" of 4 ready pods through srv.
func warmPool(t *testing.T, srv *testServer) {
	t.Helper()
	ctx := context.Background()
	if _, err := srv.cl.CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: 2, BufferMax: 4, PoolMax: 20}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "pool warm", func() (bool, string) {
		p, err := srv.cl.GetPool(ctx, "warm")
		return err == nil && p.Status.Available == 4, fmt.Sprintf("%+v %v", p, err)
	})
	time.Sleep(300 * time.Millisecond) // the agents come up on the pod IPs
}

// TestInlineRecordServedByOtherReplica: a warm claim's record is written
// into the pool's table with the claim (no record Secret of its own yet),
// and the other replica serves the sandbox from there: get, list, renew
// (which moves the record into a Secret of its own, with the renewal).
func TestInlineRecordServedByOtherReplica(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	a, b := startServer(t, ns, "inl"), startServer(t, ns, "inl")
	warmPool(t, a)
	ctx := context.Background()
	c := adminClient(t)
	sb, err := a.cl.CreateSandbox(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"},
		Metadata: map[string]string{"made": "on-a"}, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if recs := recordSecrets(t, c, ns, "inl"); len(recs) != 0 {
		t.Errorf("a warm claim wrote %d record Secrets, want none (its record is in the table)", len(recs))
	}
	if tbl := table(t, c, ns, "warm"); len(tbl.Records[alloc.SandboxOwner("inl", sb.ID)]) == 0 {
		t.Fatalf("the table holds no record of %s", sb.ID)
	}
	var got *moat.Sandbox
	waitFor(t, 10*time.Second, "the other replica serves the sandbox", func() (bool, string) {
		got, err = b.cl.GetSandbox(ctx, sb.ID)
		return err == nil && got.Status.State == moat.StateRunning, fmt.Sprint(err)
	})
	if got.Metadata["made"] != "on-a" || got.ExpiresAt == nil || !got.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Errorf("replica b sees %+v, a made %+v", got, sb)
	}
	if list, err := b.cl.ListSandboxes(ctx, moat.ListOptions{}); err != nil || len(list.Items) != 1 || list.Items[0].ID != sb.ID {
		t.Errorf("b lists %+v %v", list, err)
	}
	exp, err := b.cl.Renew(ctx, sb.ID, time.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a sees b's renewal", func() (bool, string) {
		got, err := a.cl.GetSandbox(ctx, sb.ID)
		return err == nil && got.ExpiresAt != nil && got.ExpiresAt.Equal(exp), fmt.Sprintf("%v %v", got, err)
	})
	if recs := recordSecrets(t, c, ns, "inl"); len(recs) != 1 {
		t.Errorf("after a renewal %d record Secrets, want 1 (the record moved with the write)", len(recs))
	}
	if tbl := table(t, c, ns, "warm"); len(tbl.Records) != 0 {
		t.Errorf("the table still holds records %v after the move", tbl.Records)
	}
	if err := b.cl.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the record gone", func() (bool, string) {
		n := len(recordSecrets(t, c, ns, "inl"))
		_, err := a.cl.GetSandbox(ctx, sb.ID)
		return n == 0 && err != nil, fmt.Sprint(n, err)
	})
}

// TestInlineRecordOutlivesItsServer: the server that claimed stops; its
// claims' records are durable in the table: a server started later
// serves the sandboxes from there and leaves them inline (a record with
// room costs no write until its first update), and a sandbox deleted
// while its record was inline is not brought back.
func TestInlineRecordOutlivesItsServer(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	a := startServer(t, ns, "crash")
	warmPool(t, a)
	ctx := context.Background()
	c := adminClient(t)
	batch, err := a.cl.CreateBatch(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"},
		Metadata: map[string]string{"made": "on-a"}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	gone := batch[2].ID
	if err := a.cl.DeleteSandbox(ctx, gone); err != nil {
		t.Fatal(err)
	}
	a.stop()
	tbl := table(t, c, ns, "warm")
	for _, sb := range batch[:2] {
		if len(tbl.Records[alloc.SandboxOwner("crash", sb.ID)]) == 0 {
			t.Fatalf("the table holds no record of %s", sb.ID)
		}
	}
	if recs := recordSecrets(t, c, ns, "crash"); len(recs) != 0 {
		t.Fatalf("%d record Secrets before any move", len(recs))
	}

	b := startServer(t, ns, "crash")
	before := b.writes.Snapshot()
	for _, sb := range batch[:2] {
		got, err := b.cl.GetSandbox(ctx, sb.ID)
		if err != nil || got.Metadata["made"] != "on-a" || got.Status.State != moat.StateRunning {
			t.Errorf("the next server serves %s as %+v (%v)", sb.ID, got, err)
		}
	}
	if _, err := b.cl.GetSandbox(ctx, gone); err == nil {
		t.Errorf("sandbox %s deleted before the stop is back", gone)
	}
	time.Sleep(time.Second) // five times the store's MoveAfter
	if recs := recordSecrets(t, c, ns, "crash"); len(recs) != 0 {
		t.Errorf("%d record Secrets a second later, want none: records with room stay inline", len(recs))
	}
	if tbl := table(t, c, ns, "warm"); len(tbl.Records) != 2 {
		t.Errorf("the table holds %d records a second later, want 2", len(tbl.Records))
	}
	if w := b.writes.Since(before); w["POST secrets"]+w["PUT secrets"]+w["DELETE secrets"] != 0 {
		t.Errorf("the next server wrote %v while serving inline records, want no Secret writes", w)
	}
	list, err := b.cl.ListSandboxes(ctx, moat.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Errorf("b lists %+v %v", list, err)
	}
}
