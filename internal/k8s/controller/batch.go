package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// batchReconciler serves BatchSandboxes. A new batch is allocated in one
// step under the ledger's lock: free, running pool pods for as many claims
// as the pool can serve, cold pods for the rest. The whole allocation is
// then recorded with a single status write; only cold pods cost a create
// each. Later reconciles only refresh readiness (one status write when
// something changed).
type batchReconciler struct {
	c      client.Client
	api    client.Reader
	ledger *ledger
	opts   Options
	// poke tells the pool controller that allocation changed.
	poke chan<- event.GenericEvent

	mu sync.Mutex
	// created are cold pods created but maybe not yet in the cache.
	created map[types.NamespacedName]time.Time
	// lastWrite is when each batch's status was last written.
	lastWrite map[types.UID]time.Time
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
	var b sbv1.BatchSandbox
	if err := r.c.Get(ctx, req.NamespacedName, &b); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Deleted without our finalizer: release what the ledger knows.
		if _, ok := r.ledger.claims(req.NamespacedName); ok {
			return reconcile.Result{}, r.release(ctx, req.NamespacedName, "")
		}
		return reconcile.Result{}, nil
	}
	key := req.NamespacedName
	if b.DeletionTimestamp != nil {
		if err := r.release(ctx, key, b.Spec.PoolRef); err != nil {
			return reconcile.Result{}, err
		}
		if controllerutil.RemoveFinalizer(&b, sbv1.FinalizerRelease) {
			return reconcile.Result{}, client.IgnoreNotFound(r.c.Update(ctx, &b))
		}
		return reconcile.Result{}, nil
	}
	if b.Spec.ExpireTime != nil {
		if left := time.Until(b.Spec.ExpireTime.Time); left <= 0 {
			return reconcile.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, &b))
		}
	}
	if controllerutil.AddFinalizer(&b, sbv1.FinalizerRelease) {
		// The kubernetes runtime sets the finalizer at creation, so this
		// write is only for batches made by hand.
		if err := r.c.Update(ctx, &b); err != nil {
			return reconcile.Result{}, err
		}
	}
	if b.Spec.Stopped {
		return r.stop(ctx, &b)
	}

	claims, ok := r.ledger.claims(key)
	if !ok && len(b.Status.Sandboxes) > 0 {
		// Recorded by an earlier process but not in the ledger (it was
		// loaded before): adopt it.
		claims, ok = b.Status.Sandboxes, true
		r.ledger.mu.Lock()
		r.ledger.recordLocked(key, claims)
		r.ledger.mu.Unlock()
	}
	if !ok {
		return r.allocate(ctx, &b)
	}
	return r.sync(ctx, &b, claims)
}

// coldTemplate is the template of the batch's cold pods.
func (r *batchReconciler) coldTemplate(b *sbv1.BatchSandbox, pool *sbv1.Pool) (sbv1.SandboxTemplate, bool) {
	if b.Spec.Template != nil {
		return *b.Spec.Template, true
	}
	if pool != nil {
		return pool.Spec.Template, true
	}
	return sbv1.SandboxTemplate{}, false
}

func patchOf(b *sbv1.BatchSandbox, i int32) sbv1.SandboxPatch {
	if int(i) < len(b.Spec.Patches) {
		return b.Spec.Patches[i]
	}
	return sbv1.SandboxPatch{}
}

func (r *batchReconciler) allocate(ctx context.Context, b *sbv1.BatchSandbox) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(b)
	var pool *sbv1.Pool
	var free []string
	if b.Spec.PoolRef != "" {
		pool = &sbv1.Pool{}
		err := r.c.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.PoolRef}, pool)
		switch {
		case apierrors.IsNotFound(err):
			pool = nil
		case err != nil:
			return reconcile.Result{}, err
		default:
			if free, err = r.freePods(ctx, pool); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	if _, ok := r.coldTemplate(b, pool); !ok && len(free) < int(b.Spec.Replicas) {
		return r.fail(ctx, b, fmt.Sprintf("pool %q not found and no template", b.Spec.PoolRef))
	}
	claims, undo, fresh := r.ledger.allocate(key, b.Spec.Replicas, free,
		func(i int32) bool { return pool != nil && len(patchOf(b, i).Env) == 0 },
		func(i int32) sbv1.SandboxStatus {
			return sbv1.SandboxStatus{Index: i, Pod: coldPodName(b.Name, b.UID, i), Source: sbv1.SourceCold}
		},
		func(i int32, pod string) sbv1.SandboxStatus {
			return sbv1.SandboxStatus{Index: i, Pod: pod, Source: sbv1.SourcePool}
		})
	if !fresh {
		return r.sync(ctx, b, claims)
	}
	// Fill in the addresses of the warm pods from the cache, so the one
	// status write already reports them ready.
	pods, err := r.batchPods(ctx, b, claims)
	if err != nil {
		undo()
		return reconcile.Result{}, err
	}
	claims, _ = refresh(claims, pods)
	if err := r.writeStatus(ctx, b, claims); err != nil {
		undo()
		return reconcile.Result{}, err
	}
	r.ledger.update(key, claims)
	r.pokePool(b.Namespace, b.Spec.PoolRef)
	if err := r.createCold(ctx, b, pool, claims, pods); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// freePods returns the pool's running, unallocated pods of the current
// template, from the cache.
func (r *batchReconciler) freePods(ctx context.Context, pool *sbv1.Pool) ([]string, error) {
	var list corev1.PodList
	if err := r.c.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{
		sbv1.LabelPool:         pool.Name,
		sbv1.LabelTemplateHash: templateHash(pool.Spec.Template, r.opts.AgentImage),
	}); err != nil {
		return nil, err
	}
	var out []string
	for i := range list.Items {
		p := &list.Items[i]
		if podReady(p) && !r.ledger.allocated(client.ObjectKeyFromObject(p)) {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// batchPods returns the cached pods of claims, by name.
func (r *batchReconciler) batchPods(ctx context.Context, b *sbv1.BatchSandbox, claims []sbv1.SandboxStatus) (map[string]*corev1.Pod, error) {
	out := map[string]*corev1.Pod{}
	want := map[string]bool{}
	pools := map[bool]bool{}
	for _, c := range claims {
		want[c.Pod] = true
		pools[c.Source == sbv1.SourcePool] = true
	}
	lists := []client.MatchingLabels{}
	if pools[false] {
		lists = append(lists, client.MatchingLabels{sbv1.LabelBatch: b.Name})
	}
	if pools[true] && b.Spec.PoolRef != "" {
		lists = append(lists, client.MatchingLabels{sbv1.LabelPool: b.Spec.PoolRef})
	}
	for _, sel := range lists {
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

// refresh updates readiness and addresses of claims from pods and reports
// whether anything changed. A claim whose pod was running and is absent
// from pods is gone; one never seen is still being created.
func refresh(claims []sbv1.SandboxStatus, pods map[string]*corev1.Pod) ([]sbv1.SandboxStatus, bool) {
	changed := false
	out := slices.Clone(claims)
	for i := range out {
		c := &out[i]
		if c.Gone {
			continue
		}
		p, ok := pods[c.Pod]
		if !ok {
			if c.Ready {
				// It ran and vanished (deleted or evicted): never re-create
				// a sandbox, its state is lost.
				c.Ready, c.IP, c.Gone = false, "", true
				changed = true
			}
			continue
		}
		ready, ip := podReady(p), p.Status.PodIP
		if podDone(p) {
			ready, ip = false, ""
			c.Gone = true
			changed = true
		}
		if ready != c.Ready || ip != c.IP {
			c.Ready, c.IP = ready, ip
			changed = true
		}
	}
	return out, changed
}

// sync refreshes a recorded batch: creates missing cold pods and writes
// the status if readiness changed.
func (r *batchReconciler) sync(ctx context.Context, b *sbv1.BatchSandbox, claims []sbv1.SandboxStatus) (reconcile.Result, error) {
	pods, err := r.batchPods(ctx, b, claims)
	if err != nil {
		return reconcile.Result{}, err
	}
	var pool *sbv1.Pool
	if b.Spec.PoolRef != "" {
		p := &sbv1.Pool{}
		if err := r.c.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Spec.PoolRef}, p); err == nil {
			pool = p
		}
	}
	createErr := r.createCold(ctx, b, pool, claims, pods)
	claims, changed := refresh(claims, pods)
	// The ledger holds what was last written; the cached status may lag
	// behind it, and writing from a stale copy would only conflict.
	if changed {
		// Readiness of a cold batch trickles in pod by pod: coalesce it
		// into at most one write per statusInterval until all are ready.
		if wait := r.untilNextWrite(b.UID); wait > 0 && summarize(b, claims).Phase != sbv1.BatchRunning && createErr == nil {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		if err := r.writeStatus(ctx, b, claims); err != nil {
			return reconcile.Result{}, err
		}
		r.ledger.update(client.ObjectKeyFromObject(b), claims)
	}
	if createErr != nil {
		// Surface why (e.g. a rejected pod spec) and retry with backoff.
		if msg := createErr.Error(); b.Status.Message != msg {
			b.Status = summarize(b, claims)
			b.Status.Message = msg
			_ = r.c.Status().Update(ctx, b)
		}
		return reconcile.Result{}, createErr
	}
	return r.expiry(b), nil
}

func (r *batchReconciler) expiry(b *sbv1.BatchSandbox) reconcile.Result {
	if b.Spec.ExpireTime != nil {
		return reconcile.Result{RequeueAfter: time.Until(b.Spec.ExpireTime.Time) + 10*time.Millisecond}
	}
	return reconcile.Result{}
}

// createCold creates the cold pods of claims the cache does not show.
// Creates are idempotent: the names are deterministic.
func (r *batchReconciler) createCold(ctx context.Context, b *sbv1.BatchSandbox, pool *sbv1.Pool, claims []sbv1.SandboxStatus, pods map[string]*corev1.Pod) error {
	var todo []sbv1.SandboxStatus
	for _, c := range claims {
		if c.Source == sbv1.SourceCold && !c.Gone && pods[c.Pod] == nil &&
			!r.recentlyCreated(types.NamespacedName{Namespace: b.Namespace, Name: c.Pod}) {
			todo = append(todo, c)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	t, ok := r.coldTemplate(b, pool)
	if !ok {
		return fmt.Errorf("batch %s: no template for cold pods", b.Name)
	}
	owner := metav1.NewControllerRef(b, sbv1.GroupVersion.WithKind("BatchSandbox"))
	return parallel(ctx, len(todo), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		c := todo[i]
		patch := patchOf(b, c.Index)
		p := newPod(b.Namespace, c.Pod, t, r.opts.AgentImage, patch.Env,
			mergeLabels(patch.Labels, map[string]string{sbv1.LabelBatch: b.Name}), patch.Annotations)
		p.OwnerReferences = []metav1.OwnerReference{*owner}
		if err := r.c.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
		r.markCreated(client.ObjectKeyFromObject(p))
		return nil
	})
}

func mergeLabels(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// summarize computes the status of claims.
func summarize(b *sbv1.BatchSandbox, claims []sbv1.SandboxStatus) sbv1.BatchSandboxStatus {
	st := sbv1.BatchSandboxStatus{ObservedGeneration: b.Generation, Sandboxes: claims, Phase: sbv1.BatchPending}
	for _, c := range claims {
		if !c.Gone {
			st.Allocated++
		}
		if c.Ready {
			st.Ready++
		}
	}
	if st.Ready == b.Spec.Replicas {
		st.Phase = sbv1.BatchRunning
	}
	return st
}

// writeStatus records claims as the batch's status: the one write that
// makes an allocation durable. It fails on a conflict (stale cache), so
// the caller can undo the allocation and retry.
func (r *batchReconciler) writeStatus(ctx context.Context, b *sbv1.BatchSandbox, claims []sbv1.SandboxStatus) error {
	b.Status = summarize(b, claims)
	if err := r.c.Status().Update(ctx, b); err != nil {
		return err
	}
	r.mu.Lock()
	if r.lastWrite == nil {
		r.lastWrite = map[types.UID]time.Time{}
	}
	r.lastWrite[b.UID] = time.Now()
	r.mu.Unlock()
	return nil
}

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

func (r *batchReconciler) fail(ctx context.Context, b *sbv1.BatchSandbox, msg string) (reconcile.Result, error) {
	if b.Status.Phase == sbv1.BatchFailed && b.Status.Message == msg {
		return reconcile.Result{RequeueAfter: 10 * time.Second}, nil
	}
	b.Status.Phase, b.Status.Message, b.Status.ObservedGeneration = sbv1.BatchFailed, msg, b.Generation
	if err := r.c.Status().Update(ctx, b); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: 10 * time.Second}, nil
}

// stop releases the batch's pods and records it as stopped.
func (r *batchReconciler) stop(ctx context.Context, b *sbv1.BatchSandbox) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(b)
	if _, ok := r.ledger.claims(key); ok || len(b.Status.Sandboxes) > 0 {
		if !ok {
			r.ledger.mu.Lock()
			r.ledger.recordLocked(key, b.Status.Sandboxes)
			r.ledger.mu.Unlock()
		}
		if err := r.release(ctx, key, b.Spec.PoolRef); err != nil {
			return reconcile.Result{}, err
		}
	}
	if b.Status.Phase == sbv1.BatchStopped && len(b.Status.Sandboxes) == 0 {
		return r.expiry(b), nil
	}
	b.Status = sbv1.BatchSandboxStatus{ObservedGeneration: b.Generation, Phase: sbv1.BatchStopped}
	if err := r.c.Status().Update(ctx, b); err != nil {
		return reconcile.Result{}, err
	}
	return r.expiry(b), nil
}

// release deletes the batch's pods: its cold pods with one collection
// delete, its pool pods one by one (pool pods carry no batch label, which
// would have cost a write per pod at allocation).
func (r *batchReconciler) release(ctx context.Context, key types.NamespacedName, poolRef string) error {
	claims, _ := r.ledger.claims(key)
	var errs []error
	if slices.ContainsFunc(claims, func(c sbv1.SandboxStatus) bool { return c.Source == sbv1.SourceCold }) {
		err := r.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(key.Namespace),
			client.MatchingLabels{sbv1.LabelBatch: key.Name, LabelManaged: "true"})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete cold pods of %s: %w", key.Name, err))
		}
	}
	var pool []string
	for _, c := range claims {
		if c.Source == sbv1.SourcePool && !c.Gone {
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
func (r *batchReconciler) pokePool(ns, pool string) {
	if pool == "" {
		return
	}
	select {
	case r.poke <- event.GenericEvent{Object: &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool}}}:
	default: // the pool resyncs on its next pod event
	}
}
