package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
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
	bin        string
	controller *proc // moat controller
	nodeAgent  *proc // moat node
	// ctlArgs are further arguments of moat controller
	// (enableSnapshots).
	ctlArgs []string
}

// proc is a moat process of the stack, its log in a file.
type proc struct {
	cmd *exec.Cmd
	log *os.File
}

// startProc starts moat with args, logging to a file of t's.
func (k *kubeStack) startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	logf, err := os.CreateTemp(t.TempDir(), name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(k.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &proc{cmd: cmd, log: logf}
}

// stop ends p (SIGTERM) and returns its log.
func (p *proc) stop() string {
	if p == nil {
		return ""
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()
	p.log.Close()
	b, _ := os.ReadFile(p.log.Name())
	return string(b)
}

// startController (re)starts moat controller; pauses the nodes do not
// confirm in 3 s are undone.
func (k *kubeStack) startController(t *testing.T) {
	args := []string{"controller", "--kubeconfig", k.node.Kubeconfig, "--agent-image", k.agentImage, "--log-level", "warn", "--pause-timeout", "3s"}
	k.controller = k.startProc(t, "controller", append(args, k.ctlArgs...)...)
}

// enableSnapshots restarts moat controller with the node's loopback
// registry as its snapshot registry.
func (k *kubeStack) enableSnapshots(t *testing.T) {
	k.controller.stop()
	k.ctlArgs = []string{"--snapshot-registry", k.node.Registry.Host, "--commit-timeout", "20s"}
	k.startController(t)
}

// startNodeAgent (re)starts moat node on the node; it commits snapshots
// to the node's loopback registry when the controller hands it one.
func (k *kubeStack) startNodeAgent(t *testing.T) {
	k.nodeAgent = k.startProc(t, "node", "node", "--kubeconfig", k.node.Kubeconfig, "--node-name", k.node.Name,
		"--containerd-socket", k.node.ContainerdSocket, "--log-level", "warn", "--snapshot-registry", k.node.Registry.Host)
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
	k.bin = bin
	k.startController(t)
	k.startNodeAgent(t)
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
		nodeLog := k.nodeAgent.stop()
		ctlLog := k.controller.stop()
		if t.Failed() {
			t.Logf("controller log:\n%s", tail(ctlLog, 6000))
			t.Logf("moat node log:\n%s", tail(nodeLog, 3000))
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
// commands over SSE, files, endpoints, the server proxy, pause and resume,
// delete; then a kill -9 of the server, whose successor re-adopts the
// running sandbox (same pod, same files, same expiry) and renews it; then
// pause and resume across restarts (Pause).
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
	t.Run("Pause", func(t *testing.T) { kubernetesPause(t, k, srv) })
}

// kubernetesPause: with moat node down, a pause answers a clear error
// within the controller's budget and the sandbox keeps running; with it
// up, the sandbox pauses (its processes frozen, its agent silent), stays
// paused through a kill -9 of the server and a restart of the controller
// and of moat node, and resumes with its processes and files.
func kubernetesPause(t *testing.T, k *kubeStack, srv *server) {
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image": map[string]any{"uri": k.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
	}, &c)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/44772", nil, &ep)
	base := "http://" + ep.Endpoint
	evs := runCommand(t, base, ep.Headers, `sh -c 'while :; do cut -d" " -f1 /proc/uptime >> /tmp/ticks; sleep 0.05; done' >/dev/null 2>&1 & echo $!`)
	pid := stdoutOf(evs)
	state := func() string {
		var got sandboxResp
		srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID, nil, &got)
		return got.Status.State
	}

	// moat node is down: a clear error, and the sandbox runs on.
	k.nodeAgent.stop()
	start := time.Now()
	code, body, _ := srv.do("POST", "/v1/sandboxes/"+c.ID+"/pause", nil)
	srv.expect5xx(code, "POST /v1/sandboxes/{id}/pause")
	if code < 500 || !strings.Contains(string(body), `"code"`) || !strings.Contains(string(body), "moat node") {
		t.Fatalf("pause with moat node down: %d %s", code, body)
	}
	t.Logf("pause without moat node refused after %v: %d %s", time.Since(start), code, body)
	if st := state(); st != "Running" {
		t.Fatalf("after a failed pause: %s", st)
	}
	if out := stdoutOf(runCommand(t, base, ep.Headers, "echo still-running")); out != "still-running" {
		t.Fatalf("after a failed pause: %q", out)
	}

	// moat node is up: the sandbox pauses.
	k.startNodeAgent(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		start = time.Now()
		code, body, _ = srv.do("POST", "/v1/sandboxes/"+c.ID+"/pause", nil)
		if code == 202 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pause: %d %s", code, body)
		}
		if code >= 500 {
			srv.expect5xx(code, "POST /v1/sandboxes/{id}/pause")
		}
		// moat node's cache may not have synced yet.
		time.Sleep(time.Second)
	}
	t.Logf("pause took %v", time.Since(start))
	if st := state(); st != "Paused" {
		t.Fatalf("after pause: %s", st)
	}
	// The agent is frozen with the rest: a command gets no answer.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/ping", nil)
	for h, v := range ep.Headers {
		req.Header.Set(h, v)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a paused sandbox's agent answered: %s", resp.Status)
	}
	cancel()

	// Restarts of the server, the controller and moat node keep it paused.
	srv.kill9()
	k.controller.stop()
	k.nodeAgent.stop()
	k.startController(t)
	k.startNodeAgent(t)
	srv.start(k.serverArgs()...)
	if st := state(); st != "Paused" {
		t.Fatalf("after the restarts: %s", st)
	}
	time.Sleep(time.Second)
	start = time.Now()
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+c.ID+"/resume", nil, nil)
	t.Logf("resume took %v", time.Since(start))
	if st := state(); st != "Running" {
		t.Fatalf("after resume: %s", st)
	}
	time.Sleep(300 * time.Millisecond)
	out := stdoutOf(runCommand(t, base, ep.Headers, "kill -0 "+pid+" && echo alive; cat /tmp/ticks"))
	lines := strings.Fields(out)
	if len(lines) < 3 || lines[0] != "alive" {
		t.Fatalf("the sandbox's process did not survive the pause: %q", out)
	}
	var prev, gap float64
	for i, l := range lines[1:] {
		var v float64
		fmt.Sscan(l, &v)
		if i > 0 && v-prev > gap {
			gap = v - prev
		}
		prev = v
	}
	if gap < 1 {
		t.Errorf("longest gap between ticks %.2fs: the sandbox ran while paused", gap)
	}
}
