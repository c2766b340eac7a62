package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// Tenant namespaces. With Config.Tenants set, each tenant's sandboxes, pods,
// token Secrets and volumes (PVCs) live in the tenant's own namespace
// (TenantNamespaces.Of); the server's records, leases and warm pools stay
// in Config.Namespace. moat does not create namespaces: a cluster admin
// does (as OpenSandbox's multi-tenancy requires), and a create for a
// tenant whose namespace is missing is refused before anything is made
// (runtime.ErrTenantNamespaceMissing). Before its first sandbox in a
// namespace, the backend writes there, and rewrites when they drift:
//
//   - the ResourceQuota moat-tenant-<scope> from the tenant's quota
//     (sandboxes → pods, CPU and memory → limits.cpu and limits.memory),
//     with a LimitRange moat-tenant-<scope> giving containers without
//     limits (the agent's init container) small defaults, which Kubernetes
//     requires under such a quota;
//   - the NetworkPolicy moat-tenant-<scope>, which admits ingress to the
//     scope's sandbox pods only from pods of the IngressNamespaces (the
//     server's) that are not sandboxes of the scope: never from another
//     tenant's namespace, nor from another sandbox.

// TenantNamespaces places tenants in namespaces (Config.Tenants).
type TenantNamespaces struct {
	// Namespaces maps tenant names to their namespaces (tenants.toml).
	Namespaces map[string]string
	// Lookup, if set, is used instead of Namespaces (a tenants file that
	// is reread): the namespace named for tenant, if any.
	Lookup func(tenant string) (string, bool)
	// Prefix places a tenant Namespaces does not name in
	// "<Prefix>-<tenant>"; the default tenant is in Config.Namespace
	// unless Namespaces names it.
	Prefix string
	// Quota returns a tenant's quota (nil: none).
	Quota func(tenant string) tenant.Quota
	// IngressNamespaces may reach the sandbox pods (default: the
	// server's Config.Namespace).
	IngressNamespaces []string
	// QuotaResync is how often a changed quota is carried to the
	// namespaces already written (default 5s).
	QuotaResync time.Duration
}

// Limits the LimitRange gives containers without limits in a namespace
// whose quota bounds CPU or memory.
const (
	defaultCPULimit    = "100m"
	defaultMemoryLimit = "64Mi"
)

// tenantState remembers what was last written to each namespace, so a
// create writes nothing when the tenant's objects are as wanted.
type tenantState struct {
	mu sync.Mutex
	// applied maps a namespace to the tenant and quota its objects were
	// last made from.
	applied map[string]appliedQuota
	// placed maps sandbox ids to namespaces, as seen by Create, List and
	// locate.
	placed map[string]string
}

type appliedQuota struct {
	tenant string
	quota  tenant.Quota
}

// quotaResync is how often the backend compares the tenants' quotas with
// what it wrote to their namespaces (resyncQuotas).
const quotaResync = 5 * time.Second

// resyncQuotas rewrites, every interval until ctx ends, the objects of
// the namespaces this process has written whose tenant's quota changed
// since (a quota set through the API): no API request while none did.
func (r *Runtime) resyncQuotas(ctx context.Context, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		r.tenants.mu.Lock()
		stale := map[string]string{}
		for ns, a := range r.tenants.applied {
			if r.cfg.Tenants.Quota != nil && r.cfg.Tenants.Quota(a.tenant) != a.quota {
				stale[ns] = a.tenant
			}
		}
		r.tenants.mu.Unlock()
		for ns, t := range stale {
			// Best effort: a failure is tried again next time and by the
			// tenant's next create.
			r.prepareNamespace(ctx, t, ns)
		}
	}
}

// namespaceOf is the namespace of tenant t's sandboxes.
func (r *Runtime) namespaceOf(t string) string {
	tn := r.cfg.Tenants
	t = tenant.Normalize(t)
	if tn == nil {
		return r.cfg.Namespace
	}
	lookup := tn.Lookup
	if lookup == nil {
		lookup = func(t string) (string, bool) { ns, ok := tn.Namespaces[t]; return ns, ok }
	}
	if ns, ok := lookup(t); ok && ns != "" {
		return ns
	}
	if t == tenant.Default {
		return r.cfg.Namespace
	}
	return tn.Prefix + "-" + t
}

// tenantObjectName names the scope's ResourceQuota, LimitRange and
// NetworkPolicy in a tenant namespace.
func (r *Runtime) tenantObjectName() string { return "moat-tenant-" + r.cfg.Scope }

// prepareNamespace checks that tenant t's namespace ns exists and makes
// its ResourceQuota, LimitRange and NetworkPolicy as wanted. It makes
// nothing in a namespace that does not exist.
func (r *Runtime) prepareNamespace(ctx context.Context, t, ns string) error {
	tn := r.cfg.Tenants
	if tn == nil {
		return nil
	}
	var q tenant.Quota
	if tn.Quota != nil {
		q = tn.Quota(tenant.Normalize(t))
	}
	r.tenants.mu.Lock()
	last, ok := r.tenants.applied[ns]
	r.tenants.mu.Unlock()
	if ok && last.quota == q {
		return nil
	}
	var n corev1.Namespace
	if err := r.c.Get(ctx, types.NamespacedName{Name: ns}, &n); apierrors.IsNotFound(err) || (err == nil && n.DeletionTimestamp != nil) {
		return fmt.Errorf("%w: %w", runtime.ErrTenantNamespaceMissing, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the namespace %s of tenant %s does not exist on the cluster (a cluster admin creates it)", ns, tenant.Normalize(t)))
	} else if err != nil {
		return classify("namespace "+ns, err)
	}
	for _, o := range r.tenantObjects(ns, q) {
		if err := r.apply(ctx, o); err != nil {
			return err
		}
	}
	r.tenants.mu.Lock()
	r.tenants.applied[ns] = appliedQuota{tenant: tenant.Normalize(t), quota: q}
	r.tenants.mu.Unlock()
	return nil
}

// gone returns the missing-namespace error when err, from a create in
// tenant t's namespace ns, came because ns has gone (or is being
// deleted) since prepareNamespace saw it; nil otherwise.
func (r *Runtime) gone(ctx context.Context, t, ns string, err error) error {
	if r.cfg.Tenants == nil || err == nil {
		return nil
	}
	r.tenants.mu.Lock()
	delete(r.tenants.applied, ns)
	r.tenants.mu.Unlock()
	if perr := r.prepareNamespace(ctx, t, ns); errors.Is(perr, runtime.ErrTenantNamespaceMissing) {
		return perr
	}
	return nil
}

// tenantObjects renders the objects of a tenant namespace for quota q:
// the NetworkPolicy always, the ResourceQuota and LimitRange (nil specs:
// deleted) as q asks.
func (r *Runtime) tenantObjects(ns string, q tenant.Quota) []client.Object {
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: r.tenantObjectName(), Labels: map[string]string{labelScope: r.cfg.Scope}}
	}
	from := r.cfg.Tenants.IngressNamespaces
	if len(from) == 0 {
		from = []string{r.cfg.Namespace}
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: meta(), Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelScope: r.cfg.Scope}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		// Pods of the ingress namespaces that are not sandboxes of the
		// scope: never another sandbox, even of the server's namespace.
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: from,
			}}},
			PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: labelScope, Operator: metav1.LabelSelectorOpDoesNotExist,
			}}},
		}}}},
	}}
	hard := corev1.ResourceList{}
	if q.Sandboxes > 0 {
		hard[corev1.ResourcePods] = *resource.NewQuantity(int64(q.Sandboxes), resource.DecimalSI)
	}
	if q.CPUMillis > 0 {
		hard[corev1.ResourceLimitsCPU] = *resource.NewMilliQuantity(q.CPUMillis, resource.DecimalSI)
	}
	if q.MemoryBytes > 0 {
		hard[corev1.ResourceLimitsMemory] = *resource.NewQuantity(q.MemoryBytes, resource.BinarySI)
	}
	rq := &corev1.ResourceQuota{ObjectMeta: meta()}
	if len(hard) > 0 {
		rq.Spec.Hard = hard
	}
	lr := &corev1.LimitRange{ObjectMeta: meta()}
	if q.CPUMillis > 0 || q.MemoryBytes > 0 {
		def := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(defaultCPULimit), corev1.ResourceMemory: resource.MustParse(defaultMemoryLimit)}
		lr.Spec.Limits = []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer, Default: def, DefaultRequest: def}}
	}
	// The LimitRange first: a quota on limits refuses a pod whose
	// containers have none before the LimitRange exists.
	return []client.Object{np, lr, rq}
}

// apply makes o as rendered: created, updated when it differs, deleted
// when its spec is empty (a ResourceQuota or LimitRange the quota no
// longer asks for).
func (r *Runtime) apply(ctx context.Context, o client.Object) error {
	empty := false
	switch v := o.(type) {
	case *corev1.ResourceQuota:
		empty = len(v.Spec.Hard) == 0
	case *corev1.LimitRange:
		empty = len(v.Spec.Limits) == 0
	}
	what := fmt.Sprintf("%T %s/%s", o, o.GetNamespace(), o.GetName())
	cur := o.DeepCopyObject().(client.Object)
	err := r.c.Get(ctx, client.ObjectKeyFromObject(o), cur)
	switch {
	case apierrors.IsNotFound(err) && empty:
		return nil
	case apierrors.IsNotFound(err):
		if err := r.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return classify("create "+what, err)
		}
		return nil
	case err != nil:
		return classify(what, err)
	case empty:
		return classify("delete "+what, client.IgnoreNotFound(r.c.Delete(ctx, cur)))
	}
	if specEqual(o, cur) {
		return nil
	}
	o.SetResourceVersion(cur.GetResourceVersion())
	return classify("update "+what, r.c.Update(ctx, o))
}

// specEqual reports whether a and b (one kind) have the same spec.
func specEqual(a, b client.Object) bool {
	switch a := a.(type) {
	case *corev1.ResourceQuota:
		return equality.Semantic.DeepEqual(a.Spec, b.(*corev1.ResourceQuota).Spec)
	case *corev1.LimitRange:
		return equality.Semantic.DeepEqual(a.Spec, b.(*corev1.LimitRange).Spec)
	case *networkingv1.NetworkPolicy:
		return equality.Semantic.DeepEqual(a.Spec, b.(*networkingv1.NetworkPolicy).Spec)
	}
	return false
}

// place remembers that sandbox id is in namespace ns.
func (r *Runtime) place(id, ns string) {
	if r.cfg.Tenants == nil {
		return
	}
	r.tenants.mu.Lock()
	r.tenants.placed[id] = ns
	r.tenants.mu.Unlock()
}

// forget drops what place remembered of id.
func (r *Runtime) forget(id string) {
	if r.cfg.Tenants == nil {
		return
	}
	r.tenants.mu.Lock()
	delete(r.tenants.placed, id)
	r.tenants.mu.Unlock()
}

// locate returns the namespace of sandbox id: Config.Namespace without
// tenant namespaces; else where it was seen, else where the API server
// has a BatchSandbox of the scope by that name (one request), else
// Config.Namespace (where the lookups then find nothing).
func (r *Runtime) locate(ctx context.Context, id string) (string, error) {
	if r.cfg.Tenants == nil || !runtime.ValidID(id) {
		return r.cfg.Namespace, nil
	}
	r.tenants.mu.Lock()
	ns, ok := r.tenants.placed[id]
	r.tenants.mu.Unlock()
	if ok {
		return ns, nil
	}
	var list sbv1.BatchSandboxList
	err := r.c.List(ctx, &list, client.MatchingLabels{labelScope: r.cfg.Scope},
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", id)})
	if err != nil {
		return "", classify("find sandbox "+id, err)
	}
	if len(list.Items) == 0 {
		return r.cfg.Namespace, nil
	}
	ns = list.Items[0].Namespace
	r.place(id, ns)
	return ns, nil
}

// listNamespace is the namespace List and the token sweep read: every
// namespace with tenant namespaces ("" = all), else Config.Namespace.
func (r *Runtime) listNamespace() string {
	if r.cfg.Tenants != nil {
		return ""
	}
	return r.cfg.Namespace
}

// volumeNamespace is the namespace of volume name: a tenant's volumes are
// named "<tenant>.<claim>" (lifecycle.VolumeKey), the default tenant's
// have no dot.
func (r *Runtime) volumeNamespace(name string) string {
	if r.cfg.Tenants == nil {
		return r.cfg.Namespace
	}
	return r.namespaceOf(volumeTenant(name))
}

// volumeTenant is the tenant of volume name (see volumeNamespace).
func volumeTenant(name string) string {
	if t, _, ok := strings.Cut(name, "."); ok {
		return t
	}
	return tenant.Default
}
