// Package k8stest starts throw-away Kubernetes clusters for tests and for
// the figures of `moat bench k8s` (make bench-k8s, make bench-k8s-node; the
// moat binary does not link this package): a real kube-apiserver and etcd (envtest), with
// moat's CRDs installed, plus kwok, which makes pods on fake nodes reach
// Running. No container runs: pod IPs are fake addresses nothing may dial,
// unless Options.Agents gives pods loopback IPs with stand-in agents.
// envtest runs no scheduler, so Env binds unscheduled pods to the fake
// nodes itself.
//
// The binaries come from scripts/build-k8s-tools.sh, which builds them
// from the Go module proxy into ${MOAT_CACHE:-/var/cache/moat}/k8s/<version>;
// KUBEBUILDER_ASSETS overrides the directory.
package k8stest

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/moat-sandbox/moat/config/crd"
)

// K8sVersion is the Kubernetes release the tools are built at.
const K8sVersion = "v1.37.2"

//go:embed kwok-stages.yaml
var kwokStages []byte

// AssetsDir is where kube-apiserver, etcd and kwok are looked for.
func AssetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("MOAT_CACHE")
	if cache == "" {
		cache = "/var/cache/moat"
	}
	return filepath.Join(cache, "k8s", K8sVersion)
}

// RequireEnv is the environment variable that turns missing tools from a
// skip into a failure (`make test` sets it after building them).
const RequireEnv = "MOAT_REQUIRE_K8S"

// Missing returns the tools absent from AssetsDir (nil: all present).
func Missing() []string {
	var out []string
	for _, b := range []string{"kube-apiserver", "etcd", "kwok"} {
		if fi, err := os.Stat(filepath.Join(AssetsDir(), b)); err != nil || fi.Mode()&0o111 == 0 {
			out = append(out, b)
		}
	}
	return out
}

// Env is a running control plane.
type Env struct {
	// Config is an admin client configuration.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for Config (for subprocesses).
	Kubeconfig string
	// Nodes are the names of the fake nodes.
	Nodes []string

	env     *envtest.Environment
	agents  *agents
	dir     string
	kwok    *exec.Cmd
	kwokOut *os.File
	block   *os.File // the lock of the pods' loopback block (Agents)
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// Options tune Start.
type Options struct {
	// Nodes is the number of fake nodes (default 2).
	Nodes int
	// Log receives kwok's output (default: a file in the env's directory).
	Log io.Writer
	// Agents gives pods loopback IPs (a 127.x.0.0/16 of the process's own,
	// see leaseBlock) and serves a stand-in
	// agent on each running pod's IP (see agents), so that tests can go
	// through the agent path. Without it pod IPs are fake addresses in
	// 10.244.0.0/16 that nothing may dial.
	Agents bool
	// NoCRDs leaves moat's CRDs out (a cluster moat is not installed in).
	NoCRDs bool
}

// Start brings up the control plane. Stop it with Stop.
func Start(ctx context.Context, o Options) (_ *Env, err error) {
	if m := Missing(); len(m) > 0 {
		return nil, fmt.Errorf("k8stest: %s missing in %s (run scripts/build-k8s-tools.sh)", strings.Join(m, ", "), AssetsDir())
	}
	if o.Nodes <= 0 {
		o.Nodes = 2
	}
	crds, err := crd.Objects()
	if err != nil {
		return nil, err
	}
	if o.NoCRDs {
		crds = nil
	}
	dir, err := os.MkdirTemp("", "moat-k8stest-")
	if err != nil {
		return nil, err
	}
	e := &Env{dir: dir, env: &envtest.Environment{
		BinaryAssetsDirectory:    AssetsDir(),
		CRDs:                     crds,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if e.Config, err = e.env.Start(); err != nil {
		return nil, fmt.Errorf("k8stest: start control plane: %w", err)
	}
	e.Config.QPS, e.Config.Burst = 1000, 2000
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeAdminKubeconfig(e.env, e.Kubeconfig); err != nil {
		return nil, err
	}
	stages := filepath.Join(dir, "kwok.yaml")
	if err := os.WriteFile(stages, kwokStages, 0o600); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return nil, err
	}
	if err := e.createNodes(ctx, cs, o.Nodes); err != nil {
		return nil, err
	}
	if err := e.startKwok(stages, o.Log, o.Agents); err != nil {
		return nil, err
	}
	run, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	ready := make(chan error, 1)
	e.wg.Go(func() { e.bind(run, cs, ready) })
	if err := <-ready; err != nil {
		return nil, err
	}
	if o.Agents {
		e.agents = &agents{cs: cs, serving: map[string]*agent{}}
		e.wg.Go(func() { e.agents.run(run) })
	}
	return e, nil
}

// writeAdminKubeconfig writes a kubeconfig of a system:masters user of
// env's control plane to path, for subprocesses.
func writeAdminKubeconfig(env *envtest.Environment, path string) error {
	user, err := env.AddUser(envtest.User{Name: "moat-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, kc, 0o600)
}

// createNodes registers n fake nodes that kwok (its node annotation)
// then keeps ready.
func (e *Env) createNodes(ctx context.Context, cs kubernetes.Interface, n int) error {
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("kwok-node-%d", i),
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels:      map[string]string{"type": "kwok"},
		}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("k8stest: create node: %w", err)
		}
		e.Nodes = append(e.Nodes, node.Name)
	}
	return nil
}

func (e *Env) startKwok(stages string, logw io.Writer, loopback bool) error {
	if logw == nil {
		f, err := os.Create(filepath.Join(e.dir, "kwok.log"))
		if err != nil {
			return err
		}
		e.kwokOut, logw = f, f
	}
	// Fake pod addresses: nothing listens there and nothing may dial them.
	cidr, nodeIP := "10.244.0.0/16", "10.244.0.1"
	if loopback {
		b, f, err := leaseBlock()
		if err != nil {
			return err
		}
		e.block = f
		cidr, nodeIP = fmt.Sprintf("127.%d.0.0/16", b), fmt.Sprintf("127.%d.0.1", b)
	}
	e.kwok = exec.Command(filepath.Join(AssetsDir(), "kwok"),
		"--kubeconfig", e.Kubeconfig,
		"--config", stages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--cidr="+cidr,
		"--node-ip="+nodeIP,
	)
	e.kwok.Stdout, e.kwok.Stderr = logw, logw
	if err := e.kwok.Start(); err != nil {
		return fmt.Errorf("k8stest: start kwok: %w", err)
	}
	return nil
}

// bind assigns unscheduled pods to the fake nodes (round robin): the job
// of kube-scheduler, which envtest does not run.
func (e *Env) bind(ctx context.Context, cs kubernetes.Interface, ready chan<- error) {
	sel := fields.OneTermEqualSelector("spec.nodeName", "").String()
	next := 0
	first := true
	for ctx.Err() == nil {
		list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			if first {
				ready <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		w, err := cs.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			if first {
				ready <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if first {
			ready <- nil
			first = false
		}
		for i := range list.Items {
			e.bindOne(ctx, cs, &list.Items[i], &next)
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				e.bindOne(ctx, cs, p, &next)
			}
		}
		w.Stop()
	}
}

func (e *Env) bindOne(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, next *int) {
	if p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
		return
	}
	node := e.Nodes[*next%len(e.Nodes)]
	*next++
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	// Errors: the pod was deleted meanwhile, or bound by an earlier pass.
	_ = cs.CoreV1().Pods(p.Namespace).Bind(ctx, b, metav1.CreateOptions{})
}

// Stop tears everything down.
func (e *Env) Stop() error {
	if e.cancel != nil {
		e.cancel()
	}
	e.wg.Wait()
	if e.kwok != nil && e.kwok.Process != nil {
		e.kwok.Process.Kill()
		e.kwok.Wait()
	}
	if e.kwokOut != nil {
		e.kwokOut.Close()
	}
	if e.block != nil {
		e.block.Close()
	}
	var err error
	if e.env != nil && e.env.ControlPlane.APIServer != nil {
		err = e.env.Stop()
	}
	os.RemoveAll(e.dir)
	return err
}

// KwokLog returns kwok's output so far (when Options.Log was nil).
func (e *Env) KwokLog() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "kwok.log"))
	return string(b)
}
