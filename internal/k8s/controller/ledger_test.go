package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
)

func key(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

// allocN allocates n claims of batch from free (every claim may go warm)
// and commits the record unless the caller undoes it.
func allocN(l *ledger, batch string, rec record, n int, free []string) (record, func()) {
	return l.allocate(key(batch), rec, n, free,
		func(int) bool { return true },
		func(i int, repl bool) string { return coldPodName(batch, "u1", i, repl) })
}

func TestLedgerConcurrentAllocation(t *testing.T) {
	l := newLedger()
	l.loaded = true
	var free []string
	for i := range 50 {
		free = append(free, fmt.Sprintf("pod-%d", i))
	}
	var mu sync.Mutex
	owner := map[string]string{}
	warm, cold := 0, 0
	var wg sync.WaitGroup
	for b := range 20 {
		wg.Go(func() {
			name := fmt.Sprintf("b%d", b)
			rec, _ := allocN(l, name, record{}, 4, free)
			l.commit(key(name), rec)
			mu.Lock()
			defer mu.Unlock()
			for _, c := range rec.Claims {
				if prev, ok := owner[c.Pod]; ok {
					t.Errorf("pod %s given to %s and %s", c.Pod, prev, name)
				}
				owner[c.Pod] = name
				if c.Pool {
					warm++
				} else {
					cold++
				}
			}
		})
	}
	wg.Wait()
	if warm != 50 || cold != 30 {
		t.Errorf("warm %d cold %d, want 50 and 30", warm, cold)
	}
}

func TestLedgerUndoReplaceReleaseAndReload(t *testing.T) {
	l := newLedger()
	l.loaded = true
	free := []string{"p0", "p1", "p2", "p3"}
	_, undo := allocN(l, "a", record{}, 2, free)
	undo()
	b, _ := allocN(l, "b", record{}, 3, free)
	l.commit(key("b"), b)
	if !b.Claims[2].Pool || b.Claims[0].Pod != "p0" {
		t.Fatalf("undo did not free the pods: %+v", b)
	}
	// Allocating again with a full record takes nothing.
	again, _ := allocN(l, "b", b, 3, []string{"p9"})
	if !again.equal(b) {
		t.Errorf("re-allocate changed the record: %+v", again)
	}
	// A claim whose pod vanished gets a new one; the old pod is released
	// and never handed out again (OpenSandbox #954 left such claims
	// empty forever).
	b2 := b.clone()
	b2.Released = append(b2.Released, b2.Claims[1].Pod)
	b2.Claims[1] = claim{}
	b2, _ = allocN(l, "b", b2, 3, free)
	l.commit(key("b"), b2)
	if b2.Claims[1].Pod != "p3" || !b2.Claims[1].Pool {
		t.Errorf("replacement = %+v, want the free p3", b2.Claims[1])
	}
	c, _ := allocN(l, "c", record{}, 1, free)
	if c.Claims[0].Pool {
		t.Errorf("released or taken pod re-allocated: %+v", c)
	}
	// Released batches' pods are gone too.
	l.release(key("b"))
	d, _ := allocN(l, "d", record{}, 1, free)
	if d.Claims[0].Pool {
		t.Errorf("pod of a released batch re-allocated: %+v", d)
	}

	// Reload from the batches' annotations (a controller restart).
	x := &sbv1.BatchSandbox{}
	x.Namespace, x.Name, x.Annotations = "ns", "x", map[string]string{}
	record{Claims: []claim{{Pod: "q0", Pool: true, IP: "10.0.0.1"}, {Pod: "x-u1-1"}}, Released: []string{"q1"}}.annotate(x.Annotations)
	r := fake.NewClientBuilder().WithScheme(kclient.Scheme()).WithObjects(x).WithStatusSubresource(x).Build()
	l2 := newLedger()
	if err := l2.load(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if !l2.taken(client.ObjectKey{Namespace: "ns", Name: "q0"}) || !l2.taken(client.ObjectKey{Namespace: "ns", Name: "q1"}) {
		t.Error("reloaded ledger lost q0 or the released q1")
	}
	got, _ := allocN(l2, "y", record{}, 2, []string{"q0", "q1", "q2"})
	if got.Claims[0].Pod != "q2" || got.Claims[1].Pool {
		t.Errorf("after reload: %+v", got)
	}
	// The pool's cache drops q1 once it is deleted: then it is settled.
	l2.settle(func(p types.NamespacedName) bool { return p.Name != "q1" })
	if l2.taken(client.ObjectKey{Namespace: "ns", Name: "q1"}) {
		t.Error("settled pod still gone")
	}
}

func TestRecordRoundTrip(t *testing.T) {
	rec := record{Claims: []claim{{Pod: "a", Pool: true, IP: "10.1.0.1"}, {Pod: "b"}, {}, {Pod: "c", IP: "10.1.0.3", Done: true}}, Released: []string{"z"}}
	ann := map[string]string{"other": "x"}
	rec.annotate(ann)
	// OpenSandbox's shapes, which its clients read.
	if ann[sbv1.AnnoAllocStatus] != `{"pods":["a","b","","c"],"pool":[0],"done":[3]}` ||
		ann[sbv1.AnnoEndpoints] != `["10.1.0.1","","","10.1.0.3"]` || ann[sbv1.AnnoAllocRelease] != `{"pods":["z"]}` {
		t.Errorf("annotations: %v", ann)
	}
	got, ok, err := parseRecord(ann)
	if err != nil || !ok || !got.equal(rec) {
		t.Errorf("parse = %+v %v %v, want %+v", got, ok, err, rec)
	}
	if _, ok, err := parseRecord(map[string]string{}); ok || err != nil {
		t.Errorf("no record: %v %v", ok, err)
	}
	if _, _, err := parseRecord(map[string]string{sbv1.AnnoAllocStatus: "{"}); err == nil {
		t.Error("garbage record parsed")
	}
	// An OpenSandbox record (no moat keys) reads as created pods.
	os, ok, err := parseRecord(map[string]string{sbv1.AnnoAllocStatus: `{"pods":["p"]}`})
	if err != nil || !ok || len(os.Claims) != 1 || os.Claims[0] != (claim{Pod: "p"}) {
		t.Errorf("upstream record: %+v %v %v", os, ok, err)
	}
}

func TestPoolTarget(t *testing.T) {
	for i, tc := range []struct {
		c                sbv1.CapacitySpec
		allocated, avail int
		want             int
	}{
		0: {sbv1.CapacitySpec{PoolMin: 100, PoolMax: 100}, 0, 0, 100},
		1: {sbv1.CapacitySpec{BufferMin: 2, BufferMax: 5, PoolMax: 50}, 0, 0, 5},
		2: {sbv1.CapacitySpec{BufferMin: 2, BufferMax: 5, PoolMax: 50}, 10, 3, 13}, // within the buffer: keep
		3: {sbv1.CapacitySpec{BufferMin: 2, BufferMax: 5, PoolMax: 50}, 10, 1, 15}, // below: refill to max
		4: {sbv1.CapacitySpec{BufferMin: 2, BufferMax: 5, PoolMax: 50}, 10, 9, 15}, // above: shrink to max
		5: {sbv1.CapacitySpec{BufferMin: 2, BufferMax: 5, PoolMax: 12}, 10, 0, 12}, // capped by poolMax
		6: {sbv1.CapacitySpec{BufferMin: 0, BufferMax: 0, PoolMin: 4, PoolMax: 9}, 7, 0, 7},
		7: {sbv1.CapacitySpec{BufferMin: 1, BufferMax: 3, PoolMin: 0, PoolMax: 0}, 0, 0, 0}, // poolMax 0: empty
	} {
		if got := poolTarget(tc.c, tc.allocated, tc.avail); got != tc.want {
			t.Errorf("%d: poolTarget = %d, want %d", i, got, tc.want)
		}
	}
}

func TestNewPodInjectsAgent(t *testing.T) {
	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "main", Image: "busybox", Command: []string{"sleep"}, Args: []string{"infinity"}},
		{Name: "side", Image: "busybox"},
	}}}
	p := newPod("ns", "p", tpl, "moat:agent", map[string]string{"x": "y"})
	c := p.Spec.Containers[0]
	if want := []string{agentPath, "execd", "--port", "44772", "--", "sleep", "infinity"}; !slices.Equal(c.Command, want) || c.Args != nil {
		t.Errorf("command %q args %q, want %q", c.Command, c.Args, want)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != "moat:agent" || p.Spec.Volumes[0].EmptyDir == nil {
		t.Errorf("init %+v volumes %+v", p.Spec.InitContainers, p.Spec.Volumes)
	}
	if p.Labels["x"] != "y" || p.Labels[sbv1.LabelManaged] != sbv1.ManagedBy || *p.Spec.AutomountServiceAccountToken {
		t.Errorf("labels %v automount %v", p.Labels, *p.Spec.AutomountServiceAccountToken)
	}
	if p.Spec.Containers[1].Command != nil || tpl.Spec.Containers[0].Command[0] != "sleep" {
		t.Error("the template or the second container changed")
	}
	// A template that already carries the agent, or opts out, is kept.
	again := newPod("ns", "q", &corev1.PodTemplateSpec{Spec: p.Spec}, "moat:agent", nil)
	if len(again.Spec.InitContainers) != 1 || again.Spec.Containers[0].Command[0] != agentPath || again.Spec.Containers[0].Command[5] != "sleep" {
		t.Errorf("double injection: %+v", again.Spec)
	}
	tpl.Annotations = map[string]string{sbv1.AnnoAgent: "false"}
	if own := newPod("ns", "r", tpl, "moat:agent", nil); len(own.Spec.InitContainers) != 0 || own.Spec.Containers[0].Command[0] != "sleep" {
		t.Errorf("opted-out template got the agent: %+v", own.Spec)
	}
}

func TestCheckTemplateAndShardPatch(t *testing.T) {
	if checkTemplate(nil) == nil || checkTemplate(&corev1.PodTemplateSpec{}) == nil ||
		checkTemplate(&corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}) == nil {
		t.Error("bad templates accepted")
	}
	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "a", Env: []corev1.EnvVar{{Name: "A", Value: "1"}}}}}}
	got, err := applyShardPatch(tpl, []byte(`{"metadata":{"labels":{"shard":"0"}},"spec":{"containers":[{"name":"main","env":[{"name":"B","value":"2"}]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["shard"] != "0" || len(got.Spec.Containers) != 1 || len(got.Spec.Containers[0].Env) != 2 || got.Spec.Containers[0].Image != "a" {
		t.Errorf("patched: %+v", got)
	}
	if _, err := applyShardPatch(tpl, []byte(`{"spec":{"containers":[{"name":"main","image":""}]}}`)); err == nil {
		t.Error("a patch that removes the image was accepted")
	}
}

func TestTaskOfAndShellQuote(t *testing.T) {
	b := &sbv1.BatchSandbox{Spec: sbv1.BatchSandboxSpec{
		TaskTemplate: &sbv1.TaskTemplateSpec{Spec: sbv1.TaskSpec{Process: &sbv1.ProcessTask{
			Command: []string{"sh", "-c"}, Args: []string{"echo $SHARD"}, Env: []corev1.EnvVar{{Name: "SHARD", Value: "x"}}}}},
		ShardTaskPatches: []runtime.RawExtension{{Raw: []byte(`{"spec":{"process":{"args":["echo one"]}}}`)}, {}},
	}}
	t0, err := taskOf(b, 0)
	if err != nil || !slices.Equal(t0.Process.Args, []string{"echo one"}) || t0.Process.Command[0] != "sh" || t0.Process.Env[0].Value != "x" {
		t.Errorf("claim 0 task = %+v, %v", t0, err)
	}
	if t1, err := taskOf(b, 1); err != nil || t1.Process.Args[0] != "echo $SHARD" {
		t.Errorf("claim 1 task = %+v, %v", t1, err)
	}
	if t2, err := taskOf(b, 5); err != nil || t2.Process.Args[0] != "echo $SHARD" {
		t.Errorf("claim 5 task = %+v, %v", t2, err)
	}
	b.Spec.TaskTemplate.Spec.Process.Command = nil
	if _, err := taskOf(b, 1); err == nil {
		t.Error("a task without a command was accepted")
	}
	if got := shellQuote([]string{"sh", "-c", "echo 'hi' $X"}); got != `'sh' '-c' 'echo '\''hi'\'' $X'` {
		t.Errorf("shellQuote = %s", got)
	}
}
