package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func bridgeMAC(t *testing.T, name string) string {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr.String()
}

// TestBridgeMACStable guards against the gateway MAC following the bridge's
// ports: Linux gives an unpinned bridge the lowest MAC of its ports, so it
// changed with every sandbox created or deleted, and sandboxes that had
// resolved the gateway earlier lost their replies to the host until their
// ARP entry expired (first commands stalled for seconds to minutes under
// `moat bench load`).
func TestBridgeMACStable(t *testing.T) {
	m := openTest(t, testConfig(t, 24))
	ctx := context.Background()
	br := m.Bridge()
	want := bridgeMAC(t, br)
	if want == "00:00:00:00:00:00" || want == "" {
		t.Fatalf("bridge MAC after Open = %q", want)
	}
	typ, err := os.ReadFile(filepath.Join("/sys/class/net", br, "addr_assign_type"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(typ)); got != "3" {
		t.Errorf("bridge addr_assign_type = %s, want 3 (NET_ADDR_SET)", got)
	}
	for i := range 4 {
		id := fmt.Sprintf("mac-%d", i)
		if _, err := m.Setup(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := bridgeMAC(t, br); got != want {
			t.Fatalf("bridge MAC after Setup(%s) = %s, want %s", id, got, want)
		}
		if i%2 == 1 {
			if err := m.Teardown(ctx, id); err != nil {
				t.Fatal(err)
			}
			if got := bridgeMAC(t, br); got != want {
				t.Fatalf("bridge MAC after Teardown(%s) = %s, want %s", id, got, want)
			}
		}
	}
	// A restart keeps the address, so running sandboxes keep their gateway.
	if err := m.ensureBridge(); err != nil {
		t.Fatal(err)
	}
	if got := bridgeMAC(t, br); got != want {
		t.Fatalf("bridge MAC after ensureBridge again = %s, want %s", got, want)
	}
}

// TestSetupForgetsStaleNeighbor: an address handed out again must not keep
// the host's neighbor entry of its previous owner (a MAC that is gone), or
// the host's first packets to the new sandbox are lost until it expires.
func TestSetupForgetsStaleNeighbor(t *testing.T) {
	m := openTest(t, testConfig(t, 24))
	ctx := context.Background()
	a, err := m.Setup(ctx, "neigh-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, "neigh-0"); err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(m.Bridge())
	if err != nil {
		t.Fatal(err)
	}
	// Plant a stale entry on every address the next Setup might get.
	stale, _ := net.ParseMAC("02:00:5e:00:53:01")
	ip := a.IP
	for range 16 {
		n := &netlink.Neigh{LinkIndex: br.Attrs().Index, IP: net.IP(ip.AsSlice()), HardwareAddr: stale,
			State: netlink.NUD_REACHABLE, Family: netlink.FAMILY_V4}
		if err := netlink.NeighSet(n); err != nil {
			t.Fatal(err)
		}
		ip = ip.Next()
	}
	b, err := m.Setup(ctx, "neigh-1")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Teardown(ctx, "neigh-1")
	a.IP = b.IP
	list, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.IP.Equal(net.IP(a.IP.AsSlice())) && e.HardwareAddr.String() == stale.String() {
			t.Fatalf("stale neighbor entry for %s survived Setup: %+v", a.IP, e)
		}
	}
}

// TestStaticNeighbors: the host's entries for a sandbox's addresses and
// the sandbox's entries for its gateways are permanent (exempt from the
// kernel's global limit on dynamic neighbor entries, which a cold batch of
// 1,000 sandboxes overflowed), traffic both ways needs no ARP at all, the
// host's entries go with the sandbox, and Open removes those of sandboxes
// it has no record of.
func TestStaticNeighbors(t *testing.T) { withSpares(t, testStaticNeighbors) }

func testStaticNeighbors(t *testing.T, spares int) {
	cfg := testConfig(t, 24)
	cfg.Subnet6 = leases[cfg.Bridge].Subnet6
	cfg.Spares = spares
	m := openTest(t, cfg)
	ctx := context.Background()
	waitSpares(t, m, spares)
	a, err := m.Setup(ctx, "static-a")
	if err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(m.Bridge())
	if err != nil {
		t.Fatal(err)
	}
	h, eth := sandboxEth0(t, a.NetnsPath)
	hostEntries := permanentEntries(t, netlink.NeighList, br.Attrs().Index)
	for _, ip := range []netip.Addr{a.IP, a.IP6} {
		if got := hostEntries[ip]; got != eth.Attrs().HardwareAddr.String() {
			t.Errorf("host entry for %s = %q, want permanent -> %s (eth0)", ip, got, eth.Attrs().HardwareAddr)
		}
	}
	inside := permanentEntries(t, h.NeighList, eth.Attrs().Index)
	for _, gw := range []netip.Addr{a.Gateway, a.Gateway6} {
		if got := inside[gw]; got != br.Attrs().HardwareAddr.String() {
			t.Errorf("sandbox entry for gateway %s = %q, want permanent -> %s (bridge)", gw, got, br.Attrs().HardwareAddr)
		}
	}

	// No ARP answers either way (arp_ignore 8 on eth0 and on this test's
	// own bridge), yet the host reaches the sandbox and the sandbox
	// reaches the host.
	sandboxNS, err := netns.GetFromPath(a.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sandboxNS.Close()
	if err := inNetns(sandboxNS, func() error { return writeSysctl("/proc/sys/net/ipv4/conf/eth0/arp_ignore", "8") }); err != nil {
		t.Fatal(err)
	}
	if err := writeSysctl("/proc/sys/net/ipv4/conf/"+m.Bridge()+"/arp_ignore", "8"); err != nil {
		t.Fatal(err)
	}
	in := listenIn(t, a.NetnsPath, netip.AddrPortFrom(a.IP, 0).String())
	go serveHi(in)
	c, err := net.DialTimeout("tcp", in.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("host -> sandbox without ARP: %v", err)
	}
	c.Close()
	out, err := net.Listen("tcp4", netip.AddrPortFrom(a.Gateway, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	go serveHi(out)
	if c, err = dialFrom(t, a.NetnsPath, out.Addr().String()); err != nil {
		t.Fatalf("sandbox -> gateway without ARP: %v", err)
	}
	c.Close()

	if err := m.Teardown(ctx, "static-a"); err != nil {
		t.Fatal(err)
	}
	hostEntries = permanentEntries(t, netlink.NeighList, br.Attrs().Index)
	for _, ip := range []netip.Addr{a.IP, a.IP6} {
		if got, ok := hostEntries[ip]; ok {
			t.Errorf("host entry for %s (%s) outlived Teardown", ip, got)
		}
	}

	// A sandbox lost in a crash (no record) leaves its entry: Open
	// removes it and keeps the entries of live attachments.
	b, err := m.Setup(ctx, "static-b")
	if err != nil {
		t.Fatal(err)
	}
	lost := b.IP.Next()
	mac, _ := net.ParseMAC("02:00:5e:00:53:02")
	if err := netlink.NeighSet(permanentNeighbor(br.Attrs().Index, lost, mac)); err != nil {
		t.Fatal(err)
	}
	reopen := cfg
	reopen.Spares = 0
	if _, err := Open(ctx, reopen, nil); err != nil {
		t.Fatal(err)
	}
	hostEntries = permanentEntries(t, netlink.NeighList, br.Attrs().Index)
	if _, ok := hostEntries[lost]; ok {
		t.Errorf("entry of the lost sandbox address %s survived Open", lost)
	}
	if _, ok := hostEntries[b.IP]; !ok {
		t.Errorf("Open removed the entry of the live sandbox %s", b.IP)
	}
}

// permanentEntries lists the NUD_PERMANENT neighbor entries of a link:
// address -> MAC.
func permanentEntries(t *testing.T, list func(int, int) ([]netlink.Neigh, error), link int) map[netip.Addr]string {
	t.Helper()
	neighs, err := list(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]string{}
	for _, n := range neighs {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && n.State == netlink.NUD_PERMANENT {
			out[ip.Unmap()] = n.HardwareAddr.String()
		}
	}
	return out
}
