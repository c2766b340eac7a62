package kubernetes_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	moat "github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/server"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// TestServerLifecycle drives the Lifecycle API of `moat serve --runtime
// kubernetes` (in-process, on loopback): a created sandbox is a
// BatchSandbox that reaches Running through the controller, and deleting
// it removes the BatchSandbox.
func TestServerLifecycle(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	dir := t.TempDir()
	cfg := server.Default()
	cfg.Runtime = "kubernetes"
	cfg.Kubernetes = server.KubernetesConfig{Kubeconfig: env.Kubeconfig, Namespace: ns}
	cfg.Root, cfg.RunRoot = filepath.Join(dir, "root"), filepath.Join(dir, "run")
	cfg.NoAuth = true
	cfg.Bridge = "moatk8s"
	cfg.Listen = "127.0.0.1:0"
	cfg.LogLevel = "warn"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := server.New(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; s.Close() })

	cl, err := moat.New("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// A policy is enforced by the pod's egress sidecar (the fake nodes'
	// pods get a stand-in of its egress API, k8stest): one that never
	// answers fails the create closed, leaving nothing behind (the
	// sidecar itself: TestNewPodAddsEgressSidecar, TestRealNode,
	// TestSidecar).
	func() {
		sub := &cleanups{}
		defer sub.run()
		env.WithoutSidecars(sub)
		_, err = cl.CreateSandbox(ctx, moat.CreateRequest{
			Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
			NetworkPolicy: &moat.NetworkPolicy{DefaultAction: "deny"},
		})
	}()
	var apiErr *moat.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != "SANDBOX::EGRESS_FAILED" {
		t.Errorf("create with a networkPolicy and no sidecar = %v, want SANDBOX::EGRESS_FAILED", err)
	}
	var left sbv1.BatchSandboxList
	if err := adminClient(t).List(ctx, &left, client.InNamespace(ns)); err != nil || len(left.Items) != 0 {
		t.Errorf("a failed create left %d BatchSandboxes (%v)", len(left.Items), err)
	}
	// One whose sidecar answers starts under its policy.
	filtered, err := cl.CreateSandbox(ctx, moat.CreateRequest{
		Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		NetworkPolicy: &moat.NetworkPolicy{DefaultAction: "deny"},
	})
	if err != nil {
		t.Fatalf("create with a networkPolicy: %v", err)
	}
	var fb sbv1.BatchSandbox
	if err := adminClient(t).Get(ctx, client.ObjectKey{Namespace: ns, Name: filtered.ID}, &fb); err != nil || len(fb.Endpoints()) != 1 {
		t.Fatalf("sandbox %s: %v %v", filtered.ID, err, fb.Endpoints())
	}
	if pol, _, ok := env.SidecarPolicy(fb.Endpoints()[0]); !ok || pol.DefaultAction != "deny" {
		t.Errorf("the sidecar of a sandbox created with a deny policy holds %+v (%v)", pol, ok)
	}
	if err := cl.DeleteSandbox(ctx, filtered.ID); err != nil {
		t.Fatal(err)
	}
	sb, err := cl.CreateSandbox(ctx, moat.CreateRequest{
		Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		Metadata: map[string]string{"team": "k8s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := cl.GetSandbox(ctx, sb.ID)
		if err == nil && got.Status.State == moat.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not Running: %+v, %v", sb.ID, got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := adminClient(t)
	var b sbv1.BatchSandbox
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: sb.ID}, &b); err != nil {
		t.Fatalf("no BatchSandbox for sandbox %s: %v", sb.ID, err)
	}
	if b.GetReplicas() != 1 || b.Status.Phase != sbv1.PhaseSucceed || len(b.Endpoints()) != 1 {
		t.Errorf("BatchSandbox %+v / %+v", b.Spec, b.Status)
	}
	if err := cl.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: sb.ID}, &b)
		if client.IgnoreNotFound(err) == nil && err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("BatchSandbox %s not deleted: %v", sb.ID, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanups collects cleanups to run at once (a scope shorter than a
// test's).
type cleanups struct{ fns []func() }

func (c *cleanups) Cleanup(f func()) { c.fns = append(c.fns, f) }

func (c *cleanups) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}
