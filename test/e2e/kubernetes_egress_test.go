package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
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
		req, _ := http.NewRequest(method, "http://"+ep.Endpoint+"/policy", bytes.NewReader([]byte(body)))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("OPENSANDBOX-EGRESS-AUTH", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
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
