package k8s

import (
	"bytes"
	"context"
	"flag"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// TestRun: against a throw-away control plane with kwok's fake nodes,
// `moat controller` as its own process fills the pool and delivers both
// batches with the counts the design promises (warm: one write per table
// shard the batch's pods are in, one record and one status write; cold:
// one create per pod), and the run leaves no batch or pool behind.
func TestRun(t *testing.T) {
	k8stest.RequireTools(t)
	env, err := k8stest.Start(context.Background(), k8stest.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	var out bytes.Buffer
	res, err := Run(context.Background(), Options{Kubeconfig: env.Kubeconfig, N: 10, Moat: testutil.MoatBinary(t)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(res) != 3 || res[0].Mode != "fill" || res[1].Mode != "warm" || res[2].Mode != "cold" {
		t.Fatalf("results %+v", res)
	}
	fill, warm, cold := res[0].Writes, res[1].Writes, res[2].Writes
	if fill["POST pods"] != 10 {
		t.Errorf("fill writes %v", fill)
	}
	// The delivery: one update of each allocation table shard the batch's
	// pods are in (the batch takes the whole pool here, so its pods are
	// spread over the shards), one record, one status write; nothing
	// created (the fill made the table); the pool's status write that
	// shows the pods allocated follows.
	shards := res[1].TableShards
	if shards < 1 || shards > alloc.MinShards {
		t.Fatalf("warm batch's pods are in %d table shards", shards)
	}
	delivery := maps.Clone(warm)
	delete(delivery, "PUT pools/status")
	if want := map[string]int{"PUT secrets": shards, "PUT batchsandboxes": 1, "PUT batchsandboxes/status": 1}; !maps.Equal(delivery, want) || warm["PUT pools/status"] > 1 {
		t.Errorf("warm writes %v, want %v and at most one PUT pools/status", warm, want)
	}
	if fill["POST secrets"] != alloc.MinShards+1 {
		t.Errorf("fill writes %v: the pool's allocation table (%d shards) and token Secret are made with the pool", fill, alloc.MinShards)
	}
	if cold["POST pods"] != 10 {
		t.Errorf("cold writes %v", cold)
	}
	if !strings.Contains(out.String(), "k8s warm   n=10") || !strings.Contains(out.String(), "k8s cold   n=10") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestRunNeedsCRDs: a cluster without moat's CRDs gets a clear error, not
// a controller crash loop.
func TestRunNeedsCRDs(t *testing.T) {
	k8stest.RequireTools(t)
	env, err := k8stest.Start(context.Background(), k8stest.Options{Nodes: 1, NoCRDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Stop() })
	_, err = Run(context.Background(), Options{Kubeconfig: env.Kubeconfig, N: 1, Moat: testutil.MoatBinary(t)}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "CRDs are not installed") {
		t.Fatalf("Run without CRDs: %v", err)
	}
}

var (
	benchN       = flag.Int("k8s-n", 100, "BenchmarkKwok: pool and batch size")
	benchCreates = flag.Int("k8s-creates", 10, "BenchmarkRealNode: single sandboxes to time")
	benchWarm    = flag.Int("k8s-warm", 10, "BenchmarkRealNode: warm batch size")
	benchClass   = flag.String("k8s-class", "", "BenchmarkRealNode: the sandboxes' RuntimeClass (runsc: the node's gVisor class)")
)

// BenchmarkKwok brings up a control plane with kwok's fake nodes (4) and
// runs `moat-bench k8s -n N` against it, printing its figures (make
// bench-k8s). Run it with -benchtime 1x.
func BenchmarkKwok(b *testing.B) {
	k8stest.RequireTools(b)
	env, err := k8stest.Start(context.Background(), k8stest.Options{Nodes: 4})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.Stop() })
	moat := testutil.MoatBinary(b)
	for b.Loop() {
		benchCommand(b, moat, "--kubeconfig", env.Kubeconfig, "-n", strconv.Itoa(*benchN))
	}
}

// BenchmarkRealNode brings up a real single-node cluster (k8stest.Node) and
// runs `moat-bench k8s --image` against it: create -> Running -> first
// command of single sandboxes and a warm batch (make bench-k8s-node). Run
// it with -benchtime 1x.
func BenchmarkRealNode(b *testing.B) {
	node := k8stest.StartTestNode(b)
	ctx := context.Background()
	img, err := node.Registry.PushDir(ctx, testutil.BusyboxRootfs(b), "bench/busybox:1", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"})
	if err != nil {
		b.Fatal(err)
	}
	moat := testutil.MoatBinary(b)
	agent, err := node.PushAgentImage(ctx, moat)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		benchCommand(b, moat, "--kubeconfig", node.Kubeconfig, "-n", "0", "--image", img, "--agent-image", agent,
			"--creates", strconv.Itoa(*benchCreates), "--warm", strconv.Itoa(*benchWarm), "--runtime-class", *benchClass)
	}
}

// benchCommand runs `moat-bench k8s --moat moat args...`, its figures to
// stdout.
func benchCommand(b *testing.B, moat string, args ...string) {
	cmd := exec.Command(testutil.BenchBinary(b), append([]string{"k8s", "--moat", moat}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("moat-bench k8s: %v", err)
	}
}
