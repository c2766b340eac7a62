package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
)

// TestEgressIPv6 drives IPv6 egress from real dual-stack sandboxes
// (--subnet6): IPv6 CIDR rules, AAAA answers of the DNS proxy, and direct
// IPv6 connections; and checks a server without --subnet6 gives sandboxes
// no IPv6 path at all.
func TestEgressIPv6(t *testing.T) { egressIPv6(t) }

// TestEgressIPv6Docker: the same on the docker runtime (a dual-stack
// Docker network).
func TestEgressIPv6Docker(t *testing.T) { egressIPv6(t, "--runtime", "docker") }

func egressIPv6(t *testing.T, runtimeArgs ...string) {
	srv := newServer(t)
	ref := startRegistry(t)
	o := outsideHost(t, srv.net, true)
	out6A, out6B := o.a6, o.b6
	records := map[string][]string{
		"allowed6.test.": {"allowed6.test. 60 IN AAAA " + out6A},
		"denied6.test.":  {"denied6.test. 60 IN AAAA " + out6A},
	}
	upstream, queries := nettest.ServeDNS(t, "", "127.0.0.1:0", records)
	srv.start(append([]string{"--dns-upstream", upstream, "--subnet6", srv.net.Subnet6.String()}, runtimeArgs...)...)

	create := func(s *server, np any) string { return s.createIdle(ref, np) }

	open := create(srv, nil)
	cidr := create(srv, map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": out6A + "/128"}}})
	named := create(srv, map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "allowed6.test"}}})

	if got, ok := shell(t, srv, open, "ip -6 addr show dev eth0 2>/dev/null || cat /proc/net/if_inet6"); !ok || !strings.Contains(got, srv.net.Addr6(2).String()[:14]) && !strings.Contains(got, "fd6d6f617465") {
		t.Fatalf("dual-stack sandbox has no IPv6 address: ok=%v %q", ok, got)
	}
	// Baselines: without a policy both outside addresses are reachable (NAT66).
	for _, a := range []string{out6A, out6B} {
		if got, ok := shell(t, srv, open, probeOutside(a)); !ok || !reachedOutside(got) {
			t.Fatalf("baseline: no-policy sandbox -> %s: ok=%v %q", a, ok, got)
		}
	}
	if got, ok := shell(t, srv, open, "nslookup -type=AAAA denied6.test"); !ok || !strings.Contains(got, out6A) {
		t.Fatalf("baseline: AAAA through the proxy: ok=%v %q", ok, got)
	}

	// IPv6 CIDR rule: the allowed address works, another one does not.
	if got, ok := shell(t, srv, cidr, probeOutside(out6A)); !ok || !reachedOutside(got) {
		t.Fatalf("allowed IPv6 CIDR: ok=%v %q", ok, got)
	}
	if got, _ := shell(t, srv, cidr, probeOutside(out6B)); reachedOutside(got) {
		t.Fatalf("denied IPv6 direct connection got through: %q", got)
	}

	// Names: the AAAA of an allowed name is reachable; a denied name does
	// not resolve (and is never forwarded); an unresolved address is closed.
	if got, ok := shell(t, srv, named, probeOutside("allowed6.test")); !ok || !reachedOutside(got) {
		t.Fatalf("AAAA of an allowed name: ok=%v %q", ok, got)
	}
	before := queries.Load()
	if got, ok := shell(t, srv, named, "nslookup -type=AAAA denied6.test"); ok || strings.Contains(got, out6A) {
		t.Fatalf("AAAA of a denied name resolved: ok=%v %q", ok, got)
	}
	if queries.Load() != before {
		t.Fatal("a denied name was forwarded upstream")
	}
	if got, _ := shell(t, srv, named, probeOutside(out6B)); reachedOutside(got) {
		t.Fatalf("direct IPv6 connection to an unresolved address got through: %q", got)
	}

	// Host services stay closed over IPv6 too (the bridge's IPv6 address).
	port := hostService(t, "tcp6", "[::]:0", nettest.Banner)
	if got, _ := shell(t, srv, open, fmt.Sprintf("nc -w 2 %s %d", srv.net.Addr6(1), port)); reachedOutside(got) {
		t.Fatal("a sandbox reached a host service through the bridge's IPv6 address")
	}

	// Without --subnet6: IPv6 is disabled in the sandbox, nothing gets out.
	v4 := newServer(t)
	v4.start(append([]string{"--dns-upstream", upstream}, runtimeArgs...)...)
	only4 := create(v4, nil)
	if got, ok := shell(t, v4, only4, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6"); !ok || strings.TrimSpace(got) != "1" {
		t.Fatalf("IPv4-only sandbox: disable_ipv6 = %q (ok=%v)", got, ok)
	}
	for _, a := range []string{out6A, out6B} {
		if got, _ := shell(t, v4, only4, probeOutside(a)); reachedOutside(got) {
			t.Fatalf("IPv4-only sandbox reached %s over IPv6: %q", a, got)
		}
	}
}
