package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// kubeStack is a real single-node cluster with `moat controller` running
// against it (its own process) and a namespace for the sandboxes.
type kubeStack struct {
	node       *k8stest.Node
	ref        string // busybox, as startRegistry pushes it
	agentImage string
	ns         string
}

func startKubeStack(t *testing.T) *kubeStack {
	t.Helper()
	node := k8stest.StartTestNode(t)
	ctx := context.Background()
	k := &kubeStack{node: node, ns: "moat-e2e"}
	var err error
	if k.ref, err = node.Registry.PushDir(ctx, testutil.BusyboxRootfs(t), "e2e/busybox:1",
		[]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FROM_IMAGE=yes"}); err != nil {
		t.Fatal(err)
	}
	bin := testutil.MoatBinary(t)
	if k.agentImage, err = node.PushAgentImage(ctx, bin); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.ns}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var sa corev1.ServiceAccount
		if c.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: "default"}, &sa) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no default service account in the sandboxes' namespace")
		}
		time.Sleep(50 * time.Millisecond)
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "controller", "--kubeconfig", node.Kubeconfig, "--agent-image", k.agentImage, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Sandboxes first (the server's cleanup ran already), then the
		// controller that releases their pods.
		var list sbv1.BatchSandboxList
		c.List(context.Background(), &list, client.InNamespace(k.ns))
		for i := range list.Items {
			c.Delete(context.Background(), &list.Items[i])
		}
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if c.List(context.Background(), &list, client.InNamespace(k.ns)) == nil && len(list.Items) == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("controller log:\n%s", tail(string(b), 6000))
		}
	})
	return k
}

func (k *kubeStack) serverArgs() []string {
	return []string{"--runtime", "kubernetes", "--kubeconfig", k.node.Kubeconfig, "--k8s-namespace", k.ns, "--k8s-request-fraction", "0.1",
		// The egress sidecars' DNS upstream: the pod's own loopback, where
		// nothing answers (no test resolves a name under a policy).
		"--dns-upstream", "127.0.0.1:9"}
}

// TestKubernetesLifecycle drives `moat serve --runtime kubernetes` against
// a real node: each sandbox is a real pod running moat's agent; create,
// commands over SSE, files, endpoints, the server proxy, a refused pause,
// delete; then a kill -9 of the server, whose successor re-adopts the
// running sandbox (same pod, same files, same expiry) and renews it.
func TestKubernetesLifecycle(t *testing.T) {
	k := startKubeStack(t)
	srv := newServer(t)
	srv.start(k.serverArgs()...)
	t.Run("RoundTrip", func(t *testing.T) { lifecycleRoundTrip(t, srv, k.ref, "kubernetes") })
	t.Run("KillAndReadopt", func(t *testing.T) {
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
			"image": map[string]any{"uri": k.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
		}, &c)
		var ep endpointResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/44772", nil, &ep)
		runCommand(t, "http://"+ep.Endpoint, ep.Headers, "echo state > /tmp/marker")
		var before sandboxResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID, nil, &before)

		srv.kill9()
		srv.start(k.serverArgs()...)

		var got sandboxResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID, nil, &got)
		if got.Status.State != "Running" || got.ExpiresAt != before.ExpiresAt {
			t.Fatalf("after restart: %+v (before %+v)", got, before)
		}
		var ep2 endpointResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/44772", nil, &ep2)
		if evs := runCommand(t, "http://"+ep2.Endpoint, ep2.Headers, "cat /tmp/marker"); stdoutOf(evs) != "state" {
			t.Fatalf("adopted sandbox lost state: %+v", evs)
		}
		// Renew works on the adopted sandbox.
		srv.mustJSON(200, "POST", "/v1/sandboxes/"+c.ID+"/renew-expiration", map[string]any{
			"expiresAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, nil)
		if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil); code != 204 {
			t.Fatalf("delete: %d %s", code, body)
		}
	})
}
