//go:build linux

package testnet

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// Pools of the tests below: outside the default pool, so other test
// processes never hold their slots.
const (
	pairPool  = "10.159.224.0/19" // slots 0x9fe, 0x9ff
	crashPool = "10.159.192.0/20" // slot 0x9fc
	leakPool  = "10.159.208.0/20" // slot 0x9fd
)

func TestSlotLayout(t *testing.T) {
	for i, tc := range []struct {
		slot       int
		v4, name   string
		v6, out6   string
		outside0   string
		subnetBits int
	}{
		{0xa00, "10.160.0.0/20", "moatna00", "fd6d:6f61:7465:a00::/64", "fd6d:6f61:7465:8a00::/64", "10.160.8.0/29", 21},
		{0xbff, "10.191.240.0/20", "moatnbff", "fd6d:6f61:7465:bff::/64", "fd6d:6f61:7465:8bff::/64", "10.191.248.0/29", 21},
		{0x9fd, "10.159.208.0/20", "moatn9fd", "fd6d:6f61:7465:9fd::/64", "fd6d:6f61:7465:89fd::/64", "10.159.216.0/29", 21},
	} {
		n := &Net{Slot: tc.slot, Name: slotName(tc.slot), slotNet: slotPrefix(tc.slot), t: t}
		var a6 [16]byte
		copy(a6[:], ula48[:])
		a6[6], a6[7] = byte(tc.slot>>8), byte(tc.slot)
		n.Subnet6 = netip.PrefixFrom(netip.AddrFrom16(a6), 64)
		n.Subnet = netip.PrefixFrom(n.slotNet.Addr(), tc.subnetBits)
		if n.slotNet.String() != tc.v4 || n.Name != tc.name || n.Subnet6.String() != tc.v6 || n.Outside6().String() != tc.out6 ||
			n.Outside(0).String() != tc.outside0 {
			t.Errorf("%d: slot %#x: %s %s %s %s %s", i, tc.slot, n.slotNet, n.Name, n.Subnet6, n.Outside6(), n.Outside(0))
		}
		if n.Subnet.Overlaps(n.Outside(255)) || !n.slotNet.Contains(n.Outside(255).Addr()) {
			t.Errorf("%d: Outside(255) %s vs subnet %s", i, n.Outside(255), n.Subnet)
		}
	}
}

// fakeTB records Fatalf and Errorf; Fatalf ends the goroutine as
// testing.T does.
type fakeTB struct {
	*testing.T
	mu     sync.Mutex
	fatal  string
	errors []string
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}
func (f *fakeTB) Failed() bool { return len(f.errors) > 0 || f.fatal != "" }

// newIn leases with the pool set to pool, through tb, in a goroutine (so a
// Fatalf of a fake ends only that goroutine).
func newIn(t *testing.T, tb testing.TB, pool string, opts ...Option) *Net {
	t.Setenv(EnvPool, pool)
	var n *Net
	done := make(chan struct{})
	go func() { defer close(done); n = New(tb, opts...) }()
	<-done
	return n
}

// TestLeaseSkipsOverlapAndRefuses: a slot a host address overlaps is
// skipped, two leases never share a slot, and with nothing left New fails
// the test naming the collision.
func TestLeaseSkipsOverlapAndRefuses(t *testing.T) {
	testutil.RequiresRoot(t)
	dummy := fmt.Sprintf("mtnt%d", os.Getpid()%100000)
	la := netlink.NewLinkAttrs()
	la.Name = dummy
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil { // no dummy module on every kernel
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(dummy); err == nil {
			netlink.LinkDel(l)
		}
	})
	l, _ := netlink.LinkByName(dummy)
	// 10.159.230.0/24 lies in slot 0x9fe (10.159.224.0/20).
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 159, 230, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	netlink.LinkSetUp(l)

	n := newIn(t, t, pairPool, Bits(24))
	if n.Slot != 0x9ff || n.Subnet.String() != "10.159.240.0/24" || n.Name != "moatn9ff" {
		t.Fatalf("lease %d %s %s, want slot 0x9ff (0x9fe overlaps %s)", n.Slot, n.Subnet, n.Name, dummy)
	}
	fb := &fakeTB{T: t}
	if got := newIn(t, fb, pairPool); got != nil {
		t.Fatalf("second lease in a full pool: %+v", got)
	}
	if !strings.Contains(fb.fatal, "no free test network in "+pairPool) || !strings.Contains(fb.fatal, "moatn9fe (10.159.224.0/20, fd6d:6f61:7465:9fe::/64): route 10.159.230.0/24 (table 254, "+dummy+")") {
		t.Fatalf("refusal does not name the collision:\n%s", fb.fatal)
	}
}

// TestLeaseReclaimsCrashedHolder kills a test process holding a lease
// with a bridge, a port, a netns, a link, an nft table, a mount and a
// marked process, and checks the next lease of the slot removes them all.
func TestLeaseReclaimsCrashedHolder(t *testing.T) {
	testutil.RequiresRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashingHolder$")
	cmd.Env = append(os.Environ(), "TESTNET_CRASH_HELPER=1", EnvPool+"="+crashPool)
	out, err := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("helper did not crash (%v):\n%s", err, out)
	}
	var owned, sleeper string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "OWNED "); ok {
			owned = v
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "SLEEPER "); ok {
			sleeper = v
		}
	}
	if owned == "" || sleeper == "" {
		t.Fatalf("helper output:\n%s", out)
	}
	name := slotName(0x9fc)
	if _, err := netlink.LinkByName(name); err != nil {
		t.Fatalf("helper left no bridge to reclaim: %v", err)
	}

	n := newIn(t, t, crashPool)
	if n.Name != name {
		t.Fatalf("lease %s, want %s", n.Name, name)
	}
	for _, l := range []string{name, name + "d", name + "v", crashLink} {
		if _, err := netlink.LinkByName(l); err == nil {
			t.Errorf("link %s survived the reclaim", l)
		}
	}
	if _, err := os.Stat("/run/netns/" + name + "-x"); err == nil {
		t.Errorf("netns survived the reclaim")
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), owned) {
		t.Errorf("mount under %s survived the reclaim", owned)
	}
	if _, err := os.Stat(owned); err == nil {
		t.Errorf("owned dir %s survived the reclaim", owned)
	}
	var pid int
	fmt.Sscan(sleeper, &pid)
	if unix.Kill(pid, 0) == nil && !zombie(pid) {
		t.Errorf("marked process %d survived the reclaim", pid)
	}
	c, _ := nftables.New()
	defer c.CloseLasting()
	tables, _ := c.ListTables()
	for _, tb := range tables {
		if strings.Contains(tb.Name, name) || strings.Contains(tb.Name, crashLink) {
			t.Errorf("nft table %s survived the reclaim", tb.Name)
		}
	}
}

// crashLink is the OwnLink link of TestCrashingHolder.
const crashLink = "tnetcrashd"

// TestCrashingHolder is the helper process of TestLeaseReclaimsCrashedHolder.
func TestCrashingHolder(t *testing.T) {
	if os.Getenv("TESTNET_CRASH_HELPER") != "1" {
		return // only as a helper process
	}
	n := New(t)
	must := func(args ...string) {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	must("ip", "link", "add", n.Name, "type", "bridge")
	must("ip", "addr", "add", n.Addr(1).String()+"/21", "dev", n.Name)
	must("ip", "link", "add", n.Link("d"), "type", "bridge")
	must("ip", "netns", "add", n.Netns("x"))
	must("ip", "link", "add", n.Link("v"), "master", n.Name, "type", "veth", "peer", "name", "eth0", "netns", n.Netns("x"))
	must("nft", "add", "table", "inet", "moat-host-"+n.Name)
	// A link named by someone else (a Docker network's bridge), with its
	// tables.
	n.OwnLink(crashLink)
	must("ip", "link", "add", crashLink, "type", "bridge")
	must("nft", "add", "table", "inet", "moat-vault-"+crashLink)
	dir, _ := os.MkdirTemp("", "testnet-owned-")
	n.Own(dir)
	must("mkdir", "-p", filepath.Join(dir, "m"))
	must("mount", "-t", "tmpfs", "tmpfs", filepath.Join(dir, "m"))
	sleep := exec.Command("sleep", "1000")
	sleep.Env = append(os.Environ(), n.Env())
	sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("OWNED %s\nSLEEPER %d\n", dir, sleep.Process.Pid)
	os.Stdout.Sync()
	unix.Kill(os.Getpid(), unix.SIGKILL)
	time.Sleep(time.Minute)
}

// leakLink is the OwnLink link of TestReleaseReportsLeaks.
const leakLink = "tnetleakd"

// TestReleaseReportsLeaks: a passing test that leaves a netns behind, or
// a link it registered with OwnLink (and its tables), fails; the bridge and
// its host table are a server's to keep.
func TestReleaseReportsLeaks(t *testing.T) {
	testutil.RequiresRoot(t)
	// The leak below is made on purpose: it must not be reported to the
	// enclosing `make test` run, whose final leak check would fail on it.
	t.Setenv(EnvRun, "")
	fb := &fakeTB{T: t}
	var n *Net
	t.Run("leaky", func(st *testing.T) {
		fb.T = st
		n = newIn(t, fb, leakPool)
		for _, args := range [][]string{
			{"link", "add", n.Name, "type", "bridge"},
			{"netns", "add", n.Netns("leak")},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				st.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		for _, table := range []string{"moat-host-" + n.Name, "moat-host-" + leakLink, "moat-vault-" + leakLink} {
			if out, err := exec.Command("nft", "add", "table", "inet", table).CombinedOutput(); err != nil {
				st.Fatalf("nft: %v: %s", err, out)
			}
		}
		// A Docker network's bridge the server keeps: the test must remove
		// it (and its tables) itself; here it does not.
		n.OwnLink(leakLink)
		if out, err := exec.Command("ip", "link", "add", leakLink, "type", "bridge").CombinedOutput(); err != nil {
			st.Fatalf("ip: %v: %s", err, out)
		}
	})
	// The subtest's cleanup has run: the lease is released.
	want := []string{"netns " + n.Netns("leak"), "link " + leakLink, "nft table inet moat-host-" + leakLink, "nft table inet moat-vault-" + leakLink}
	if len(fb.errors) != 1 || strings.Contains(fb.errors[0], "link "+n.Name+",") || strings.Contains(fb.errors[0], "moat-host-"+n.Name) {
		t.Fatalf("release reported %q, want the netns and the owned link with its tables", fb.errors)
	}
	for _, w := range want {
		if !strings.Contains(fb.errors[0], w) {
			t.Errorf("release did not report %q: %q", w, fb.errors[0])
		}
	}
	if _, err := os.Stat("/run/netns/" + n.Netns("leak")); err == nil {
		t.Fatal("release did not remove the netns")
	}
	for _, l := range []string{n.Name, leakLink} {
		if _, err := netlink.LinkByName(l); err == nil {
			t.Fatalf("release did not remove link %s", l)
		}
	}
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), leakLink) {
		t.Fatalf("release did not remove the owned link's tables:\n%s", out)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
