package k8stest

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

// Main runs a test binary's tests against one shared Env started with o
// (stored in *env), or skips them all with a message when the tools are
// missing, unless RequireEnv is set (then it fails).
func Main(m *testing.M, env **Env, o Options) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if testing.Short() {
		os.Exit(m.Run())
	}
	if miss := Missing(); len(miss) > 0 {
		msg := fmt.Sprintf("k8stest: %s not found in %s; build them with scripts/build-k8s-tools.sh (make test does)",
			strings.Join(miss, ", "), AssetsDir())
		if os.Getenv(RequireEnv) != "" {
			fmt.Fprintln(os.Stderr, "FAIL:", msg)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "SKIP:", msg)
		testutil.Main(m)
	}
	e, err := Start(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "k8stest: stop:", err)
	}
	testutil.RemoveBuilt()
	os.Exit(code)
}

// Require skips t when no Env is running (tools missing, or -short).
func Require(t testing.TB, env *Env) {
	t.Helper()
	if env == nil {
		if testing.Short() {
			t.Skip("k8stest: skipped in -short mode")
		}
		t.Skipf("k8stest: Kubernetes test tools missing in %s (run scripts/build-k8s-tools.sh)", AssetsDir())
	}
}

// RequireTools skips t when the tools are missing (failing instead when
// RequireEnv is set), for tests that Start their own Env.
func RequireTools(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("k8stest: skipped in -short mode")
	}
	if miss := Missing(); len(miss) > 0 {
		msg := fmt.Sprintf("k8stest: %s not found in %s (run scripts/build-k8s-tools.sh)", strings.Join(miss, ", "), AssetsDir())
		if os.Getenv(RequireEnv) != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// ReadManifests reads the objects of a YAML file of one or more documents.
func ReadManifests(t testing.TB, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(o.Object) > 0 {
			out = append(out, &o)
		}
	}
}

// StartTestNode starts a real single-node cluster for t on a leased test
// network (testutil/testnet: bridge, subnet and cgroup parent of its own)
// and stops it at t's end. It skips t in -short mode, fails without root
// under CI (skips otherwise), and skips when the node tools are missing
// unless RequireEnv is set.
func StartTestNode(t testing.TB) *Node {
	t.Helper()
	if testing.Short() {
		t.Skip("k8stest: real node skipped in -short mode")
	}
	testutil.RequiresRoot(t)
	if miss := MissingNodeTools(); len(miss) > 0 {
		msg := fmt.Sprintf("k8stest: node tools missing: %s (run scripts/build-k8s-tools.sh)", strings.Join(miss, ", "))
		if os.Getenv(RequireEnv) != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	pause := testutil.BusyboxRootfs(t)
	lease := testnet.New(t, testnet.Bits(24))
	subnet := &net.IPNet{IP: lease.Subnet.Addr().AsSlice(), Mask: net.CIDRMask(lease.Subnet.Bits(), 32)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, err := StartNode(ctx, NodeOptions{Name: lease.Name, Bridge: lease.Name, Subnet: subnet,
		CgroupRoot: lease.CgroupParent, Env: []string{lease.Env()}, PauseRootfs: pause})
	if err != nil {
		t.Fatal(err)
	}
	lease.Own(node.dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node logs:\n%s", node.Logs())
		}
		if err := node.Stop(); err != nil {
			t.Errorf("stop node: %v", err)
		}
		// The kubelet must not have touched the host's firewall.
		for _, tool := range []string{"iptables-save", "ip6tables-save"} {
			if out, err := exec.Command(tool).Output(); err == nil && strings.Contains(string(out), "KUBE-") {
				t.Errorf("%s shows chains the kubelet left:\n%s", tool, out)
			}
		}
	})
	return node
}
