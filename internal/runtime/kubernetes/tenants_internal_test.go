package kubernetes

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/moat-sandbox/moat/internal/tenant"
)

// TestTenantPlacement: the namespace of each tenant and volume, and the
// quota objects rendered from a tenant's quota.
func TestTenantPlacement(t *testing.T) {
	one := &Runtime{cfg: Config{Namespace: "moat", Scope: "s"}}
	if one.namespaceOf("acme") != "moat" || one.volumeNamespace("acme.data") != "moat" {
		t.Error("without tenant namespaces everything is in Namespace")
	}
	r := &Runtime{cfg: Config{Namespace: "moat", Scope: "s", Tenants: &TenantNamespaces{
		Namespaces: map[string]string{"alpha": "ns-alpha"}, Prefix: "moat"}}}
	for i, tc := range []struct{ tenant, want string }{
		{"", "moat"}, {tenant.Default, "moat"}, {"alpha", "ns-alpha"}, {"beta", "moat-beta"},
	} {
		if got := r.namespaceOf(tc.tenant); got != tc.want {
			t.Errorf("%d: tenant %q in %s, want %s", i, tc.tenant, got, tc.want)
		}
	}
	for i, tc := range []struct{ volume, want string }{
		{"data", "moat"}, {"alpha.data", "ns-alpha"}, {"beta.data", "moat-beta"},
	} {
		if got := r.volumeNamespace(tc.volume); got != tc.want {
			t.Errorf("%d: volume %q in %s, want %s", i, tc.volume, got, tc.want)
		}
	}
	// The file may place the default tenant too.
	r.cfg.Tenants.Namespaces[tenant.Default] = "legacy"
	if got := r.namespaceOf(""); got != "legacy" {
		t.Errorf("default tenant in %s, want legacy", got)
	}

	objs := r.tenantObjects("moat-beta", tenant.Quota{Sandboxes: 3, MemoryBytes: 1 << 30})
	if len(objs) != 3 {
		t.Fatalf("%d objects", len(objs))
	}
	rq := objs[2].(*corev1.ResourceQuota)
	if p, m := rq.Spec.Hard[corev1.ResourcePods], rq.Spec.Hard[corev1.ResourceLimitsMemory]; p.Value() != 3 || m.Value() != 1<<30 || len(rq.Spec.Hard) != 2 {
		t.Errorf("quota hard %v", rq.Spec.Hard)
	}
	if lr := objs[1].(*corev1.LimitRange); len(lr.Spec.Limits) != 1 {
		t.Errorf("a memory quota needs container defaults: %+v", lr.Spec)
	}
	objs = r.tenantObjects("moat-beta", tenant.Quota{})
	if rq, lr := objs[2].(*corev1.ResourceQuota), objs[1].(*corev1.LimitRange); len(rq.Spec.Hard) != 0 || len(lr.Spec.Limits) != 0 {
		t.Errorf("no quota, yet %v / %v (apply deletes empty ones)", rq.Spec, lr.Spec)
	}
}
