//go:build linux

// Package testnet hands each test its own slice of the host's network
// name and address space, so tests can run while other test processes,
// moat servers and unrelated software share the machine.
//
// A lease (New) gives a test:
//
//   - a slot number, held by an flock on /run/moat-test/leases/<slot>
//     for as long as the test runs, so no other test process (nor another
//     test of the same process) gets it; a crashed holder's lock is
//     released by the kernel and the slot's leftovers are removed by the
//     next test that takes it;
//   - names derived from the slot ("moatn1f3"): the bridge name, and the
//     prefix of every netns, link and nft table the test makes;
//   - an IPv4 /20 of the pool (10.160.0.0/11 unless $MOAT_TEST_POOL says
//     otherwise) and two IPv6 ULA /64s that no route or address on the
//     host overlaps, in any routing table: the first halves are the
//     test's Subnet and Subnet6 (for a server's bridge), the second halves
//     are for fake "outside" links (Outside, Outside6). A slot that
//     overlaps is skipped; when every slot overlaps or is held, New fails
//     the test with the reasons instead of running on a collision.
//
// At cleanup, even after a failure, everything named after the slot or
// living in its subnets is removed: processes started with Env, the
// server's cgroups under CgroupParent, mounts under directories passed to
// Own, network namespaces, bridge ports, links and nft tables. What a
// passing test left behind besides the bridge and its host table (which a
// moat server keeps on purpose) is reported as a leak: the test fails and,
// under `make test`, the run's leak check fails too (see Journal).
package testnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/mountinfo"
)

const (
	// LeaseDir holds one lock file per slot.
	LeaseDir = "/run/moat-test/leases"
	// NamePrefix starts the name of every object a lease owns.
	NamePrefix = "moatn"
	// EnvMarker is the environment variable Env sets on processes a test
	// starts; leftovers are found (and killed) by it.
	EnvMarker = "MOAT_TEST_NET"
	// EnvRun, when set to a directory (the Makefile's test target does),
	// makes every lease journal its slot and any leaks there for the
	// end-of-run check (cmd leakcheck).
	EnvRun = "MOAT_TEST_RUN"
	// EnvPool overrides the IPv4 pool leases are carved from.
	EnvPool = "MOAT_TEST_POOL"

	slotBits = 20 // every slot is an IPv4 /20
	subBits  = 21 // Subnet is at most its first half
)

// tenNet holds every pool; a slot is the /20 10.<slot/16>.<slot%16*16>.0,
// so a slot number names the same addresses whatever the pool.
var tenNet = netip.MustParsePrefix("10.0.0.0/8")

// defaultPool is 10.160.0.0/11: 512 slots of /20 (0xa00..0xbff), clear of
// moat's default 10.88.0.0/16, the bench's 10.89.0.0/16 and Docker's
// default pools.
var defaultPool = netip.MustParsePrefix("10.160.0.0/11")

// ula48 is the ULA /48 of test IPv6 prefixes: fd6d:6f61:7465:<slot>::/64.
var ula48 = [6]byte{0xfd, 0x6d, 0x6f, 0x61, 0x74, 0x65}

// Net is one leased test network. Its fields are read-only.
type Net struct {
	// Slot is the lease number (0..4095): the slot's /20 is
	// 10.<Slot/16>.<Slot%16*16>.0/20.
	Slot int
	// Name ("moatn1f3", 8 bytes) is the bridge name and the prefix of every
	// netns, link and nft table of the lease; see Netns and Link.
	Name string
	// Subnet is an IPv4 prefix (a /21 unless Bits asked for a longer one)
	// no host route or address overlaps.
	Subnet netip.Prefix
	// Subnet6 is an IPv6 ULA /64 no host route or address overlaps.
	Subnet6 netip.Prefix
	// CgroupParent ("/moat-test/moatn1f3") is the cgroup a server of the
	// test puts its sandboxes under; it is removed at cleanup.
	CgroupParent string

	slotNet netip.Prefix // the whole /20 of the slot
	lock    *os.File
	owned   []string
	links   []string // OwnLink's
	t       testing.TB
}

// Option adjusts a lease.
type Option func(*options)

type options struct{ bits int }

// Bits makes Subnet a /bits (21..30) at the start of the slot's /20.
func Bits(bits int) Option { return func(o *options) { o.bits = bits } }

// record is the content of a lease file: what a crashed holder's successor
// must clean up.
type record struct {
	PID   int      `json:"pid"`
	Test  string   `json:"test"`
	Owned []string `json:"owned,omitempty"`
	Links []string `json:"links,omitempty"`
}

// New leases a network for t and releases it at cleanup. t must be a root
// test (callers gate with testutil.RequiresRoot).
func New(t testing.TB, opts ...Option) *Net {
	t.Helper()
	o := options{bits: subBits}
	for _, f := range opts {
		f(&o)
	}
	if o.bits < subBits || o.bits > 30 {
		t.Fatalf("testnet: Bits(%d): want 21..30", o.bits)
	}
	pool, err := poolPrefix()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(LeaseDir, 0o755); err != nil {
		t.Fatalf("testnet: %v", err)
	}
	slots := 1 << (slotBits - pool.Bits())
	first := int(pool.Addr().As4()[1])<<4 | int(pool.Addr().As4()[2])>>4
	start := rand.IntN(slots)
	var reasons []string
	for i := range slots {
		slot := first + (start+i)%slots
		n, why := tryLease(t, slot)
		if n == nil {
			if why != "" {
				reasons = append(reasons, why)
			}
			continue
		}
		n.Subnet = netip.PrefixFrom(n.slotNet.Addr(), o.bits)
		t.Cleanup(n.release)
		return n
	}
	slices.Sort(reasons)
	if len(reasons) > 8 {
		reasons = append(reasons[:8], fmt.Sprintf("... and %d more", len(reasons)-8))
	}
	t.Fatalf("testnet: no free test network in %s (%d slots held by other tests or overlapping the host's routes); "+
		"set %s to another part of 10.0.0.0/8 (a /8../20) to use other addresses:\n  %s", pool, slots, EnvPool, strings.Join(reasons, "\n  "))
	return nil
}

func poolPrefix() (netip.Prefix, error) {
	s := os.Getenv(EnvPool)
	if s == "" {
		return defaultPool, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !tenNet.Contains(p.Addr()) || p.Bits() > slotBits || p.Bits() < 8 {
		return netip.Prefix{}, fmt.Errorf("testnet: %s=%q: want a prefix of 10.0.0.0/8 of /8../20", EnvPool, s)
	}
	return p.Masked(), nil
}

// slotName is the object-name prefix of a slot. The hex part has a fixed
// width, so one slot's name is never a prefix of another's.
func slotName(slot int) string { return fmt.Sprintf("%s%03x", NamePrefix, slot) }

// slotPrefix is the IPv4 /20 of a slot (0..4095).
func slotPrefix(slot int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(slot >> 4), byte(slot&15) << 4, 0}), slotBits)
}

// tryLease takes slot if it is free and clear of the host's routes. It
// returns nil and, for a collision with the host, the reason.
func tryLease(t testing.TB, slot int) (*Net, string) {
	path := filepath.Join(LeaseDir, strconv.Itoa(slot))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, "" // held by a live test
	}
	n := &Net{Slot: slot, Name: slotName(slot), lock: f, t: t}
	n.CgroupParent = "/moat-test/" + n.Name
	n.slotNet = slotPrefix(slot)
	var a6 [16]byte
	copy(a6[:], ula48[:])
	a6[6], a6[7] = byte(slot>>8), byte(slot)
	n.Subnet6 = netip.PrefixFrom(netip.AddrFrom16(a6), 64)

	// A holder that crashed left its record: sweep what it made.
	var prev record
	if b, _ := os.ReadFile(path); len(b) > 0 {
		json.Unmarshal(b, &prev)
	}
	n.links = prev.Links // swept below, then forgotten
	if left := n.sweep(prev.Owned); len(left) > 0 {
		t.Logf("testnet: removed leftovers of %s (pid %d, %s): %s", n.Name, prev.PID, prev.Test, strings.Join(left, ", "))
	}
	if why := n.overlap(); why != "" {
		f.Close()
		return nil, fmt.Sprintf("%s (%s, %s): %s", n.Name, n.slotNet, n.Subnet6, why)
	}
	n.links = nil
	n.save()
	if run := os.Getenv(EnvRun); run != "" {
		appendLine(filepath.Join(run, "leases"), n.Name)
	}
	return n, ""
}

// overlap reports a host route or address overlapping the slot, in any
// routing table ("" if none). Default routes do not count.
func (n *Net) overlap() string {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := dump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return fmt.Sprintf("list routes: %v", err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			p, ok := prefixOf(r.Dst)
			if !ok || p.Bits() == 0 {
				continue
			}
			if n.overlaps(p) {
				return fmt.Sprintf("route %s (table %d, %s)", p, r.Table, linkName(r.LinkIndex))
			}
		}
		addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, fam) })
		if err != nil {
			return fmt.Sprintf("list addresses: %v", err)
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok && n.overlaps(p) {
				return fmt.Sprintf("address %s on %s", p, linkName(a.LinkIndex))
			}
		}
	}
	return ""
}

func (n *Net) overlaps(p netip.Prefix) bool {
	return p.Overlaps(n.slotNet) || p.Overlaps(n.Subnet6) || p.Overlaps(n.Outside6())
}

func prefixOf(ipn *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ipn.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := ipn.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), bits).Masked(), true
}

func linkName(index int) string {
	if l, err := netlink.LinkByIndex(index); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("link %d", index)
}

// Addr returns the i-th address of Subnet (1 is the first host address,
// which a moat server takes as its gateway).
func (n *Net) Addr(i int) netip.Addr { return nth(n.Subnet.Addr(), i) }

// Addr6 returns the i-th address of Subnet6.
func (n *Net) Addr6(i int) netip.Addr { return nth(n.Subnet6.Addr(), i) }

// Outside returns the i-th /29 (i in 0..255) of the second half of the
// slot's /20, for a fake "outside" link of the test: it never overlaps
// Subnet.
func (n *Net) Outside(i int) netip.Prefix {
	if i < 0 || i > 255 {
		n.t.Fatalf("testnet: Outside(%d): want 0..255", i)
	}
	return netip.PrefixFrom(nth(n.slotNet.Addr(), 2048+8*i), 29)
}

// Outside6 returns the slot's second IPv6 /64
// (fd6d:6f61:7465:<0x8000|slot>::/64), for fake outside links.
func (n *Net) Outside6() netip.Prefix {
	a := n.Subnet6.Addr().As16()
	a[6] |= 0x80
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

func nth(base netip.Addr, i int) netip.Addr {
	a := base
	for range i {
		a = a.Next()
	}
	return a
}

// Netns returns a netns name of the lease: Name-suffix.
func (n *Net) Netns(suffix string) string { return n.Name + "-" + suffix }

// Link returns an interface name of the lease: Name+suffix, at most 15
// bytes (suffix at most 7).
func (n *Net) Link(suffix string) string {
	if len(n.Name)+len(suffix) > 15 {
		n.t.Fatalf("testnet: link suffix %q too long", suffix)
	}
	return n.Name + suffix
}

// Env returns the marker to add to the environment of every process the
// test starts (servers, helpers): leftovers are found by it.
func (n *Net) Env() string { return EnvMarker + "=" + n.Name }

// Own registers dir (a directory the test made, e.g. a server's run root):
// at cleanup every mount under it is detached, and a successor of a
// crashed holder removes it.
func (n *Net) Own(dir string) {
	n.owned = append(n.owned, dir)
	n.save()
}

// OwnLink registers a link the test's code makes under a name that is
// not the lease's (a Docker network's bridge, which the daemon names after
// the network): the sweep removes it and its nft tables (moat-host-<name>,
// moat-vault-<name>), reports them as left behind, and a successor of a
// crashed holder removes them too.
func (n *Net) OwnLink(name string) {
	if !slices.Contains(n.links, name) {
		n.links = append(n.links, name)
		n.save()
	}
}

func (n *Net) save() {
	b, _ := json.Marshal(record{PID: os.Getpid(), Test: n.t.Name(), Owned: n.owned, Links: n.links})
	n.lock.Truncate(0)
	n.lock.WriteAt(b, 0)
}

// release sweeps the lease and unlocks it.
func (n *Net) release() {
	left := n.sweep(nil)
	var leaks []string
	for _, l := range left {
		if !expected(n, l) {
			leaks = append(leaks, l)
		}
	}
	if len(leaks) > 0 && !n.t.Failed() {
		n.t.Errorf("testnet: the test left behind: %s", strings.Join(leaks, ", "))
		if run := os.Getenv(EnvRun); run != "" {
			appendLine(filepath.Join(run, "leaks"), n.t.Name()+": "+strings.Join(leaks, ", "))
		}
	}
	n.lock.Truncate(0)
	n.lock.Close()
}

// expected reports whether a swept object is one a moat server keeps on
// purpose after a clean shutdown: its bridge, its host nft table and its
// credential proxy's intercept table (nft.InterceptTable).
func expected(n *Net, what string) bool {
	return what == "link "+n.Name || what == "nft table inet moat-host-"+n.Name || what == "nft table inet moat-vault-"+n.Name
}

// sweep removes everything of the slot, plus mounts and directories under
// extra (a crashed holder's Own dirs), and returns what it removed.
func (n *Net) sweep(extra []string) []string {
	var did []string
	// Processes first: they hold mounts, namespaces and cgroups.
	did = append(did, killMarked(n.Name)...)
	did = append(did, n.removeCgroups()...)
	dirs := append(slices.Clone(n.owned), extra...)
	for _, d := range dirs {
		did = append(did, unmountUnder(d)...)
	}
	for _, d := range extra {
		if strings.HasPrefix(d, os.TempDir()+"/") {
			os.RemoveAll(d)
		}
	}
	did = append(did, n.removeNetns()...)
	did = append(did, n.removeLinks()...)
	did = append(did, n.removeTables()...)
	return did
}

// killMarked SIGKILLs every process whose environment carries the lease's
// marker and waits (briefly) for them to go.
func killMarked(name string) []string {
	want := []byte(EnvMarker + "=" + name + "\x00")
	var did []string
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !containsEnv(env, want) {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if unix.Kill(pid, unix.SIGKILL) == nil {
			did = append(did, fmt.Sprintf("process %d (%s)", pid, strings.TrimSpace(string(comm))))
			pids = append(pids, pid)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) && unix.Kill(pid, 0) == nil && !zombie(pid) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return did
}

func containsEnv(env, want []byte) bool {
	return len(env) >= len(want) && (string(env[:len(want)]) == string(want) || strings.Contains(string(env), "\x00"+string(want)))
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

// removeCgroups kills what is left in the lease's cgroups (every hierarchy)
// and removes them, deepest first.
func (n *Net) removeCgroups() []string {
	var did []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*" + n.CgroupParent)
	if d := "/sys/fs/cgroup" + n.CgroupParent; exists(d) {
		roots = append(roots, d)
	}
	for _, root := range roots {
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			d := dirs[i]
			for range 50 {
				procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				pids := strings.Fields(string(procs))
				if len(pids) == 0 {
					break
				}
				for _, p := range pids {
					if pid, err := strconv.Atoi(p); err == nil {
						unix.Kill(pid, unix.SIGKILL)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := unix.Rmdir(d); err == nil && d != root {
				did = append(did, "cgroup "+strings.TrimPrefix(d, "/sys/fs/cgroup/"))
			}
		}
	}
	// The per-hierarchy /moat-test parents stay: other leases use them.
	return did
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) []string {
	mps, _ := mountinfo.Under("/proc/self/mountinfo", filepath.Clean(dir))
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	var did []string
	for _, mp := range slices.Compact(mps) {
		if unix.Unmount(mp, unix.MNT_DETACH) == nil {
			did = append(did, "mount "+mp)
		}
	}
	return did
}

// removeNetns deletes the lease's named network namespaces (/run/netns).
func (n *Net) removeNetns() []string {
	var did []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if e.Name() != n.Name && !strings.HasPrefix(e.Name(), n.Name+"-") {
			continue
		}
		p := filepath.Join("/run/netns", e.Name())
		unix.Unmount(p, unix.MNT_DETACH)
		if os.Remove(p) == nil {
			did = append(did, "netns "+e.Name())
		}
	}
	return did
}

// removeLinks deletes the bridge's ports, every link named after the
// lease, and moat-named links holding an address of the slot (a Docker
// network's bridge).
func (n *Net) removeLinks() []string {
	links, err := dump(netlink.LinkList)
	if err != nil {
		return nil
	}
	var did []string
	brIndex := -1
	for _, l := range links {
		if l.Attrs().Name == n.Name {
			brIndex = l.Attrs().Index
		}
	}
	del := func(l netlink.Link, what string) {
		if netlink.LinkDel(l) == nil {
			did = append(did, what)
		}
	}
	for _, l := range links {
		a := l.Attrs()
		if brIndex > 0 && a.MasterIndex == brIndex {
			del(l, "bridge port "+a.Name)
		}
	}
	for _, l := range links {
		a := l.Attrs()
		switch {
		case a.Name == n.Name:
			// the bridge, last
		case strings.HasPrefix(a.Name, n.Name) || slices.Contains(n.links, a.Name):
			del(l, "link "+a.Name)
		case strings.HasPrefix(a.Name, "moat") && n.holdsAddr(l):
			// a Docker network's bridge, named by the daemon
			del(l, "link "+a.Name)
		}
	}
	for _, l := range links {
		if l.Attrs().Name == n.Name {
			del(l, "link "+n.Name)
		}
	}
	return did
}

func (n *Net) holdsAddr(l netlink.Link) bool {
	addrs, _ := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_ALL) })
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok && n.overlaps(p) {
			return true
		}
	}
	return false
}

// removeTables deletes host nft tables whose name contains the lease's
// name (moat-host-<bridge> and any table a test names after its lease)
// and the moat tables of OwnLink's links.
func (n *Net) removeTables() []string {
	c, err := nftables.New()
	if err != nil {
		return nil
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return nil
	}
	var did []string
	for _, t := range tables {
		if strings.Contains(t.Name, n.Name) || n.ownsTable(t.Name) {
			c.DelTable(t)
			if c.Flush() == nil {
				did = append(did, "nft table "+familyName(t.Family)+" "+t.Name)
			}
		}
	}
	return did
}

// ownsTable reports whether table is a moat table (moat-<kind>-<link>) of
// one of OwnLink's links.
func (n *Net) ownsTable(table string) bool {
	for _, l := range n.links {
		if strings.HasPrefix(table, "moat-") && strings.HasSuffix(table, "-"+l) {
			return true
		}
	}
	return false
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	case nftables.TableFamilyARP:
		return "arp"
	}
	return strconv.Itoa(int(f))
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// appendLine appends one line to a journal file shared by the run's test
// processes (O_APPEND writes of one short line do not interleave).
func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	f.WriteString(line + "\n")
}

// Held reports whether a live process holds the lease of the slot named
// name (a Name such as "moatn1f3").
func Held(name string) bool {
	slot, err := strconv.ParseInt(strings.TrimPrefix(name, NamePrefix), 16, 32)
	if err != nil || !strings.HasPrefix(name, NamePrefix) {
		return false
	}
	f, err := os.OpenFile(filepath.Join(LeaseDir, strconv.Itoa(int(slot))), os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// SlotOf returns the lease name an object name starts with ("" if none):
// "moatn1f3" for "moatn1f3-out", "moatn1f3o" or "moat-host-moatn1f3".
func SlotOf(object string) string {
	i := strings.Index(object, NamePrefix)
	if i < 0 || len(object) < i+len(NamePrefix)+3 {
		return ""
	}
	name := object[i : i+len(NamePrefix)+3]
	if _, err := strconv.ParseUint(name[len(NamePrefix):], 16, 16); err != nil {
		return ""
	}
	return name
}

// Dump runs a netlink dump again when the kernel flags it interrupted (the
// table changed while it was read; common while other tests churn links).
func Dump[T any](f func() (T, error)) (T, error) { return dump(f) }

func dump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range 10 {
		if v, err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// LinkGone reports whether network interface name is gone (from the
// test's netns) within d: moat deletes a torn-down sandbox's veth after
// the delete returns (see internal/network/deletions.go).
func LinkGone(name string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat("/sys/class/net/" + name); errors.Is(err, os.ErrNotExist) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
