package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// poolReconciler keeps each Pool at its size: it creates pods up to
// max(min, allocated+buffer) (capped by max) and deletes free pods beyond
// that, or whose template is stale.
type poolReconciler struct {
	c      client.Client
	ledger *ledger
	api    client.Reader
	opts   Options

	mu sync.Mutex
	// inflight are pods created but not yet seen in the cache, per pool,
	// so a lagging cache does not make the pool create them again.
	inflight map[types.NamespacedName]map[string]time.Time
	// lastStatus is the status this process last wrote, per pool.
	lastStatus map[types.UID]sbv1.PoolStatus
}

// inflightTTL bounds how long a created pod counts as pending without
// showing up in the cache.
const inflightTTL = time.Minute

func (r *poolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lg := log.FromContext(ctx)
	if err := r.ledger.load(ctx, r.api); err != nil {
		return reconcile.Result{}, err
	}
	var pool sbv1.Pool
	if err := r.c.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.deleteFree(ctx, req.NamespacedName, nil)
		}
		return reconcile.Result{}, err
	}
	if pool.DeletionTimestamp != nil {
		if err := r.deleteFree(ctx, req.NamespacedName, nil); err != nil {
			return reconcile.Result{}, err
		}
		if controllerutil.RemoveFinalizer(&pool, sbv1.FinalizerRelease) {
			return reconcile.Result{}, client.IgnoreNotFound(r.c.Update(ctx, &pool))
		}
		return reconcile.Result{}, nil
	}
	if controllerutil.AddFinalizer(&pool, sbv1.FinalizerRelease) {
		if err := r.c.Update(ctx, &pool); err != nil {
			return reconcile.Result{}, err
		}
	}

	pods, err := r.poolPods(ctx, req.NamespacedName)
	if err != nil {
		return reconcile.Result{}, err
	}
	hash := templateHash(pool.Spec.Template, r.opts.AgentImage)
	seen := map[string]bool{}
	var free, pending, stale []*corev1.Pod
	allocated := 0
	for _, p := range pods {
		seen[p.Name] = true
		key := client.ObjectKeyFromObject(p)
		switch {
		case p.DeletionTimestamp != nil:
		case r.ledger.allocated(key):
			if _, taken := r.ledger.owner(key); taken {
				allocated++
			}
		case podDone(p) || p.Labels[sbv1.LabelTemplateHash] != hash:
			stale = append(stale, p)
		case podReady(p):
			free = append(free, p)
		default:
			pending = append(pending, p)
		}
	}
	inflight := r.pending(req.NamespacedName, seen)

	want := max(int(pool.Spec.Min), allocated+int(pool.Spec.Buffer))
	if pool.Spec.Max > 0 {
		want = min(want, int(pool.Spec.Max))
	}
	have := allocated + len(free) + len(pending) + inflight
	var errs []error
	if err := r.deletePods(ctx, stale); err != nil {
		errs = append(errs, err)
	}
	switch {
	case have < want:
		if err := r.create(ctx, &pool, hash, want-have); err != nil {
			errs = append(errs, err)
		}
	case have > want && inflight == 0:
		// Shrink: pending pods first, then free ones.
		extra := have - want
		victims := append(pending, free...)
		if extra < len(victims) {
			victims = victims[:extra]
		}
		if err := r.deletePods(ctx, victims); err != nil {
			errs = append(errs, err)
		}
	}

	st := sbv1.PoolStatus{
		ObservedGeneration: pool.Generation,
		Total:              int32(allocated + len(free) + len(pending)),
		Free:               int32(len(free)),
		Allocated:          int32(allocated),
		Pending:            int32(len(pending) + inflight),
	}
	r.mu.Lock()
	last, wrote := r.lastStatus[pool.UID]
	r.mu.Unlock()
	// Compare with what this process last wrote too: the cached pool may
	// not show it yet, and a write from that stale copy would conflict.
	if st != pool.Status && (!wrote || st != last) {
		pool.Status = st
		switch err := r.c.Status().Update(ctx, &pool); {
		case err == nil:
			r.mu.Lock()
			if r.lastStatus == nil {
				r.lastStatus = map[types.UID]sbv1.PoolStatus{}
			}
			r.lastStatus[pool.UID] = st
			r.mu.Unlock()
		case apierrors.IsConflict(err):
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		default:
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		lg.Error(errs[0], "pool reconcile", "errors", len(errs))
		return reconcile.Result{}, errs[0]
	}
	if inflight > 0 {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// poolPods lists the pool's pods from the cache and settles the ledger's
// deleted set against it.
func (r *poolReconciler) poolPods(ctx context.Context, pool types.NamespacedName) ([]*corev1.Pod, error) {
	var list corev1.PodList
	if err := r.c.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{sbv1.LabelPool: pool.Name}); err != nil {
		return nil, err
	}
	live := map[types.NamespacedName]bool{}
	out := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
		if out[i].DeletionTimestamp == nil {
			live[client.ObjectKeyFromObject(out[i])] = true
		}
	}
	r.ledger.settle(func(p types.NamespacedName) bool {
		return p.Namespace != pool.Namespace || live[p]
	}, 5*time.Minute)
	return out, nil
}

// pending drops inflight pods the cache has seen and returns how many are
// still expected.
func (r *poolReconciler) pending(pool types.NamespacedName, seen map[string]bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.inflight[pool]
	for name, t := range m {
		if seen[name] || time.Since(t) > inflightTTL {
			delete(m, name)
		}
	}
	return len(m)
}

func (r *poolReconciler) create(ctx context.Context, pool *sbv1.Pool, hash string, n int) error {
	key := client.ObjectKeyFromObject(pool)
	pods := make([]*corev1.Pod, n)
	r.mu.Lock()
	if r.inflight == nil {
		r.inflight = map[types.NamespacedName]map[string]time.Time{}
	}
	if r.inflight[key] == nil {
		r.inflight[key] = map[string]time.Time{}
	}
	for i := range pods {
		pods[i] = newPod(pool.Namespace, podName(pool.Name, randomSuffix(8)), pool.Spec.Template, r.opts.AgentImage, nil,
			map[string]string{sbv1.LabelPool: pool.Name, sbv1.LabelTemplateHash: hash}, nil)
		r.inflight[key][pods[i].Name] = time.Now()
	}
	r.mu.Unlock()
	return parallel(ctx, len(pods), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		err := r.c.Create(ctx, pods[i])
		if err != nil {
			r.mu.Lock()
			delete(r.inflight[key], pods[i].Name)
			r.mu.Unlock()
			return fmt.Errorf("create pool pod %s: %w", pods[i].Name, err)
		}
		return nil
	})
}

// deletePods deletes free pool pods, marking them gone first so that no
// batch takes them meanwhile.
func (r *poolReconciler) deletePods(ctx context.Context, pods []*corev1.Pod) error {
	var mine []*corev1.Pod
	for _, p := range pods {
		if r.ledger.markGone(client.ObjectKeyFromObject(p)) {
			mine = append(mine, p)
		}
	}
	return parallel(ctx, len(mine), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		if err := r.c.Delete(ctx, mine[i]); err != nil && !apierrors.IsNotFound(err) {
			r.ledger.unmarkGone(client.ObjectKeyFromObject(mine[i]))
			return fmt.Errorf("delete pool pod %s: %w", mine[i].Name, err)
		}
		return nil
	})
}

// deleteFree deletes every unallocated pod of a deleted pool; allocated
// ones stay with their batch until it releases them.
func (r *poolReconciler) deleteFree(ctx context.Context, pool types.NamespacedName, _ *sbv1.Pool) error {
	pods, err := r.poolPods(ctx, pool)
	if err != nil {
		return err
	}
	var free []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil && !r.ledger.allocated(client.ObjectKeyFromObject(p)) {
			free = append(free, p)
		}
	}
	return r.deletePods(ctx, free)
}

// parallel runs fn(0..n-1) with at most conc at once and returns the first error.
func parallel(ctx context.Context, n, conc int, fn func(context.Context, int) error) error {
	if conc < 1 {
		conc = 1
	}
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}
