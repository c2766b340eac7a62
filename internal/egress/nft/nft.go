//go:build linux

// Package nft enforces an egress policy with nftables inside one network
// namespace, over netlink (no nft binary): table "inet moat" on the output
// hook and its stateless twin "netdev moat" on eth0's egress hook, for
// senders that skip the IP stack (gVisor). Each change is one netlink
// batch, which the kernel commits atomically: no instant has a partial or
// empty ruleset, and conntrack keeps established connections.
package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Names of the nftables objects moat owns in a sandbox netns.
const (
	TableName = "moat"
	ChainName = "output"
)

// outputMark is the packet mark the output chain sets ("moat").
const outputMark = 0x6d6f6174

// Set names.
const (
	setDeny4  = "deny4"
	setDeny6  = "deny6"
	setAllow4 = "allow4"
	setAllow6 = "allow6"
	setDyn4   = "dyn4"
	setDyn6   = "dyn6"
)

const (
	// dynSetSize bounds each dynamic set; adding past it fails the DNS query.
	dynSetSize = 65536
	// elemChunk bounds the elements per netlink message: the element list
	// is one nested attribute, whose length field is 16 bits.
	elemChunk = 512
	// sockBuf is forced as netlink send/receive buffer so a full 4096-rule
	// batch fits in one sendmsg (the default wmem_max is ~208 KiB).
	sockBuf = 16 << 20
	// minDynTTL is the shortest dynamic element timeout installed.
	minDynTTL = time.Second
)

// Config is the desired ruleset of one namespace.
type Config struct {
	// Policy gives the default action and the static IP/CIDR sets. Required.
	Policy *policy.Matcher
	// DNS is the only DNS server the namespace may reach (UDP and TCP), the
	// moat DNS proxy. Required.
	DNS netip.AddrPort
	// Blocked ranges are always dropped, even if the policy or a DNS answer
	// allows them: the host, the sandbox bridge, link-local/metadata
	// addresses. The DNS address itself stays reachable.
	Blocked []netip.Prefix
	// Resolved becomes the exact content of the dynamic sets, replacing
	// what AllowResolved added before. Entries with a TTL under a second
	// are skipped.
	Resolved []Resolved
	// Device is the namespace's interface whose egress hook also enforces
	// the policy (for AF_PACKET senders). Default "eth0".
	Device string
	// Exempt, if not 0, is a packet mark that passes both chains first:
	// the traffic of an enforcer that runs inside the namespace it filters
	// (the Kubernetes egress sidecar's upstream DNS queries). Setting a
	// socket's mark needs CAP_NET_ADMIN or CAP_NET_RAW, which the
	// sandbox's processes lack.
	Exempt uint32
	// LocalProxy, if not 0, is a port on 127.0.0.1 that the pod intercept
	// table (ApplyPodIntercept) redirects to: those packets keep the
	// original output interface in this hook, so "oifname lo" misses them.
	LocalProxy uint16
}

func (c Config) device() string {
	if c.Device == "" {
		return "eth0"
	}
	return c.Device
}

// Resolved is a group of addresses allowed for TTL.
type Resolved struct {
	IPs []netip.Addr
	TTL time.Duration
}

// Firewall is moat's nftables table in one network namespace. Methods are
// safe for concurrent use and serialized. The Firewall holds the namespace
// open until Close.
type Firewall struct {
	path string

	mu   sync.Mutex
	ns   *os.File
	conn *nftables.Conn
	// dyn mirrors the dynamic sets: address → expiry. It lets
	// AllowResolved skip addresses that already outlive the new TTL, since
	// re-adding an element would reset (and possibly shorten) its timeout.
	dyn       map[netip.Addr]time.Time
	lastPrune time.Time
}

// Open opens the network namespace at netnsPath (a bind-mounted netns file
// such as /run/netns/NAME, or /proc/PID/ns/net). It does not change any
// rules.
func Open(netnsPath string) (*Firewall, error) {
	if netnsPath == "" {
		return nil, fmt.Errorf("nft: empty netns path: %w", errdefs.ErrInvalidArgument)
	}
	f, err := os.Open(netnsPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("nft: netns %s: %w", netnsPath, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("nft: open netns %s: %w", netnsPath, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("nft: %s is not a namespace file: %w", netnsPath, errdefs.ErrInvalidArgument)
	}
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(forceBuffers)}
	if !ownNamespace(f) {
		// Entering another namespace (setns) needs CAP_SYS_ADMIN; an
		// enforcer inside the namespace it filters (the Kubernetes
		// sidecar) holds only CAP_NET_ADMIN and needs no setns.
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("nft: netlink in netns %s: %w", netnsPath, err)
	}
	return &Firewall{path: netnsPath, ns: f, conn: conn, dyn: map[netip.Addr]time.Time{}}, nil
}

// ownNamespace reports whether ns is the calling thread's network
// namespace.
func ownNamespace(ns *os.File) bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(ns.Fd()), &a) != nil || unix.Stat("/proc/thread-self/ns/net", &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

func forceBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf))
	})
	return errors.Join(err, serr)
}

// Close releases the netlink socket and the namespace. It does not remove
// the rules (see Remove).
func (f *Firewall) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ns == nil {
		return nil
	}
	err := errors.Join(f.conn.CloseLasting(), f.ns.Close())
	f.ns = nil
	return err
}

// Apply atomically installs the ruleset for cfg, replacing any previous
// moat table in the namespace.
func (f *Firewall) Apply(ctx context.Context, cfg Config) error {
	if cfg.Policy == nil || !cfg.DNS.IsValid() {
		return fmt.Errorf("nft: Apply needs a policy and a DNS address: %w", errdefs.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usableLocked(ctx); err != nil {
		return err
	}
	now := time.Now()
	dyn := map[netip.Addr]time.Time{}
	for _, r := range cfg.Resolved {
		if r.TTL < minDynTTL {
			continue
		}
		exp := now.Add(r.TTL)
		for _, ip := range r.IPs {
			ip = ip.Unmap()
			if old, ok := dyn[ip]; !ok || exp.After(old) {
				dyn[ip] = exp
			}
		}
	}
	if err := f.buildLocked(cfg, dyn, now); err != nil {
		return err
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("nft: apply ruleset in %s: %w", f.path, err)
	}
	f.dyn, f.lastPrune = dyn, now
	return nil
}

// AllowResolved adds ips to the dynamic allow sets for ttl (at least a
// second). Addresses already allowed for longer are left alone. It needs a
// prior Apply.
func (f *Firewall) AllowResolved(ctx context.Context, ips []netip.Addr, ttl time.Duration) error {
	ttl = max(ttl, minDynTTL)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usableLocked(ctx); err != nil {
		return err
	}
	now := time.Now()
	exp := now.Add(ttl)
	var v4, v6 []nftables.SetElement
	var added []netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap()
		if old, ok := f.dyn[ip]; ok && !old.Before(exp.Add(-time.Second)) {
			continue // outlives the new TTL (within a second)
		}
		el := nftables.SetElement{Key: ip.AsSlice(), Timeout: ttl}
		if ip.Is4() {
			v4 = append(v4, el)
		} else {
			v6 = append(v6, el)
		}
		added = append(added, ip)
	}
	if len(added) == 0 {
		return nil
	}
	for _, t := range []*nftables.Table{table(), netdevTable()} {
		for _, s := range []struct {
			name string
			els  []nftables.SetElement
		}{{setDyn4, v4}, {setDyn6, v6}} {
			if len(s.els) == 0 {
				continue
			}
			if err := f.conn.SetAddElements(&nftables.Set{Table: t, Name: s.name, HasTimeout: true}, s.els); err != nil {
				return fmt.Errorf("nft: encode elements: %w", err)
			}
		}
	}
	if err := f.conn.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("nft: no moat table in %s (Apply first): %w", f.path, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("nft: add resolved addresses in %s: %w", f.path, err)
	}
	for _, ip := range added {
		f.dyn[ip] = exp
	}
	if now.Sub(f.lastPrune) > time.Minute {
		for ip, e := range f.dyn {
			if e.Before(now) {
				delete(f.dyn, ip)
			}
		}
		f.lastPrune = now
	}
	return nil
}

// Remove deletes the moat tables from the namespace; a missing table is
// not an error.
func (f *Firewall) Remove(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usableLocked(ctx); err != nil {
		return err
	}
	for _, t := range []*nftables.Table{table(), netdevTable()} {
		f.conn.AddTable(t) // makes the delete idempotent
		f.conn.DelTable(t)
	}
	if err := f.conn.Flush(); err != nil {
		return fmt.Errorf("nft: remove table in %s: %w", f.path, err)
	}
	f.dyn = map[netip.Addr]time.Time{}
	return nil
}

// DynamicAddrs returns the addresses currently in the dynamic sets as the
// kernel reports them (expired elements excluded).
func (f *Firewall) DynamicAddrs(ctx context.Context) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usableLocked(ctx); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, name := range []string{setDyn4, setDyn6} {
		els, err := f.conn.GetSetElements(&nftables.Set{Table: table(), Name: name, KeyType: keyType(name)})
		if err != nil {
			return nil, fmt.Errorf("nft: list %s in %s: %w", name, f.path, err)
		}
		for _, e := range els {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

func (f *Firewall) usableLocked(ctx context.Context) error {
	if f.ns == nil {
		return fmt.Errorf("nft: firewall for %s is closed: %w", f.path, errdefs.ErrFailedPrecondition)
	}
	return ctx.Err()
}

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

// netdevTable is the twin of table on the sandbox interface's egress hook.
// The inet output hook sees only packets of the kernel's own IP stack;
// frames written to an AF_PACKET socket (gVisor's netstack under runsc
// sends everything that way) skip it but not the device's egress hook
// (packet sockets with qdisc bypass included, since Linux 6.4).
func netdevTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: TableName}
}

func keyType(set string) nftables.SetDatatype {
	switch set {
	case setDeny6, setAllow6, setDyn6:
		return nftables.TypeIP6Addr
	default:
		return nftables.TypeIPAddr
	}
}

// buildLocked queues the whole replacement batch on f.conn: the inet
// table on the output hook and its netdev twin on the egress hook of the
// sandbox interface (see netdevTable), with the same sets and rules.
func (f *Firewall) buildLocked(cfg Config, dyn map[netip.Addr]time.Time, now time.Time) error {
	for _, netdev := range []bool{false, true} {
		if err := f.buildTableLocked(cfg, dyn, now, netdev); err != nil {
			return err
		}
	}
	return nil
}

func (f *Firewall) buildTableLocked(cfg Config, dyn map[netip.Addr]time.Time, now time.Time, netdev bool) error {
	c := f.conn
	t := table()
	if netdev {
		t = netdevTable()
	}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)

	verdict := expr.VerdictDrop
	chainPolicy := nftables.ChainPolicyDrop
	if cfg.Policy.Default() == policy.Allow {
		verdict, chainPolicy = expr.VerdictAccept, nftables.ChainPolicyAccept
	}
	ch := &nftables.Chain{
		Name: ChainName, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &chainPolicy,
	}
	if netdev {
		ch.Hooknum, ch.Device = nftables.ChainHookEgress, cfg.device()
	}
	chain := c.AddChain(ch)

	sets, err := addSets(c, t, cfg, dyn, now)
	if err != nil {
		return err
	}
	for _, exprs := range chainRules(cfg, sets, netdev, verdict) {
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs})
	}
	return nil
}

// addSets adds the table's address sets: the interval sets of the static
// policy (with the blocked ranges in the deny sets) and the timeout sets
// of the resolved addresses in dyn, which expire at their times.
func addSets(c *nftables.Conn, t *nftables.Table, cfg Config, dyn map[netip.Addr]time.Time, now time.Time) (map[string]*nftables.Set, error) {
	static := cfg.Policy.StaticSets()
	blocked4, blocked6 := blockedRanges(cfg.Blocked)
	contents := map[string][]policy.Range{
		setDeny4:  union(append(blocked4, static.Deny4...)),
		setDeny6:  union(append(blocked6, static.Deny6...)),
		setAllow4: static.Allow4,
		setAllow6: static.Allow6,
	}
	sets := map[string]*nftables.Set{}
	for _, name := range []string{setDeny4, setDeny6, setAllow4, setAllow6} {
		s := &nftables.Set{Table: t, Name: name, KeyType: keyType(name), Interval: true}
		if err := c.AddSet(s, nil); err != nil {
			return nil, fmt.Errorf("nft: encode set %s: %w", name, err)
		}
		if err := addChunked(c, s, intervalElements(contents[name], name == setDeny6 || name == setAllow6)); err != nil {
			return nil, err
		}
		sets[name] = s
	}
	var d4, d6 []nftables.SetElement
	for ip, exp := range dyn {
		el := nftables.SetElement{Key: ip.AsSlice(), Timeout: exp.Sub(now).Truncate(time.Millisecond)}
		if ip.Is4() {
			d4 = append(d4, el)
		} else {
			d6 = append(d6, el)
		}
	}
	for name, els := range map[string][]nftables.SetElement{setDyn4: d4, setDyn6: d6} {
		s := &nftables.Set{Table: t, Name: name, KeyType: keyType(name), HasTimeout: true, Size: dynSetSize}
		if err := c.AddSet(s, nil); err != nil {
			return nil, fmt.Errorf("nft: encode set %s: %w", name, err)
		}
		if err := addChunked(c, s, els); err != nil {
			return nil, err
		}
		sets[name] = s
	}
	return sets, nil
}

// chainRules is the filter chain, in order: the hook's own rules, then
// neighbour discovery, DNS to the proxy only (other DNS, DoT and DoQ
// dropped), the sets, and the default. Deny comes before the dynamic set,
// so an allowed name resolving into a denied or Blocked range stays shut.
func chainRules(cfg Config, sets map[string]*nftables.Set, netdev bool, verdict expr.VerdictKind) [][]expr.Any {
	fam := familyOf(netdev)
	dnsIP := cfg.DNS.Addr().Unmap()
	var rules [][]expr.Any
	if cfg.Exempt != 0 {
		rules = append(rules, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(cfg.Exempt)},
			accept(),
		})
	}
	if netdev {
		rules = append(rules, netdevRules(fam, dnsIP)...)
	} else {
		rules = append(rules, outputRules()...)
	}
	rules = append(rules,
		// IPv6 neighbour discovery (icmpv6 types 133-136) is the IPv6 ARP;
		// without it no IPv6 destination is reachable. It is link-local.
		concat(fam.match(true), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{136}},
			accept(),
		}),
	)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rules = append(rules, concat(fam.daddrEq(dnsIP), l4Port(proto, cfg.DNS.Port()), []expr.Any{accept()}))
	}
	if cfg.LocalProxy != 0 && !netdev {
		rules = append(rules, concat(fam.daddrEq(netip.MustParseAddr("127.0.0.1")), l4Port(unix.IPPROTO_TCP, cfg.LocalProxy), []expr.Any{accept()}))
	}
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		for _, port := range []uint16{53, 853} {
			rules = append(rules, concat(l4Port(proto, port), []expr.Any{drop()}))
		}
	}
	for _, sv := range []struct {
		v4, v6 string
		v      expr.VerdictKind
	}{{setDeny4, setDeny6, expr.VerdictDrop}, {setAllow4, setAllow6, expr.VerdictAccept}, {setDyn4, setDyn6, expr.VerdictAccept}} {
		rules = append(rules,
			concat(fam.daddr(false), []expr.Any{lookup(sets[sv.v4]), &expr.Verdict{Kind: sv.v}}),
			concat(fam.daddr(true), []expr.Any{lookup(sets[sv.v6]), &expr.Verdict{Kind: sv.v}}))
	}
	return append(rules, []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: verdict}})
}

// outputRules open the output hook's chain.
func outputRules() [][]expr.Any {
	return [][]expr.Any{
		// meta mark set <outputMark>: seen by the output hook (the
		// netdev twin lets these through).
		{
			&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(outputMark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		},
		// ct state established,related accept
		{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
				Xor:  binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
			accept(),
		},
		// oifname "lo" accept
		{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
			accept(),
		},
	}
}

// netdevRules open the netdev egress hook's chain. Without conntrack, its
// senders' established connections do not survive a policy change.
func netdevRules(fam family, dnsIP netip.Addr) [][]expr.Any {
	return [][]expr.Any{
		// Packets of the kernel's own stack were filtered on the output
		// hook, which marked them; only unmarked ones (AF_PACKET) go on.
		{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(outputMark)},
			accept(),
		},
		// ARP is the IPv4 neighbour discovery.
		{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(unix.ETH_P_ARP)},
			accept(),
		},
		// Untracked replies of the sandbox's own servers go to the
		// gateway (ingress, agent); the host's table filters them.
		concat(fam.daddrEq(dnsIP), []expr.Any{accept()}),
	}
}

// family builds the address-family checks of one table: the inet table
// tests meta nfproto, the netdev one the frame's ethertype.
type family struct{ netdev bool }

func familyOf(netdev bool) family { return family{netdev} }

func (f family) match(v6 bool) []expr.Any {
	if f.netdev {
		eth := uint16(unix.ETH_P_IP)
		if v6 {
			eth = unix.ETH_P_IPV6
		}
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(eth)},
		}
	}
	proto := byte(unix.NFPROTO_IPV4)
	if v6 {
		proto = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func (f family) daddr(v6 bool) []expr.Any {
	off, n := uint32(16), uint32(4)
	if v6 {
		off, n = 24, 16
	}
	return append(f.match(v6), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
}

func (f family) daddrEq(a netip.Addr) []expr.Any {
	return append(f.daddr(a.Is6()), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()})
}

func addChunked(c *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	for len(els) > 0 {
		n := min(len(els), elemChunk)
		if s.Interval && n < len(els) && els[n].IntervalEnd {
			n++ // keep a range's start and end in one message
		}
		if err := c.SetAddElements(s, els[:n]); err != nil {
			return fmt.Errorf("nft: encode elements of %s: %w", s.Name, err)
		}
		els = els[n:]
	}
	return nil
}

// intervalElements encodes sorted disjoint ranges the way nft(8) does: an
// interval-end element at the zero address when the first range starts
// later, a start element per range, and an end element at To+1 unless the
// range reaches the top of the address space.
func intervalElements(rs []policy.Range, v6 bool) []nftables.SetElement {
	if len(rs) == 0 {
		return nil
	}
	zero := netip.IPv4Unspecified()
	if v6 {
		zero = netip.IPv6Unspecified()
	}
	var out []nftables.SetElement
	if rs[0].From != zero {
		out = append(out, nftables.SetElement{Key: zero.AsSlice(), IntervalEnd: true})
	}
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.From.AsSlice()})
		if next := r.To.Next(); next.IsValid() {
			out = append(out, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// blockedRanges converts prefixes to ranges per family.
func blockedRanges(ps []netip.Prefix) (v4, v6 []policy.Range) {
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		if p.Addr().Is4() {
			v4 = append(v4, policy.PrefixRange(p))
		} else {
			v6 = append(v6, policy.PrefixRange(p))
		}
	}
	return v4, v6
}

// union merges possibly overlapping ranges into sorted disjoint,
// non-adjacent ranges.
func union(rs []policy.Range) []policy.Range {
	if len(rs) == 0 {
		return nil
	}
	sorted := append([]policy.Range{}, rs...)
	slices.SortFunc(sorted, func(a, b policy.Range) int { return a.From.Compare(b.From) })
	out := sorted[:1]
	for _, r := range sorted[1:] {
		last := &out[len(out)-1]
		if next := last.To.Next(); !next.IsValid() || r.From.Compare(next) <= 0 {
			if r.To.Compare(last.To) > 0 {
				last.To = r.To
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func accept() *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictAccept} }
func drop() *expr.Verdict   { return &expr.Verdict{Kind: expr.VerdictDrop} }

// daddr loads the IPv4 or IPv6 destination address into register 1, after
// checking the packet's family (the inet table sees both).
func daddr(v6 bool) []expr.Any {
	proto, off, n := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
	if v6 {
		proto, off, n = unix.NFPROTO_IPV6, 24, 16
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
	}
}

func daddrEq(a netip.Addr) []expr.Any {
	return append(daddr(a.Is6()), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()})
}

// l4Port matches "meta l4proto proto th dport port".
func l4Port(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func lookup(s *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}
