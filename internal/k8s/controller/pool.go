package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
)

// poolReconciler keeps each Pool at its size (see poolTarget): it creates
// pods up to the target and deletes free pods beyond it, or whose template
// is stale. A template that cannot make a pod sets Ready=False with the
// reason instead.
type poolReconciler struct {
	c      client.Client
	ledger *ledger
	// tables are the pools' allocation tables, shared with moat servers:
	// a pod they name belongs to a claim (or is retired).
	tables *alloc.Allocator
	api    client.Reader
	opts   Options
	// iso keeps the namespaces' isolation policy (isolation.go).
	iso *isolator

	mu sync.Mutex
	// inflight are pods created but not yet seen in the cache, per pool,
	// so a lagging cache does not make the pool create them again.
	inflight map[types.NamespacedName]map[string]time.Time
	// lastStatus is the status this process last wrote, per pool, and
	// lastStatusAt when.
	lastStatus   map[types.UID]sbv1.PoolStatus
	lastStatusAt map[types.UID]time.Time
}

// inflightTTL bounds how long a created pod counts as pending without
// showing up in the cache.
const inflightTTL = time.Minute

func (r *poolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if err := r.ledger.load(ctx, r.api); err != nil {
		return reconcile.Result{}, err
	}
	pool, err := r.prepare(ctx, req.NamespacedName)
	if err != nil || pool == nil {
		return reconcile.Result{}, err
	}
	pods, err := r.poolPods(ctx, req.NamespacedName)
	if err != nil {
		return reconcile.Result{}, err
	}
	terr := checkTemplate(pool.Spec.Template)
	hash := templateHash(pool.Spec.Template, r.opts.AgentImage)
	c := r.census(req.NamespacedName, pods, hash)
	c.inflight = r.pending(req.NamespacedName, c.seen)
	errs := r.resize(ctx, pool, hash, terr, c)
	st := poolStatus(pool, hash, c, terr, errs)
	if !poolStatusEqual(st, pool.Status) {
		res, err := r.writeStatus(ctx, pool, st, c, errs)
		if err != nil {
			errs = append(errs, err)
		} else if res != nil {
			return *res, nil
		}
	}
	if len(errs) > 0 {
		log.FromContext(ctx).Error(errs[0], "pool reconcile", "errors", len(errs))
		return reconcile.Result{}, errs[0]
	}
	if c.inflight > 0 {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// prepare reads the pool and keeps its finalizer and allocation table. A
// nil pool (with a nil error) means there is nothing more to do: the pool
// is gone or going, and its free pods were deleted.
func (r *poolReconciler) prepare(ctx context.Context, key types.NamespacedName) (*sbv1.Pool, error) {
	var pool sbv1.Pool
	if err := r.c.Get(ctx, key, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			if err := r.deleteFree(ctx, key); err != nil {
				return nil, err
			}
			return nil, r.dropTables(ctx, key)
		}
		return nil, err
	}
	if pool.DeletionTimestamp != nil {
		if err := r.deleteFree(ctx, key); err != nil {
			return nil, err
		}
		if controllerutil.RemoveFinalizer(&pool, sbv1.FinalizerRelease) {
			return nil, client.IgnoreNotFound(r.c.Update(ctx, &pool))
		}
		return nil, nil
	}
	if controllerutil.AddFinalizer(&pool, sbv1.FinalizerRelease) {
		if err := r.c.Update(ctx, &pool); err != nil {
			return nil, err
		}
	}
	// The allocation table is made with the pool: a warm batch then
	// updates it (one write) instead of creating it on delivery.
	if err := r.tables.Ensure(ctx, key); err != nil {
		return nil, err
	}
	return &pool, nil
}

// poolCensus sorts a pool's pods by what the reconcile does with them.
type poolCensus struct {
	free, pending, stale, retired []*corev1.Pod
	allocated, updated            int
	inflight                      int // creates in flight (not listed yet)
	seen                          map[string]bool
}

// have is the pods the pool has or is getting, allocated or not.
func (c poolCensus) have() int { return c.allocated + len(c.free) + len(c.pending) + c.inflight }

// census sorts pods (the pool's, revision hash current) through the
// ledger and the allocation table.
func (r *poolReconciler) census(key types.NamespacedName, pods []*corev1.Pod, hash string) poolCensus {
	c := poolCensus{seen: map[string]bool{}}
	for _, p := range pods {
		c.seen[p.Name] = true
		pk := client.ObjectKeyFromObject(p)
		if p.DeletionTimestamp == nil && p.Labels[sbv1.LabelPoolRevision] == hash {
			c.updated++
		}
		owner, named := r.tables.Owner(key, p.Name)
		switch {
		case p.DeletionTimestamp != nil:
		case r.ledger.taken(pk):
			if _, ok := r.ledger.owner(pk); ok {
				c.allocated++
			}
		case named:
			// Claimed through a moat server's Lifecycle API (or a batch
			// this process has not loaded yet); "" is retired: released
			// by its owner, whose delete may have failed.
			if owner != "" {
				c.allocated++
			} else {
				c.retired = append(c.retired, p)
			}
		case podEnded(p) || p.Labels[sbv1.LabelPoolRevision] != hash:
			c.stale = append(c.stale, p)
		case podReady(p):
			c.free = append(c.free, p)
		default:
			c.pending = append(c.pending, p)
		}
	}
	return c
}

// resize deletes the stale and retired pods and creates or deletes pods
// towards the pool's target (none created while the template is invalid,
// terr).
func (r *poolReconciler) resize(ctx context.Context, pool *sbv1.Pool, hash string, terr error, c poolCensus) []error {
	key := client.ObjectKeyFromObject(pool)
	want := poolTarget(pool.Spec.CapacitySpec, c.allocated, len(c.free)+len(c.pending)+c.inflight)
	have := c.have()
	var errs []error
	if err := r.deletePods(ctx, key, c.stale); err != nil {
		errs = append(errs, err)
	}
	if err := parallel(ctx, len(c.retired), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		return client.IgnoreNotFound(r.c.Delete(ctx, c.retired[i]))
	}); err != nil {
		errs = append(errs, err)
	}
	switch {
	case terr != nil:
		// Nothing to create from; the condition says why.
	case have < want:
		if err := r.create(ctx, pool, hash, want-have); err != nil {
			errs = append(errs, err)
		}
	case have > want && c.inflight == 0:
		// Shrink: pending pods first, then free ones.
		extra := have - want
		victims := append(c.pending, c.free...)
		if extra < len(victims) {
			victims = victims[:extra]
		}
		if err := r.deletePods(ctx, key, victims); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// poolStatus is the status the pool's census gives, with its Ready
// condition (readyCondition).
func poolStatus(pool *sbv1.Pool, hash string, c poolCensus, terr error, errs []error) sbv1.PoolStatus {
	st := sbv1.PoolStatus{
		ObservedGeneration: pool.Generation,
		Revision:           hash,
		Total:              int32(c.allocated + len(c.free) + len(c.pending)),
		Allocated:          int32(c.allocated),
		Available:          int32(len(c.free)),
		Updated:            int32(c.updated),
		Conditions:         slices.Clone(pool.Status.Conditions),
	}
	meta.SetStatusCondition(&st.Conditions, readyCondition(pool.Generation, c, terr, errs))
	return st
}

// readyCondition: Ready is true while the pool serves; false with
// InvalidTemplate when its template is invalid, else with CreateFailed
// and the first error of the reconcile.
func readyCondition(generation int64, c poolCensus, terr error, errs []error) metav1.Condition {
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Serving", ObservedGeneration: generation,
		Message: fmt.Sprintf("%d available, %d allocated, %d starting", len(c.free), c.allocated, len(c.pending)+c.inflight)}
	if terr != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, sbv1.ReasonInvalidTemplate, terr.Error()
	} else if len(errs) > 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, sbv1.ReasonCreateFailed, errs[0].Error()
	}
	return cond
}

// writeStatus writes st unless this process wrote it last (the cached
// pool may not show it yet, and a write from that stale copy would
// conflict) or it may wait. A non-nil result ends the reconcile with it.
func (r *poolReconciler) writeStatus(ctx context.Context, pool *sbv1.Pool, st sbv1.PoolStatus, c poolCensus, errs []error) (*reconcile.Result, error) {
	r.mu.Lock()
	last, wrote := r.lastStatus[pool.UID]
	lastAt := r.lastStatusAt[pool.UID]
	r.mu.Unlock()
	if wrote && poolStatusEqual(st, last) {
		return nil, nil
	}
	// While a pool fills, its pods come up one by one: their counts
	// are coalesced into at most one status write per statusInterval
	// (a write per pod made the fill of 100 cost ~50 status writes on
	// the reconcile path). The write that shows no pod starting any
	// more, and any change of revision or condition, go at once.
	if wait := statusInterval - time.Since(lastAt); wrote && wait > 0 && len(errs) == 0 &&
		len(c.pending)+c.inflight > 0 && onlyCounts(st, last) {
		return &reconcile.Result{RequeueAfter: wait}, nil
	}
	pool.Status = st
	switch err := r.c.Status().Update(ctx, pool); {
	case err == nil:
		r.mu.Lock()
		if r.lastStatus == nil {
			r.lastStatus = map[types.UID]sbv1.PoolStatus{}
		}
		r.lastStatus[pool.UID] = st
		if r.lastStatusAt == nil {
			r.lastStatusAt = map[types.UID]time.Time{}
		}
		r.lastStatusAt[pool.UID] = time.Now()
		r.mu.Unlock()
		return nil, nil
	case apierrors.IsConflict(err):
		return &reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	default:
		return nil, err
	}
}

// poolTarget is the number of pods a pool should hold (allocated plus
// free), given allocated pods and avail free or starting ones: the free
// ones are kept within [BufferMin, BufferMax] (refilled to BufferMax when
// they fall below BufferMin), and the total within [PoolMin, PoolMax].
func poolTarget(c sbv1.CapacitySpec, allocated, avail int) int {
	free := avail
	switch {
	case free < int(c.BufferMin):
		free = int(c.BufferMax)
	case free > int(c.BufferMax):
		free = int(c.BufferMax)
	}
	return min(max(allocated+free, int(c.PoolMin)), int(c.PoolMax))
}

// onlyCounts reports whether pool statuses a and b differ at most in their
// pod counts (and the condition messages that quote them).
func onlyCounts(a, b sbv1.PoolStatus) bool {
	if a.Revision != b.Revision || a.ObservedGeneration != b.ObservedGeneration || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i, c := range a.Conditions {
		d := b.Conditions[i]
		if c.Type != d.Type || c.Status != d.Status || c.Reason != d.Reason {
			return false
		}
	}
	return true
}

// poolStatusEqual compares two statuses, ignoring condition times.
func poolStatusEqual(a, b sbv1.PoolStatus) bool {
	strip := func(s sbv1.PoolStatus) sbv1.PoolStatus {
		s.Conditions = slices.Clone(s.Conditions)
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return s
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}

// poolPods lists the pool's pods from the cache and settles the ledger's
// deleted set against it. The pods are the cache's own (no deep copies of
// every pod per reconcile): read them and delete them, never change them.
func (r *poolReconciler) poolPods(ctx context.Context, pool types.NamespacedName) ([]*corev1.Pod, error) {
	var list corev1.PodList
	if err := r.c.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{sbv1.LabelPool: pool.Name},
		client.UnsafeDisableDeepCopy); err != nil {
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
	})
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
	if err := r.iso.ensure(ctx, pool.Namespace); err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(pool)
	pods := make([]*corev1.Pod, n)
	r.mu.Lock()
	if r.inflight == nil {
		r.inflight = map[types.NamespacedName]map[string]time.Time{}
	}
	if r.inflight[key] == nil {
		r.inflight[key] = map[string]time.Time{}
	}
	names := make([]string, n)
	for i := range pods {
		pods[i] = newPod(pool.Namespace, podName(pool.Name, randomSuffix(8)), pool.Spec.Template, r.opts.AgentImage,
			map[string]string{sbv1.LabelPool: pool.Name, sbv1.LabelPoolRevision: hash})
		r.inflight[key][pods[i].Name] = time.Now()
		names[i] = pods[i].Name
	}
	r.mu.Unlock()
	if ownToken(pool.Spec.Template) {
		// Each pod gets its own agent token (and egress token, with an
		// egress sidecar), recorded before the pods exist (a pod whose
		// key is missing cannot start).
		egress := pool.Spec.Template.Annotations[sbv1.AnnoEgress] != ""
		if _, err := alloc.AddTokens(ctx, r.c, key, names, egress); err != nil {
			r.mu.Lock()
			for _, name := range names {
				delete(r.inflight[key], name)
			}
			r.mu.Unlock()
			return err
		}
		for _, p := range pods {
			c := &p.Spec.Containers[0]
			c.Env = append(c.Env, alloc.TokenEnvVar(pool.Name, p.Name))
			if egress {
				podEgressToken(p, alloc.EgressTokenEnvVar(sidecar.EnvToken, pool.Name, p.Name))
			}
		}
	}
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

// ownToken reports whether the pods of pool template t get an agent
// token of their own (alloc.TokenEnvVar): when moat's agent runs in them
// and the template does not set the token itself.
func ownToken(t *corev1.PodTemplateSpec) bool {
	if !wantsAgent(t) || len(t.Spec.Containers) == 0 {
		return false
	}
	return !slices.ContainsFunc(t.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == alloc.TokenEnv })
}

// deletePods deletes free pool pods, marking them gone first so that no
// batch takes them meanwhile, and retiring them in the pool's table, so
// that no moat server does: a pod a server claimed first is kept.
func (r *poolReconciler) deletePods(ctx context.Context, pool types.NamespacedName, pods []*corev1.Pod) error {
	var mine []*corev1.Pod
	var names []string
	for _, p := range pods {
		if r.ledger.markGone(client.ObjectKeyFromObject(p)) {
			mine = append(mine, p)
			names = append(names, p.Name)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	res, err := r.tables.Apply(ctx, pool, alloc.Change{Retire: names})
	if err != nil {
		for _, p := range mine {
			r.ledger.unmarkGone(client.ObjectKeyFromObject(p))
		}
		return err
	}
	mine = slices.DeleteFunc(mine, func(p *corev1.Pod) bool {
		if slices.Contains(res.Retired, p.Name) {
			return false
		}
		r.ledger.unmarkGone(client.ObjectKeyFromObject(p))
		return true
	})
	err = parallel(ctx, len(mine), r.opts.CreateConcurrency, func(ctx context.Context, i int) error {
		if err := r.c.Delete(ctx, mine[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pool pod %s: %w", mine[i].Name, err)
		}
		return nil
	})
	if len(res.Retired) > 0 {
		// Their tokens are not needed any more (best effort: a later
		// deletion sweeps what is left).
		if terr := alloc.RemoveTokens(ctx, r.c, pool, res.Retired); terr != nil && err == nil {
			err = terr
		}
	}
	return err
}

// deleteFree deletes every unallocated pod of a deleted pool; allocated
// ones stay with their batch until it releases them.
func (r *poolReconciler) deleteFree(ctx context.Context, pool types.NamespacedName) error {
	pods, err := r.poolPods(ctx, pool)
	if err != nil {
		return err
	}
	var free []*corev1.Pod
	for _, p := range pods {
		_, named := r.tables.Owner(pool, p.Name)
		if p.DeletionTimestamp == nil && !named && !r.ledger.taken(client.ObjectKeyFromObject(p)) {
			free = append(free, p)
		}
	}
	return r.deletePods(ctx, pool, free)
}

// dropTables deletes a deleted pool's allocation table and token Secret
// once none of its pods is left (claimed pods outlive their pool, and
// their claims live in the table until they are released; each pod's
// deletion brings the pool back here).
func (r *poolReconciler) dropTables(ctx context.Context, pool types.NamespacedName) error {
	pods, err := r.poolPods(ctx, pool)
	if err != nil || len(pods) > 0 {
		return err
	}
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: alloc.TokenSecretName(pool.Name)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: alloc.EgressSecretName(pool.Name)}},
	}
	// The table's shards: those the cache holds, and every one of the
	// count the allocator knows (one the cache has not seen yet).
	shards := map[string]bool{}
	var tables corev1.SecretList
	if err := r.c.List(ctx, &tables, client.InNamespace(pool.Namespace), client.MatchingLabels{alloc.LabelTable: "true"}); err != nil {
		return err
	}
	for i := range tables.Items {
		if cm := &tables.Items[i]; cm.Annotations[alloc.AnnoPool] == pool.Name {
			shards[cm.Name] = true
		}
	}
	for n := range max(r.tables.ShardCount(pool), alloc.MinShards) {
		shards[alloc.ShardName(pool.Name, n)] = true
	}
	for name := range shards {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: name}})
	}
	for _, obj := range objs {
		if err := r.c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
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
