package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testConfig returns a Config on a leased test network (a bridge and a
// /bits subnet, with an IPv6 /64 in Subnet6Lease) so tests collide neither
// with a real moat nor with other tests on the host; the lease removes
// what a test leaves at cleanup.
func testConfig(t *testing.T, bits int) Config {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	n := testnet.New(t, testnet.Bits(bits))
	n.Own(dir)
	leases[n.Name] = n
	return Config{
		Bridge:   n.Name,
		Subnet:   n.Subnet,
		StateDir: filepath.Join(dir, "state"),
		NetnsDir: filepath.Join(dir, "netns"),
	}
}

// leases are the test networks by bridge name (tests run one at a time).
var leases = map[string]*testnet.Net{}

func openTest(t *testing.T, cfg Config) *Manager {
	t.Helper()
	testutil.RequiresRoot(t)
	m, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		atts, _ := m.List(ctx)
		for _, a := range atts {
			m.Teardown(ctx, a.ID)
		}
		// After the teardowns: Close waits for their veth deletions, so the
		// next test's sandboxes of the same IDs find their veth names free.
		m.Close()
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			netlink.LinkDel(l)
		}
	})
	return m
}

// assertGone checks that no trace of id remains.
func assertGone(t *testing.T, m *Manager, id string) {
	t.Helper()
	if _, err := os.Stat(m.NetnsPath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file of %s still exists (err=%v)", id, err)
	}
	m.settleDeletes() // Teardown deletes the veth after it returns
	if _, err := netlink.LinkByName(HostVethName(id)); err == nil {
		t.Errorf("veth of %s still exists", id)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), m.NetnsPath(id)) {
		t.Errorf("netns of %s still mounted", id)
	}
	entries, _ := os.ReadDir(m.ipDir())
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(m.ipDir(), e.Name()))
		if string(data) == id {
			t.Errorf("address %s still allocated to %s", e.Name(), id)
		}
	}
	if _, err := m.Get(context.Background(), id); !errdefs.IsNotFound(err) {
		t.Errorf("Get(%s) after teardown = %v, want ErrNotFound", id, err)
	}
}

// sandboxEth0 returns a netlink handle inside the namespace at path
// (closed at cleanup) and its eth0.
func sandboxEth0(t *testing.T, path string) (*netlink.Handle, netlink.Link) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return h, eth
}

// listenIn opens a TCP listener inside the namespace at path.
func listenIn(t *testing.T, path string, addr string) net.Listener {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	l, lerr := net.Listen("tcp4", addr)
	if err := netns.Set(orig); err != nil {
		panic(err) // thread would stay in the wrong namespace
	}
	if lerr != nil {
		t.Fatal(lerr)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// withSpares runs test once making every network in Setup and once with
// spares made ahead.
func withSpares(t *testing.T, test func(t *testing.T, spares int)) {
	for _, n := range []int{0, 2} {
		t.Run(fmt.Sprintf("spares=%d", n), func(t *testing.T) { test(t, n) })
	}
}

func TestSetupTeardown(t *testing.T) { withSpares(t, testSetupTeardown) }

func testSetupTeardown(t *testing.T, spares int) {
	cfg := testConfig(t, 24)
	cfg.Spares = spares
	m := openTest(t, cfg)
	ctx := context.Background()
	waitSpares(t, m, spares)

	start := time.Now()
	a, err := m.Setup(ctx, "sbx-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("setup took %v", time.Since(start))
	if !cfg.Subnet.Contains(a.IP) || a.IP == m.Gateway() {
		t.Errorf("IP %s not a host address of %s", a.IP, cfg.Subnet)
	}
	if want := cfg.Subnet.Addr().Next(); a.Gateway != want {
		t.Errorf("gateway %s, want %s", a.Gateway, want)
	}
	if a.NetnsPath != filepath.Join(cfg.NetnsDir, "sbx-1") {
		t.Errorf("netns path %s", a.NetnsPath)
	}
	if a.HostVeth != HostVethName("sbx-1") {
		t.Errorf("host veth %s, want %s", a.HostVeth, HostVethName("sbx-1"))
	}
	host, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	br, _ := netlink.LinkByName(cfg.Bridge)
	if host.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("host veth not on bridge")
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("host veth %s is down", a.HostVeth)
	}

	// Inside: lo and eth0 up with the address, default route via gateway.
	h, eth := sandboxEth0(t, a.NetnsPath)
	addrs, _ := h.AddrList(eth, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IP.String() != a.IP.String() {
		t.Errorf("eth0 addresses %v, want %s", addrs, a.IP)
	}
	routes, _ := h.RouteList(eth, netlink.FAMILY_V4)
	var gw bool
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			gw = r.Gw.String() == a.Gateway.String()
		}
	}
	if !gw {
		t.Errorf("no default route via %s in %v", a.Gateway, routes)
	}

	// Host -> sandbox and sandbox loopback work.
	l := listenIn(t, a.NetnsPath, "0.0.0.0:0")
	port := l.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(a.IP, uint16(port)).String(), 2*time.Second)
	if err != nil {
		t.Fatalf("host cannot reach sandbox: %v", err)
	}
	buf := make([]byte, 2)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Errorf("read %q, %v", buf, err)
	}
	c.Close()
	l.Close()

	if _, err := m.Setup(ctx, "sbx-1"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Setup = %v, want ErrAlreadyExists", err)
	}
	if got, err := m.List(ctx); err != nil || len(got) != 1 || got[0].IP != a.IP {
		t.Errorf("List = %v, %v", got, err)
	}

	if err := m.Teardown(ctx, "sbx-1"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, m, "sbx-1")
	if err := m.Teardown(ctx, "sbx-1"); err != nil {
		t.Errorf("second Teardown = %v", err)
	}
	if _, err := m.Setup(ctx, "Bad_ID"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Setup(bad id) = %v", err)
	}
}

func TestExhaustion(t *testing.T) { withSpares(t, testExhaustion) }

// testExhaustion: every address goes to a sandbox, spares or not (a spare
// holds an address until a sandbox takes it).
func testExhaustion(t *testing.T, spares int) {
	cfg := testConfig(t, 29) // 8 addresses: network, gateway, 5 hosts, broadcast
	cfg.Spares = spares
	m := openTest(t, cfg)
	ctx := context.Background()
	seen := map[netip.Addr]bool{}
	for i := range 5 {
		a, err := m.Setup(ctx, fmt.Sprintf("x%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if seen[a.IP] {
			t.Fatalf("address %s handed out twice", a.IP)
		}
		seen[a.IP] = true
	}
	_, err := m.Setup(ctx, "x5")
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("6th Setup = %v, want ErrResourceExhausted", err)
	}
	assertGone(t, m, "x5")
	// Freeing one makes room again.
	if err := m.Teardown(ctx, "x2"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Setup(ctx, "x5"); err != nil {
		t.Fatalf("Setup after free: %v", err)
	}
}

func TestCrashRecovery(t *testing.T) {
	cfg := testConfig(t, 24)
	m := openTest(t, cfg)
	ctx := context.Background()
	good, err := m.Setup(ctx, "good")
	if err != nil {
		t.Fatal(err)
	}
	half, err := m.Setup(ctx, "half")
	if err != nil {
		t.Fatal(err)
	}
	// Simulate a crash in the middle of setup: the completion record was
	// never written.
	if err := os.Remove(filepath.Join(m.attachDir(), "half.json")); err != nil {
		t.Fatal(err)
	}
	// And a crash right after creating an address file.
	os.WriteFile(filepath.Join(m.ipDir(), "10.251.0.77"), nil, 0o600)

	m2, err := Open(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertGone(t, m2, "half")
	if _, err := os.Stat(filepath.Join(m.ipDir(), "10.251.0.77")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty address file not reclaimed")
	}
	got, err := m2.Get(ctx, "good")
	if err != nil || got.IP != good.IP {
		t.Fatalf("good attachment lost: %v %v", got, err)
	}
	if _, err := netlink.LinkByName(good.HostVeth); err != nil {
		t.Errorf("good veth removed by recovery")
	}
	// No double allocation: new setups never reuse the surviving address,
	// and the reclaimed one is free again.
	for i := range 3 {
		a, err := m2.Setup(ctx, fmt.Sprintf("n%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if a.IP == good.IP {
			t.Fatalf("address %s of a live sandbox reallocated", a.IP)
		}
	}
	_ = half
}

func TestParallelSetup(t *testing.T) { withSpares(t, testParallelSetup) }

func testParallelSetup(t *testing.T, spares int) {
	cfg := testConfig(t, 24)
	cfg.Spares = spares
	m := openTest(t, cfg)
	ctx := context.Background()
	const n = 20
	var wg sync.WaitGroup
	ips := make([]netip.Addr, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			a, err := m.Setup(ctx, fmt.Sprintf("p%d", i))
			ips[i], errs[i] = a.IP, err
		})
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("setup %d: %v", i, errs[i])
		}
		if seen[ips[i]] {
			t.Fatalf("duplicate address %s", ips[i])
		}
		seen[ips[i]] = true
	}
	for i := range n {
		wg.Go(func() { errs[i] = m.Teardown(ctx, fmt.Sprintf("p%d", i)) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		assertGone(t, m, fmt.Sprintf("p%d", i))
	}
}

func TestLastHost(t *testing.T) {
	for i, tc := range []struct {
		prefix string
		last   string
		n      int
	}{
		{"10.88.0.0/16", "10.88.255.254", 65533},
		{"10.0.0.0/29", "10.0.0.6", 5},
		{"192.168.1.0/24", "192.168.1.254", 253},
	} {
		p := netip.MustParsePrefix(tc.prefix)
		if got := lastHost(p).String(); got != tc.last {
			t.Errorf("%d: lastHost(%s) = %s, want %s", i, p, got, tc.last)
		}
		if got := numHosts(p); got != tc.n {
			t.Errorf("%d: numHosts(%s) = %d, want %d", i, p, got, tc.n)
		}
	}
}

// BenchmarkSetupTeardown times Setup and Teardown (setup-µs/op,
// teardown-µs/op: until they return; the veth deletion Teardown leaves
// running is not counted), making every network in Setup and with spares
// made ahead (the pool is refilled between iterations, outside the time,
// as it is between creates).
func BenchmarkSetupTeardown(b *testing.B) {
	for _, spares := range []int{0, 4} {
		b.Run(fmt.Sprintf("spares=%d", spares), func(b *testing.B) { benchSetupTeardown(b, spares) })
	}
}

func benchSetupTeardown(b *testing.B, spares int) {
	testutil.RequiresRoot(b)
	dir := b.TempDir()
	n := testnet.New(b, testnet.Bits(24))
	n.Own(dir)
	cfg := Config{Bridge: n.Name, Subnet: n.Subnet, StateDir: dir + "/s", NetnsDir: dir + "/n", Spares: spares}
	ctx := context.Background()
	m, err := Open(ctx, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		m.Close()
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			netlink.LinkDel(l)
		}
	}()
	var setup, teardown time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		waitSpares(b, m, spares)
		b.StartTimer()
		id := fmt.Sprintf("b%d", i)
		s := time.Now()
		if _, err := m.Setup(ctx, id); err != nil {
			b.Fatal(err)
		}
		setup += time.Since(s)
		s = time.Now()
		if err := m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		teardown += time.Since(s)
	}
	b.ReportMetric(float64(setup.Microseconds())/float64(b.N), "setup-µs/op")
	b.ReportMetric(float64(teardown.Microseconds())/float64(b.N), "teardown-µs/op")
}

// TestOpenRefusesRoutedSubnet: a second manager on another bridge with a
// subnet overlapping one the first routes is refused before it touches the
// host, so the first keeps its route; reopening the first bridge is fine,
// and so is a subnet that a wider route through a gateway contains.
func TestOpenRefusesRoutedSubnet(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.Subnet6 = leases[cfg.Bridge].Subnet6
	openTest(t, cfg)
	lease := leases[cfg.Bridge]
	at := func(off, bits int) netip.Prefix { return netip.PrefixFrom(lease.Addr(off), bits) }
	for i, sub := range []struct{ v4, v6 netip.Prefix }{
		{cfg.Subnet, netip.Prefix{}},
		{at(64, 26), netip.Prefix{}},                              // a part of it, without its gateway
		{netip.PrefixFrom(cfg.Subnet.Addr(), 23), netip.Prefix{}}, // a wider one
		{lease.Outside(0), cfg.Subnet6},                           // IPv6 only
	} {
		other := cfg
		other.Bridge = lease.Link("b")
		other.Subnet, other.Subnet6 = sub.v4, sub.v6
		other.StateDir, other.NetnsDir = t.TempDir(), t.TempDir()
		_, err := Open(context.Background(), other, nil)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "already routed") || !strings.Contains(err.Error(), cfg.Bridge) {
			t.Fatalf("%d: Open on %s/%s = %v, want a refusal naming %s", i, sub.v4, sub.v6, err, cfg.Bridge)
		}
		if _, err := netlink.LinkByName(other.Bridge); err == nil {
			t.Fatalf("%d: the refused Open created bridge %s", i, other.Bridge)
		}
	}
	if _, err := Open(context.Background(), cfg, nil); err != nil {
		t.Fatalf("reopening the bridge's own subnet: %v", err)
	}

	// A wider route through a gateway (offsets 3072..4095 of the slot, via
	// a link on Outside(0)) only shadows: a /24 inside it is allowed.
	la := netlink.NewLinkAttrs()
	la.Name = lease.Link("w")
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	w, _ := netlink.LinkByName(la.Name)
	t.Cleanup(func() {
		for _, name := range []string{lease.Link("w"), lease.Link("n")} {
			if l, err := netlink.LinkByName(name); err == nil {
				netlink.LinkDel(l)
			}
		}
	})
	o := lease.Outside(0)
	if err := netlink.AddrAdd(w, &netlink.Addr{IPNet: &net.IPNet{IP: o.Addr().Next().AsSlice(), Mask: net.CIDRMask(29, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(w); err != nil {
		t.Fatal(err)
	}
	wide := at(3072, 22)
	if err := netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: wide.Addr().AsSlice(), Mask: net.CIDRMask(22, 32)},
		Gw: o.Addr().Next().Next().AsSlice(), LinkIndex: w.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	inside := cfg
	inside.Bridge = lease.Link("n")
	inside.Subnet, inside.Subnet6 = at(3328, 24), netip.Prefix{}
	inside.StateDir, inside.NetnsDir = t.TempDir(), t.TempDir()
	if _, err := Open(context.Background(), inside, nil); err != nil {
		t.Fatalf("Open on a subnet inside a wider route via a gateway: %v", err)
	}
}
