package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestKubernetesEgress: `moat serve --runtime kubernetes` enforces a
// sandbox's networkPolicy in its pod (the egress sidecar) with the native
// runtime's semantics: a name is answered only if allowed and only its
// addresses are reachable, the sandbox holds neither NET_ADMIN nor
// NET_RAW and cannot use the egress API without the token, a PATCH
// through the server's egress API (what the SDKs call) changes the policy
// live, and a restarted server serves the same policy. The outside host
// is two plain pods of the test; the upstream resolver serves a map of
// the test's own on the node's bridge address.
func TestKubernetesEgress(t *testing.T) {
	k := startKubeStack(t)
	a, b := outsidePods(t, k)
	upstream, _ := nettest.ServeDNS(t, "", net.JoinHostPort(k.node.Gateway.String(), "0"), map[string][]string{
		"allowed.test.": {"allowed.test. 300 IN A " + a},
		"denied.test.":  {"denied.test. 300 IN A " + b},
	})
	args := k.serverArgs()
	args[slices.Index(args, "--dns-upstream")+1] = upstream
	srv := newServer(t)
	srv.start(args...)

	id := srv.createIdle(k.ref, map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "allowed.test"}}})
	reach := func(host string) bool {
		t.Helper()
		out, _ := shell(t, srv, id, probeOutside(host))
		return reachedOutside(out)
	}
	if !reach("allowed.test") {
		t.Error("allowed.test is unreachable")
	}
	if reach("denied.test") {
		t.Error("a sandbox reached denied.test, which its policy denies")
	}
	if reach(b) {
		t.Errorf("a sandbox reached %s (denied.test's address) directly", b)
	}
	if out, _ := shell(t, srv, id, "nslookup denied.test 2>&1; true"); strings.Contains(out, b) {
		t.Errorf("denied.test was answered: %q", out)
	}
	// No capability that could change the ruleset or slip past it.
	out, _ := shell(t, srv, id, "grep CapBnd /proc/self/status")
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("CapBnd: %q", out)
	}
	bnd, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if netAdmin, netRaw := uint64(1)<<12, uint64(1)<<13; bnd&netAdmin != 0 || bnd&netRaw != 0 {
		t.Errorf("the sandbox's bounding set %x holds NET_ADMIN or NET_RAW", bnd)
	}
	// The sidecar's API is on the pod's loopback, but wants the token.
	if out, _ := shell(t, srv, id, "wget -q -O- http://127.0.0.1:18080/policy 2>&1; true"); strings.Contains(out, "enforcing") {
		t.Errorf("the sandbox read its policy from the sidecar without the token: %q", out)
	}

	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/endpoints/18080", nil, &ep)
	tok := ep.Headers["OPENSANDBOX-EGRESS-AUTH"]
	if tok == "" || !strings.HasSuffix(ep.Endpoint, "/sandboxes/"+id+"/proxy/18080") {
		t.Fatalf("egress endpoint %+v", ep)
	}
	call := func(method, body, token string) (int, string) {
		t.Helper()
		var h map[string]string
		if token != "" {
			h = map[string]string{"OPENSANDBOX-EGRESS-AUTH": token}
		}
		return testutil.EgressPolicy(t, method, ep.Endpoint, h, body)
	}
	if code, _ := call("PATCH", `[{"action":"allow","target":"denied.test"}]`, ""); code != 401 {
		t.Fatalf("egress PATCH without token: %d", code)
	}
	if code, body := call("PATCH", `[{"action":"allow","target":"denied.test"}]`, tok); code != 200 || !strings.Contains(body, `"enforcing"`) {
		t.Fatalf("egress PATCH: %d %s", code, body)
	}
	if !reach("denied.test") {
		t.Error("after the PATCH allowed it, denied.test is unreachable")
	}

	srv.kill9()
	srv.start(args...)
	code, body := call("GET", "", tok)
	var st struct {
		Mode   string `json:"mode"`
		Policy struct {
			Egress []struct{ Action, Target string } `json:"egress"`
		} `json:"policy"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Mode != "enforcing" || len(st.Policy.Egress) != 2 {
		t.Fatalf("policy after a server restart: %d %s", code, body)
	}
	if code, body := call("POST", `{"defaultAction":"deny"}`, tok); code != 200 || !strings.Contains(body, `"deny_all"`) {
		t.Fatalf("egress POST deny-all: %d %s", code, body)
	}
	if reach("allowed.test") {
		t.Error("under deny-all, allowed.test is still reachable")
	}
	t.Run("WarmClaim", func(t *testing.T) { kubernetesWarmPolicy(t, srv, k, b) })
	t.Run("TenantNamespaces", func(t *testing.T) { kubernetesTenantIsolation(t, k, a) })
}

// kubernetesTenantIsolation: with a tenants file, each tenant's sandboxes
// run in its own namespace on the real node, and the NetworkPolicy moat
// makes there keeps tenants' pods apart: a sandbox of one tenant cannot
// open a connection to another's, either way, nor can one of the
// server's own namespace (the default tenant); the node (the server)
// reaches them all, and they reach a plain pod (outside, its address).
func kubernetesTenantIsolation(t *testing.T, k *kubeStack, outside string) {
	c, err := client.New(k.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	home, nsA, nsB := k.ns+"-ten", k.ns+"-ten-alpha", k.ns+"-ten-beta"
	for _, ns := range []string{home, nsA, nsB} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.Background(), n) })
	}
	const alphaKey, betaKey = "osk-alpha-0123456789abcdef", "osk-beta-0123456789abcdef"
	file := filepath.Join(t.TempDir(), "tenants.toml")
	if err := os.WriteFile(file, []byte(`
[[tenants]]
name = "alpha"
namespace = "`+nsA+`"
api_keys = ["`+alphaKey+`"]

[[tenants]]
name = "beta"
namespace = "`+nsB+`"
api_keys = ["`+betaKey+`"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := k.serverArgs()
	args[slices.Index(args, "--k8s-namespace")+1] = home
	srv := newServer(t)
	srv.start(append(args, "--tenants-file", file)...)

	// Each sandbox serves a banner on port 7000.
	// create makes a sandbox of the tenant of key, which must land in
	// namespace ns, and returns its id and pod address.
	create := func(key, ns string) (string, string) {
		t.Helper()
		var sb sandboxResp
		code, body, _ := srv.do("POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": k.ref},
			"entrypoint": []string{"sh", "-c", "while true; do echo " + strings.TrimSpace(nettest.Banner) + " | nc -l -p 7000; done"}, "timeout": 600},
			"OPEN-SANDBOX-API-KEY", key)
		if code != 202 || json.Unmarshal(body, &sb) != nil {
			t.Fatalf("create: %d %s", code, body)
		}
		t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+sb.ID, nil) })
		shell(t, srv, sb.ID, "true") // it runs
		var bs sbv1.BatchSandbox
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: sb.ID}, &bs); err != nil || len(bs.Endpoints()) != 1 {
			t.Fatalf("sandbox %s in namespace %s: %v %v", sb.ID, ns, err, bs.Endpoints())
		}
		return sb.ID, bs.Endpoints()[0]
	}
	a, ipA := create(alphaKey, nsA)
	b, ipB := create(betaKey, nsB)
	d, _ := create(srv.key, home)
	reach := func(from, ip string) bool {
		t.Helper()
		out, _ := shell(t, srv, from, probeOutside(ip))
		return reachedOutside(out)
	}
	for _, ip := range []string{ipA, ipB} {
		// From the node: the banner is served.
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "7000"), 5*time.Second)
		if err != nil {
			t.Fatalf("the node cannot reach a tenant's sandbox at %s: %v", ip, err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(conn)
		conn.Close()
		if !reachedOutside(string(got)) {
			t.Fatalf("%s:7000 answered %q, not the banner", ip, got)
		}
	}
	if !reach(a, outside) || !reach(b, outside) {
		t.Fatalf("the tenants' sandboxes cannot reach a plain pod at %s", outside)
	}
	if reach(d, ipA) || reach(d, ipB) {
		t.Error("a sandbox of the server's namespace reached a tenant's sandbox")
	}
	if reach(a, ipB) {
		t.Error("tenant alpha's sandbox reached tenant beta's")
	}
	if reach(b, ipA) {
		t.Error("tenant beta's sandbox reached tenant alpha's")
	}
}

// kubernetesWarmPolicy: a claim with a network policy from a pool stays
// warm (the pool's pod, no cold pod) and is filtered like a cold create
// from its first command; the egress API changes it live; a claim
// without a policy from the same pool resolves and reaches everything
// (its sidecar allows all). denied is denied.test's address.
func kubernetesWarmPolicy(t *testing.T, srv *server, k *kubeStack, denied string) {
	srv.mustJSON(201, "POST", "/v1/pools", map[string]any{
		"name":         "warm-egress",
		"template":     map[string]any{"image": map[string]any{"uri": k.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}},
		"capacitySpec": map[string]int{"bufferMin": 2, "bufferMax": 2, "poolMin": 0, "poolMax": 4},
	}, nil)
	t.Cleanup(func() { srv.do("DELETE", "/v1/pools/warm-egress", nil) })
	var pool struct {
		Status struct{ Total, Allocated, Available int } `json:"status"`
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		srv.mustJSON(200, "GET", "/v1/pools/warm-egress", nil, &pool)
		if pool.Status.Available == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not warm: %+v", pool.Status)
		}
		time.Sleep(500 * time.Millisecond)
	}
	claim := func(np any) string {
		t.Helper()
		body := map[string]any{"extensions": map[string]string{"poolRef": "warm-egress"}, "timeout": 600}
		if np != nil {
			body["networkPolicy"] = np
		}
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", body, &c)
		t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
		return c.ID
	}
	start := time.Now()
	id := claim(map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "allowed.test"}}})
	t.Logf("warm claim with a policy answered in %v", time.Since(start))
	// The pool's status follows its table (the controller writes it).
	for deadline := time.Now().Add(30 * time.Second); ; {
		srv.mustJSON(200, "GET", "/v1/pools/warm-egress", nil, &pool)
		if pool.Status.Allocated == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim with a policy did not take a pool pod: %+v", pool.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	reach := func(id, host string) bool {
		t.Helper()
		out, _ := shell(t, srv, id, probeOutside(host))
		return reachedOutside(out)
	}
	if !reach(id, "allowed.test") {
		t.Error("warm claim: allowed.test is unreachable")
	}
	if reach(id, "denied.test") || reach(id, denied) {
		t.Error("warm claim: reached denied.test, which its policy denies")
	}
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/endpoints/18080", nil, &ep)
	if code, body := testutil.EgressPolicy(t, "PATCH", ep.Endpoint, ep.Headers, `[{"action":"allow","target":"denied.test"}]`); code != 200 {
		t.Fatalf("egress PATCH of a warm claim: %d %s", code, body)
	}
	if !reach(id, "denied.test") {
		t.Error("warm claim: after the PATCH allowed it, denied.test is unreachable")
	}

	open := claim(nil)
	if !reach(open, "allowed.test") || !reach(open, denied) {
		t.Error("a warm claim without a policy cannot resolve or reach the outside hosts")
	}
}

// outsidePods starts two plain pods (not sandboxes) in k's namespace that
// answer the banner on port 7000, and returns their addresses.
func outsidePods(t *testing.T, k *kubeStack) (string, string) {
	t.Helper()
	c, err := client.New(k.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ips []string
	for _, name := range []string{"outside-a", "outside-b"} {
		zero := int64(0)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: name},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &zero, Containers: []corev1.Container{{Name: "banner", Image: k.ref,
				Command: []string{"sh", "-c", "while true; do echo " + strings.TrimSpace(nettest.Banner) + " | nc -l -p 7000; done"}}}},
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.Background(), p) })
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				t.Fatal(err)
			}
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s not running: %+v", name, p.Status)
			}
			time.Sleep(200 * time.Millisecond)
		}
		ips = append(ips, p.Status.PodIP)
	}
	return ips[0], ips[1]
}
