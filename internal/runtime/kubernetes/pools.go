package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/kstore"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Pools and claims. The backend keeps the Lifecycle API's pools as Pool
// resources (moat controller fills them) and claims their pods itself:
// the claim is one write of the pool's allocation table (internal/k8s/alloc),
// shared with the controller and with every other server replica, so no
// pod is ever handed out twice and no round trip through a BatchSandbox
// and the controller is needed. A claimed sandbox is its table entry
// (owner alloc.SandboxOwner(scope, id)) and its pod; its agent token is
// the pod's own (the pool's token Secret). Its record goes in the same
// write (inline records, below).

// annoDefinition holds the lifecycle's record of a pool on its Pool.
const annoDefinition = "moat." + sbv1.Group + "/pool-definition"

var _ runtime.Pools = (*Runtime)(nil)

// informers builds the backend's cache: pool pods, allocation tables, pool
// token Secrets and Pools of the namespace, and the BatchSandboxes of the
// scope (Create waits on these without polling the API server).
func informers(rc *rest.Config, ns, scope string, allNamespaces bool) (cache.Cache, error) {
	hasPool, err := labels.Parse(sbv1.LabelPool)
	if err != nil {
		return nil, err
	}
	// Table shards and token Secrets: every Secret of a pool.
	poolData, err := labels.Parse(alloc.LabelPoolData)
	if err != nil {
		return nil, err
	}
	sandboxes := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{labelScope: scope})}
	if allNamespaces {
		// Tenant namespaces: the scope's sandboxes in every namespace
		// (tenants.go); the pools stay in ns.
		sandboxes.Namespaces = map[string]cache.Config{cache.AllNamespaces: {}}
	}
	return cache.New(rc, cache.Options{
		Scheme:            kclient.Scheme(),
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:        {Label: hasPool},
			&corev1.Secret{}:     {Label: poolData},
			&sbv1.BatchSandbox{}: sandboxes,
		},
	})
}

// startClaims starts the informers and the allocator; they run until
// Close.
func (r *Runtime) startClaims(rc *rest.Config) error {
	inf, err := informers(rc, r.cfg.Namespace, r.cfg.Scope, r.cfg.Tenants != nil)
	if err != nil {
		return fmt.Errorf("kubernetes: %w: %v", errdefs.ErrUnavailable, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cache, r.stop = inf, cancel
	r.alloc, err = alloc.New(ctx, alloc.Options{
		Client:    r.c,
		Reader:    r.c,
		Informers: inf,
		Revision:  r.poolRevision,
		Usable:    r.hasToken,
		Size:      r.poolMax,
		Changed:   r.inlineChanged,
	})
	if err != nil {
		cancel()
		return fmt.Errorf("kubernetes: %w", err)
	}
	// Pools and the scope's BatchSandboxes are read from the cache too.
	for _, o := range []client.Object{&sbv1.Pool{}, &sbv1.BatchSandbox{}} {
		if _, err := inf.GetInformer(ctx, o); err != nil {
			cancel()
			return fmt.Errorf("kubernetes: informer: %w", err)
		}
	}
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		inf.Start(ctx)
	}()
	sctx, scancel := context.WithTimeout(ctx, r.cfg.SyncTimeout)
	defer scancel()
	if !inf.WaitForCacheSync(sctx) {
		cancel()
		<-r.done
		return fmt.Errorf("kubernetes: %w: the informers did not sync in %v", errdefs.ErrUnavailable, r.cfg.SyncTimeout)
	}
	return nil
}

// poolRevision is the template revision of a pool (its status, written
// by the controller).
func (r *Runtime) poolRevision(pool types.NamespacedName) string {
	var p sbv1.Pool
	if err := r.cache.Get(context.Background(), pool, &p); err != nil {
		return ""
	}
	return p.Status.Revision
}

// poolMax is the most pods a pool may have (sizes its allocation table
// if this server is the first to make it).
func (r *Runtime) poolMax(pool types.NamespacedName) int {
	var p sbv1.Pool
	if err := r.cache.Get(context.Background(), pool, &p); err != nil {
		return 0
	}
	return int(p.Spec.CapacitySpec.PoolMax)
}

// hasToken returns what reports whether a pool pod's own agent token is
// known: the allocator asks for every free pod on every claim, so the
// token Secret is read once per ask (a cache read per pod cost ~10 µs,
// 10 ms per claim with 1,000 free pods).
func (r *Runtime) hasToken(pool types.NamespacedName) func(pod string) bool {
	tokens := r.tokens(pool)
	return func(pod string) bool { return len(tokens[pod]) > 0 }
}

// token returns pod's agent token from its pool's token Secret.
func (r *Runtime) token(pool types.NamespacedName, pod string) (string, bool) {
	t, ok := r.tokens(pool)[pod]
	return string(t), ok && len(t) > 0
}

// tokens returns the data of pool's token Secret (a token per pod): read
// from the cache without a deep copy (read only; a copy per call made
// claims O(pool²): ~30 s each with 5,000 pods).
func (r *Runtime) tokens(pool types.NamespacedName) map[string][]byte {
	var s corev1.Secret
	noCopy := true
	err := r.cache.Get(context.Background(), types.NamespacedName{Namespace: pool.Namespace, Name: alloc.TokenSecretName(pool.Name)}, &s,
		&client.GetOptions{UnsafeDisableDeepCopy: &noCopy})
	if err != nil {
		return nil
	}
	return s.Data
}

// poolTemplate renders a pool template: the sandbox's container without a
// token (the controller gives every pod its own).
func (r *Runtime) poolTemplate(spec runtime.Spec) *corev1.PodTemplateSpec {
	spec.AgentToken = ""
	return r.template(spec)
}

// PutPool implements runtime.Pools.
func (r *Runtime) PutPool(ctx context.Context, p runtime.PoolSpec, create bool) error {
	spec := p.Template
	spec.ID = p.Name
	if err := r.validate(spec); err != nil {
		return err
	}
	if len(spec.Mounts) > 0 {
		return runtime.Invalid("pools of the kubernetes runtime cannot mount volumes")
	}
	if ns := r.namespaceOf(spec.Tenant); ns != r.cfg.Namespace {
		// Pools, their tables and token Secrets live in the server's
		// namespace; a pool of a tenant elsewhere would run its pods
		// outside the tenant's namespace.
		return fmt.Errorf("pool %s: %w", p.Name, errdefs.Newf(errdefs.ErrNotImplemented,
			"warm pools are not supported for tenant %s, whose sandboxes live in namespace %s (pools serve the tenants of namespace %s)", spec.Tenant, ns, r.cfg.Namespace))
	}
	tpl := r.poolTemplate(spec)
	if err := r.poolEgress(ctx, p.Name, tpl, spec.Class); err != nil {
		return err
	}
	capSpec := sbv1.CapacitySpec{BufferMin: int32(p.BufferMin), BufferMax: int32(p.BufferMax), PoolMin: int32(p.PoolMin), PoolMax: int32(p.PoolMax)}
	if create {
		pool := &sbv1.Pool{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.cfg.Namespace, Name: p.Name,
				Labels:      map[string]string{labelScope: r.cfg.Scope},
				Annotations: map[string]string{annoDefinition: string(p.Definition)}},
			Spec: sbv1.PoolSpec{Template: tpl, CapacitySpec: capSpec},
		}
		return classify("create pool "+p.Name, r.c.Create(ctx, pool))
	}
	for {
		var pool sbv1.Pool
		if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.cfg.Namespace, Name: p.Name}, &pool); err != nil {
			return classify("pool "+p.Name, err)
		}
		if pool.Annotations == nil {
			pool.Annotations = map[string]string{}
		}
		pool.Annotations[annoDefinition] = string(p.Definition)
		pool.Spec.Template, pool.Spec.CapacitySpec = tpl, capSpec
		err := r.c.Update(ctx, &pool)
		if !apierrors.IsConflict(err) {
			return classify("update pool "+p.Name, err)
		}
	}
}

// getPool reads a pool from the cache, or from the API server when the
// cache has not seen it yet (made by another replica a moment ago).
func (r *Runtime) getPool(ctx context.Context, name string) (*sbv1.Pool, error) {
	if !runtime.ValidID(name) {
		return nil, fmt.Errorf("pool %q: %w", name, errdefs.ErrNotFound)
	}
	key := types.NamespacedName{Namespace: r.cfg.Namespace, Name: name}
	var p sbv1.Pool
	err := r.cache.Get(ctx, key, &p)
	if apierrors.IsNotFound(err) {
		err = r.c.Get(ctx, key, &p)
	}
	if err != nil {
		return nil, classify("pool "+name, err)
	}
	if p.DeletionTimestamp != nil {
		return nil, fmt.Errorf("pool %q is being deleted: %w", name, errdefs.ErrNotFound)
	}
	return &p, nil
}

func (r *Runtime) poolSpec(p *sbv1.Pool) (runtime.PoolSpec, runtime.PoolStatus) {
	c := p.Spec.CapacitySpec
	spec := runtime.PoolSpec{Name: p.Name, BufferMin: int(c.BufferMin), BufferMax: int(c.BufferMax), PoolMin: int(c.PoolMin), PoolMax: int(c.PoolMax)}
	if d := p.Annotations[annoDefinition]; d != "" {
		spec.Definition = []byte(d)
	}
	if t := p.Spec.Template; t != nil && len(t.Spec.Containers) > 0 {
		ct := t.Spec.Containers[0]
		spec.Template = runtime.Spec{Image: ct.Image, Entrypoint: slices.Concat(ct.Command, ct.Args), WorkingDir: ct.WorkingDir}
		for _, e := range ct.Env {
			if e.ValueFrom == nil {
				if spec.Template.Env == nil {
					spec.Template.Env = map[string]string{}
				}
				spec.Template.Env[e.Name] = e.Value
			}
		}
		if t.Spec.RuntimeClassName != nil {
			spec.Template.Class = *t.Spec.RuntimeClassName
		}
		spec.Egress = t.Annotations[sbv1.AnnoEgress] != ""
		spec.Template.Resources.CPUMillis = ct.Resources.Limits.Cpu().MilliValue()
		spec.Template.Resources.MemoryBytes = ct.Resources.Limits.Memory().Value()
	}
	st := runtime.PoolStatus{Total: int(p.Status.Total), Allocated: int(p.Status.Allocated), Available: int(p.Status.Available), Revision: p.Status.Revision}
	return spec, st
}

// GetPool implements runtime.Pools.
func (r *Runtime) GetPool(ctx context.Context, name string) (runtime.PoolSpec, runtime.PoolStatus, error) {
	p, err := r.getPool(ctx, name)
	if err != nil {
		return runtime.PoolSpec{}, runtime.PoolStatus{}, err
	}
	spec, st := r.poolSpec(p)
	return spec, st, nil
}

// ListPools implements runtime.Pools: the pools of this server's scope and
// those made by hand (no scope), in name order.
func (r *Runtime) ListPools(ctx context.Context) ([]runtime.PoolSpec, []runtime.PoolStatus, error) {
	var list sbv1.PoolList
	if err := r.cache.List(ctx, &list, client.InNamespace(r.cfg.Namespace)); err != nil {
		return nil, nil, classify("list pools", err)
	}
	slices.SortFunc(list.Items, func(a, b sbv1.Pool) int { return strings.Compare(a.Name, b.Name) })
	var specs []runtime.PoolSpec
	var sts []runtime.PoolStatus
	for i := range list.Items {
		p := &list.Items[i]
		if s, ok := p.Labels[labelScope]; (ok && s != r.cfg.Scope) || p.DeletionTimestamp != nil {
			continue
		}
		spec, st := r.poolSpec(p)
		specs, sts = append(specs, spec), append(sts, st)
	}
	return specs, sts, nil
}

// DeletePool implements runtime.Pools. The controller deletes the idle
// pods; claimed ones stay with their sandboxes.
func (r *Runtime) DeletePool(ctx context.Context, name string) error {
	p, err := r.getPool(ctx, name)
	if err != nil {
		return err
	}
	if err := r.c.Delete(ctx, p, client.Preconditions{UID: &p.UID}); err != nil {
		return classify("delete pool "+name, err)
	}
	return nil
}

// Claim implements runtime.Pools: one write of the pool's table gives
// every id a free pod (as many as the pool has). With inline records on
// (EnableInlineRecords) the sandboxes' records go in the same write.
func (r *Runtime) Claim(ctx context.Context, pool string, ids []string, record func(runtime.Claimed) []byte) ([]runtime.Claimed, error) {
	p, err := r.getPool(ctx, pool)
	if err != nil {
		return nil, err
	}
	if t := p.Spec.Template; t != nil && len(t.Spec.Containers) > 0 &&
		slices.ContainsFunc(t.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == alloc.TokenEnv }) {
		// Claimed sandboxes would share one token: the code of one could
		// reach the others.
		return nil, fmt.Errorf("pool %s: %w: its template sets %s, so its pods share one agent token; claims need a token per pod (leave it out and the controller makes them)",
			pool, errdefs.ErrFailedPrecondition, alloc.TokenEnv)
	}
	for _, id := range ids {
		if !runtime.ValidID(id) {
			return nil, runtime.Invalid("invalid sandbox id %q", id)
		}
	}
	key := types.NamespacedName{Namespace: r.cfg.Namespace, Name: pool}
	class := ""
	if p.Spec.Template != nil && p.Spec.Template.Spec.RuntimeClassName != nil {
		class = *p.Spec.Template.Spec.RuntimeClassName
	}
	now := time.Now().UTC()
	inline := record != nil && r.inline.Load() != nil
	chs := make([]alloc.Change, len(ids))
	for i, id := range ids {
		chs[i] = alloc.Change{Owner: alloc.SandboxOwner(r.cfg.Scope, id), Want: 1}
		if inline {
			chs[i].Record = func(pod string, st alloc.PodState) []byte {
				tok, _ := r.token(key, pod)
				return record(runtime.Claimed{
					Status:     runtime.Status{ID: id, State: runtime.StateRunning, IP: st.IP, Class: class, CreatedAt: now},
					AgentToken: tok, Recorded: true,
				})
			}
		}
	}
	res, err := r.alloc.ApplyAll(ctx, key, chs)
	if err != nil {
		return nil, err
	}
	var out []runtime.Claimed
	var lost []string
	for i, rs := range res {
		if len(rs.Pods) == 0 {
			continue
		}
		pod := rs.Pods[0]
		st, _ := r.alloc.Pod(key, pod)
		tok, ok := r.token(key, pod)
		if !ok || st.IP == "" {
			// Its token or address vanished since it was picked (the
			// pod is going): give it up.
			lost = append(lost, ids[i])
			continue
		}
		out = append(out, runtime.Claimed{
			Status:     runtime.Status{ID: ids[i], State: runtime.StateRunning, IP: st.IP, Class: class, CreatedAt: now},
			AgentToken: tok, Recorded: rs.Recorded,
		})
	}
	for _, id := range lost {
		r.Delete(context.WithoutCancel(ctx), id)
	}
	return out, nil
}

// claimed returns the pool and pod of a claimed sandbox. A sandbox
// another replica claimed a moment ago may not be in this process's
// tables yet: when fresh is set, a miss reads the tables from the API
// server before it answers.
func (r *Runtime) claimed(ctx context.Context, id string, fresh bool) (types.NamespacedName, string, time.Time, bool, error) {
	owner := alloc.SandboxOwner(r.cfg.Scope, id)
	pool, own, ok := r.alloc.Find(r.cfg.Namespace, owner)
	if !ok && fresh {
		if err := r.alloc.Refresh(ctx, r.cfg.Namespace); err != nil {
			return types.NamespacedName{}, "", time.Time{}, false, err
		}
		pool, own, ok = r.alloc.Find(r.cfg.Namespace, owner)
	}
	if !ok || len(own.Pods) == 0 {
		return types.NamespacedName{}, "", time.Time{}, false, nil
	}
	return pool, own.Pods[0], own.At, true, nil
}

// claimStatus is the status of a claimed sandbox, from its pod.
func (r *Runtime) claimStatus(id string, pool types.NamespacedName, pod string, at time.Time) runtime.Status {
	st := runtime.Status{ID: id, State: runtime.StateStopped, CreatedAt: at.UTC(), Message: "pod " + pod + " is gone"}
	ps, ok := r.alloc.Pod(pool, pod)
	switch {
	case !ok:
	case ps.Ended:
		st.Message = "pod " + pod + " ended"
	case ps.Deleting:
		st.Message = "pod " + pod + " is being deleted"
	case ps.Ready:
		st.State, st.IP, st.Message = runtime.StateRunning, ps.IP, ""
	default:
		st.State, st.Message = runtime.StateUnknown, "pod "+pod+" is not ready"
	}
	return st
}

// releaseClaim gives up a claimed sandbox: its pod is retired in the
// table (never handed out again) and deleted, and its token forgotten.
func (r *Runtime) releaseClaim(ctx context.Context, id string, pool types.NamespacedName, pod string) error {
	owner := alloc.SandboxOwner(r.cfg.Scope, id)
	if _, err := r.alloc.Apply(ctx, pool, alloc.Change{Owner: owner, ReleaseAll: true}); err != nil {
		return err
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: pod}}
	if err := r.c.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		// Retired: no one takes it again, and the controller deletes the
		// retired pods it still sees.
		return classify("delete pod "+pod, err)
	}
	// A leftover key is harmless (the key of a deleted pod opens nothing).
	alloc.RemoveTokens(ctx, r.c, pool, []string{pod})
	return nil
}

// claimedStatuses lists the sandboxes of this scope claimed from pools.
func (r *Runtime) claimedStatuses() []runtime.Status {
	prefix := alloc.SandboxOwner(r.cfg.Scope, "")
	var out []runtime.Status
	for _, h := range r.alloc.Holdings(r.cfg.Namespace, func(o string) bool { return strings.HasPrefix(o, prefix) }) {
		id, _ := alloc.SandboxOf(r.cfg.Scope, h.Owner)
		if len(h.Pods) == 0 {
			continue
		}
		out = append(out, r.claimStatus(id, h.Pool, h.Pods[0], h.At))
	}
	return out
}

// Inline records. A claim can write its sandbox's record into the same
// write of the pool's table as the claim (alloc.Table.Records): one write
// per warm claim or warm batch instead of two. The server's store
// (kstore) reads them through InlineRecords, and moves one into a Secret
// of its own at its first update, or when its shard is short of room
// (alloc.InlineRoom); EnableInlineRecords turns them on once that store
// listens.

// InlineRecords is the kstore.Inline of the sandbox records this
// backend's claims write.
func (r *Runtime) InlineRecords() kstore.Inline { return inlineSource{r} }

// EnableInlineRecords makes claims write their records inline and calls
// changed whenever the inline records of a part of the source (a table
// shard; nil: any) may have changed.
func (r *Runtime) EnableInlineRecords(changed func(part any)) {
	r.inline.Store(&changed)
	changed(nil) // the records the informers brought before
}

func (r *Runtime) inlineChanged(pool types.NamespacedName, shard int) {
	if f := r.inline.Load(); f != nil {
		(*f)(inlineFrom{pool, shard})
	}
}

type inlineSource struct{ r *Runtime }

type inlineFrom struct {
	pool  types.NamespacedName
	shard int
}

// Records lists the inline records of part (an inlineFrom: one shard of
// a pool's table), or of every shard.
func (s inlineSource) Records(part any) map[string]kstore.InlineRecord {
	r := s.r
	prefix := alloc.SandboxOwner(r.cfg.Scope, "")
	mine := func(o string) bool { return strings.HasPrefix(o, prefix) }
	var ins []alloc.InlineRecord
	if p, ok := part.(inlineFrom); ok {
		ins = r.alloc.ShardRecords(p.pool, p.shard, mine)
	} else {
		ins = r.alloc.InlineRecords(r.cfg.Namespace, mine)
	}
	out := make(map[string]kstore.InlineRecord, len(ins))
	for _, in := range ins {
		id, _ := alloc.SandboxOf(r.cfg.Scope, in.Owner)
		out[id] = kstore.InlineRecord{Raw: in.Raw, From: inlineFrom{in.Pool, in.Shard}, Mine: in.Mine, Crowded: in.Crowded}
	}
	return out
}

func (s inlineSource) Drop(ctx context.Context, key string, rec kstore.InlineRecord) (bool, error) {
	r := s.r
	from, ok := rec.From.(inlineFrom)
	if !ok {
		return false, fmt.Errorf("inline record %s: %w: no origin", key, errdefs.ErrInternal)
	}
	owner := alloc.SandboxOwner(r.cfg.Scope, key)
	res, err := r.alloc.Apply(ctx, from.pool, alloc.Change{Owner: owner, DropRecord: rec.Raw})
	if err != nil {
		return false, err
	}
	if res.Dropped {
		// This write dropped it from the shard as the API server had it
		// (a sandbox's pod and record are in one shard): no read needed.
		return len(res.Held) > 0, nil
	}
	return r.alloc.Holds(ctx, from.pool, from.shard, owner)
}
