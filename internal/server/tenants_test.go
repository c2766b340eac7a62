package server

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moat-sandbox/moat/internal/tenant"
)

// TestTenantNamespacesConfig: a tenants file needs auth, and places its
// tenants' namespaces; without one (and without --k8s-tenant-namespaces)
// everything stays in one namespace.
func TestTenantNamespacesConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tenants.toml")
	os.WriteFile(p, []byte("[[tenants]]\nname = \"a\"\nnamespace = \"ns-a\"\napi_keys = [\"0123456789abcdef\"]\n[[tenants]]\nname = \"b\"\napi_keys = [\"fedcba9876543210\"]\n"), 0o600)
	if errs := (&Config{TenantsFile: p, NoAuth: true}).validateTenants(); len(errs) == 0 {
		t.Error("a tenants file without auth was accepted")
	}
	c := Config{TenantsFile: p, Kubernetes: KubernetesConfig{Namespace: "moat"}}
	if errs := c.validateTenants(); len(errs) > 0 {
		t.Fatal(errs)
	}
	quota := func(string) tenant.Quota { return tenant.Quota{} }
	tn := tenantNamespaces(c, deps{quota: quota})
	if tn == nil || tn.Namespaces["a"] != "ns-a" || len(tn.Namespaces) != 1 || tn.Quota == nil || !slices.Contains(tn.IngressNamespaces, "moat") {
		t.Errorf("placement %+v", tn)
	}
	if tn := tenantNamespaces(Config{Kubernetes: KubernetesConfig{Namespace: "moat"}}, deps{}); tn != nil {
		t.Errorf("without a tenants file: %+v, want one namespace", tn)
	}
	c = Config{Kubernetes: KubernetesConfig{Namespace: "moat", TenantNamespaces: true, IngressNamespaces: []string{"gw"}}}
	if tn := tenantNamespaces(c, deps{}); tn == nil || !slices.Equal(tn.IngressNamespaces, []string{"gw"}) {
		t.Errorf("--k8s-tenant-namespaces: %+v", tn)
	}
}
