package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	moat "github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
	"github.com/moat-sandbox/moat/internal/server"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// TestTenantNamespaces: with a tenants file (OpenSandbox's tenants.toml)
// each tenant's sandboxes, pods, token Secrets and volumes live in the
// tenant's namespace, with a ResourceQuota from its quota and a
// NetworkPolicy admitting only the server's namespace; a tenant sees
// none of another's sandboxes; a tenant whose namespace is missing gets
// a clear error and nothing is made; the file's keys authenticate.
func TestTenantNamespaces(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	c := adminClient(t)
	ctx := context.Background()
	ns := namespace(t)   // the server's namespace (tenant default)
	nsA := namespace(t)  // tenant alpha's, named in the file
	nsB := ns + "-beta"  // tenant beta's, by the prefix rule
	nsG := ns + "-gamma" // tenant gamma's: never made
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}); err != nil {
		t.Fatal(err)
	}
	fakeQuotaController(t, c, nsB)

	const (
		rootKey  = "root-key-0123456789abcdef0123456789"
		alphaKey = "osk-alpha-0123456789abcdef"
		betaKey  = "osk-beta-0123456789abcdef"
		gammaKey = "osk-gamma-0123456789abcdef"
	)
	dir := t.TempDir()
	file := filepath.Join(dir, "tenants.toml")
	if err := os.WriteFile(file, []byte(`
[[tenants]]
name = "alpha"
namespace = "`+nsA+`"
api_keys = ["`+alphaKey+`", "osk-alpha-rotated-0123456789"]

[[tenants]]
name = "beta"
api_keys = ["`+betaKey+`"]

[[tenants]]
name = "gamma"
api_keys = ["`+gammaKey+`"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startTenantServer(t, ns, "tenantns", func(cfg *server.Config) {
		cfg.APIKey, cfg.TenantsFile, cfg.TenantsReload = rootKey, file, 50*time.Millisecond
	})
	cl := func(key string) *moat.Client {
		cl, err := moat.New(url, moat.WithAPIKey(key))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	root, alpha, beta, gamma := cl(rootKey), cl(alphaKey), cl(betaKey), cl(gammaKey)
	if _, err := root.PutTenant(ctx, "beta", moat.TenantQuota{Sandboxes: 2, CPU: "2"}); err != nil {
		t.Fatal(err)
	}

	// A key the file does not hold: 401.
	var apiErr *moat.APIError
	if _, err := cl("osk-unknown-0123456789abcdef").ListSandboxes(ctx, moat.ListOptions{}); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Errorf("list with an unknown key = %v, want 401", err)
	}

	yes := true
	sbA, err := alpha.CreateSandbox(ctx, moat.CreateRequest{
		Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		Volumes: []moat.Volume{{Name: "data", MountPath: "/data", PVC: &moat.PVCVolume{ClaimName: "data", CreateIfNotExists: &yes}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := beta.CreateSandbox(ctx, moat.CreateRequest{
		Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		ResourceLimits: map[string]string{"cpu": "500m"},
	})
	if err != nil {
		t.Fatal(err)
	}

	// Each lands in its tenant's namespace, with its token Secret and
	// volume; nothing of them is in the server's namespace.
	for _, w := range []struct{ id, ns string }{{sbA.ID, nsA}, {sbB.ID, nsB}} {
		var b sbv1.BatchSandbox
		if err := c.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: w.id}, &b); err != nil {
			t.Errorf("sandbox %s: no BatchSandbox in %s: %v", w.id, w.ns, err)
		}
		var sec corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: w.id + "-agent"}, &sec); err != nil {
			t.Errorf("sandbox %s: no token Secret in %s: %v", w.id, w.ns, err)
		}
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(w.ns)); err != nil || len(pods.Items) != 1 {
			t.Errorf("namespace %s: %d pods (%v), want 1", w.ns, len(pods.Items), err)
		}
	}
	var inServer sbv1.BatchSandboxList
	if err := c.List(ctx, &inServer, client.InNamespace(ns)); err != nil || len(inServer.Items) != 0 {
		t.Errorf("server namespace holds %d BatchSandboxes (%v)", len(inServer.Items), err)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "alpha.data"}, &pvc); err != nil {
		t.Errorf("alpha's volume: no PVC alpha.data in %s: %v", nsA, err)
	}

	// The tenant objects: a quota where the tenant has one, the policy
	// everywhere.
	var rq corev1.ResourceQuota
	if err := c.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "moat-tenant-tenantns"}, &rq); err != nil {
		t.Fatalf("beta: no ResourceQuota: %v", err)
	}
	if p, cpu := rq.Spec.Hard[corev1.ResourcePods], rq.Spec.Hard[corev1.ResourceLimitsCPU]; p.Value() != 2 || cpu.MilliValue() != 2000 || len(rq.Spec.Hard) != 2 {
		t.Errorf("beta's ResourceQuota hard = %v, want pods 2, limits.cpu 2", rq.Spec.Hard)
	}
	var lr corev1.LimitRange
	if err := c.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "moat-tenant-tenantns"}, &lr); err != nil || len(lr.Spec.Limits) != 1 {
		t.Errorf("beta: LimitRange %+v (%v), want container defaults", lr.Spec, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "moat-tenant-tenantns"}, &rq); client.IgnoreNotFound(err) != nil || err == nil {
		t.Errorf("alpha has no quota, yet a ResourceQuota (%v)", err)
	}
	for _, n := range []string{nsA, nsB} {
		var np networkingv1.NetworkPolicy
		if err := c.Get(ctx, client.ObjectKey{Namespace: n, Name: "moat-tenant-tenantns"}, &np); err != nil {
			t.Errorf("%s: no NetworkPolicy: %v", n, err)
			continue
		}
		in := np.Spec.Ingress
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(in) != 1 || len(in[0].From) != 1 ||
			in[0].From[0].NamespaceSelector == nil || in[0].From[0].PodSelector == nil ||
			len(in[0].From[0].PodSelector.MatchExpressions) != 1 || in[0].From[0].PodSelector.MatchExpressions[0].Operator != metav1.LabelSelectorOpDoesNotExist ||
			len(in[0].From[0].NamespaceSelector.MatchExpressions) != 1 ||
			!slices.Equal(in[0].From[0].NamespaceSelector.MatchExpressions[0].Values, []string{ns}) ||
			np.Spec.PodSelector.MatchLabels["moat.sandbox.opensandbox.io/server-scope"] != "tenantns" {
			t.Errorf("%s: NetworkPolicy spec %+v, want ingress only from namespace %s", n, np.Spec, ns)
		}
	}

	// A quota set through the API reaches the namespace without a
	// create.
	if _, err := root.PutTenant(ctx, "beta", moat.TenantQuota{Sandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "beta's new ResourceQuota", func() (bool, string) {
		var rq corev1.ResourceQuota
		var lr corev1.LimitRange
		err := c.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "moat-tenant-tenantns"}, &rq)
		p := rq.Spec.Hard[corev1.ResourcePods]
		lrErr := c.Get(ctx, client.ObjectKey{Namespace: nsB, Name: "moat-tenant-tenantns"}, &lr)
		return err == nil && p.Value() == 3 && len(rq.Spec.Hard) == 1 && client.IgnoreNotFound(lrErr) == nil && lrErr != nil,
			fmt.Sprintf("hard %v, LimitRange %v", rq.Spec.Hard, lrErr)
	})

	// Warm pools serve the server's namespace only: a tenant placed
	// elsewhere cannot make one (its pods would run outside its
	// namespace), and no Pool is made.
	_, err = alpha.CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: 1, BufferMax: 1, PoolMin: 1, PoolMax: 2}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotImplemented {
		t.Errorf("alpha creates a pool: %v, want 501", err)
	}
	for _, n := range []string{ns, nsA} {
		var pools sbv1.PoolList
		if err := c.List(ctx, &pools, client.InNamespace(n)); err != nil || len(pools.Items) != 0 {
			t.Errorf("a refused pool left %d Pools in %s (%v)", len(pools.Items), n, err)
		}
	}

	// A tenant sees its own sandboxes only.
	for _, w := range []struct {
		name      string
		cl        *moat.Client
		own, away string
	}{{"alpha", alpha, sbA.ID, sbB.ID}, {"beta", beta, sbB.ID, sbA.ID}} {
		list, err := w.cl.ListSandboxes(ctx, moat.ListOptions{})
		if err != nil || len(list.Items) != 1 || list.Items[0].ID != w.own {
			t.Errorf("%s lists %+v (%v), want only %s", w.name, list, err, w.own)
		}
		if _, err := w.cl.GetSandbox(ctx, w.away); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Errorf("%s gets the other tenant's sandbox: %v, want 404", w.name, err)
		}
		if err := w.cl.DeleteSandbox(ctx, w.away); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Errorf("%s deletes the other tenant's sandbox: %v, want 404", w.name, err)
		}
	}
	if list, err := root.ListSandboxes(ctx, moat.ListOptions{}); err != nil || len(list.Items) != 2 {
		t.Errorf("the platform key lists %+v (%v), want both", list, err)
	}

	// gamma's namespace does not exist: a clear error, and nothing made.
	_, err = gamma.CreateSandbox(ctx, moat.CreateRequest{
		Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		Volumes: []moat.Volume{{Name: "data", MountPath: "/data", PVC: &moat.PVCVolume{ClaimName: "data", CreateIfNotExists: &yes}}},
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Code != "TENANT::NAMESPACE_NOT_FOUND" {
		t.Errorf("create in a missing namespace = %v, want 409 TENANT::NAMESPACE_NOT_FOUND", err)
	} else if apiErr.Message == "" || !strings.Contains(apiErr.Message, nsG) {
		t.Errorf("message %q does not name namespace %s", apiErr.Message, nsG)
	}
	_, err = gamma.CreateSandbox(ctx, moat.CreateRequest{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}})
	if !errors.As(err, &apiErr) || apiErr.Code != "TENANT::NAMESPACE_NOT_FOUND" {
		t.Errorf("create without volumes in a missing namespace = %v, want TENANT::NAMESPACE_NOT_FOUND", err)
	}
	var all sbv1.BatchSandboxList
	if err := c.List(ctx, &all, client.MatchingLabels{"moat.sandbox.opensandbox.io/server-scope": "tenantns"}); err != nil || len(all.Items) != 2 {
		t.Errorf("after gamma's refused creates: %d BatchSandboxes of the scope (%v), want 2", len(all.Items), err)
	}
	var secs corev1.SecretList
	if err := c.List(ctx, &secs, client.MatchingLabels{"moat.sandbox.opensandbox.io/agent-token": "true", "moat.sandbox.opensandbox.io/server-scope": "tenantns"}); err != nil || len(secs.Items) != 2 {
		t.Errorf("after gamma's refused creates: %d token Secrets (%v), want 2", len(secs.Items), err)
	}
	var pvcs corev1.PersistentVolumeClaimList
	if err := c.List(ctx, &pvcs, client.MatchingLabels{"moat.sandbox.opensandbox.io/server-scope": "tenantns"}); err != nil || len(pvcs.Items) != 1 {
		t.Errorf("after gamma's refused creates: %d PVCs (%v), want 1 (alpha's)", len(pvcs.Items), err)
	}
	// The refused creates stay listed as Failed for the client to
	// inspect, as every refused create does.
	if list, err := gamma.ListSandboxes(ctx, moat.ListOptions{}); err != nil || slices.ContainsFunc(list.Items, func(sb moat.Sandbox) bool { return sb.Status.State != moat.StateFailed }) {
		t.Errorf("gamma lists %+v (%v), want only Failed creates", list, err)
	}

	// A backend that has not seen the sandboxes finds them in their
	// namespaces (another replica, a restarted server).
	rt, err := kubernetes.New(env.Config, kubernetes.Config{Namespace: ns, Scope: "tenantns",
		Tenants: &kubernetes.TenantNamespaces{Namespaces: map[string]string{"alpha": nsA}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sbA.ID, sbB.ID} {
		if st, err := rt.Status(ctx, id); err != nil || st.State != runtime.StateRunning {
			t.Errorf("a fresh backend: sandbox %s is %+v (%v), want running", id, st, err)
		}
	}
	rt.Close()

	// Deleting removes the sandbox from its tenant's namespace.
	for _, w := range []struct {
		cl     *moat.Client
		id, ns string
	}{{alpha, sbA.ID, nsA}, {beta, sbB.ID, nsB}} {
		if err := w.cl.DeleteSandbox(ctx, w.id); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "BatchSandbox "+w.id+" deleted", func() (bool, string) {
			var b sbv1.BatchSandbox
			err := c.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: w.id}, &b)
			return client.IgnoreNotFound(err) == nil && err != nil, "still there"
		})
	}

	// The file is reread: a new key works and a removed tenant's key
	// stops working, without a restart.
	if err := os.WriteFile(file, []byte(`
[[tenants]]
name = "alpha"
namespace = "`+nsA+`"
api_keys = ["osk-alpha-new-0123456789"]

[[tenants]]
name = "beta"
api_keys = ["`+betaKey+`"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the reread tenants file", func() (bool, string) {
		_, errNew := cl("osk-alpha-new-0123456789").ListSandboxes(ctx, moat.ListOptions{})
		_, errOld := alpha.ListSandboxes(ctx, moat.ListOptions{})
		_, errGamma := gamma.ListSandboxes(ctx, moat.ListOptions{})
		return errNew == nil && errOld != nil && errGamma != nil, "new key, old key, gamma's key"
	})

	// A namespace deleted after the server used it: the same clear error
	// (envtest runs no namespace controller, so it stays Terminating).
	if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}); err != nil {
		t.Fatal(err)
	}
	_, err = beta.CreateSandbox(ctx, moat.CreateRequest{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		ResourceLimits: map[string]string{"cpu": "500m"}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Code != "TENANT::NAMESPACE_NOT_FOUND" {
		t.Errorf("create in a deleted namespace = %v, want 409 TENANT::NAMESPACE_NOT_FOUND", err)
	}
	var leftB sbv1.BatchSandboxList
	if err := c.List(ctx, &leftB, client.InNamespace(nsB)); err != nil || len(leftB.Items) != 0 {
		t.Errorf("a refused create in a deleted namespace left %d BatchSandboxes (%v)", len(leftB.Items), err)
	}
}

// fakeQuotaController fills the status of ResourceQuotas in ns as
// kube-controller-manager's quota controller would (envtest runs none,
// and the API server's quota admission refuses pods while a quota's
// status is unknown): hard from spec, used from zero.
func fakeQuotaController(t *testing.T, c client.Client, ns string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var list corev1.ResourceQuotaList
			if c.List(ctx, &list, client.InNamespace(ns)) == nil {
				for i := range list.Items {
					rq := &list.Items[i]
					if len(rq.Status.Hard) == len(rq.Spec.Hard) {
						continue
					}
					rq.Status.Hard = rq.Spec.Hard.DeepCopy()
					rq.Status.Used = corev1.ResourceList{}
					for k, v := range rq.Spec.Hard {
						z := v.DeepCopy()
						z.Set(0)
						rq.Status.Used[k] = z
					}
					c.Status().Update(ctx, rq)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// startTenantServer runs `moat serve --runtime kubernetes` in-process
// with API keys (edit sets them) and returns its URL.
func startTenantServer(t *testing.T, ns, scope string, edit func(*server.Config)) string {
	t.Helper()
	dir := t.TempDir()
	cfg := server.Default()
	cfg.Runtime = "kubernetes"
	cfg.Kubernetes = server.KubernetesConfig{Kubeconfig: env.Kubeconfig, Namespace: ns}
	cfg.Root, cfg.RunRoot = filepath.Join(dir, "root"), filepath.Join(dir, "run")
	cfg.Bridge = scope
	cfg.Listen = "127.0.0.1:0"
	cfg.LogLevel = "warn"
	edit(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := server.New(ctx, cfg, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		s.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; s.Close() })
	return "http://" + ln.Addr().String()
}
