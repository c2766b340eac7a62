package network

import (
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// dialFrom dials addr (tcp) from inside the namespace at path.
func dialFrom(t *testing.T, path, addr string) (net.Conn, error) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	done := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- res{nil, err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- res{nil, err}
			return
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		done <- res{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// readSysctlIn reads a /proc/sys value inside the namespace at path.
func readSysctlIn(t *testing.T, path, key string) string {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var out string
	if err := inNetns(ns, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		out = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func serveHi(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("hi"))
		c.Close()
	}
}

func TestDualStackAndIsolation(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.Subnet6 = leases[cfg.Bridge].Subnet6
	m := openTest(t, cfg)
	ctx := context.Background()
	a, err := m.Setup(ctx, "sbx-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Setup(ctx, "sbx-b")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Subnet6.Contains(a.IP6) || a.Gateway6 != m.Gateway6() || a.PrefixLen6 != 64 {
		t.Fatalf("IPv6 attachment %+v", a)
	}
	// Same host offset as the IPv4 address.
	if a4, a6 := a.IP.As4(), a.IP6.As16(); a4[3] != a6[15] || a6[14] != 0 {
		t.Errorf("IPv6 %s does not mirror IPv4 %s", a.IP6, a.IP)
	}
	if got, _ := m.Get(ctx, "sbx-a"); got.IP6 != a.IP6 {
		t.Errorf("recorded IP6 %s, want %s", got.IP6, a.IP6)
	}
	for _, att := range []Attachment{a, b} {
		l, _ := netlink.LinkByName(att.HostVeth)
		pi, err := netlink.LinkGetProtinfo(l)
		if err != nil || !pi.Isolated {
			t.Errorf("bridge port %s not isolated: %+v %v", att.HostVeth, pi, err)
		}
		if v := readSysctlIn(t, att.NetnsPath, "net/ipv6/conf/eth0/disable_ipv6"); v != "0" {
			t.Errorf("disable_ipv6 = %s in a dual-stack sandbox", v)
		}
	}

	// B listens on both families.
	lb := listenIn(t, b.NetnsPath, "0.0.0.0:0")
	port := lb.Addr().(*net.TCPAddr).Port
	go serveHi(lb)
	lb6 := listen6In(t, b.NetnsPath, netip.AddrPortFrom(b.IP6, 0).String())
	port6 := lb6.Addr().(*net.TCPAddr).Port
	go serveHi(lb6)

	// The host reaches B over both families.
	for _, addr := range []string{netip.AddrPortFrom(b.IP, uint16(port)).String(), netip.AddrPortFrom(b.IP6, uint16(port6)).String()} {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatalf("host -> %s: %v", addr, err)
		}
		c.Close()
	}
	// A reaches the host (gateway) over IPv6, but not B at all.
	hl, err := net.Listen("tcp6", netip.AddrPortFrom(m.Gateway6(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	go serveHi(hl)
	if c, err := dialFrom(t, a.NetnsPath, hl.Addr().String()); err != nil {
		t.Errorf("sandbox -> IPv6 gateway: %v", err)
	} else {
		c.Close()
	}
	for _, addr := range []string{netip.AddrPortFrom(b.IP, uint16(port)).String(), netip.AddrPortFrom(b.IP6, uint16(port6)).String()} {
		if c, err := dialFrom(t, a.NetnsPath, addr); err == nil {
			c.Close()
			t.Errorf("sandbox A reached sandbox B at %s", addr)
		}
	}
	// Reopening without Subnet6 removes the bridge's IPv6 gateway address.
	cfg4 := cfg
	cfg4.Subnet6 = netip.Prefix{}
	if _, err := Open(ctx, cfg4, nil); err != nil {
		t.Fatal(err)
	}
	br, _ := netlink.LinkByName(cfg.Bridge)
	if addrs, _ := netlink.AddrList(br, netlink.FAMILY_V6); slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.IsGlobalUnicast() }) {
		t.Errorf("bridge keeps IPv6 addresses after IPv6 was turned off: %v", addrs)
	}
	if _, err := Open(ctx, cfg, nil); err != nil { // and back on
		t.Fatal(err)
	}

	// Control: with A's port no longer isolated, the same dials work, so
	// isolation (not something else) is what blocked them.
	la, _ := netlink.LinkByName(a.HostVeth)
	if err := netlink.LinkSetIsolated(la, false); err != nil {
		t.Fatal(err)
	}
	// A's blocked attempts left failed neighbour entries for B: forget
	// them, and allow a few tries (ARP under a loaded machine).
	forgetNeighbours(t, a.NetnsPath)
	for _, addr := range []string{netip.AddrPortFrom(b.IP, uint16(port)).String(), netip.AddrPortFrom(b.IP6, uint16(port6)).String()} {
		var err error
		for try := 0; try < 5; try++ {
			var c net.Conn
			if c, err = dialFrom(t, a.NetnsPath, addr); err == nil {
				c.Close()
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("control: A -> B at %s without isolation: %v", addr, err)
		}
	}
}

func TestIPv6OffDisablesIPv6(t *testing.T) {
	cfg := testConfig(t, 24)
	m := openTest(t, cfg)
	a, err := m.Setup(context.Background(), "sbx-v4")
	if err != nil {
		t.Fatal(err)
	}
	if a.IP6.IsValid() || m.Gateway6().IsValid() {
		t.Fatalf("IPv6 address without Subnet6: %+v", a)
	}
	if v := readSysctlIn(t, a.NetnsPath, "net/ipv6/conf/eth0/disable_ipv6"); v != "1" {
		t.Errorf("disable_ipv6 = %s, want 1", v)
	}
	h, eth := sandboxEth0(t, a.NetnsPath)
	if addrs, _ := h.AddrList(eth, netlink.FAMILY_V6); len(addrs) != 0 {
		t.Errorf("eth0 has IPv6 addresses %v", addrs)
	}
}

func TestSubnet6Validation(t *testing.T) {
	for _, s := range []string{"10.1.0.0/16", "fd6d:6f61:74::/40", "fd6d:6f61:74::/120", "::ffff:10.0.0.0/104"} {
		c := Config{Subnet: netip.MustParsePrefix("10.245.0.0/16"), Subnet6: netip.MustParsePrefix(s)}
		if err := c.setDefaults(); err == nil {
			t.Errorf("subnet6 %s accepted", s)
		}
	}
	c := Config{Subnet: netip.MustParsePrefix("10.245.0.0/16"), Subnet6: netip.MustParsePrefix("fd6d:6f61:74:1::5/64")}
	if err := c.setDefaults(); err != nil || c.Subnet6.String() != "fd6d:6f61:74:1::/64" {
		t.Errorf("setDefaults = %v, subnet6 %s", err, c.Subnet6)
	}
}

// listen6In opens a TCP listener on an IPv6 address inside the namespace.
func listen6In(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	type res struct {
		l   net.Listener
		err error
	}
	done := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- res{nil, err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- res{nil, err}
			return
		}
		l, err := net.Listen("tcp6", addr)
		done <- res{l, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	return r.l
}

// forgetNeighbours deletes the neighbour entries of eth0 in the netns at
// path.
func forgetNeighbours(t *testing.T, path string) {
	t.Helper()
	h, eth := sandboxEth0(t, path)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		neighs, _ := h.NeighList(eth.Attrs().Index, fam)
		for _, n := range neighs {
			h.NeighDel(&n)
		}
	}
}
