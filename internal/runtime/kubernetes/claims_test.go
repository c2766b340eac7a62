package kubernetes_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	moat "github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/server"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// testServer is an in-process `moat serve --runtime kubernetes` whose API
// writes are counted (it talks to the API server through a counting
// proxy).
type testServer struct {
	cl     *moat.Client
	url    string // the server's base URL
	writes *k8stest.WriteCounter
	scope  string
	root   string
	// stop stops the server (at once; again at the test's end is a no-op).
	stop func()
}

// stateFile reports whether the server wrote a state file of its own.
func (s *testServer) stateFile() bool {
	_, err := os.Stat(filepath.Join(s.root, "state.db"))
	return err == nil
}

func startServer(t *testing.T, ns, scope string) *testServer {
	t.Helper()
	return startServerWith(t, ns, scope, nil)
}

// startServerWith is startServer with edit applied to the configuration.
func startServerWith(t *testing.T, ns, scope string, edit func(*server.Config)) *testServer {
	t.Helper()
	dir := t.TempDir()
	w := &k8stest.WriteCounter{}
	proxy, err := k8stest.StartCountingProxy(env.Config, w, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg := server.Default()
	cfg.Runtime = "kubernetes"
	cfg.Kubernetes = server.KubernetesConfig{Kubeconfig: proxy.Kubeconfig, Namespace: ns}
	cfg.Root, cfg.RunRoot = filepath.Join(dir, "root"), filepath.Join(dir, "run")
	cfg.NoAuth = true
	cfg.Bridge = scope
	cfg.Listen = "127.0.0.1:0"
	cfg.LogLevel = "warn"
	// What egress sidecars would resolve through (kwok's pods run
	// nothing: no query is sent).
	cfg.DNSUpstreams = []string{"127.0.0.1:53"}
	if edit != nil {
		edit(&cfg)
	}
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
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	stop := sync.OnceFunc(func() { cancel(); <-done; s.Close() })
	t.Cleanup(stop)
	cl, err := moat.New("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return &testServer{cl: cl, url: "http://" + ln.Addr().String(), writes: w, scope: scope, root: cfg.Root, stop: stop}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, last)
}

func table(t *testing.T, c client.Client, ns, pool string) alloc.Table {
	t.Helper()
	tbl, err := alloc.ReadTable(context.Background(), c, types.NamespacedName{Namespace: ns, Name: pool})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

// TestClaimThroughLifecycleAPI: on the kubernetes runtime, a pool made
// through the Lifecycle API is a Pool that the controller fills; a create
// with its poolRef, and a batch, are served from its warm pods by one
// write of the pool's allocation table and one of the sandbox records
// (whatever the batch size), with no BatchSandbox; each claimed
// sandbox has its pod's own token, gets the claim's env through its agent
// and its metadata and timeout in its record; deleting it retires and
// deletes the pod, and the pool refills.
func TestClaimThroughLifecycleAPI(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	// The records stay inline (in the table): the writes counted are the
	// claims' alone, with no later moves.
	srv := startServer(t, ns, "claims")
	ctx := context.Background()
	c := adminClient(t)

	pool, err := srv.cl.CreatePool(ctx, moat.PoolSpec{Name: "warm",
		Template:     moat.PoolTemplate{Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"}, Env: map[string]string{"FROM": "pool"}},
		CapacitySpec: moat.PoolCapacity{BufferMin: 2, BufferMax: 4, PoolMax: 10}})
	if err != nil {
		t.Fatal(err)
	}
	var cr sbv1.Pool
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "warm"}, &cr); err != nil {
		t.Fatalf("no Pool resource for pool %s: %v", pool.Name, err)
	}
	waitFor(t, 60*time.Second, "pool warm", func() (bool, string) {
		p, err := srv.cl.GetPool(ctx, "warm")
		return err == nil && p.Status.Available == 4, fmt.Sprintf("%+v %v", p, err)
	})
	time.Sleep(300 * time.Millisecond) // the agents come up on the pod IPs

	before := srv.writes.Snapshot()
	sb, err := srv.cl.CreateSandbox(ctx, moat.CreateRequest{
		Extensions: map[string]string{"poolRef": "warm"}, Env: map[string]string{"CLAIM": "yes"},
		Metadata: map[string]string{"team": "k8s"}, Timeout: 10 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	writes := srv.writes.Since(before)
	t.Logf("API writes of a warm claim: %v", writes)
	if k8stest.Total(writes) != 1 || writes["PUT secrets"] != 1 {
		t.Errorf("a warm claim made API writes %v, want one: the table shard with the record in it", writes)
	}
	if sb.Status.State != moat.StateRunning || sb.Metadata["team"] != "k8s" || sb.ExpiresAt == nil {
		t.Errorf("claimed sandbox %+v", sb)
	}
	var none sbv1.BatchSandbox
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: sb.ID}, &none); err == nil {
		t.Errorf("a claim made BatchSandbox %s", sb.ID)
	}
	tbl := table(t, c, ns, "warm")
	own, ok := tbl.Owners[alloc.SandboxOwner("claims", sb.ID)]
	if !ok || len(own.Pods) != 1 {
		t.Fatalf("table %+v has no entry for %s", tbl, sb.ID)
	}
	pod := own.Pods[0]
	var rec struct {
		ID       string            `json:"id"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(tbl.Records[alloc.SandboxOwner("claims", sb.ID)], &rec); err != nil || rec.ID != sb.ID || rec.Metadata["team"] != "k8s" {
		t.Errorf("the claim's table shard holds record %+v (%v), want sandbox %s's", rec, err, sb.ID)
	}
	var p corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod}, &p); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: alloc.TokenSecretName("warm")}, &sec); err != nil {
		t.Fatal(err)
	}
	ep, err := srv.cl.Endpoint(ctx, sb.ID, agentproto.Port, false)
	if err != nil {
		t.Fatal(err)
	}
	if ep.Address != net.JoinHostPort(p.Status.PodIP, "44772") || ep.Headers[agentproto.TokenHeader] != string(sec.Data[pod]) {
		t.Errorf("endpoint %+v, want pod %s at %s with its own token", ep, pod, p.Status.PodIP)
	}
	ag, ok := env.Agent(p.Status.PodIP)
	if !ok || ag.Env()["CLAIM"] != "yes" {
		t.Errorf("the claim's env did not reach the agent of %s", pod)
	}

	// A batch from the same pool: its own pods, tokens and records, in one
	// write per table shard its pods come from (the pool's three other
	// pods are spread over the shards by their names' hash; a shard with
	// free pods for the whole batch serves it alone).
	before = srv.writes.Snapshot()
	batch, err := srv.cl.CreateBatch(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	tbl = table(t, c, ns, "warm")
	shards := map[int]bool{}
	for _, b := range batch {
		for _, p := range tbl.Owners[alloc.SandboxOwner("claims", b.ID)].Pods {
			shards[alloc.ShardOf(p, alloc.MinShards)] = true
		}
	}
	if writes := srv.writes.Since(before); k8stest.Total(writes) != len(shards) || writes["PUT secrets"] != len(shards) {
		t.Errorf("a warm batch of 3 from %d shards made API writes %v, want one per shard, the records in them", len(shards), writes)
	}
	for _, b := range batch {
		if len(tbl.Records[alloc.SandboxOwner("claims", b.ID)]) == 0 {
			t.Errorf("batch sandbox %s has no record in the table", b.ID)
		}
	}
	seen := map[string]bool{pod: true}
	tokens := map[string]bool{ep.Headers[agentproto.TokenHeader]: true}
	for _, b := range batch {
		own := tbl.Owners[alloc.SandboxOwner("claims", b.ID)]
		if b.Status.State != moat.StateRunning || len(own.Pods) != 1 || seen[own.Pods[0]] {
			t.Errorf("batch sandbox %s: %+v, pods %v", b.ID, b.Status, own.Pods)
			continue
		}
		seen[own.Pods[0]] = true
		e, err := srv.cl.Endpoint(ctx, b.ID, agentproto.Port, false)
		if err != nil || tokens[e.Headers[agentproto.TokenHeader]] {
			t.Errorf("batch sandbox %s endpoint %+v %v: token not its own", b.ID, e, err)
		}
		tokens[e.Headers[agentproto.TokenHeader]] = true
	}

	// The pool refills behind the claims.
	waitFor(t, 60*time.Second, "pool refilled", func() (bool, string) {
		p, err := srv.cl.GetPool(ctx, "warm")
		return err == nil && p.Status.Available >= 2 && p.Status.Allocated == 4, fmt.Sprintf("%+v %v", p.Status, err)
	})

	// Back-pressure: a batch that would take the pool past its poolMax
	// (10) is refused with upstream's 429, and claims nothing.
	before = srv.writes.Snapshot()
	_, err = srv.cl.CreateBatch(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}}, 12)
	var apiErr *moat.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "KUBERNETES::POOL_CAPACITY_EXHAUSTED" {
		t.Errorf("a batch past poolMax: %v", err)
	}
	if writes := srv.writes.Since(before); k8stest.Total(writes) != 0 {
		t.Errorf("a refused claim made API writes %v", writes)
	}
	if p, err := srv.cl.GetPool(ctx, "warm"); err != nil || p.Status.Allocated != 4 {
		t.Errorf("a refused claim changed the pool: %+v %v", p, err)
	}
	claimWithPolicy(t, srv, c, ns, pod, p.Status.PodIP)

	got, err := srv.cl.GetSandbox(ctx, sb.ID)
	if err != nil || got.Status.State != moat.StateRunning {
		t.Fatalf("get claimed sandbox: %+v %v", got, err)
	}
	if err := srv.cl.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	tbl = table(t, c, ns, "warm")
	if _, still := tbl.Owners[alloc.SandboxOwner("claims", sb.ID)]; still {
		t.Errorf("deleted sandbox still in the table")
	}
	if _, still := tbl.Records[alloc.SandboxOwner("claims", sb.ID)]; still {
		t.Errorf("deleted sandbox's record still in the table")
	}
	if _, retired := tbl.Retired[pod]; !retired {
		t.Errorf("pod %s of a deleted sandbox not retired: %+v", pod, tbl)
	}
	waitFor(t, 30*time.Second, "claimed pod deleted", func() (bool, string) {
		var p corev1.Pod
		err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod}, &p)
		return client.IgnoreNotFound(err) == nil && (err != nil || p.DeletionTimestamp != nil), fmt.Sprint(err)
	})
	if _, err := srv.cl.GetSandbox(ctx, sb.ID); err == nil {
		t.Error("deleted sandbox still found")
	}

	// A record too large to go inline (alloc.MaxInlineRecord: a big env)
	// is written on its own after the claim.
	before = srv.writes.Snapshot()
	big, err := srv.cl.CreateSandbox(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"},
		Env: map[string]string{"BIG": strings.Repeat("x", alloc.MaxInlineRecord)}})
	if err != nil {
		t.Fatal(err)
	}
	if writes := srv.writes.Since(before); k8stest.Total(writes) != 2 || writes["PUT secrets"] != 1 || writes["POST secrets"] != 1 {
		t.Errorf("a warm claim with a large record made API writes %v, want the table shard and the record", writes)
	}
	if tbl := table(t, c, ns, "warm"); tbl.Records[alloc.SandboxOwner("claims", big.ID)] != nil || len(tbl.Owners[alloc.SandboxOwner("claims", big.ID)].Pods) != 1 {
		t.Errorf("a large record went inline, or its claim is not in the table")
	}
	if got, err := srv.cl.GetSandbox(ctx, big.ID); err != nil || got.Status.State != moat.StateRunning {
		t.Errorf("the claim with a large record: %+v %v", got, err)
	}
}

// claimWithPolicy: the pods of a pool made through the Lifecycle API have
// an egress sidecar (the sandbox container without NET_ADMIN), each with
// an egress token of its own that the sandbox container is not given;
// a claim with a network policy stays warm (the same one write), and its
// policy is in force in its pod's sidecar before the claim answers; the
// egress API changes it live there. A claim without one leaves its pod's
// sidecar as it started (allowing everything). pod, ip: a pod claimed
// without a policy.
func claimWithPolicy(t *testing.T, srv *testServer, c client.Client, ns, pod, ip string) {
	ctx := context.Background()
	var p corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: pod}, &p); err != nil {
		t.Fatal(err)
	}
	var side *corev1.Container
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == sidecar.ContainerName {
			side = &p.Spec.InitContainers[i]
		}
	}
	if side == nil {
		t.Fatalf("pool pod %s has no egress sidecar: %+v", pod, p.Spec.InitContainers)
	}
	var tokRef *corev1.SecretKeySelector
	for _, e := range side.Env {
		if e.Name == sidecar.EnvToken && e.ValueFrom != nil {
			tokRef = e.ValueFrom.SecretKeyRef
		}
	}
	if tokRef == nil || tokRef.Name != alloc.TokenSecretName("warm") || tokRef.Key != alloc.EgressTokenKey(pod) {
		t.Errorf("pool pod %s's sidecar token %+v, want its own key in the pool's token Secret", pod, tokRef)
	}
	for _, e := range p.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key == alloc.EgressTokenKey(pod) {
			t.Errorf("the sandbox container is given the egress token (%s)", e.Name)
		}
	}
	if sc := p.Spec.Containers[0].SecurityContext; sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "NET_ADMIN") {
		t.Errorf("the sandbox container of pool pod %s keeps NET_ADMIN: %+v", pod, sc)
	}
	if pol, set, ok := env.SidecarPolicy(ip); !ok || set != 0 || pol.DefaultAction != policy.Allow {
		t.Errorf("sidecar of %s, claimed without a policy: %+v set %d times (%v), want it allowing everything, untouched", pod, pol, set, ok)
	}

	before := srv.writes.Snapshot()
	np := &moat.NetworkPolicy{DefaultAction: "deny", Egress: []moat.NetworkRule{{Action: "allow", Target: "pypi.example.test"}}}
	sb, err := srv.cl.CreateSandbox(ctx, moat.CreateRequest{Extensions: map[string]string{"poolRef": "warm"}, NetworkPolicy: np})
	if err != nil {
		t.Fatalf("a warm claim with a network policy: %v", err)
	}
	t.Cleanup(func() { srv.cl.DeleteSandbox(context.Background(), sb.ID) })
	if writes := srv.writes.Since(before); k8stest.Total(writes) != 1 {
		t.Errorf("a warm claim with a policy made API writes %v, want the one of any claim", writes)
	}
	tbl := table(t, c, ns, "warm")
	own, ok := tbl.Owners[alloc.SandboxOwner("claims", sb.ID)]
	if !ok || len(own.Pods) != 1 {
		t.Fatalf("claim with a policy: not warm (table %+v)", tbl)
	}
	var pp corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: own.Pods[0]}, &pp); err != nil {
		t.Fatal(err)
	}
	pol, set, ok := env.SidecarPolicy(pp.Status.PodIP)
	if !ok || set != 1 || pol.DefaultAction != policy.Deny || len(pol.Egress) != 1 || pol.Egress[0].Target != "pypi.example.test" {
		t.Fatalf("sidecar of claimed pod %s: %+v set %d times (%v), want the claim's policy", pp.Name, pol, set, ok)
	}

	// Live: the egress API's PATCH (what the SDKs call) reaches the
	// sidecar.
	ep, err := srv.cl.Endpoint(ctx, sb.ID, sidecar.Port, false)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := testutil.EgressPolicy(t, "PATCH", ep.Address, ep.Headers, `[{"action":"allow","target":"10.9.0.0/16"}]`); code != 200 {
		t.Fatalf("PATCH policy: %d %s", code, body)
	}
	if pol, set, _ := env.SidecarPolicy(pp.Status.PodIP); set != 2 || len(pol.Egress) != 2 ||
		!slices.ContainsFunc(pol.Egress, func(r policy.Rule) bool { return r.Target == "10.9.0.0/16" }) {
		t.Errorf("after PATCH the sidecar enforces %+v (set %d times)", pol, set)
	}
}
