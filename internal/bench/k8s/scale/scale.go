// Package scale is the cluster-scale scenario of the Lifecycle API's claim
// path on Kubernetes (issue #19), behind `moat-bench k8s claims`: on the
// cluster of a kubeconfig (fake nodes such as kwok's suit it: the pods'
// agents are never called), in a namespace of its own, `moat controller`
// and R replicas of `moat serve --runtime kubernetes` as processes at
// their defaults (each behind a loopback proxy that counts its API
// writes), a Pool of P warm pods made through the Lifecycle API, then C single claims by W
// concurrent clients spread over the replicas and one batch of B. It
// reports the pool's fill time, claim latency (p50, p99, max), the claim
// throughput, the batch's wall time and the servers' API writes, and checks
// the ledger first: every claim answered, each claimed sandbox owns
// exactly one pod in the pool's allocation table, no pod is owned twice,
// and every replica lists every sandbox. A run whose check fails returns
// an error and no figures.
package scale

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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	moat "github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/bench/k8s/apiwrites"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
)

// Options size the scenario.
type Options struct {
	// Kubeconfig is the cluster's kubeconfig ("": $KUBECONFIG,
	// ~/.kube/config, or in-cluster). It must have moat's CRDs.
	Kubeconfig string
	// Pool is the number of warm pods (default 1000).
	Pool int
	// Batch is the size of a batch claim (default 100); Batches batches
	// (default 1) are claimed one after another, through the replicas in
	// turn, after the single claims, which take the rest of the pool.
	Batch, Batches int
	// Claims is the number of single claims (default: the rest of the
	// pool after the batch).
	Claims int
	// PolicyClaims, if set, are single claims with a network policy
	// after the others, each followed by one without (by the same W
	// clients; 2×PolicyClaims pods), for comparison under the same load:
	// a claim with a policy sets it through its pod's egress sidecar
	// before it answers. The pool's pods then need an egress API at their IPs
	// (kwok's pods with the test harness's stand-in sidecars, which
	// enforce nothing: the figure is the server's path and one sidecar
	// round trip, not nftables), and the servers get a DNS upstream so
	// that the pool's pods have a sidecar.
	PolicyClaims int
	// CRDClaims, if set, are claims of one through the CRD path after the
	// others, for comparison: a BatchSandbox of one with the pool's
	// poolRef per claim, by W clients, each done when the batch shows its
	// pod ready (the controller's allocation).
	CRDClaims int
	// Replicas is the number of server replicas (default 2).
	Replicas int
	// Workers is the number of concurrent clients (default 16).
	Workers int
	// Moat is the moat binary to run as controller and servers (required).
	Moat string
	// Timeout bounds the pool fill (default 10 minutes).
	Timeout time.Duration
	// Chaos kills the last replica and the controller (SIGKILL) halfway
	// through the single claims and starts a new controller: the claims
	// the killed replica had not answered are lost to their clients, and
	// the check then wants their pods given back (the surviving leader's
	// orphan sweep, with a grace of a few seconds) and every answered
	// claim kept. The figures of such a run are not the steady state.
	Chaos bool
}

// Result holds the figures of one run.
type Result struct {
	Options
	// Nodes are the cluster's nodes.
	Nodes int
	// Fill is the time from the pool's creation to Pool available pods.
	Fill time.Duration
	// Claims single claims took ClaimWall; P50, P99 and Max are their
	// latencies.
	Claims        int
	ClaimWall     time.Duration
	P50, P99, Max time.Duration
	// BatchWall is the median batch's wall time, BatchMax the longest.
	BatchWall, BatchMax time.Duration
	ClaimWrites         map[string]int
	// BatchWrites are the writes of all the batches.
	BatchWrites map[string]int
	// Unanswered are the claims the killed replica never answered
	// (Chaos); of those it had made, GivenBack had no record and their
	// pods were given back, Recorded had one (sandboxes whose answer
	// alone was lost).
	Unanswered, GivenBack, Recorded int
	// PolicyP50 and PolicyP99 are the latencies of the PolicyClaims,
	// PairedP50 and PairedP99 those of the plain claims made between
	// them, PolicyWrites the writes of both.
	PolicyP50, PolicyP99 time.Duration
	PairedP50, PairedP99 time.Duration
	PolicyWrites         map[string]int
	// CRD are the CRD path's figures (CRDClaims).
	CRDWall        time.Duration
	CRDP50, CRDP99 time.Duration
	// TableBytes is the size of the pool's allocation table at the end
	// (all its shards), ShardBytes the largest shard's: a write carries
	// one shard.
	TableBytes, ShardBytes int
}

// PerSecond is the single claims' throughput.
func (r Result) PerSecond() float64 { return float64(r.Claims) / r.ClaimWall.Seconds() }

func (r Result) String() string {
	crd := ""
	if r.CRDClaims > 0 {
		crd = fmt.Sprintf("  crd-claims=%d in %v (%.0f/s) p50=%v p99=%v", r.CRDClaims, r.CRDWall.Round(time.Millisecond),
			float64(r.CRDClaims)/r.CRDWall.Seconds(), r.CRDP50.Round(100*time.Microsecond), r.CRDP99.Round(100*time.Microsecond))
	}
	if r.PolicyClaims > 0 {
		crd = fmt.Sprintf("  policy-claims=%d p50=%v p99=%v, plain ones between them p50=%v p99=%v, writes=%d (%s)", r.PolicyClaims,
			r.PolicyP50.Round(100*time.Microsecond), r.PolicyP99.Round(100*time.Microsecond),
			r.PairedP50.Round(100*time.Microsecond), r.PairedP99.Round(100*time.Microsecond),
			apiwrites.Total(r.PolicyWrites), fmtWrites(r.PolicyWrites)) + crd
	}
	chaos := ""
	if r.Chaos {
		chaos = fmt.Sprintf(" chaos (a replica and the controller killed; %d claims unanswered: %d pods given back, %d recorded)", r.Unanswered, r.GivenBack, r.Recorded)
	}
	return fmt.Sprintf("k8s scale%s nodes=%d pool=%d replicas=%d workers=%d: fill=%v  claims=%d in %v (%.0f/s) p50=%v p99=%v max=%v writes=%d (%s)  batch=%dx%d wall p50=%v max=%v writes=%d (%s)  table=%d bytes (largest shard %d)%s  ledger ok",
		chaos, r.Nodes, r.Pool, r.Replicas, r.Workers, r.Fill.Round(time.Millisecond),
		r.Claims, r.ClaimWall.Round(time.Millisecond), r.PerSecond(), r.P50.Round(100*time.Microsecond), r.P99.Round(100*time.Microsecond), r.Max.Round(100*time.Microsecond),
		apiwrites.Total(r.ClaimWrites), fmtWrites(r.ClaimWrites),
		r.Batch, r.Batches, r.BatchWall.Round(100*time.Microsecond), r.BatchMax.Round(100*time.Microsecond), apiwrites.Total(r.BatchWrites), fmtWrites(r.BatchWrites), r.TableBytes, r.ShardBytes, crd)
}

func fmtWrites(w map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(w)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, w[k]))
	}
	return strings.Join(parts, " ")
}

func (o *Options) defaults() error {
	if o.Pool <= 0 {
		o.Pool = 1000
	}
	if o.Batch <= 0 {
		o.Batch = min(100, o.Pool/2)
	}
	if o.Batches <= 0 {
		o.Batches = 1
	}
	batched := o.batched()
	if batched > o.Pool {
		return fmt.Errorf("%d batches of %d are more than the pool %d", o.Batches, o.Batch, o.Pool)
	}
	if o.CRDClaims < 0 || o.PolicyClaims < 0 || o.CRDClaims+2*o.PolicyClaims > o.Pool-batched-1 {
		return fmt.Errorf("%d CRD and 2×%d policy claims do not fit a pool of %d with %d batches of %d and a single claim", o.CRDClaims, o.PolicyClaims, o.Pool, o.Batches, o.Batch)
	}
	if o.Claims <= 0 || o.Claims > o.Pool-batched-o.CRDClaims-2*o.PolicyClaims {
		o.Claims = o.Pool - batched - o.CRDClaims - 2*o.PolicyClaims
	}
	if o.Chaos && o.PolicyClaims > 0 {
		return errors.New("a chaos run makes no policy claims")
	}
	if o.Replicas <= 0 {
		o.Replicas = 2
	}
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Moat == "" {
		return errors.New("no moat binary to run (Options.Moat)")
	}
	return nil
}

// batched is the number of sandboxes the batches claim.
func (o *Options) batched() int { return o.Batch * o.Batches }

// proc is a moat process of the run.
type proc struct {
	cmd  *exec.Cmd
	logs *bytes.Buffer
	done chan struct{}
}

func start(ctx context.Context, bin string, args ...string) (*proc, error) {
	p := &proc{logs: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	p.cmd.WaitDelay = 20 * time.Second
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start moat %s: %w", args[0], err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Run runs the scenario once and prints its figures to out.
func Run(ctx context.Context, o Options, out io.Writer) (res Result, err error) {
	if err := o.defaults(); err != nil {
		return Result{}, err
	}
	res.Options = o
	r := &run{o: o, res: &res}
	if err := r.connect(ctx); err != nil {
		return res, err
	}
	if r.dir, err = os.MkdirTemp("", "moat-scale-"); err != nil {
		return res, err
	}
	defer os.RemoveAll(r.dir)
	r.ns, r.scope = fmt.Sprintf("moat-scale-%04x", rand.Uint32()&0xffff), "moatscale"
	if err := r.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); err != nil {
		return res, err
	}
	// The namespace goes at the end (the processes stop first: deferred
	// later, run earlier), with everything the run made; the proxies go
	// before the processes stop.
	defer r.deleteNamespace(ctx, &err)
	defer r.stopProcs(&err)
	defer r.closeProxies()
	if err := r.startController(ctx); err != nil {
		return res, err
	}
	for i := range o.Replicas {
		if err := r.startReplica(ctx, i); err != nil {
			return res, err
		}
	}
	if err := r.fill(ctx); err != nil {
		return res, err
	}
	if err := r.singleClaims(ctx); err != nil {
		return res, err
	}
	if o.PolicyClaims > 0 {
		if err := r.policyClaims(ctx); err != nil {
			return res, err
		}
	}
	if err := r.batches(ctx); err != nil {
		return res, err
	}
	if o.CRDClaims > 0 {
		if err := crdClaims(ctx, r.cfg, r.ns, o, &res); err != nil {
			return res, err
		}
	}
	if o.Chaos {
		if err := r.unanswered(ctx); err != nil {
			return res, err
		}
	}
	if err := check(ctx, r.c, r.ns, r.scope, r.ids, r.clients); err != nil {
		return res, fmt.Errorf("ledger check: %w", err)
	}
	r.tableSize(ctx)
	fmt.Fprintln(out, res)
	return res, nil
}

// run is the state of one Run: the cluster, the processes it started,
// the replicas' clients and write counters, and the sandboxes answered so
// far, which the ledger check wants at the end. Its steps are Run's, in
// order; each fills its part of res.
type run struct {
	o        Options
	res      *Result
	cfg      *rest.Config
	c        client.Client
	dir      string // per-replica kubeconfigs and roots
	ns       string // the run's namespace
	scope    string // the servers' --bridge: the owners' scope in the table
	ctlArgs  []string
	ctl      *proc   // the controller (the first one, with Chaos)
	procs    []*proc // every process: the controller, the replicas, a second controller
	proxies  []io.Closer
	counters []*apiwrites.Counter
	clients  []*moat.Client
	ids      []string // the sandboxes answered
}

// connect makes the run's client and checks that the cluster has moat's
// CRDs before anything is made in it (a missing CRD otherwise fails late,
// inside a server), then counts the nodes.
func (r *run) connect(ctx context.Context) error {
	cfg, err := kclient.Load(r.o.Kubeconfig)
	if err != nil {
		return err
	}
	r.cfg = kclient.RateLimited(cfg, 0, 0)
	if r.c, err = client.New(r.cfg, client.Options{Scheme: kclient.Scheme()}); err != nil {
		return err
	}
	if err := r.c.List(ctx, &sbv1.PoolList{}, client.Limit(1)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return errors.New("moat's CRDs are not installed in this cluster (helm install deploy/helm/moat, or kubectl apply -f config/crd/bases)")
		}
		return err
	}
	var nodes corev1.NodeList
	if err := r.c.List(ctx, &nodes); err != nil {
		return err
	}
	r.res.Nodes = len(nodes.Items)
	return nil
}

// deleteNamespace deletes the run's namespace (past ctx's end: it holds
// everything the run made); its error becomes the run's unless the run
// failed already.
func (r *run) deleteNamespace(ctx context.Context, err *error) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if derr := r.c.Delete(dctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); derr != nil && !apierrors.IsNotFound(derr) && *err == nil {
		*err = derr
	}
}

// stopProcs stops the processes still running; a failed run's error gets
// their output, which is where a server says why.
func (r *run) stopProcs(err *error) {
	for _, p := range r.procs {
		if !p.exited() {
			p.stop()
		}
	}
	if *err != nil {
		for i, p := range r.procs {
			if p.logs.Len() > 0 {
				*err = fmt.Errorf("%w\n--- process %d (%s) output:\n%s", *err, i, p.cmd.Args[1], tail(p.logs.String(), 4000))
			}
		}
	}
}

func (r *run) closeProxies() {
	for _, p := range slices.Backward(r.proxies) {
		p.Close()
	}
}

// startController starts `moat controller` on the run's namespace; its
// arguments are kept for the second one of a Chaos run.
func (r *run) startController(ctx context.Context) error {
	r.ctlArgs = []string{"controller", "--agent-image", "moat:scale", "--namespace", r.ns, "--log-level", "error"}
	if r.o.Kubeconfig != "" {
		r.ctlArgs = append(r.ctlArgs, "--kubeconfig", r.o.Kubeconfig)
	}
	ctl, err := start(ctx, r.o.Moat, r.ctlArgs...)
	if err != nil {
		return err
	}
	r.ctl = ctl
	r.procs = append(r.procs, ctl)
	return nil
}

// startReplica starts replica i, `moat serve` behind a proxy that counts
// its API writes, and waits for it to answer. A Chaos run's replicas give
// back an unrecorded claim's pods after 5s, not the default 10 minutes,
// so that the check can wait for it.
func (r *run) startReplica(ctx context.Context, i int) error {
	grace := 10 * time.Minute // the default
	if r.o.Chaos {
		grace = 5 * time.Second
	}
	counter := &apiwrites.Counter{}
	r.counters = append(r.counters, counter)
	pdir := filepath.Join(r.dir, fmt.Sprintf("r%d", i))
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		return err
	}
	proxy, err := apiwrites.StartProxy(r.cfg, counter, pdir)
	if err != nil {
		return err
	}
	r.proxies = append(r.proxies, proxy)
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	args := []string{"serve", "--runtime", "kubernetes", "--kubeconfig", proxy.Kubeconfig,
		"--k8s-namespace", r.ns, "--bridge", r.scope, "--insecure-no-auth", "--listen", addr,
		"--root", filepath.Join(pdir, "root"), "--run-root", filepath.Join(pdir, "run"),
		"--allow-registry", "loopback", "--log-level", "error", "--console=false", "--k8s-orphan-grace", grace.String()}
	if r.o.PolicyClaims > 0 {
		// The pool's pods get an egress sidecar (which resolves
		// nothing here: kwok's pods run nothing).
		args = append(args, "--dns-upstream", "127.0.0.1:53")
	}
	p, err := start(ctx, r.o.Moat, args...)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	// One connection per worker and more: the clients must not be the
	// bottleneck.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * r.o.Workers}}
	cl, err := moat.New("http://"+addr, moat.WithHTTPClient(hc))
	if err != nil {
		return err
	}
	r.clients = append(r.clients, cl)
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		if p.exited() {
			return false, errors.New("moat serve exited")
		}
		_, err := cl.ListSandboxes(ctx, moat.ListOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("replica %d: %w", i, err)
	}
	return nil
}

// fill makes the pool through the Lifecycle API (the first replica) and
// times the controller's fill, as the last replica sees it.
func (r *run) fill(ctx context.Context) error {
	start0 := time.Now()
	if _, err := r.clients[0].CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:scale"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: r.o.Pool, BufferMax: r.o.Pool, PoolMax: r.o.Pool}}); err != nil {
		return err
	}
	if err := waitFor(ctx, r.o.Timeout, func() (bool, error) {
		p, err := r.clients[len(r.clients)-1].GetPool(ctx, "warm")
		return err == nil && p.Status.Available == r.o.Pool, nil
	}); err != nil {
		return fmt.Errorf("filling the pool of %d: %w", r.o.Pool, err)
	}
	r.res.Fill = time.Since(start0)
	if r.o.PolicyClaims > 0 {
		if err := r.waitSidecars(ctx); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second) // the pool's last status writes land before counting
	return nil
}

// waitSidecars waits until every pod of the pool answers on its egress
// API port. A real sidecar is started and probed before the pod's
// containers (a Running pod has it); the stand-ins of kwok's pods are
// started by the test harness as it sees them, a moment after.
func (r *run) waitSidecars(ctx context.Context) error {
	return waitFor(ctx, r.o.Timeout, func() (bool, error) {
		var pods corev1.PodList
		if err := r.c.List(ctx, &pods, client.InNamespace(r.ns), client.MatchingLabels{sbv1.LabelPool: "warm"}); err != nil {
			return false, nil
		}
		if len(pods.Items) < r.o.Pool {
			return false, nil
		}
		for _, p := range pods.Items {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(sidecar.Port)), time.Second)
			if err != nil {
				return false, nil
			}
			c.Close()
		}
		return true, nil
	})
}

// snap is every replica's write counts now, for since.
func (r *run) snap() []map[string]int {
	s := make([]map[string]int, len(r.counters))
	for i, w := range r.counters {
		s[i] = w.Snapshot()
	}
	return s
}

// since sums the replicas' writes since before (a snap).
func (r *run) since(before []map[string]int) map[string]int {
	sum := map[string]int{}
	for i, w := range r.counters {
		for k, v := range w.Since(before[i]) {
			sum[k] += v
		}
	}
	return sum
}

// claimReq is the request of every claim: a sandbox from the pool.
func claimReq() moat.CreateRequest {
	return moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}, Timeout: time.Hour}
}

// claimState is the shared state of the single claims' workers: n claims
// of req; mu guards errs, lat, the run's ids and res.Unanswered.
type claimState struct {
	n         int
	req       moat.CreateRequest
	mu        sync.Mutex
	next      atomic.Int64 // the next claim's index
	errs      []error
	lat       []time.Duration
	killOnce  sync.Once
	killing   atomic.Bool // the victim is being (or was) killed
	killErr   error
	victim    int            // the replica a Chaos run kills: the last
	survivors []*moat.Client // the others
}

// singleClaims makes res.Claims claims by W workers, claim by claim over
// the replicas. With Chaos, W claims are kept back: the pods the killed
// replica took for claims it never answered are out until the orphan
// sweep.
func (r *run) singleClaims(ctx context.Context) error {
	r.res.Claims = r.o.Claims
	if r.o.Chaos {
		r.res.Claims = min(r.res.Claims, r.o.Pool-r.o.batched()-r.o.Workers)
	}
	r.ids = make([]string, 0, r.o.Pool)
	victim := len(r.clients) - 1
	cs := &claimState{n: r.res.Claims, req: claimReq(), lat: make([]time.Duration, 0, r.res.Claims), victim: victim, survivors: r.clients[:victim]}
	before := r.snap()
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range r.o.Workers {
		wg.Go(func() { r.claimWorker(ctx, cs, w) })
	}
	wg.Wait()
	if cs.killErr != nil {
		return cs.killErr
	}
	if r.o.Chaos {
		r.clients = cs.survivors
	}
	r.res.ClaimWall = time.Since(t0)
	r.res.ClaimWrites = r.since(before)
	if len(cs.errs) > 0 {
		return fmt.Errorf("%d of %d claims failed, first: %w", len(cs.errs), r.res.Claims, cs.errs[0])
	}
	if len(cs.lat) != r.res.Claims {
		return fmt.Errorf("%d claims answered, want %d", len(cs.lat), r.res.Claims)
	}
	lat := cs.lat
	slices.Sort(lat)
	r.res.P50, r.res.P99, r.res.Max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	return nil
}

// policyClaims makes PolicyClaims claims with a network policy and as
// many without, one of each in turn (so that both see the same load), by
// W workers over the replicas in turn.
func (r *run) policyClaims(ctx context.Context) error {
	plain, pol := claimReq(), claimReq()
	pol.NetworkPolicy = &moat.NetworkPolicy{DefaultAction: "deny", Egress: []moat.NetworkRule{{Action: "allow", Target: "pypi.example.test"}}}
	n := r.o.PolicyClaims
	var (
		next              atomic.Int64
		mu                sync.Mutex
		errs              []error
		withPol, withoutP []time.Duration
	)
	before := r.snap()
	var wg sync.WaitGroup
	for range r.o.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= 2*n {
					return
				}
				req := plain
				if i%2 == 0 {
					req = pol
				}
				t := time.Now()
				sb, err := r.clients[(i/2)%len(r.clients)].CreateSandbox(ctx, req)
				d := time.Since(t)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case i%2 == 0:
					r.ids, withPol = append(r.ids, sb.ID), append(withPol, d)
				default:
					r.ids, withoutP = append(r.ids, sb.ID), append(withoutP, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.res.PolicyWrites = r.since(before)
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d claims with and without a policy failed, first: %w", len(errs), 2*n, errs[0])
	}
	if len(withPol) != n || len(withoutP) != n {
		return fmt.Errorf("%d claims with a policy and %d without answered, want %d each", len(withPol), len(withoutP), n)
	}
	p50p99 := func(lat []time.Duration) (time.Duration, time.Duration) {
		slices.Sort(lat)
		return lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	r.res.PolicyP50, r.res.PolicyP99 = p50p99(withPol)
	r.res.PairedP50, r.res.PairedP99 = p50p99(withoutP)
	return nil
}

// claimWorker is worker w of singleClaims: it claims until every claim is
// taken. With Chaos it stays on its replica (w's), and the worker that
// takes the middle claim kills the victim first; a claim lost with the
// victim is claimed again through a survivor.
func (r *run) claimWorker(ctx context.Context, cs *claimState, w int) {
	req := cs.req
	rep := w % len(r.clients)
	for {
		i := int(cs.next.Add(1)) - 1
		if i >= cs.n {
			return
		}
		if r.o.Chaos && i == cs.n/2 {
			cs.killOnce.Do(func() { r.kill(ctx, cs) })
		}
		if !r.o.Chaos {
			// Claim by claim through the replicas in turn, so that
			// every replica serves claims however few the workers.
			rep = i % len(r.clients)
		}
		t := time.Now()
		sb, err := r.clients[rep].CreateSandbox(ctx, req)
		d := time.Since(t)
		cs.mu.Lock()
		switch {
		case err == nil:
			r.ids, cs.lat = append(r.ids, sb.ID), append(cs.lat, d)
		case r.o.Chaos && rep == cs.victim && cs.killing.Load():
			// Lost with the replica: the client claims again
			// through a survivor.
			r.res.Unanswered++
			rep = w % len(cs.survivors)
			cs.next.Add(-1)
		default:
			cs.errs = append(cs.errs, err)
		}
		cs.mu.Unlock()
	}
}

// kill kills (SIGKILL) the victim replica and the controller, and starts
// a new controller.
func (r *run) kill(ctx context.Context, cs *claimState) {
	cs.killing.Store(true)
	v := r.procs[1+cs.victim]
	v.cmd.Process.Kill()
	<-v.done
	r.ctl.cmd.Process.Kill()
	<-r.ctl.done
	ctl2, err := start(ctx, r.o.Moat, r.ctlArgs...)
	if err != nil {
		cs.killErr = err
		return
	}
	r.procs = append(r.procs, ctl2)
}

// batches claims the batches of B, one after another, through the
// replicas in turn.
func (r *run) batches(ctx context.Context) error {
	req := claimReq()
	before := r.snap()
	var walls []time.Duration
	for k := range r.o.Batches {
		t0 := time.Now()
		batch, err := r.clients[(len(r.clients)-1+k)%len(r.clients)].CreateBatch(ctx, req, r.o.Batch)
		walls = append(walls, time.Since(t0))
		if err != nil {
			return fmt.Errorf("batch %d of %d (of %d sandboxes): %w", k+1, r.o.Batches, r.o.Batch, err)
		}
		if len(batch) != r.o.Batch {
			return fmt.Errorf("batch %d of %d: %d sandboxes answered, want %d", k+1, r.o.Batches, len(batch), r.o.Batch)
		}
		for _, sb := range batch {
			r.ids = append(r.ids, sb.ID)
		}
	}
	r.res.BatchWrites = r.since(before)
	slices.Sort(walls)
	r.res.BatchWall, r.res.BatchMax = walls[len(walls)/2], walls[len(walls)-1]
	return nil
}

// unanswered settles a Chaos run's claims the killed replica made but
// never answered: the leader (after the lease passes, if the dead replica
// held it) gives back the pods of those it never recorded; those it
// recorded are sandboxes like any other (listed, expiring), whose answer
// alone was lost, and join the ids the check wants.
func (r *run) unanswered(ctx context.Context) error {
	answered := map[string]bool{}
	for _, id := range r.ids {
		answered[id] = true
	}
	if tbl, err := table(ctx, r.c, r.ns); err == nil {
		for o := range tbl.Owners {
			if id, ok := alloc.SandboxOf(r.scope, o); ok && !answered[id] {
				r.res.GivenBack++
			}
		}
	}
	var extra map[string]bool
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		tbl, err := table(ctx, r.c, r.ns)
		if err != nil {
			return false, nil
		}
		extra = map[string]bool{}
		for o := range tbl.Owners {
			id, ok := alloc.SandboxOf(r.scope, o)
			if !ok || answered[id] {
				continue
			}
			if _, err := r.clients[0].GetSandbox(ctx, id); err != nil {
				return false, nil // not recorded: to be given back
			}
			extra[id] = true
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("the unanswered claims' pods were not given back: %w", err)
	}
	r.res.GivenBack -= len(extra)
	r.res.Recorded = len(extra)
	for id := range extra {
		r.ids = append(r.ids, id)
	}
	return nil
}

// tableSize records the size of the pool's table at the end (best
// effort: the figures only).
func (r *run) tableSize(ctx context.Context) {
	if shards, err := alloc.ReadShards(ctx, r.c, client.ObjectKey{Namespace: r.ns, Name: "warm"}); err == nil {
		for _, s := range shards {
			r.res.TableBytes += s.Bytes
			r.res.ShardBytes = max(r.res.ShardBytes, s.Bytes)
		}
	}
}

// check verifies the ledger: each sandbox owns exactly one pool pod in the
// table, no pod has two owners, every owned pod exists, and every replica
// lists every sandbox.
func check(ctx context.Context, c client.Client, ns, scope string, ids []string, clients []*moat.Client) error {
	tbl, err := table(ctx, c, ns)
	if err != nil {
		return err
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return err
	}
	exists := map[string]bool{}
	for _, p := range pods.Items {
		exists[p.Name] = true
	}
	owner := map[string]string{}
	for o, own := range tbl.Owners {
		for _, p := range own.Pods {
			if prev, dup := owner[p]; dup {
				return fmt.Errorf("pod %s is owned by %s and %s", p, prev, o)
			}
			owner[p] = o
		}
	}
	want := map[string]bool{}
	for _, id := range ids {
		if want[id] {
			return fmt.Errorf("sandbox id %s answered twice", id)
		}
		want[id] = true
		own := tbl.Owners[alloc.SandboxOwner(scope, id)]
		if len(own.Pods) != 1 {
			return fmt.Errorf("sandbox %s owns pods %v in the table, want one", id, own.Pods)
		}
		if !exists[own.Pods[0]] {
			return fmt.Errorf("sandbox %s owns pod %s, which does not exist", id, own.Pods[0])
		}
	}
	for o := range tbl.Owners {
		if id, ok := alloc.SandboxOf(scope, o); ok && !want[id] {
			return fmt.Errorf("the table has a claim %s that no client got", id)
		}
	}
	for i, cl := range clients {
		err := waitFor(ctx, time.Minute, func() (bool, error) {
			got := 0
			for page := 1; ; page++ {
				list, err := cl.ListSandboxes(ctx, moat.ListOptions{Page: page, PageSize: 1000})
				if err != nil || list.Pagination.TotalItems != len(want) {
					return false, nil
				}
				for _, sb := range list.Items {
					if want[sb.ID] {
						got++
					}
				}
				if len(list.Items) == 0 || page*1000 >= list.Pagination.TotalItems {
					break
				}
			}
			return got == len(want), nil
		})
		if err != nil {
			return fmt.Errorf("replica %d does not list the %d sandboxes: %w", i, len(want), err)
		}
	}
	return nil
}

// crdClaims makes o.CRDClaims BatchSandboxes of one from the pool, by
// o.Workers clients, each timed from its create until the batch shows its
// pod ready, and checks that each got one pod of the table.
func crdClaims(ctx context.Context, cfg *rest.Config, ns string, o Options, res *Result) error {
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		return err
	}
	one := int32(1)
	lat := make([]time.Duration, o.CRDClaims)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	claim := func(i int) error {
		name := fmt.Sprintf("crd-%d", i)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		w, err := wc.Watch(cctx, &sbv1.BatchSandboxList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": name})
		if err != nil {
			return err
		}
		defer w.Stop()
		t := time.Now()
		if err := wc.Create(cctx, &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sbv1.BatchSandboxSpec{Replicas: &one, PoolRef: "warm"}}); err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			if b, ok := ev.Object.(*sbv1.BatchSandbox); ok && b.Status.Ready == 1 && b.Status.Phase == sbv1.PhaseSucceed {
				lat[i] = time.Since(t)
				return nil
			}
		}
		return fmt.Errorf("batch %s: not ready: %v", name, cctx.Err())
	}
	t0 := time.Now()
	for range o.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= o.CRDClaims {
					return
				}
				if err := claim(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	res.CRDWall = time.Since(t0)
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d CRD claims failed, first: %w", len(errs), o.CRDClaims, errs[0])
	}
	slices.Sort(lat)
	res.CRDP50, res.CRDP99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	tbl, err := table(ctx, wc, ns)
	if err != nil {
		return err
	}
	for i := range o.CRDClaims {
		if own := tbl.Owners[alloc.BatchOwner(fmt.Sprintf("crd-%d", i))]; len(own.Pods) != 1 {
			return fmt.Errorf("ledger check: batch crd-%d owns pods %v in the table, want one", i, own.Pods)
		}
	}
	return nil
}

// table reads the pool's allocation table from the API server.
func table(ctx context.Context, c client.Client, ns string) (alloc.Table, error) {
	return alloc.ReadTable(ctx, c, client.ObjectKey{Namespace: ns, Name: "warm"})
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
