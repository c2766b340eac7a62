// Package k8s is `moat-bench k8s`: figures of moat's Kubernetes path on a
// cluster that exists (its kubeconfig; moat's CRDs installed), with `moat
// controller` as its own process at its default flags, behind a loopback
// proxy that counts its API writes, so the figures are what users get.
//
//   - Batches (N > 0; any cluster, kwok's fake nodes for large N): the time
//     to fill a Pool of N, and the wall time and API writes to deliver N
//     sandboxes as one BatchSandbox from the warm pool and cold.
//   - Sandboxes (Image set; real nodes, whose pod IPs this process can
//     reach): create -> Running -> first command of one sandbox at a time
//     through the kubernetes runtime (what `moat serve --runtime
//     kubernetes` runs), and a BatchSandbox of Warm sandboxes from a warm
//     Pool until each has answered its first command.
//
// Everything runs in a namespace of its own, deleted at the end. The
// throw-away clusters of `make bench-k8s` and `make bench-k8s-node` come
// from the test harness (internal/testutil/k8stest), which this package does
// not link.
package k8s

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/agentproto"
	sandboxbench "github.com/moat-sandbox/moat/internal/bench"
	"github.com/moat-sandbox/moat/internal/bench/k8s/apiwrites"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
)

// Options tune the benchmark.
type Options struct {
	// Kubeconfig is the cluster's client configuration ("" = $KUBECONFIG,
	// ~/.kube/config or in-cluster).
	Kubeconfig string
	// N is the pool and batch size of the batch figures (0 skips them).
	N int
	// Image, if set, is an image the nodes can pull and run (with sh,
	// echo and tail): the sandbox figures run with it.
	Image string
	// AgentImage is the controller's --agent-image (default "moat:bench",
	// which only fake nodes "run"; real nodes need a real one).
	AgentImage string
	// Creates is how many single sandboxes are timed (default 10).
	Creates int
	// Warm is the size of the warm batch of the sandbox figures (default 10).
	Warm int
	// Class is the RuntimeClass of the sandbox figures' pods ("" = the
	// node's default runtime).
	Class string
	// Timeout bounds each phase (default 5m).
	Timeout time.Duration
	// Moat is the moat binary whose `controller` verb is measured
	// (required).
	Moat string
	// ControllerArgs are extra flags for `moat controller`.
	ControllerArgs []string
}

// Result is one measured figure.
type Result struct {
	Mode string
	N    int
	Wall time.Duration
	// Latency summarizes per-sandbox times (the sandbox figures).
	Latency *sandboxbench.Percentiles
	// Writes are the controller's API writes, by "VERB resource".
	Writes map[string]int
	// ClientWrites are the writes of the requester (creating the batch).
	ClientWrites int
	// TableShards is, for a warm batch, how many of the pool's allocation
	// table shards its pods are in: the table writes its delivery needs
	// (one per shard; alloc.ShardOf).
	TableShards int
}

func (r Result) String() string {
	if r.Latency != nil {
		return fmt.Sprintf("k8s %-6s %v  controller-writes=%d", r.Mode, *r.Latency, apiwrites.Total(r.Writes))
	}
	keys := slices.Sorted(maps.Keys(r.Writes))
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Writes[k]))
	}
	shards := ""
	if r.TableShards > 0 {
		shards = fmt.Sprintf("  table-shards=%d", r.TableShards)
	}
	return fmt.Sprintf("k8s %-6s n=%d  wall=%-9v  controller-writes=%d (%s)  client-writes=%d%s",
		r.Mode, r.N, r.Wall.Round(time.Millisecond), apiwrites.Total(r.Writes), strings.Join(parts, " "), r.ClientWrites, shards)
}

// run is one benchmark run: the cluster, its namespace and the measured
// controller.
type run struct {
	o      Options
	cfg    *rest.Config // admin, straight to the API server (not counted)
	c      client.Client
	ns     string
	writes *apiwrites.Counter
	out    io.Writer
}

// Run measures the figures o asks for and prints one line each.
func Run(ctx context.Context, o Options, out io.Writer) (_ []Result, err error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	cfg, c, err := connect(ctx, o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "moat-bench-k8s-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &run{o: o, cfg: cfg, c: c, out: out, writes: &apiwrites.Counter{}, ns: fmt.Sprintf("moat-bench-%04x", rand.Uint32()&0xffff)}
	proxy, err := apiwrites.StartProxy(cfg, r.writes, dir)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); err != nil {
		return nil, err
	}
	defer func() {
		if derr := r.deleteNamespace(context.WithoutCancel(ctx)); err == nil {
			err = derr
		}
	}()
	if err := r.waitServiceAccount(ctx); err != nil {
		return nil, err
	}
	ctl, err := r.startController(ctx, proxy.Kubeconfig)
	if err != nil {
		return nil, err
	}
	defer func() { err = ctl.stop(ctx, err) }()
	if err := r.waitController(ctx, ctl.health); err != nil {
		return nil, err
	}
	return r.measure(ctx)
}

func (o *Options) defaults() error {
	if o.Creates <= 0 {
		o.Creates = 10
	}
	if o.Warm <= 0 {
		o.Warm = 10
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.AgentImage == "" {
		o.AgentImage = "moat:bench"
	}
	if o.N <= 0 && o.Image == "" {
		return errors.New("bench k8s: nothing to measure (set -n for the batch figures, --image for the sandbox figures)")
	}
	if o.Moat == "" {
		return errors.New("bench k8s: no moat binary to run (Options.Moat)")
	}
	return nil
}

// connect loads the kubeconfig and checks that moat's CRDs are installed.
func connect(ctx context.Context, kubeconfig string) (*rest.Config, client.Client, error) {
	cfg, err := kclient.Load(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	cfg = kclient.RateLimited(cfg, 0, 0)
	c, err := client.New(cfg, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		return nil, nil, err
	}
	if err := c.List(ctx, &sbv1.PoolList{}, client.Limit(1)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil, errors.New("bench k8s: moat's CRDs are not installed in this cluster (helm install deploy/helm/moat, or kubectl apply -f config/crd/bases)")
		}
		return nil, nil, fmt.Errorf("bench k8s: %w", err)
	}
	return cfg, c, nil
}

// controllerProc is the `moat controller` process of a run.
type controllerProc struct {
	r      *run
	cmd    *exec.Cmd
	cancel context.CancelFunc
	logs   bytes.Buffer
	health string // its /healthz and /readyz address
}

// startController starts `moat controller` on the run's namespace,
// through the API server at kubeconfig (the counting proxy).
func (r *run) startController(ctx context.Context, kubeconfig string) (*controllerProc, error) {
	health, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p := &controllerProc{r: r, health: health}
	cctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	p.cmd = exec.CommandContext(cctx, r.o.Moat, append([]string{"controller", "--kubeconfig", kubeconfig,
		"--agent-image", r.o.AgentImage, "--namespace", r.ns, "--log-level", "error", "--health-addr", health}, r.o.ControllerArgs...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	if err := p.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start moat controller: %w", err)
	}
	return p, nil
}

// stop lets the controller release what the benchmark made (finalizers),
// then stops it; err is the run's error, returned with the controller's
// output appended (or the clean-up's error when the run had none).
func (p *controllerProc) stop(ctx context.Context, err error) error {
	if cerr := p.r.cleanUp(context.WithoutCancel(ctx)); err == nil {
		err = cerr
	}
	p.cancel()
	p.cmd.Wait()
	if err != nil && p.logs.Len() > 0 {
		err = fmt.Errorf("%w\ncontroller output:\n%s", err, p.logs.String())
	}
	return err
}

// waitController returns once the controller reconciles: the figures
// start then, not with its start-up.
func (r *run) waitController(ctx context.Context, health string) error {
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		res, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, fmt.Errorf("readyz: %s", res.Status)
	}); err != nil {
		return fmt.Errorf("moat controller not ready: %w", err)
	}
	// /readyz answers once the process serves; its workers start after
	// their caches synced (over a second on a busy host): a Pool of none,
	// reconciled, says they run.
	probe := &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "probe"},
		Spec: sbv1.PoolSpec{Template: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "busybox:bench"}}}}}}
	if err := r.c.Create(ctx, probe); err != nil {
		return err
	}
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		err := r.c.Get(ctx, client.ObjectKeyFromObject(probe), probe)
		return err == nil && probe.Status.ObservedGeneration == probe.Generation, err
	}); err != nil {
		return fmt.Errorf("moat controller does not reconcile: %w", err)
	}
	return nil
}

// measure takes the figures the options ask for.
func (r *run) measure(ctx context.Context) ([]Result, error) {
	var results []Result
	if r.o.N > 0 {
		res, err := r.batches(ctx)
		results = append(results, res...)
		if err != nil {
			return results, err
		}
	}
	if r.o.Image != "" {
		res, err := r.sandboxes(ctx)
		results = append(results, res...)
		if err != nil {
			return results, err
		}
	}
	return results, nil
}

// waitServiceAccount waits for the namespace's default service account
// (real clusters refuse pods before the controller-manager made it).
func (r *run) waitServiceAccount(ctx context.Context) error {
	return waitFor(ctx, time.Minute, func() (bool, error) {
		var sa corev1.ServiceAccount
		err := r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: "default"}, &sa)
		if apierrors.IsNotFound(err) {
			// envtest runs no controller-manager: make it.
			err = r.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "default"}})
			if apierrors.IsAlreadyExists(err) {
				err = nil
			}
		}
		return err == nil, err
	})
}

// cleanUp deletes the batches and pools of the run and waits until the
// controller has released them.
func (r *run) cleanUp(ctx context.Context) error {
	r.c.DeleteAllOf(ctx, &sbv1.BatchSandbox{}, client.InNamespace(r.ns))
	r.c.DeleteAllOf(ctx, &sbv1.Pool{}, client.InNamespace(r.ns))
	return waitFor(ctx, 2*time.Minute, func() (bool, error) {
		var bl sbv1.BatchSandboxList
		var pl sbv1.PoolList
		if err := r.c.List(ctx, &bl, client.InNamespace(r.ns)); err != nil {
			return false, err
		}
		if err := r.c.List(ctx, &pl, client.InNamespace(r.ns)); err != nil {
			return false, err
		}
		return len(bl.Items)+len(pl.Items) == 0, nil
	})
}

// deleteNamespace deletes the run's namespace and waits until it is gone.
func (r *run) deleteNamespace(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}
	if err := r.c.Delete(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// envtest has no namespace controller: a namespace stays Terminating
	// there, which is harmless; a real cluster empties and removes it.
	return nil
}

// batches measures a pool fill, a warm and a cold batch of N.
func (r *run) batches(ctx context.Context) ([]Result, error) {
	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "sandbox", Image: "busybox:bench", Command: []string{"sleep", "infinity"},
	}}}}
	if r.o.Image != "" {
		tpl.Spec.Containers[0].Image = r.o.Image
	}
	n := int32(r.o.N)
	var results []Result

	// Pool fill: from the Pool's creation to N available pods.
	before := r.writes.Snapshot()
	start := time.Now()
	if err := r.c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "warm"},
		Spec: sbv1.PoolSpec{Template: tpl, CapacitySpec: sbv1.CapacitySpec{PoolMin: n, PoolMax: n}}}); err != nil {
		return nil, err
	}
	if err := r.waitPool(ctx, "warm", n); err != nil {
		return nil, fmt.Errorf("warming the pool: %w", err)
	}
	fill := Result{Mode: "fill", N: r.o.N, Wall: time.Since(start), Writes: r.writes.Since(before), ClientWrites: 1}
	results = append(results, fill)
	fmt.Fprintln(r.out, fill)
	time.Sleep(time.Second) // let the pool's last status write land before counting

	for _, mode := range []string{"warm", "cold"} {
		b := &sbv1.BatchSandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "batch-" + mode},
			Spec:       sbv1.BatchSandboxSpec{Replicas: &n},
		}
		if mode == "warm" {
			b.Spec.PoolRef = "warm"
		} else {
			b.Spec.Template = tpl
		}
		before := r.writes.Snapshot()
		start := time.Now()
		if err := r.c.Create(ctx, b); err != nil {
			return results, err
		}
		if err := r.waitBatch(ctx, b, n); err != nil {
			return results, fmt.Errorf("%s batch: %w", mode, err)
		}
		wall := time.Since(start)
		time.Sleep(500 * time.Millisecond) // count writes that trail the allocation too
		res := Result{Mode: mode, N: r.o.N, Wall: wall, Writes: r.writes.Since(before), ClientWrites: 1}
		if mode == "warm" {
			stored, err := alloc.ReadShards(ctx, r.c, client.ObjectKey{Namespace: r.ns, Name: "warm"})
			if err != nil || len(stored) == 0 {
				return results, fmt.Errorf("read the pool's allocation table: %d shards, %v", len(stored), err)
			}
			shards := map[int]bool{}
			for _, pod := range b.AllocatedPods() {
				shards[alloc.ShardOf(pod, stored[0].Count)] = true
			}
			res.TableShards = len(shards)
		}
		results = append(results, res)
		fmt.Fprintln(r.out, res)
	}
	// The batches' pods go before the sandbox figures (a real node is small).
	return results, r.cleanUp(ctx)
}

func (r *run) waitPool(ctx context.Context, name string, n int32) error {
	return waitFor(ctx, r.o.Timeout, func() (bool, error) {
		var p sbv1.Pool
		err := r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: name}, &p)
		return err == nil && p.Status.Available == n && p.Status.Total == n, err
	})
}

func (r *run) waitBatch(ctx context.Context, b *sbv1.BatchSandbox, n int32) error {
	return waitFor(ctx, r.o.Timeout, func() (bool, error) {
		err := r.c.Get(ctx, client.ObjectKeyFromObject(b), b)
		return err == nil && b.Status.Phase == sbv1.PhaseSucceed && b.Status.Ready == n, err
	})
}

// sandboxes measures create -> Running -> first command of Creates single
// sandboxes through the kubernetes runtime, one at a time, and a batch of
// Warm sandboxes from a warm Pool until each answered its first command.
func (r *run) sandboxes(ctx context.Context) ([]Result, error) {
	rt, err := kubernetes.New(r.cfg, kubernetes.Config{Namespace: r.ns, CreateTimeout: r.o.Timeout})
	if err != nil {
		return nil, err
	}
	defer rt.Close()
	agent := &sandboxbench.Client{HTTP: &http.Client{Timeout: time.Minute}}
	var results []Result
	single, err := r.singleCreates(ctx, rt, agent)
	if err != nil {
		return results, err
	}
	results = append(results, single)
	fmt.Fprintln(r.out, single)

	// A warm batch: fill a Pool of Warm, then one BatchSandbox of Warm
	// from it; the wall time ends when every sandbox answered a command.
	fill, err := r.fillWarm(ctx)
	if err != nil {
		return results, err
	}
	fmt.Fprintln(r.out, fill)
	results = append(results, fill)
	time.Sleep(time.Second)
	warm, err := r.warmBatch(ctx, agent)
	if err != nil {
		return results, err
	}
	results = append(results, warm)
	fmt.Fprintf(r.out, "%v  wall=%v\n", warm, warm.Wall.Round(time.Millisecond))
	return results, nil
}

// singleCreates times create -> Running -> first command of Creates
// sandboxes, one at a time, through the kubernetes runtime.
func (r *run) singleCreates(ctx context.Context, rt *kubernetes.Runtime, agent *sandboxbench.Client) (Result, error) {
	var lat []time.Duration
	before := r.writes.Snapshot()
	for i := range r.o.Creates {
		id := fmt.Sprintf("bench-%d-%04x", i, rand.Uint32()&0xffff)
		tok := alloc.NewToken()
		start := time.Now()
		st, err := rt.Create(ctx, runtime.Spec{ID: id, Image: r.o.Image, Class: r.o.Class, AgentToken: tok, Entrypoint: []string{"tail", "-f", "/dev/null"}})
		if err != nil {
			return Result{}, fmt.Errorf("create %s: %w", id, err)
		}
		err = firstCommand(ctx, agent, st.IP, tok, r.o.Timeout)
		lat = append(lat, time.Since(start))
		if derr := rt.Delete(ctx, id); err == nil {
			err = derr
		}
		if err != nil {
			return Result{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	p := sandboxbench.Summarize(lat)
	return Result{Mode: "create", N: len(lat), Latency: &p, Writes: r.writes.Since(before)}, nil
}

// fillWarm times the fill of the Pool node-warm of Warm real pods.
func (r *run) fillWarm(ctx context.Context) (Result, error) {
	n := int32(r.o.Warm)
	before := r.writes.Snapshot()
	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "sandbox", Image: r.o.Image, Command: []string{"tail", "-f", "/dev/null"},
	}}}}
	if r.o.Class != "" {
		tpl.Spec.RuntimeClassName = &r.o.Class
	}
	start := time.Now()
	if err := r.c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "node-warm"},
		Spec: sbv1.PoolSpec{Template: tpl, CapacitySpec: sbv1.CapacitySpec{PoolMin: n, PoolMax: n}}}); err != nil {
		return Result{}, err
	}
	if err := r.waitPool(ctx, "node-warm", n); err != nil {
		return Result{}, fmt.Errorf("warming the pool: %w", err)
	}
	return Result{Mode: "fill", N: r.o.Warm, Wall: time.Since(start), Writes: r.writes.Since(before)}, nil
}

// warmBatch times one BatchSandbox of Warm from the Pool node-warm until
// each of its sandboxes answered a command.
func (r *run) warmBatch(ctx context.Context, agent *sandboxbench.Client) (Result, error) {
	n := int32(r.o.Warm)
	b := &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "node-batch"},
		Spec: sbv1.BatchSandboxSpec{Replicas: &n, PoolRef: "node-warm"}}
	before := r.writes.Snapshot()
	start := time.Now()
	if err := r.c.Create(ctx, b); err != nil {
		return Result{}, err
	}
	if err := r.waitBatch(ctx, b, n); err != nil {
		return Result{}, fmt.Errorf("warm batch: %w", err)
	}
	var toks corev1.Secret
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.ns, Name: alloc.TokenSecretName("node-warm")}, &toks); err != nil {
		return Result{}, err
	}
	pods, ips := b.AllocatedPods(), b.Endpoints()
	if len(pods) != int(n) || len(ips) != int(n) {
		return Result{}, fmt.Errorf("warm batch: pods %v, endpoints %v", pods, ips)
	}
	per := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			errs[i] = firstCommand(ctx, agent, ips[i], string(toks.Data[pods[i]]), r.o.Timeout)
			per[i] = time.Since(start)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Result{}, fmt.Errorf("warm batch: %w", err)
	}
	wp := sandboxbench.Summarize(per)
	return Result{Mode: "warm", N: int(n), Wall: slices.Max(per), Latency: &wp, Writes: r.writes.Since(before), ClientWrites: 1}, nil
}

// freeAddr returns a free loopback address.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// firstCommand runs `echo ok` through the agent at ip (retrying while it
// does not listen yet) and checks its output.
func firstCommand(ctx context.Context, agent *sandboxbench.Client, ip, token string, timeout time.Duration) error {
	ep := sandboxbench.Endpoint{Endpoint: net.JoinHostPort(ip, strconv.Itoa(agentproto.Port)), Headers: map[string]string{agentproto.TokenHeader: token}}
	var out string
	var last error
	err := waitFor(ctx, timeout, func() (bool, error) {
		out, last = agent.Run(ctx, ep, "echo ok")
		return last == nil, last
	})
	if err != nil {
		return err
	}
	if out != "ok" {
		return fmt.Errorf("first command printed %q", out)
	}
	return nil
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return fmt.Errorf("timed out after %v (last error %v)", timeout, last)
}
