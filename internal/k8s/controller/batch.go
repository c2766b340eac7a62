package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
)

// batchReconciler serves BatchSandboxes. Claims without a pod are
// allocated in one step under the ledger's lock: free, running pool pods
// for as many claims as the pool can serve, pods created for the batch
// for the rest. The allocation is made durable by one write of the
// batch's annotations (the record, guarded by the resourceVersion the
// allocation was computed from); the counts follow in one status write.
// Only created pods cost a write each. A claim whose pod is deleted gets
// a new one (never the same sandbox back: its state is lost); a claim
// whose pod ended keeps it, as a failed or finished sandbox.
type batchReconciler struct {
	c      client.Client
	api    client.Reader
	ledger *ledger
	// tables are the pools' allocation tables (internal/k8s/alloc): a
	// pool pod is the batch's once its table says so.
	tables *alloc.Allocator
	opts   Options
	// poke tells the pool controller that allocation changed.
	poke  chan<- event.GenericEvent
	tasks *taskRunner
	// iso keeps the namespaces' isolation policy (isolation.go).
	iso *isolator
	// events records the batches' pause failures (pause.go).
	events events.EventRecorder

	mu sync.Mutex
	// created are pods created but maybe not yet in the cache.
	created map[types.NamespacedName]time.Time
	// lastWrite is when each batch's record was last written.
	lastWrite map[types.UID]time.Time
	// written is the status and finalizer this process last wrote per
	// batch: the cached batch may not show them yet, and a write from that
	// stale copy would only conflict.
	written map[types.UID]writtenState
	// ends are how ended pods ended, found in their events (evictions.go).
	ends map[types.UID]string
}

type writtenState struct {
	status    sbv1.BatchSandboxStatus
	finalizer bool
	at        time.Time
}

func (r *batchReconciler) lastWritten(uid types.UID) (writtenState, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.written[uid]
	return w, ok
}

func (r *batchReconciler) noteWritten(uid types.UID, f func(*writtenState)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.written == nil {
		r.written = map[types.UID]writtenState{}
	}
	for u, w := range r.written {
		if time.Since(w.at) > inflightTTL {
			delete(r.written, u)
		}
	}
	w := r.written[uid]
	f(&w)
	w.at = time.Now()
	r.written[uid] = w
}

// recentlyCreated reports whether the controller created pod in the last
// inflightTTL (so a lagging cache does not cause a second create).
func (r *batchReconciler) recentlyCreated(pod types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, t := range r.created {
		if time.Since(t) > inflightTTL {
			delete(r.created, p)
		}
	}
	_, ok := r.created[pod]
	return ok
}

func (r *batchReconciler) markCreated(pod types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.created == nil {
		r.created = map[types.NamespacedName]time.Time{}
	}
	r.created[pod] = time.Now()
}

func (r *batchReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if err := r.ledger.load(ctx, r.api); err != nil {
		return reconcile.Result{}, err
	}
	key := req.NamespacedName
	var b sbv1.BatchSandbox
	if err := r.c.Get(ctx, key, &b); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Deleted without our finalizer: release what the ledger knows.
		if _, ok := r.ledger.get(key); ok {
			return reconcile.Result{}, r.releaseAll(ctx, key, "")
		}
		return reconcile.Result{}, nil
	}
	if b.DeletionTimestamp != nil {
		if err := r.releaseAll(ctx, key, b.Spec.PoolRef); err != nil {
			return reconcile.Result{}, err
		}
		orig := b.DeepCopy()
		if controllerutil.RemoveFinalizer(&b, sbv1.FinalizerRelease) {
			// A patch, not an update: the cached copy may be older than
			// the controller's last write, and the release is done.
			return reconcile.Result{}, client.IgnoreNotFound(r.c.Patch(ctx, &b, client.MergeFrom(orig)))
		}
		return reconcile.Result{}, nil
	}
	if b.Spec.ExpireTime != nil && !time.Now().Before(b.Spec.ExpireTime.Time) {
		return reconcile.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, &b))
	}
	rec, had := r.ledger.get(key)
	if !had {
		// Recorded by an earlier process after this one loaded the
		// ledger, or never allocated.
		parsed, ok, err := parseRecord(b.Annotations)
		if err != nil {
			return r.writeStatus(ctx, &b, rec, nil, failure{sbv1.ReasonInvalidTemplate, err.Error()}, nil)
		}
		if ok {
			rec, had = r.ledger.adopt(key, parsed), true
		}
	}
	return r.sync(ctx, &b, rec, had)
}

// failure is why claims cannot be served (a Ready=False condition).
type failure struct{ reason, msg string }

// poolOf returns the batch's pool, nil if it names none or none exists.
func (r *batchReconciler) poolOf(ctx context.Context, b *sbv1.BatchSandbox) (*sbv1.Pool, error) {
	if b.Spec.PoolRef == "" {
		return nil, nil
	}
	pool := &sbv1.Pool{}
	err := r.c.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.PoolRef}, pool)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case pool.DeletionTimestamp != nil:
		return nil, nil
	}
	return pool, nil
}

// coldTemplate is the template of claim i's pod when no warm pod serves
// it: the batch's template, else its pool's, with shard patch i applied.
func coldTemplate(b *sbv1.BatchSandbox, pool *sbv1.Pool, i int) (*corev1.PodTemplateSpec, *failure) {
	t := b.Spec.Template
	if t == nil && pool != nil {
		t = pool.Spec.Template
	}
	if t == nil {
		if b.Spec.PoolRef != "" && pool == nil {
			return nil, &failure{sbv1.ReasonPoolNotFound, fmt.Sprintf("pool %q not found and the batch has no template", b.Spec.PoolRef)}
		}
		return nil, &failure{sbv1.ReasonInvalidTemplate, "the batch has neither a poolRef nor a template"}
	}
	if err := checkTemplate(t); err != nil {
		return nil, &failure{sbv1.ReasonInvalidTemplate, err.Error()}
	}
	if i < len(b.Spec.ShardPatches) {
		pt, err := applyShardPatch(t, b.Spec.ShardPatches[i].Raw)
		if err != nil {
			return nil, &failure{sbv1.ReasonInvalidTemplate, fmt.Sprintf("claim %d: %v", i, err)}
		}
		t = pt
	}
	return t, nil
}

func hasShardPatch(b *sbv1.BatchSandbox, i int) bool {
	if i >= len(b.Spec.ShardPatches) {
		return false
	}
	raw := string(b.Spec.ShardPatches[i].Raw)
	return raw != "" && raw != "null" && raw != "{}"
}

// sync brings a batch to its spec: refreshes the claims from the pods,
// allocates claims without a pod, persists the record, creates missing
// pods, deletes released ones and writes the status.
func (r *batchReconciler) sync(ctx context.Context, b *sbv1.BatchSandbox, rec record, had bool) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(b)
	replicas := int(b.GetReplicas())
	pool, err := r.poolOf(ctx, b)
	if err != nil {
		return reconcile.Result{}, err
	}
	pods, err := r.batchPods(ctx, b, rec)
	if err != nil {
		return reconcile.Result{}, err
	}
	next := scaleDown(refresh(rec, pods), replicas)
	var tasks *taskReport
	if b.Spec.TaskTemplate != nil {
		rep := r.tasks.run(ctx, b, next, pods)
		tasks = &rep
		if p := b.Spec.TaskResourcePolicyWhenCompleted; p != nil && *p == sbv1.TaskRelease {
			releaseFinished(&next, rep.finished)
		}
	}

	var fail *failure
	undo := func() {}
	// Pool pods the table gives this batch beyond its record: taken by an
	// earlier pass whose record write failed. They serve claims first;
	// those left over are released.
	var poolKey types.NamespacedName
	var extra []string
	if b.Spec.PoolRef != "" {
		poolKey = types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.PoolRef}
		held, _ := r.tables.Held(poolKey, alloc.BatchOwner(b.Name))
		extra = slices.DeleteFunc(held, func(p string) bool { return recordHas(next, p) })
	}
	if needsAllocation(next, replicas) {
		if next, pods, undo, fail, err = r.allocate(ctx, b, pool, next, pods, extra); err != nil {
			return reconcile.Result{}, err
		}
	}
	if b.Spec.PoolRef != "" {
		// The table is the fence: the batch's pool pods are recorded in it
		// before the batch's own record, and a pod a moat server took
		// meanwhile undoes this allocation (the next pass picks again).
		if ok, err := r.recordInTable(ctx, poolKey, b, &next, extra); err != nil || !ok {
			undo()
			if err != nil {
				return reconcile.Result{}, err
			}
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil // Requeue is deprecated
		}
	}
	w, _ := r.lastWritten(b.UID)
	newTasks := tasks != nil && len(tasks.started) > 0
	if !next.equal(rec) || !had || newTasks || (!controllerutil.ContainsFinalizer(b, sbv1.FinalizerRelease) && !w.finalizer) {
		if wait := r.untilNextWrite(b.UID); wait > 0 && had && !newTasks && onlyAddresses(rec, next) && !complete(next, replicas) {
			// Readiness of created pods trickles in pod by pod: coalesce
			// it into at most one write per statusInterval.
			undo()
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		var started map[string]string
		if tasks != nil {
			started = tasks.started
		}
		if err := r.writeRecord(ctx, b, next, started); err != nil {
			undo()
			return reconcile.Result{}, err
		}
		if tasks != nil {
			r.tasks.recorded(b.Namespace, started)
		}
		r.ledger.commit(key, next)
		if len(next.Released) != len(rec.Released) || slices.ContainsFunc(next.Claims, func(c claim) bool { return c.Pool }) {
			r.pokePool(b.Namespace, b.Spec.PoolRef)
		}
	}
	return r.converge(ctx, b, pool, next, pods, fail, tasks)
}

// scaleDown gives up the pods of the claims past replicas.
func scaleDown(next record, replicas int) record {
	if len(next.Claims) <= replicas {
		return next
	}
	for _, c := range next.Claims[replicas:] {
		if c.Pod != "" {
			next.Released = append(next.Released, c.Pod)
		}
	}
	next.Claims = next.Claims[:replicas]
	return next
}

// releaseFinished gives up the sandboxes of the finished tasks' claims at
// once (TaskResourcePolicyWhenCompleted Release).
func releaseFinished(next *record, finished []int) {
	for _, i := range finished {
		if c := &next.Claims[i]; !c.Done && c.Pod != "" {
			c.Done = true
			next.Released = append(next.Released, c.Pod)
		}
	}
}

// allocate serves the batch's unserved claims from the pool's free pods
// (extra, the pods the table already gives the batch, first) or cold, in
// the ledger; undo takes the allocation back. Claims that went cold need
// a template: without one, none of them is served (the warm ones stay
// allocated) and fail says why.
func (r *batchReconciler) allocate(ctx context.Context, b *sbv1.BatchSandbox, pool *sbv1.Pool, next record, pods map[string]*corev1.Pod, extra []string) (_ record, _ map[string]*corev1.Pod, undo func(), fail *failure, err error) {
	var free []string
	if pool != nil {
		if free, err = r.freePods(ctx, pool); err != nil {
			return next, pods, func() {}, nil, err
		}
		free = append(slices.Clone(extra), free...)
	}
	before := next
	next, undo = r.ledger.allocate(client.ObjectKeyFromObject(b), next, int(b.GetReplicas()), free,
		func(i int) bool { return pool != nil && !hasShardPatch(b, i) },
		func(i int, replacement bool) string { return coldPodName(b.Name, b.UID, i, replacement) })
	for i, c := range next.Claims {
		if c.Pool || c.Pod == "" || (i < len(before.Claims) && before.Claims[i].Pod == c.Pod) {
			continue
		}
		if _, f := coldTemplate(b, pool, i); f != nil {
			fail = f
			next.Claims[i].Pod = ""
		}
	}
	// Warm pods run already: their addresses go into the same write.
	if refreshed, err := r.batchPods(ctx, b, next); err == nil {
		next = refresh(next, refreshed)
		pods = refreshed
	}
	return next, pods, undo, fail, nil
}

// converge creates the pods the record names, deletes the released ones
// and writes the status; fail (or a failed create) is its condition.
func (r *batchReconciler) converge(ctx context.Context, b *sbv1.BatchSandbox, pool *sbv1.Pool, next record, pods map[string]*corev1.Pod, fail *failure, tasks *taskReport) (reconcile.Result, error) {
	createErr := r.createPods(ctx, b, pool, next, pods)
	delErr := r.deleteReleased(ctx, b, next, pods)
	if fail == nil && createErr != nil {
		fail = &failure{sbv1.ReasonCreateFailed, createErr.Error()}
	}
	res, err := r.writeStatus(ctx, b, next, pods, derefFailure(fail), tasks)
	if err == nil {
		err = errors.Join(createErr, delErr)
	}
	if fail != nil && err == nil {
		// Retry later (the pool may appear, the template may be fixed:
		// both also trigger a reconcile through the watches).
		res.RequeueAfter = 10 * time.Second
	}
	if tasks != nil && tasks.active && err == nil && (res.RequeueAfter == 0 || res.RequeueAfter > taskPoll) {
		res.RequeueAfter = taskPoll
	}
	return res, err
}

func derefFailure(f *failure) failure {
	if f == nil {
		return failure{}
	}
	return *f
}

// needsAllocation: some claim below replicas has no pod (and is not done).
func needsAllocation(rec record, replicas int) bool {
	if len(rec.Claims) < replicas {
		return true
	}
	return slices.ContainsFunc(rec.Claims[:replicas], func(c claim) bool { return c.Pod == "" && !c.Done })
}

// complete: every claim has a pod with an address (or is done).
func complete(rec record, replicas int) bool {
	if len(rec.Claims) < replicas {
		return false
	}
	return !slices.ContainsFunc(rec.Claims, func(c claim) bool { return !c.Done && (c.Pod == "" || c.IP == "") })
}

// onlyAddresses: a and b differ in claim addresses only.
func onlyAddresses(a, b record) bool {
	if len(a.Claims) != len(b.Claims) || !slices.Equal(a.Released, b.Released) {
		return false
	}
	for i := range a.Claims {
		x, y := a.Claims[i], b.Claims[i]
		x.IP, y.IP = "", ""
		if x != y {
			return false
		}
	}
	return true
}

// refresh updates the claims of rec from pods (the cache). A pod that ran
// and is gone (deleted or evicted) is released and its claim emptied, so
// that it gets a new pod; a pod never seen is still being created; an
// ended pod marks its claim done.
func refresh(rec record, pods map[string]*corev1.Pod) record {
	out := rec.clone()
	for i := range out.Claims {
		c := &out.Claims[i]
		if c.Pod == "" || c.Done {
			continue
		}
		p := pods[c.Pod]
		switch {
		case p == nil || p.DeletionTimestamp != nil:
			if c.IP != "" || c.Pool || p != nil {
				out.Released = append(out.Released, c.Pod)
				*c = claim{}
			}
		case podEnded(p):
			c.Done = true
		case podReady(p):
			c.IP = p.Status.PodIP
		}
	}
	return out
}

// recordHas reports whether pod is the pod of a claim of rec.
func recordHas(rec record, pod string) bool {
	return slices.ContainsFunc(rec.Claims, func(c claim) bool { return c.Pod == pod })
}

// recordInTable makes the pool's table give the batch exactly the pool
// pods of its live claims: it adopts those the table does not name yet
// (new picks, and records from before tables existed) and releases the
// extra ones the allocation did not use (they join rec's released pods,
// to be deleted). ok is false when the table gave a picked pod to
// another owner first.
func (r *batchReconciler) recordInTable(ctx context.Context, pool types.NamespacedName, b *sbv1.BatchSandbox, rec *record, extra []string) (bool, error) {
	owner := alloc.BatchOwner(b.Name)
	held, _ := r.tables.Held(pool, owner)
	var want, adopt, release []string
	for _, c := range rec.Claims {
		if c.Pool && c.Pod != "" && !c.Done {
			want = append(want, c.Pod)
			if !slices.Contains(held, c.Pod) {
				adopt = append(adopt, c.Pod)
			}
		}
	}
	for _, p := range extra {
		if !slices.Contains(want, p) {
			release = append(release, p)
		}
	}
	if len(adopt) == 0 && len(release) == 0 {
		return true, nil
	}
	res, err := r.tables.Apply(ctx, pool, alloc.Change{Owner: owner, Adopt: adopt, Release: release})
	if err != nil {
		return false, err
	}
	for _, p := range want {
		if !slices.Contains(res.Held, p) {
			return false, nil
		}
	}
	rec.Released = append(rec.Released, release...)
	return true, nil
}

// freePods returns the pool's running, unallocated pods of the current
// template, from the cache.
func (r *batchReconciler) freePods(ctx context.Context, pool *sbv1.Pool) ([]string, error) {
	var list corev1.PodList
	// Read only, and every pod of the pool: no deep copies.
	if err := r.c.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{
		sbv1.LabelPool:         pool.Name,
		sbv1.LabelPoolRevision: templateHash(pool.Spec.Template, r.opts.AgentImage),
	}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var out []string
	for i := range list.Items {
		p := &list.Items[i]
		if _, named := r.tables.Owner(client.ObjectKeyFromObject(pool), p.Name); named {
			continue // another owner's, or retired
		}
		if podReady(p) && !r.ledger.taken(client.ObjectKeyFromObject(p)) {
			out = append(out, p.Name)
		}
	}
	// A batch from as few table shards as it can: one write each.
	return alloc.ByShard(out, r.tables.ShardCount(client.ObjectKeyFromObject(pool))), nil
}

// batchPods returns the cached pods of rec's claims and released pods, by
// name.
func (r *batchReconciler) batchPods(ctx context.Context, b *sbv1.BatchSandbox, rec record) (map[string]*corev1.Pod, error) {
	want := map[string]bool{}
	anyPool := false
	for _, c := range rec.Claims {
		if c.Pod != "" {
			want[c.Pod] = true
			anyPool = anyPool || c.Pool
		}
	}
	for _, p := range rec.Released {
		want[p] = true
		anyPool = true
	}
	out := map[string]*corev1.Pod{}
	if len(want) == 0 {
		return out, nil
	}
	sels := []client.MatchingLabels{{sbv1.LabelBatch: b.Name}}
	if anyPool && b.Spec.PoolRef != "" {
		sels = append(sels, client.MatchingLabels{sbv1.LabelPool: b.Spec.PoolRef})
	}
	for _, sel := range sels {
		var list corev1.PodList
		if err := r.c.List(ctx, &list, client.InNamespace(b.Namespace), sel); err != nil {
			return nil, err
		}
		for i := range list.Items {
			if p := &list.Items[i]; want[p.Name] {
				out[p.Name] = p
			}
		}
	}
	return out, nil
}

// writeRecord persists rec in the batch's annotations (and the release
// finalizer, for batches made by hand): the write that makes an
// allocation durable. It carries the resourceVersion the allocation was
// computed from, so it fails on a conflict and the caller undoes it.
func (r *batchReconciler) writeRecord(ctx context.Context, b *sbv1.BatchSandbox, rec record, started map[string]string) error {
	if b.Annotations == nil {
		b.Annotations = map[string]string{}
	}
	rec.annotate(b.Annotations)
	if len(started) > 0 {
		all := startedTasks(b)
		for pod, id := range started {
			all[pod] = id
		}
		j, _ := json.Marshal(all)
		b.Annotations[AnnoTasks] = string(j)
	}
	if b.Spec.PoolRef != "" && slices.ContainsFunc(rec.Claims, func(c claim) bool { return c.Pool }) {
		b.Annotations[sbv1.AnnoPoolName] = b.Spec.PoolRef
	}
	controllerutil.AddFinalizer(b, sbv1.FinalizerRelease)
	if err := r.c.Update(ctx, b); err != nil {
		return fmt.Errorf("record allocation of %s: %w", b.Name, err)
	}
	r.noteWrite(b.UID)
	r.noteWritten(b.UID, func(w *writtenState) { w.finalizer = true })
	return nil
}

func (r *batchReconciler) noteWrite(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastWrite == nil {
		r.lastWrite = map[types.UID]time.Time{}
	}
	r.lastWrite[uid] = time.Now()
}

// createPods creates the pods of claims the cache does not show. Creates
// are idempotent: the names are in the record before the create.
func (r *batchReconciler) createPods(ctx context.Context, b *sbv1.BatchSandbox, pool *sbv1.Pool, rec record, pods map[string]*corev1.Pod) error {
	type todo struct {
		i   int
		pod string
	}
	var list []todo
	for i, c := range rec.Claims {
		if !c.Pool && c.Pod != "" && !c.Done && pods[c.Pod] == nil &&
			!r.recentlyCreated(types.NamespacedName{Namespace: b.Namespace, Name: c.Pod}) {
			list = append(list, todo{i, c.Pod})
		}
	}
	if len(list) == 0 {
		return nil
	}
	if err := r.iso.ensure(ctx, b.Namespace); err != nil {
		return err
	}
	owner := metav1.NewControllerRef(b, sbv1.GroupVersion.WithKind("BatchSandbox"))
	return parallel(ctx, len(list), r.opts.CreateConcurrency, func(ctx context.Context, k int) error {
		t, f := coldTemplate(b, pool, list[k].i)
		if f != nil {
			return errors.New(f.msg)
		}
		p := newPod(b.Namespace, list[k].pod, t, r.opts.AgentImage, map[string]string{
			sbv1.LabelBatch: b.Name, sbv1.LabelPodIndex: strconv.Itoa(list[k].i),
		})
		p.OwnerReferences = []metav1.OwnerReference{*owner}
		if err := r.c.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
		r.markCreated(client.ObjectKeyFromObject(p))
		return nil
	})
}

// deleteReleased deletes the released pods the cache still shows live.
func (r *batchReconciler) deleteReleased(ctx context.Context, b *sbv1.BatchSandbox, rec record, pods map[string]*corev1.Pod) error {
	var live []*corev1.Pod
	var fromPool []string
	for _, name := range rec.Released {
		if p := pods[name]; p != nil && p.DeletionTimestamp == nil {
			live = append(live, p)
			if p.Labels[sbv1.LabelPool] != "" {
				fromPool = append(fromPool, name)
			}
		}
	}
	if len(fromPool) > 0 && b.Spec.PoolRef != "" {
		// Retired in the table first, so that no allocator takes them
		// while they go.
		pool := types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.PoolRef}
		if _, err := r.tables.Apply(ctx, pool, alloc.Change{Owner: alloc.BatchOwner(b.Name), Release: fromPool}); err != nil {
			return err
		}
	}
	return parallel(ctx, len(live), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		if err := r.c.Delete(ctx, live[i], client.Preconditions{UID: &live[i].UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete released pod %s: %w", live[i].Name, err)
		}
		return nil
	})
}

// taskPoll is how often the tasks of a batch are looked at while some
// are pending or running.
const taskPoll = time.Second

// statusInterval is the least time between two readiness writes of a
// batch that is not complete yet.
const statusInterval = 250 * time.Millisecond

// untilNextWrite is how long a batch's next readiness write must wait.
func (r *batchReconciler) untilNextWrite(uid types.UID) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	for u, t := range r.lastWrite {
		if time.Since(t) > inflightTTL {
			delete(r.lastWrite, u)
		}
	}
	t, ok := r.lastWrite[uid]
	if !ok {
		return 0
	}
	return statusInterval - time.Since(t)
}

// summarize computes the status of a batch from its record and pods.
func (r *batchReconciler) summarize(b *sbv1.BatchSandbox, rec record, pods map[string]*corev1.Pod, fail failure, tasks *taskReport) sbv1.BatchSandboxStatus {
	replicas := int32(b.GetReplicas())
	st := b.Status.DeepCopy()
	st.ObservedGeneration = b.Generation
	st.Replicas, st.Allocated, st.Ready = 0, 0, 0
	ended, done := 0, 0
	why := "" // how the first pod that ended by itself ended
	for _, c := range rec.Claims {
		if c.Pod == "" {
			continue
		}
		if c.Done {
			// Ended by itself (PodFailed), or released after its task.
			done++
			if !slices.Contains(rec.Released, c.Pod) {
				ended++
				if p := pods[c.Pod]; why == "" && p != nil {
					why = r.endReason(p)
				}
			}
			continue
		}
		st.Replicas++
		p := pods[c.Pod]
		if c.Pool || (p != nil && p.Spec.NodeName != "") {
			st.Allocated++
		}
		if c.IP != "" && p != nil && podReady(p) {
			st.Ready++
		}
	}
	st.TaskRunning, st.TaskSucceed, st.TaskFailed, st.TaskUnknown, st.TaskPending = 0, 0, 0, 0, 0
	if tasks != nil {
		c := tasks.counts
		st.TaskPending, st.TaskRunning, st.TaskSucceed, st.TaskFailed, st.TaskUnknown =
			c[taskPending], c[taskRunning], c[taskSucceeded], c[taskFailed], c[taskUnknown]
		if tasks.lastErr != "" {
			st.TaskLastErrorMessage = tasks.lastErr
		}
	}
	now := metav1.Now()
	switch {
	case fail.reason != "":
		st.Phase = sbv1.PhaseFailed
		setCondition(st, sbv1.ConditionReady, false, fail.reason, fail.msg, now)
	case st.Ready+int32(done) == replicas:
		st.Phase = sbv1.PhaseSucceed
		setCondition(st, sbv1.ConditionReady, true, sbv1.ReasonAllReady, fmt.Sprintf("%d of %d sandboxes ready", st.Ready, replicas), now)
	default:
		st.Phase = sbv1.PhasePending
		msg := fmt.Sprintf("%d of %d sandboxes ready", st.Ready, replicas)
		if why := waitingFor(rec, pods); why != "" {
			msg += "; " + why
		}
		setCondition(st, sbv1.ConditionReady, false, sbv1.ReasonPodsStarting, msg, now)
	}
	if ended > 0 {
		msg := fmt.Sprintf("%d sandbox pods ended", ended)
		if why != "" {
			msg += "; " + why
		}
		setCondition(st, sbv1.ConditionPodFailed, true, sbv1.ReasonPodsFailed, msg, now)
	} else {
		removeCondition(st, sbv1.ConditionPodFailed)
	}
	return *st
}

// waitingFor says why the first claim that is not ready waits: its pod
// is unschedulable (pool or node exhausted: say so, not just time out), or
// a container is waiting (image pull, crash loop).
func waitingFor(rec record, pods map[string]*corev1.Pod) string {
	for _, c := range rec.Claims {
		p := pods[c.Pod]
		if c.Done || p == nil || podReady(p) {
			continue
		}
		for _, cd := range p.Status.Conditions {
			if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse && cd.Message != "" {
				return fmt.Sprintf("pod %s: %s", p.Name, cd.Message)
			}
		}
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" && w.Reason != "ContainerCreating" {
				return fmt.Sprintf("pod %s: container %s: %s %s", p.Name, cs.Name, w.Reason, w.Message)
			}
		}
	}
	return ""
}

// setCondition sets a condition, keeping its transition time when its
// status does not change.
func setCondition(st *sbv1.BatchSandboxStatus, t sbv1.BatchSandboxConditionType, ok bool, reason, msg string, now metav1.Time) {
	status := "False"
	if ok {
		status = "True"
	}
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != status {
			c.LastTransitionTime = &now
		}
		c.Status, c.Reason, c.Message = status, reason, msg
		return
	}
	st.Conditions = append(st.Conditions, sbv1.BatchSandboxCondition{Type: t, Status: status, Reason: reason, Message: msg, LastTransitionTime: &now})
}

func removeCondition(st *sbv1.BatchSandboxStatus, t sbv1.BatchSandboxConditionType) {
	st.Conditions = slices.DeleteFunc(st.Conditions, func(c sbv1.BatchSandboxCondition) bool { return c.Type == t })
}

// writeStatus writes the batch's status if it changed, and asks for the
// expiry reconcile.
func (r *batchReconciler) writeStatus(ctx context.Context, b *sbv1.BatchSandbox, rec record, pods map[string]*corev1.Pod, fail failure, tasks *taskReport) (reconcile.Result, error) {
	again := r.findEnds(ctx, rec, pods)
	st := r.summarize(b, rec, pods, fail, tasks)
	active := activePods(rec, pods)
	plan := planPause(b, &st, active, metav1.Now(), r.opts.PauseTimeout)
	if plan.want != nil {
		if err := r.writeWishes(ctx, active, *plan.want); err != nil {
			return reconcile.Result{}, err
		}
	}
	last, wrote := r.lastWritten(b.UID)
	if !statusEqual(st, b.Status) && !(wrote && statusEqual(st, last.status)) {
		b.Status = st
		if err := r.c.Status().Update(ctx, b); err != nil {
			if apierrors.IsConflict(err) {
				// A stale cache: the next event brings the fresh copy.
				return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
			}
			return reconcile.Result{}, err
		}
		r.noteWritten(b.UID, func(w *writtenState) { w.status = st })
		if plan.failed != "" && r.events != nil {
			r.events.Eventf(b, nil, corev1.EventTypeWarning, eventPauseFailed(b), "Pause", "%s", plan.failed)
		}
	}
	if plan.requeue > 0 {
		return reconcile.Result{RequeueAfter: plan.requeue}, nil
	}
	if again {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if b.Spec.ExpireTime != nil {
		return reconcile.Result{RequeueAfter: time.Until(b.Spec.ExpireTime.Time) + 10*time.Millisecond}, nil
	}
	return reconcile.Result{}, nil
}

// statusEqual compares two statuses, ignoring condition times.
func statusEqual(a, b sbv1.BatchSandboxStatus) bool {
	strip := func(s sbv1.BatchSandboxStatus) string {
		s.Conditions = slices.Clone(s.Conditions)
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = nil
		}
		j, _ := json.Marshal(s)
		return string(j)
	}
	return strip(a) == strip(b)
}

// releaseAll deletes a batch's pods: its created pods with one collection
// delete, its pool pods one by one (pool pods carry no batch label, which
// would have cost a write per pod at allocation).
func (r *batchReconciler) releaseAll(ctx context.Context, key types.NamespacedName, poolRef string) error {
	// Retire the batch's pool pods in every table that gives it some
	// (the batch, and so its poolRef, may be gone), before they go.
	owner := alloc.BatchOwner(key.Name)
	var pool []string
	for _, h := range r.tables.Holdings(key.Namespace, func(o string) bool { return o == owner }) {
		if _, err := r.tables.Apply(ctx, h.Pool, alloc.Change{Owner: owner, ReleaseAll: true}); err != nil {
			return err
		}
		pool = append(pool, h.Pods...)
	}
	rec, ok := r.ledger.get(key)
	if !ok && len(pool) == 0 {
		// Never allocated, or released already by this process (pods
		// are created only after the record is written).
		return nil
	}
	r.tasks.forget(key.Namespace, rec)
	var errs []error
	err := r.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(key.Namespace),
		client.MatchingLabels{sbv1.LabelBatch: key.Name, sbv1.LabelManaged: sbv1.ManagedBy})
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete pods of %s: %w", key.Name, err))
	}
	for _, c := range rec.Claims {
		if c.Pool && c.Pod != "" && !slices.Contains(pool, c.Pod) {
			pool = append(pool, c.Pod)
		}
	}
	if err := parallel(ctx, len(pool), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: pool[i]}}
		if err := r.c.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", pool[i], err)
		}
		return nil
	}); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	r.ledger.release(key)
	r.pokePool(key.Namespace, poolRef)
	return nil
}

// pokePool wakes the pool controller for a pool whose allocation changed
// (pool pods carry no per-batch label, so no pod event would).
func (r *batchReconciler) pokePool(ns, pool string) { pokePool(r.poke, ns, pool) }

func pokePool(poke chan<- event.GenericEvent, ns, pool string) {
	if pool == "" {
		return
	}
	select {
	case poke <- event.GenericEvent{Object: &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool}}}:
	default: // the pool resyncs on its next pod event
	}
}
