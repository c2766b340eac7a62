package e2e

import (
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
)

// TestDockerParity drives the docker runtime through what makes the
// native one safe: egress policy enforced in the container's netns by the
// same enforcer (IP rules, names through the DNS proxy, no other
// resolver), no sandbox-to-sandbox traffic, no IPv6 without --subnet6,
// and a clear refusal of the one thing it cannot do (a disk quota).
func TestDockerParity(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	o := outsideHost(t, srv.net, false)
	records := map[string][]string{"allowed.test.": {"allowed.test. 60 IN A " + o.a}}
	upstream, queries := nettest.ServeDNS(t, "", "127.0.0.1:0", records)
	nettest.ServeDNS(t, o.ns, o.b+":53", records) // a resolver the sandboxes must not use
	nettest.ServeTCP(t, o.ns, o.b+":7000")
	srv.startDocker("--dns-upstream", upstream)

	create := func(np any) string { return srv.createIdle(ref, np) }

	open := create(nil)
	named := create(map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "allowed.test"}}})

	// Baselines: without a policy the outside host is reachable (NAT),
	// names resolve through the proxy, and the other resolver answers.
	for _, a := range []string{o.a, o.b} {
		if got, ok := shell(t, srv, open, probeOutside(a)); !ok || !reachedOutside(got) {
			t.Fatalf("baseline: docker sandbox without policy -> %s: ok=%v %q", a, ok, got)
		}
	}
	if got, ok := shell(t, srv, open, "nslookup allowed.test"); !ok || !strings.Contains(got, o.a) {
		t.Fatalf("baseline: resolve through the DNS proxy: ok=%v %q", ok, got)
	}
	if got, ok := shell(t, srv, open, "nslookup allowed.test "+o.b); !ok || !strings.Contains(got, o.a) {
		t.Fatalf("baseline: the other resolver: ok=%v %q", ok, got)
	}

	// The policy: only allowed.test, resolved through moat's proxy.
	if got, ok := shell(t, srv, named, probeOutside("allowed.test")); !ok || !reachedOutside(got) {
		t.Fatalf("allowed name: ok=%v %q", ok, got)
	}
	if got, _ := shell(t, srv, named, probeOutside(o.b)); reachedOutside(got) {
		t.Fatalf("a docker sandbox with a deny policy reached an unresolved address: %q", got)
	}
	before := queries.Load()
	if got, ok := shell(t, srv, named, "nslookup denied.test"); ok || strings.Contains(got, o.a) {
		t.Fatalf("a denied name resolved: ok=%v %q", ok, got)
	}
	if queries.Load() != before {
		t.Fatal("a denied name was forwarded upstream")
	}
	if got, _ := shell(t, srv, named, "nslookup allowed.test "+o.b); strings.Contains(got, o.a) {
		t.Fatalf("a docker sandbox with a policy used another resolver: %q", got)
	}
	// A live update through the egress API closes the address.
	var eg endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+named+"/endpoints/18080", nil, &eg)
	path := strings.TrimPrefix(eg.Endpoint, srv.addr) + "/policy"
	if code, body, _ := srv.do("PATCH", path, []map[string]string{{"action": "deny", "target": "allowed.test"}},
		"OPENSANDBOX-EGRESS-AUTH", eg.Headers["OPENSANDBOX-EGRESS-AUTH"]); code != 200 {
		t.Fatalf("egress PATCH on a docker sandbox: %d %s", code, body)
	}
	if got, _ := shell(t, srv, named, probeOutside(o.a)); reachedOutside(got) {
		t.Fatalf("the address of a name denied by a live update stays open: %q", got)
	}

	// Isolation: one sandbox cannot reach another's agent, but the host can.
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+named+"/endpoints/44772", nil, &ep)
	if got, _ := shell(t, srv, open, "nc -w 2 "+strings.TrimSuffix(ep.Endpoint, ":44772")+" 44772 </dev/null && echo connected"); strings.Contains(got, "connected") {
		t.Fatal("a docker sandbox reached another sandbox's agent")
	}

	// No IPv6 path without --subnet6.
	if got, ok := shell(t, srv, open, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6"); !ok || strings.TrimSpace(got) != "1" {
		t.Fatalf("IPv6 in a docker sandbox without --subnet6: disable_ipv6=%q (ok=%v)", got, ok)
	}

	// A disk quota is refused, clearly.
	code, body, _ := srv.do("POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"}, "resourceLimits": map[string]string{"disk": "64Mi"}})
	if code != 501 || !strings.Contains(string(body), "disk") {
		t.Fatalf("a disk quota on docker: %d %s, want 501 naming the disk quota", code, body)
	}
}
