package scale

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

var (
	nodes    = flag.Int("scale.nodes", 0, "fake nodes (default: a small run)")
	pool     = flag.Int("scale.pool", 0, "warm pods")
	batch    = flag.Int("scale.batch", 0, "batch size")
	batches  = flag.Int("scale.batches", 0, "batches (one after another)")
	claims   = flag.Int("scale.claims", 0, "single claims (default: the rest of the pool)")
	crd      = flag.Int("scale.crd", -1, "claims of one through the CRD path (BatchSandboxes), after the others")
	policy   = flag.Int("scale.policy", -1, "single claims with a network policy, after the others (the pods get stand-in egress sidecars)")
	replicas = flag.Int("scale.replicas", 0, "server replicas")
	workers  = flag.Int("scale.workers", 0, "concurrent clients")
)

// cluster starts a throw-away control plane with n of kwok's fake nodes
// and returns its kubeconfig. With sidecars, the pods get loopback IPs
// and this process serves a stand-in agent and egress sidecar on each
// (k8stest.Options.Agents), for claims with a network policy.
func cluster(t testing.TB, n int, sidecars bool) string {
	t.Helper()
	env, err := k8stest.Start(context.Background(), k8stest.Options{Nodes: n, Agents: sidecars})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	return env.Kubeconfig
}

// BenchmarkClaims runs `moat-bench k8s claims` on a throw-away control
// plane with -scale.nodes of kwok's fake nodes (default 100), sized by the
// other -scale.* flags (make bench-k8s-claims). Run it with -benchtime 1x.
func BenchmarkClaims(b *testing.B) {
	k8stest.RequireTools(b)
	kc := cluster(b, cmp.Or(*nodes, 100), *policy > 0)
	args := []string{"k8s", "claims", "--kubeconfig", kc, "--moat", testutil.MoatBinary(b)}
	for name, v := range map[string]int{"pool": *pool, "batch": *batch, "batches": *batches, "claims": *claims, "replicas": *replicas, "workers": *workers} {
		if v > 0 {
			args = append(args, "--"+name, strconv.Itoa(v))
		}
	}
	if *crd >= 0 {
		args = append(args, "--crd", strconv.Itoa(*crd))
	}
	if *policy > 0 {
		args = append(args, "--policy", strconv.Itoa(*policy))
	}
	bench := testutil.BenchBinary(b)
	for b.Loop() {
		cmd := exec.Command(bench, args...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			b.Fatalf("moat-bench %v: %v", args, err)
		}
	}
}

// TestRun: the scenario at a small size (or the size of the -scale.*
// flags): two server processes claim a whole pool concurrently, single
// claims and a batch, then claims of one through the CRD path
// (BatchSandboxes) and claims with a network policy (set through the pods'
// stand-in egress sidecars) from the same pool, and the ledger check
// passes (Run fails otherwise); every claim is warm, with one record
// write, and the batch writes the table and one record.
func TestRun(t *testing.T) {
	k8stest.RequireTools(t)
	ctrllog.SetLogger(logr.Discard())
	// Ten pods spare: a replica whose pod cache lags the fill a moment
	// still finds every claim a warm pod.
	o := Options{Kubeconfig: cluster(t, max(*nodes, 2), true), Pool: 80, Claims: 20, Batch: 5, Batches: 2, CRDClaims: 10, PolicyClaims: 10, Replicas: 2, Workers: 8, Moat: testutil.MoatBinary(t)}
	if *pool > 0 {
		o.Pool, o.Claims = *pool, 0 // the rest of the pool, unless -scale.claims
	}
	if *batch > 0 {
		o.Batch = *batch
	}
	if *batches > 0 {
		o.Batches = *batches
	}
	if *crd >= 0 {
		o.CRDClaims = *crd
	}
	if *claims > 0 {
		o.Claims = *claims
	}
	if *policy >= 0 {
		o.PolicyClaims = *policy
	}
	if *replicas > 0 {
		o.Replicas = *replicas
	}
	if *workers > 0 {
		o.Workers = *workers
	}
	var out bytes.Buffer
	res, err := Run(context.Background(), o, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	// Every claim is warm: its record goes in its table shard write, and
	// no pod or batch is made. The records then move into Secrets of their
	// own (at most one each), off the claims' path.
	if w := res.ClaimWrites; w["POST secrets"] > res.Claims || w["PUT secrets"] < 1 || w["POST pods"] > 0 || w["POST batchsandboxes"] > 0 {
		t.Errorf("claim writes %v for %d claims: want table shard writes, at most one record move each, no pod or batch", w, res.Claims)
	}
	// A claim with a policy writes what any claim does: its policy goes
	// to the pod's sidecar, not the API server.
	if w := res.PolicyWrites; o.PolicyClaims > 0 && (w["POST secrets"] > 2*o.PolicyClaims || w["PUT secrets"] < 1 || w["POST pods"] > 0 || w["POST batchsandboxes"] > 0) {
		t.Errorf("writes %v of %d claims with a policy and as many without: want those of plain claims", w, o.PolicyClaims)
	}
	if w := res.BatchWrites; w["PUT secrets"] < o.Batches || w["POST secrets"] > o.Batch*o.Batches || w["POST pods"] > 0 || w["POST batchsandboxes"] > 0 {
		t.Errorf("batch writes %v, want the table (the records in it)", w)
	}
}

// TestChaos: the scenario with a replica and the controller killed
// (SIGKILL) halfway through the claims: every answered claim keeps its
// pod, the pods of the claims the dead replica never answered are given
// back by the surviving leader, and no pod is owned twice (Run checks
// all of it).
func TestChaos(t *testing.T) {
	k8stest.RequireTools(t)
	ctrllog.SetLogger(logr.Discard())
	var out bytes.Buffer
	res, err := Run(context.Background(), Options{Kubeconfig: cluster(t, 2, false), Pool: 60, Batch: 10, Replicas: 2, Workers: 8, Chaos: true, Moat: testutil.MoatBinary(t)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	if res.Unanswered == 0 {
		// Four workers were on the killed replica: the one that killed
		// it at least had a claim in flight or refused.
		t.Errorf("no claim went unanswered: the replica was not killed mid-claims")
	}
}
