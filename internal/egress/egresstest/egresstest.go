//go:build linux

// Package egresstest enforces network policies on a test backend's
// sandboxes as the server does (the host firewall and NAT of the bridge,
// the egress enforcer in each sandbox's netns), against a fake outside
// host in a netns of the test's own: the runtime conformance suite's
// Egress case runs on it (runtimetest.EgressHarness).
package egresstest

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

// Network describes a backend's sandbox network.
type Network struct {
	// Bridge, Subnet and Gateway are the host bridge and its IPv4 range and
	// address.
	Bridge  string
	Subnet  netip.Prefix
	Gateway netip.Addr
	// NetnsPath locates a sandbox's network namespace.
	NetnsPath func(ctx context.Context, id string) (string, error)
}

// Harness is a runtimetest.EgressHarness.
type Harness struct {
	enf          *egress.Enforcer
	netns        func(ctx context.Context, id string) (string, error)
	allowed, den string
}

// New firewalls nw's bridge, starts an enforcer for it and an outside host
// with two addresses from lease's outside range (index 2), both serving
// nettest.Banner on port 7000. Everything goes at cleanup.
func New(t *testing.T, lease *testnet.Net, nw Network) *Harness {
	t.Helper()
	ctx := context.Background()
	if err := nft.ApplyHost(ctx, nft.HostConfig{Bridge: nw.Bridge, Subnet: nw.Subnet, Gateway: nw.Gateway}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nft.RemoveHost(context.Background(), nw.Bridge) })
	out := lease.Outside(2)
	host, a, b := out.Addr().Next(), out.Addr().Next().Next(), out.Addr().Next().Next().Next()
	name, veth := lease.Netns("eg"), lease.Link("eg")
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", veth).Run() })
	run("addr", "add", host.String()+"/29", "dev", veth)
	run("link", "set", veth, "up")
	run("-n", name, "addr", "add", a.String()+"/29", "dev", "eth0")
	run("-n", name, "addr", "add", b.String()+"/29", "dev", "eth0")
	run("-n", name, "link", "set", "eth0", "up")
	run("-n", name, "link", "set", "lo", "up")
	if !strings.HasPrefix(nettest.Banner, runtimetest.Banner) {
		t.Fatalf("nettest.Banner %q does not start with runtimetest.Banner %q", nettest.Banner, runtimetest.Banner)
	}
	for _, addr := range []netip.Addr{a, b} {
		nettest.ServeTCP(t, "/run/netns/"+name, netip.AddrPortFrom(addr, 7000).String())
	}
	enf, err := egress.New(egress.Config{
		DNS: netip.AddrPortFrom(nw.Gateway, 53),
		// No DNS in the suite's case (IP rules only): a dead upstream.
		Upstreams:  []string{"127.0.0.1:9"},
		Blocked:    []netip.Prefix{nw.Subnet, netip.MustParsePrefix("169.254.0.0/16")},
		Unattached: nw.Subnet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { enf.Close() })
	return &Harness{enf: enf, netns: nw.NetnsPath, allowed: a.String(), den: b.String()}
}

// Attach enforces p on sandbox id (address ip) until the test ends.
func (h *Harness) Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error {
	path, err := h.netns(ctx, id)
	if err != nil {
		return err
	}
	return h.enf.Attach(ctx, id, path, ip, p)
}

// Update replaces the policy of sandbox id live.
func (h *Harness) Update(ctx context.Context, id string, p policy.NetworkPolicy) error {
	_, err := h.enf.Update(ctx, id, p)
	return err
}

// Outside returns the outside host's two addresses (port 7000 answers
// with nettest.Banner on both).
func (h *Harness) Outside() (string, string) { return h.allowed, h.den }
