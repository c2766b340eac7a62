//go:build linux

package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const blockedWait = 300 * time.Millisecond

func matcher(t testing.TB, p policy.NetworkPolicy) *policy.Matcher {
	t.Helper()
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// reach asserts which TCP/UDP destinations the sandbox can reach.
func reach(t *testing.T, tp *nettest.Topology, step string, want map[string]bool) {
	t.Helper()
	for dst, ok := range want {
		network, addr := "tcp", dst
		if len(dst) > 4 && dst[:4] == "udp:" {
			network, addr = "udp", dst[4:]
		}
		wait := 2 * time.Second
		if !ok {
			wait = blockedWait
		}
		var err error
		if network == "tcp" {
			err = nettest.DialTCP(tp.SandboxPath, addr, wait)
		} else {
			err = nettest.EchoUDP(tp.SandboxPath, addr, wait)
		}
		if ok && err != nil {
			t.Errorf("%s: %s %s should be reachable: %v", step, network, addr, err)
		}
		if !ok && err == nil {
			t.Errorf("%s: %s %s should be blocked", step, network, addr)
		}
	}
}

func TestFirewall(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	tp := nettest.New(t)
	for _, h := range []string{"10.250.2.10", "10.250.2.53", "10.250.3.10", "10.250.3.20", "fd00:250:2::10"} {
		tp.AddHost(t, netip.MustParseAddr(h))
	}
	const (
		resolved   = "10.250.2.10:80"
		otherDNS   = "10.250.2.53:53"
		inCIDR     = "10.250.3.10:80"
		deniedInIt = "10.250.3.20:80"
		v6         = "[fd00:250:2::10]:80"
	)
	proxy := net.JoinHostPort(nettest.GatewayIP.String(), "53")
	for _, a := range []string{resolved, otherDNS, inCIDR, deniedInIt, v6, proxy} {
		nettest.ServeTCP(t, tp.GatewayPath, a)
	}
	for _, a := range []string{otherDNS, proxy, "10.250.2.53:853", "10.250.2.10:5000"} {
		nettest.ServeUDP(t, tp.GatewayPath, a)
	}
	all := map[string]bool{resolved: true, otherDNS: true, inCIDR: true, deniedInIt: true, v6: true, proxy: true,
		"udp:" + otherDNS: true, "udp:" + proxy: true, "udp:10.250.2.53:853": true, "udp:10.250.2.10:5000": true}
	reach(t, tp, "0 before Apply", all)

	f, err := Open(tp.SandboxPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dns := netip.AddrPortFrom(nettest.GatewayIP, 53)

	// 1 default deny with an ordered CIDR pair: the deny of .20 comes first.
	deny := policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{
		{Action: policy.Deny, Target: "10.250.3.20"},
		{Action: policy.Allow, Target: "10.250.3.0/24"},
		{Action: policy.Allow, Target: "example.com"},
	}}
	start := time.Now()
	if err := f.Apply(ctx, Config{Policy: matcher(t, deny), DNS: dns}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Apply (3 rules): %v", time.Since(start))
	if out, err := exec.Command("ip", "netns", "exec", tp.Sandbox, "nft", "list", "table", "inet", TableName).CombinedOutput(); err == nil {
		t.Logf("ruleset:\n%s", out)
	}
	// Ingress (the server reaching execd in the sandbox) still works: the
	// replies are conntrack-established.
	nettest.ServeTCP(t, tp.SandboxPath, net.JoinHostPort(nettest.SandboxIP.String(), "44772"))
	if err := nettest.DialTCP(tp.GatewayPath, net.JoinHostPort(nettest.SandboxIP.String(), "44772"), 2*time.Second); err != nil {
		t.Errorf("1 deny: ingress to the sandbox broken: %v", err)
	}
	reach(t, tp, "1 deny", map[string]bool{resolved: false, otherDNS: false, inCIDR: true, deniedInIt: false, v6: false,
		proxy: true, "udp:" + proxy: true, "udp:" + otherDNS: false, "udp:10.250.2.53:853": false, "udp:10.250.2.10:5000": false})

	// 2 resolved addresses open up, TCP and UDP alike.
	start = time.Now()
	if err := f.AllowResolved(ctx, []netip.Addr{netip.MustParseAddr("10.250.2.10")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("AllowResolved: %v", time.Since(start))
	reach(t, tp, "2 resolved", map[string]bool{resolved: true, "udp:10.250.2.10:5000": true, otherDNS: false})
	if got, _ := f.DynamicAddrs(ctx); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.250.2.10")}) {
		t.Errorf("DynamicAddrs = %v", got)
	}

	// 3 re-Apply keeps the dynamic entries passed in Resolved, drops others.
	if err := f.Apply(ctx, Config{Policy: matcher(t, deny), DNS: dns}); err != nil {
		t.Fatal(err)
	}
	reach(t, tp, "3 re-apply without resolved", map[string]bool{resolved: false})
	if err := f.Apply(ctx, Config{Policy: matcher(t, deny), DNS: dns,
		Resolved: []Resolved{{IPs: []netip.Addr{netip.MustParseAddr("10.250.2.10"), netip.MustParseAddr("fd00:250:2::10")}, TTL: time.Minute}}}); err != nil {
		t.Fatal(err)
	}
	// Forget the gateway's MAC so IPv6 needs neighbour discovery again.
	if out, err := exec.Command("ip", "-n", tp.Sandbox, "neigh", "flush", "all").CombinedOutput(); err != nil {
		t.Fatalf("neigh flush: %v: %s", err, out)
	}
	reach(t, tp, "3 re-apply with resolved", map[string]bool{resolved: true, v6: true, inCIDR: true})

	// 4 default allow with a Blocked range: blocked beats resolved; DNS
	// still only via the proxy.
	allow := policy.NetworkPolicy{DefaultAction: policy.Allow, Egress: []policy.Rule{{Action: policy.Deny, Target: "10.250.3.10"}}}
	if err := f.Apply(ctx, Config{Policy: matcher(t, allow), DNS: dns, Blocked: []netip.Prefix{netip.MustParsePrefix("10.250.2.0/25")},
		Resolved: []Resolved{{IPs: []netip.Addr{netip.MustParseAddr("10.250.2.10")}, TTL: time.Minute}}}); err != nil {
		t.Fatal(err)
	}
	reach(t, tp, "4 allow+blocked", map[string]bool{resolved: false, otherDNS: false, "udp:" + otherDNS: false,
		inCIDR: false, deniedInIt: true, v6: true, proxy: true, "udp:" + proxy: true})

	// 5 Remove restores everything, and is idempotent.
	if err := f.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	reach(t, tp, "5 removed", all)
	if err := f.AllowResolved(ctx, []netip.Addr{netip.MustParseAddr("10.250.2.99")}, time.Minute); err == nil {
		t.Error("AllowResolved without a table succeeded")
	}
}

func TestResolvedTimeouts(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	tp := nettest.New(t)
	f, err := Open(tp.SandboxPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Apply(ctx, Config{Policy: matcher(t, policy.DenyAll()), DNS: netip.AddrPortFrom(nettest.GatewayIP, 53)}); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("10.250.2.10")
	if err := f.AllowResolved(ctx, []netip.Addr{a}, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := f.AllowResolved(ctx, []netip.Addr{a}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if exp := time.Until(f.dyn[a]); exp < 9*time.Minute {
		t.Errorf("shorter TTL shortened the entry: expires in %v", exp)
	}
	// The kernel agrees.
	els, err := f.conn.GetSetElements(&nftables.Set{Table: table(), Name: setDyn4, KeyType: nftables.TypeIPAddr})
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 1 || els[0].Expires < 9*time.Minute {
		t.Errorf("kernel elements = %+v", els)
	}
	// A 2-second entry really expires.
	b := netip.MustParseAddr("10.250.2.11")
	if err := f.AllowResolved(ctx, []netip.Addr{b}, 0); err != nil { // clamped to 1s
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if got, _ := f.DynamicAddrs(ctx); slices.Contains(got, b) {
		t.Errorf("1s element still present after 1.5s: %v", got)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(""); err == nil {
		t.Error("Open(\"\") succeeded")
	}
	if _, err := Open("/nonexistent/netns"); err == nil {
		t.Error("Open(missing) succeeded")
	}
	if _, err := Open("/etc/hostname"); err == nil {
		t.Error("Open(regular file) succeeded")
	}
}

// TestApplyLargePolicy measures installing a policy at the rule cap, and
// checks that the large interval sets still match correctly.
func TestApplyLargePolicy(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	tp := nettest.New(t)
	tp.AddHost(t, netip.MustParseAddr("10.250.3.10"))
	tp.AddHost(t, netip.MustParseAddr("10.250.5.10"))
	nettest.ServeTCP(t, tp.GatewayPath, "10.250.3.10:80")
	nettest.ServeTCP(t, tp.GatewayPath, "10.250.5.10:80")
	var p policy.NetworkPolicy
	p.DefaultAction = policy.Deny
	// 4000 disjoint /28 allows in 172.16/12 and 96 v6 rules, then the test range.
	for i := range 4000 {
		p.Egress = append(p.Egress, policy.Rule{Action: []policy.Action{policy.Allow, policy.Deny}[i%2],
			Target: fmt.Sprintf("172.%d.%d.%d/28", 16+i/4096, (i/16)%256, (i%16)*16)})
	}
	for i := range 95 {
		p.Egress = append(p.Egress, policy.Rule{Action: policy.Allow, Target: fmt.Sprintf("fd00:%x::/32", i+1)})
	}
	p.Egress = append(p.Egress, policy.Rule{Action: policy.Allow, Target: "10.250.3.0/24"})
	f, err := Open(tp.SandboxPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := matcher(t, p)
	var ips []netip.Addr
	for i := range 2000 {
		ips = append(ips, netip.AddrFrom4([4]byte{192, 168, byte(i / 256), byte(i % 256)}))
	}
	cfg := Config{Policy: m, DNS: netip.AddrPortFrom(nettest.GatewayIP, 53), Resolved: []Resolved{{IPs: ips, TTL: time.Hour}}}
	for round := range 3 {
		start := time.Now()
		if err := f.Apply(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		t.Logf("Apply round %d (%d rules, %d dynamic): %v", round, len(p.Egress), len(ips), time.Since(start))
	}
	reach(t, tp, "large", map[string]bool{"10.250.3.10:80": true, "10.250.5.10:80": false})
}
