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
	if o.CRDClaims < 0 || o.CRDClaims > o.Pool-batched {
		return fmt.Errorf("%d CRD claims do not fit a pool of %d with %d batches of %d", o.CRDClaims, o.Pool, o.Batches, o.Batch)
	}
	if o.Claims <= 0 || o.Claims > o.Pool-batched-o.CRDClaims {
		o.Claims = o.Pool - batched - o.CRDClaims
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
	cfg, err := kclient.Load(o.Kubeconfig)
	if err != nil {
		return res, err
	}
	cfg = kclient.RateLimited(cfg, 0, 0)
	c, err := client.New(cfg, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		return res, err
	}
	if err := c.List(ctx, &sbv1.PoolList{}, client.Limit(1)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return res, errors.New("moat's CRDs are not installed in this cluster (helm install deploy/helm/moat, or kubectl apply -f config/crd/bases)")
		}
		return res, err
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return res, err
	}
	res.Nodes = len(nodes.Items)
	dir, err := os.MkdirTemp("", "moat-scale-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ns, scope := fmt.Sprintf("moat-scale-%04x", rand.Uint32()&0xffff), "moatscale"
	grace := 10 * time.Minute // the default
	if o.Chaos {
		grace = 5 * time.Second
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return res, err
	}
	// The namespace goes at the end (the processes stop first: deferred
	// later, run earlier), with everything the run made.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := c.Delete(dctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); derr != nil && !apierrors.IsNotFound(derr) && err == nil {
			err = derr
		}
	}()

	var procs []*proc
	defer func() {
		for _, p := range procs {
			if !p.exited() {
				p.stop()
			}
		}
		if err != nil {
			for i, p := range procs {
				if p.logs.Len() > 0 {
					err = fmt.Errorf("%w\n--- process %d (%s) output:\n%s", err, i, p.cmd.Args[1], tail(p.logs.String(), 4000))
				}
			}
		}
	}()
	ctlArgs := []string{"controller", "--agent-image", "moat:scale", "--namespace", ns, "--log-level", "error"}
	if o.Kubeconfig != "" {
		ctlArgs = append(ctlArgs, "--kubeconfig", o.Kubeconfig)
	}
	ctl, err := start(ctx, o.Moat, ctlArgs...)
	if err != nil {
		return res, err
	}
	procs = append(procs, ctl)

	counters := make([]*apiwrites.Counter, o.Replicas)
	clients := make([]*moat.Client, o.Replicas)
	for i := range o.Replicas {
		counters[i] = &apiwrites.Counter{}
		pdir := filepath.Join(dir, fmt.Sprintf("r%d", i))
		if err := os.MkdirAll(pdir, 0o700); err != nil {
			return res, err
		}
		proxy, err := apiwrites.StartProxy(cfg, counters[i], pdir)
		if err != nil {
			return res, err
		}
		defer proxy.Close()
		addr, err := freeAddr()
		if err != nil {
			return res, err
		}
		p, err := start(ctx, o.Moat, "serve", "--runtime", "kubernetes", "--kubeconfig", proxy.Kubeconfig,
			"--k8s-namespace", ns, "--bridge", scope, "--insecure-no-auth", "--listen", addr,
			"--root", filepath.Join(pdir, "root"), "--run-root", filepath.Join(pdir, "run"),
			"--allow-registry", "loopback", "--log-level", "error", "--console=false", "--k8s-orphan-grace", grace.String())
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
		// One connection per worker and more: the clients must not be the
		// bottleneck.
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * o.Workers}}
		if clients[i], err = moat.New("http://"+addr, moat.WithHTTPClient(hc)); err != nil {
			return res, err
		}
		if err := waitFor(ctx, time.Minute, func() (bool, error) {
			if p.exited() {
				return false, errors.New("moat serve exited")
			}
			_, err := clients[i].ListSandboxes(ctx, moat.ListOptions{})
			return err == nil, nil
		}); err != nil {
			return res, fmt.Errorf("replica %d: %w", i, err)
		}
	}

	// The pool, through the Lifecycle API; filled by the controller.
	start0 := time.Now()
	if _, err := clients[0].CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:scale"}, Entrypoint: []string{"sleep", "infinity"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: o.Pool, BufferMax: o.Pool, PoolMax: o.Pool}}); err != nil {
		return res, err
	}
	if err := waitFor(ctx, o.Timeout, func() (bool, error) {
		p, err := clients[len(clients)-1].GetPool(ctx, "warm")
		return err == nil && p.Status.Available == o.Pool, nil
	}); err != nil {
		return res, fmt.Errorf("filling the pool of %d: %w", o.Pool, err)
	}
	res.Fill = time.Since(start0)
	time.Sleep(2 * time.Second) // the pool's last status writes land before counting

	snap := func() []map[string]int {
		s := make([]map[string]int, len(counters))
		for i, w := range counters {
			s[i] = w.Snapshot()
		}
		return s
	}
	since := func(before []map[string]int) map[string]int {
		sum := map[string]int{}
		for i, w := range counters {
			for k, v := range w.Since(before[i]) {
				sum[k] += v
			}
		}
		return sum
	}

	// Single claims: W workers, claim by claim over the replicas. With
	// Chaos, W claims are kept back: the pods the killed replica took for
	// claims it never answered are out until the orphan sweep.
	res.Claims = o.Claims
	if o.Chaos {
		res.Claims = min(res.Claims, o.Pool-o.batched()-o.Workers)
	}
	req := moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}, Timeout: time.Hour}
	lat := make([]time.Duration, 0, res.Claims)
	ids := make([]string, 0, o.Pool)
	var (
		mu        sync.Mutex
		next      atomic.Int64
		errs      []error
		wg        sync.WaitGroup
		killOnce  sync.Once
		killing   atomic.Bool
		killErr   error
		victim    = len(clients) - 1
		survivors = clients[:victim]
	)
	kill := func() {
		killing.Store(true)
		procs[1+victim].cmd.Process.Kill()
		<-procs[1+victim].done
		ctl.cmd.Process.Kill()
		<-ctl.done
		ctl2, err := start(ctx, o.Moat, ctlArgs...)
		if err != nil {
			killErr = err
			return
		}
		procs = append(procs, ctl2)
	}
	before := snap()
	t0 := time.Now()
	for w := range o.Workers {
		r := w % len(clients)
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= res.Claims {
					return
				}
				if o.Chaos && i == res.Claims/2 {
					killOnce.Do(kill)
				}
				if !o.Chaos {
					// Claim by claim through the replicas in turn, so
					// that every replica serves claims however few
					// the workers.
					r = i % len(clients)
				}
				cl := clients[r]
				t := time.Now()
				sb, err := cl.CreateSandbox(ctx, req)
				d := time.Since(t)
				mu.Lock()
				switch {
				case err == nil:
					ids, lat = append(ids, sb.ID), append(lat, d)
				case o.Chaos && r == victim && killing.Load():
					// Lost with the replica: the client claims again
					// through a survivor.
					res.Unanswered++
					r = w % len(survivors)
					next.Add(-1)
				default:
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if killErr != nil {
		return res, killErr
	}
	if o.Chaos {
		clients = survivors
	}
	res.ClaimWall = time.Since(t0)
	res.ClaimWrites = since(before)
	if len(errs) > 0 {
		return res, fmt.Errorf("%d of %d claims failed, first: %w", len(errs), res.Claims, errs[0])
	}
	if len(lat) != res.Claims {
		return res, fmt.Errorf("%d claims answered, want %d", len(lat), res.Claims)
	}
	slices.Sort(lat)
	res.P50, res.P99, res.Max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]

	// Batches of B, one after another, through the replicas in turn.
	before = snap()
	var walls []time.Duration
	for k := range o.Batches {
		t0 = time.Now()
		batch, err := clients[(len(clients)-1+k)%len(clients)].CreateBatch(ctx, req, o.Batch)
		walls = append(walls, time.Since(t0))
		if err != nil {
			return res, fmt.Errorf("batch %d of %d (of %d sandboxes): %w", k+1, o.Batches, o.Batch, err)
		}
		if len(batch) != o.Batch {
			return res, fmt.Errorf("batch %d of %d: %d sandboxes answered, want %d", k+1, o.Batches, len(batch), o.Batch)
		}
		for _, sb := range batch {
			ids = append(ids, sb.ID)
		}
	}
	res.BatchWrites = since(before)
	slices.Sort(walls)
	res.BatchWall, res.BatchMax = walls[len(walls)/2], walls[len(walls)-1]

	if o.CRDClaims > 0 {
		if err := crdClaims(ctx, cfg, ns, o, &res); err != nil {
			return res, err
		}
	}
	if o.Chaos {
		// The claims the killed replica made but never answered: the
		// leader (after the lease passes, if the dead replica held it)
		// gives back the pods of those it never recorded; those it
		// recorded are sandboxes like any other (listed, expiring), whose
		// answer alone was lost.
		answered := map[string]bool{}
		for _, id := range ids {
			answered[id] = true
		}
		var extra map[string]bool
		if tbl, err := table(ctx, c, ns); err == nil {
			for o := range tbl.Owners {
				if id, ok := alloc.SandboxOf(scope, o); ok && !answered[id] {
					res.GivenBack++
				}
			}
		}
		if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
			tbl, err := table(ctx, c, ns)
			if err != nil {
				return false, nil
			}
			extra = map[string]bool{}
			for o := range tbl.Owners {
				id, ok := alloc.SandboxOf(scope, o)
				if !ok || answered[id] {
					continue
				}
				if _, err := clients[0].GetSandbox(ctx, id); err != nil {
					return false, nil // not recorded: to be given back
				}
				extra[id] = true
			}
			return true, nil
		}); err != nil {
			return res, fmt.Errorf("the unanswered claims' pods were not given back: %w", err)
		}
		res.GivenBack -= len(extra)
		res.Recorded = len(extra)
		for id := range extra {
			ids = append(ids, id)
		}
	}
	if err := check(ctx, c, ns, scope, ids, clients); err != nil {
		return res, fmt.Errorf("ledger check: %w", err)
	}
	if shards, err := alloc.ReadShards(ctx, c, client.ObjectKey{Namespace: ns, Name: "warm"}); err == nil {
		for _, s := range shards {
			res.TableBytes += s.Bytes
			res.ShardBytes = max(res.ShardBytes, s.Bytes)
		}
	}
	fmt.Fprintln(out, res)
	return res, nil
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
