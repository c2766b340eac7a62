// Package network gives every sandbox its own network namespace attached to
// a moat-owned Linux bridge.
//
// Layout of one attachment (sandbox ID "abc"):
//
//	host netns:  bridge <Config.Bridge> (gateway = first address of Config.Subnet)
//	               └─ veth "mv<hash(id)>" (host end, enslaved to the bridge)
//	sandbox netns (bind-mounted at <Config.NetnsDir>/abc):
//	               lo (up), eth0 (peer end, <IP>/<prefix>), default route via the gateway
//
// With Config.Subnet6 set, sandboxes are dual-stack: the bridge also gets
// the first address of the IPv6 prefix and eth0 the address at the same
// host offset as its IPv4 one (10.88.0.7 -> fd..::7), with an IPv6 default
// route. Without it IPv6 is disabled on eth0, so a sandbox has no IPv6
// path at all (not even link-local).
//
// Every host veth is an isolated bridge port: isolated ports cannot
// exchange frames with each other, only with the bridge itself (the host),
// so sandboxes on one bridge cannot reach each other at layer 2 whatever
// their addresses (the host firewall also refuses to route bridge to
// bridge).
//
// Everything is done with netlink and raw syscalls; no `ip` binary is run.
//
// State on disk under Config.StateDir survives a crash of the server:
//
//	ips/<addr>            one file per allocated address, created with O_EXCL, holding the ID
//	attachments/<id>.json written (atomically) only once an attachment is complete
//
// An address file without a complete attachment is a half-done setup; Open
// tears those down, as well as orphaned namespace files and bridge ports.
// Egress control and NAT are layered on top by another package: it reads
// the bridge name and subnet from Manager.Bridge and Manager.Subnet.
package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Defaults for Config.
const (
	DefaultBridge   = "moat0"
	DefaultStateDir = "/var/lib/moat/network"
	DefaultNetnsDir = "/run/moat/netns"
	// sandboxIfName is the interface name inside every sandbox.
	sandboxIfName = "eth0"
	// hostVethPrefix starts the host end of every sandbox veth.
	hostVethPrefix = "mv"
)

// DefaultSubnet is the sandbox address range when Config.Subnet is unset.
var DefaultSubnet = netip.MustParsePrefix("10.88.0.0/16")

// Config configures a Manager. The zero value selects every default.
type Config struct {
	// Bridge is the name of the host bridge (default "moat0"). It is created
	// if missing and left in place on shutdown.
	Bridge string `json:"bridge,omitempty"`
	// Subnet is the IPv4 range sandboxes get addresses from (default
	// 10.88.0.0/16). The first address is the gateway, set on the bridge.
	Subnet netip.Prefix `json:"subnet,omitempty"`
	// Subnet6, if set, makes sandboxes dual-stack: an IPv6 prefix (a ULA
	// /64 such as fd00:6d6f:6174::/64) whose first address is the IPv6
	// gateway. It must have at least as many host bits as Subnet. Unset
	// (the default) disables IPv6 inside sandboxes.
	Subnet6 netip.Prefix `json:"subnet6,omitempty"`
	// StateDir holds the persistent IPAM and attachment records (default
	// /var/lib/moat/network).
	StateDir string `json:"stateDir,omitempty"`
	// NetnsDir holds one bind-mounted namespace file per sandbox (default
	// /run/moat/netns).
	NetnsDir string `json:"netnsDir,omitempty"`
}

func (c *Config) setDefaults() error {
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultSubnet
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.NetnsDir == "" {
		c.NetnsDir = DefaultNetnsDir
	}
	c.Subnet = c.Subnet.Masked()
	if !c.Subnet.Addr().Is4() {
		return fmt.Errorf("network: subnet %s: only IPv4 is supported: %w", c.Subnet, errdefs.ErrInvalidArgument)
	}
	if c.Subnet.Bits() > 30 {
		return fmt.Errorf("network: subnet %s is too small: %w", c.Subnet, errdefs.ErrInvalidArgument)
	}
	if c.Subnet6.IsValid() {
		c.Subnet6 = c.Subnet6.Masked()
		if !c.Subnet6.Addr().Is6() || c.Subnet6.Addr().Is4In6() {
			return fmt.Errorf("network: subnet6 %s is not an IPv6 prefix: %w", c.Subnet6, errdefs.ErrInvalidArgument)
		}
		if c.Subnet6.Bits() < 48 || 128-c.Subnet6.Bits() < 32-c.Subnet.Bits() {
			return fmt.Errorf("network: subnet6 %s: want a prefix of /48 or longer with at least as many host bits as %s: %w",
				c.Subnet6, c.Subnet, errdefs.ErrInvalidArgument)
		}
	}
	if len(c.Bridge) > 15 {
		return fmt.Errorf("network: bridge name %q longer than 15 bytes: %w", c.Bridge, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Attachment is one sandbox's network.
type Attachment struct {
	// ID is the sandbox ID.
	ID string `json:"id"`
	// NetnsPath is the bind-mounted network namespace file, suitable for an
	// OCI "network" namespace path.
	NetnsPath string `json:"netnsPath"`
	// IP is the sandbox address (on eth0 inside the namespace).
	IP netip.Addr `json:"ip"`
	// PrefixLen is the subnet prefix length of IP.
	PrefixLen int `json:"prefixLen"`
	// Gateway is the bridge address and the sandbox's default route.
	Gateway netip.Addr `json:"gateway"`
	// HostVeth is the host-side veth name, a port of the bridge.
	HostVeth string `json:"hostVeth"`
	// IP6, PrefixLen6 and Gateway6 are the IPv6 address, prefix length and
	// default gateway; IP6 is invalid (omitted) when IPv6 is off.
	IP6        netip.Addr `json:"ip6,omitzero"`
	PrefixLen6 int        `json:"prefixLen6,omitempty"`
	Gateway6   netip.Addr `json:"gateway6,omitzero"`
}

// Manager sets up and tears down sandbox networks. Its methods are safe for
// concurrent use; calls for the same ID must not overlap (the runtime
// serializes them).
type Manager struct {
	cfg     Config
	log     *slog.Logger
	gateway netip.Addr

	mu     sync.Mutex
	byIP   map[netip.Addr]string // allocated address -> ID
	byID   map[string]netip.Addr
	cursor netip.Addr // last allocated address, for next-fit allocation
}

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// Open prepares the bridge and state directories, loads the persistent
// IPAM, and reconciles leftovers of setups interrupted by a crash. log may
// be nil.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:     cfg,
		log:     log,
		gateway: cfg.Subnet.Addr().Next(),
		byIP:    map[netip.Addr]string{},
		byID:    map[string]netip.Addr{},
	}
	m.cursor = m.gateway
	for _, d := range []string{m.ipDir(), m.attachDir(), cfg.NetnsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
	}
	if err := m.ensureBridge(); err != nil {
		return nil, err
	}
	if err := m.reconcile(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// Bridge returns the host bridge name (for egress/NAT rules).
func (m *Manager) Bridge() string { return m.cfg.Bridge }

// Subnet returns the sandbox address range (for egress/NAT rules).
func (m *Manager) Subnet() netip.Prefix { return m.cfg.Subnet }

// Gateway returns the bridge address, the sandboxes' default gateway.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// Subnet6 returns the sandbox IPv6 range; it is invalid when IPv6 is off.
func (m *Manager) Subnet6() netip.Prefix { return m.cfg.Subnet6 }

// Gateway6 returns the bridge's IPv6 address; invalid when IPv6 is off.
func (m *Manager) Gateway6() netip.Addr {
	if !m.cfg.Subnet6.IsValid() {
		return netip.Addr{}
	}
	return m.cfg.Subnet6.Addr().Next()
}

// ip6For maps an IPv4 sandbox address to its IPv6 one: the same offset
// from the start of Subnet6 as ip has from the start of Subnet.
func (m *Manager) ip6For(ip netip.Addr) netip.Addr {
	if !m.cfg.Subnet6.IsValid() {
		return netip.Addr{}
	}
	a, b := ip.As4(), m.cfg.Subnet.Addr().As4()
	off := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) -
		(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
	v := m.cfg.Subnet6.Addr().As16()
	for i := 15; i >= 12; i-- {
		v[i] |= byte(off)
		off >>= 8
	}
	return netip.AddrFrom16(v)
}

func (m *Manager) ipDir() string     { return filepath.Join(m.cfg.StateDir, "ips") }
func (m *Manager) attachDir() string { return filepath.Join(m.cfg.StateDir, "attachments") }

// NetnsPath returns where the namespace file of id lives.
func (m *Manager) NetnsPath(id string) string { return filepath.Join(m.cfg.NetnsDir, id) }

// HostVethName returns the deterministic host-side veth name for id: a
// short hash, because interface names are limited to 15 bytes.
func HostVethName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hostVethPrefix + hex.EncodeToString(sum[:6])
}

func (m *Manager) ensureBridge() error {
	link, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("network: look up bridge %s: %w", m.cfg.Bridge, err)
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.cfg.Bridge}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: create bridge %s: %w", m.cfg.Bridge, err)
		}
		if link, err = netlink.LinkByName(m.cfg.Bridge); err != nil {
			return fmt.Errorf("network: look up bridge %s: %w", m.cfg.Bridge, err)
		}
	}
	if _, ok := link.(*netlink.Bridge); !ok {
		return fmt.Errorf("network: %s exists and is a %s, not a bridge: %w", m.cfg.Bridge, link.Type(), errdefs.ErrFailedPrecondition)
	}
	if err := pinBridgeMAC(link); err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{
		IP:   m.gateway.AsSlice(),
		Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32),
	}}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("network: address bridge %s: %w", m.cfg.Bridge, err)
	}
	if m.cfg.Subnet6.IsValid() {
		// The bridge must never take router advertisements or redirects
		// from a sandbox (they would install host routes).
		for _, k := range []string{"accept_ra", "accept_redirects", "disable_ipv6"} {
			if err := writeSysctl(filepath.Join("/proc/sys/net/ipv6/conf", m.cfg.Bridge, k), "0"); err != nil {
				return fmt.Errorf("network: bridge %s: %w", m.cfg.Bridge, err)
			}
		}
		addr6 := &netlink.Addr{IPNet: &net.IPNet{IP: m.Gateway6().AsSlice(), Mask: net.CIDRMask(m.cfg.Subnet6.Bits(), 128)},
			Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(link, addr6); err != nil {
			return fmt.Errorf("network: IPv6 address bridge %s: %w", m.cfg.Bridge, err)
		}
	} else {
		// IPv6 turned off since an earlier start: drop the old gateway
		// address (link-local ones stay; sandboxes have IPv6 disabled).
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("network: list addresses of %s: %w", m.cfg.Bridge, err)
		}
		for _, a := range addrs {
			if a.IP.IsGlobalUnicast() {
				if err := netlink.AddrDel(link, &a); err != nil {
					return fmt.Errorf("network: remove IPv6 address %s from %s: %w", a.IPNet, m.cfg.Bridge, err)
				}
			}
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network: bring up bridge %s: %w", m.cfg.Bridge, err)
	}
	return nil
}

// pinBridgeMAC gives the bridge a fixed MAC address unless one was set
// already. Left alone, Linux gives a bridge the lowest MAC of its ports, so
// its (the gateway's) MAC changes whenever a sandbox's veth joins or
// leaves; sandboxes that resolved the gateway earlier then send to a MAC
// nobody owns until their ARP entry expires, and TCP backoff stretches
// that into replies delayed by seconds to minutes. The current address is
// kept when there is one, so sandboxes of a running server are unaffected.
func pinBridgeMAC(link netlink.Link) error {
	name := link.Attrs().Name
	const netAddrSet = "3" // NET_ADDR_SET: the address was set explicitly
	if t, err := os.ReadFile(filepath.Join("/sys/class/net", name, "addr_assign_type")); err == nil && strings.TrimSpace(string(t)) == netAddrSet {
		return nil
	}
	mac := link.Attrs().HardwareAddr
	if len(mac) != 6 || bytes.Equal(mac, make(net.HardwareAddr, 6)) {
		// No ports: derive a stable, locally administered unicast address.
		sum := sha256.Sum256([]byte("moat-bridge/" + name))
		mac = net.HardwareAddr(sum[:6])
		mac[0] = mac[0]&0xfe | 0x02
	}
	if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
		return fmt.Errorf("network: set MAC address of bridge %s: %w", name, err)
	}
	return nil
}

// RemoveBridge deletes the bridge. It is meant for tests and uninstall;
// it fails with ErrFailedPrecondition while attachments exist.
func (m *Manager) RemoveBridge(ctx context.Context) error {
	m.mu.Lock()
	n := len(m.byID)
	m.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("network: %d attachments remain: %w", n, errdefs.ErrFailedPrecondition)
	}
	link, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("network: delete bridge: %w", err)
	}
	return nil
}

// Setup creates the network of sandbox id. On error nothing is left
// behind. Setting up an ID that already has an attachment is
// ErrAlreadyExists.
func (m *Manager) Setup(ctx context.Context, id string) (_ Attachment, err error) {
	if !idPattern.MatchString(id) {
		return Attachment{}, fmt.Errorf("network: bad sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return Attachment{}, err
	}
	ip, err := m.allocate(id)
	if err != nil {
		return Attachment{}, err
	}
	defer func() {
		if err != nil {
			if terr := m.Teardown(context.WithoutCancel(ctx), id); terr != nil {
				m.log.Warn("network: rollback failed", "id", id, "err", terr)
			}
		}
	}()
	a := Attachment{
		ID:        id,
		NetnsPath: m.NetnsPath(id),
		IP:        ip,
		PrefixLen: m.cfg.Subnet.Bits(),
		Gateway:   m.gateway,
		HostVeth:  HostVethName(id),
	}
	if m.cfg.Subnet6.IsValid() {
		a.IP6, a.PrefixLen6, a.Gateway6 = m.ip6For(ip), m.cfg.Subnet6.Bits(), m.Gateway6()
	}
	ns, err := createNetns(a.NetnsPath)
	if err != nil {
		return Attachment{}, err
	}
	defer ns.Close()
	if err := m.plumb(a, ns); err != nil {
		return Attachment{}, err
	}
	m.forgetNeighbors(a)
	if err := writeJSONAtomic(filepath.Join(m.attachDir(), id+".json"), a); err != nil {
		return Attachment{}, fmt.Errorf("network: record attachment: %w", err)
	}
	return a, nil
}

// forgetNeighbors drops the host's neighbor (ARP/NDP) entries for a's
// addresses on the bridge. Addresses are reused after a delete (or a
// crash), and an entry left from the previous owner points at a MAC that
// no longer exists: the host's first packets to the new sandbox would go
// nowhere until the entry expired (tens of seconds), which is longer than
// the agent-ready timeout.
func (m *Manager) forgetNeighbors(a Attachment) {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return
	}
	for _, ip := range []netip.Addr{a.IP, a.IP6} {
		if !ip.IsValid() {
			continue
		}
		n := &netlink.Neigh{LinkIndex: br.Attrs().Index, IP: net.IP(ip.AsSlice())}
		if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			m.log.Debug("network: forget neighbor", "ip", ip, "err", err)
		}
	}
}

// plumb creates the veth pair and configures both ends.
func (m *Manager) plumb(a Attachment, ns netns.NsHandle) error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge %s: %w: %w", m.cfg.Bridge, err, errdefs.ErrUnavailable)
	}
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:        a.HostVeth,
			MasterIndex: br.Attrs().Index,
			MTU:         br.Attrs().MTU,
		},
		PeerName:      sandboxIfName,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: veth %s: %w", a.HostVeth, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("network: create veth %s: %w", a.HostVeth, err)
	}
	if err := netlink.LinkSetIsolated(veth, true); err != nil {
		return fmt.Errorf("network: isolate bridge port %s: %w", a.HostVeth, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("network: bring up %s: %w", a.HostVeth, err)
	}

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("network: netlink in sandbox netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("network: sandbox lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("network: bring up lo: %w", err)
	}
	eth, err := h.LinkByName(sandboxIfName)
	if err != nil {
		return fmt.Errorf("network: sandbox %s: %w", sandboxIfName, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP.AsSlice(), Mask: net.CIDRMask(a.PrefixLen, 32)}}
	if err := h.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("network: address %s: %w", sandboxIfName, err)
	}
	// Before eth0 comes up, so no IPv6 packet (not even a link-local
	// router solicitation) ever leaves a sandbox without IPv6.
	ipv6Off := "1"
	if a.IP6.IsValid() {
		ipv6Off = "0"
	}
	if err := inNetns(ns, func() error {
		return writeSysctl("/proc/sys/net/ipv6/conf/"+sandboxIfName+"/disable_ipv6", ipv6Off)
	}); err != nil {
		return fmt.Errorf("network: sandbox IPv6 setting: %w", err)
	}
	if a.IP6.IsValid() {
		addr6 := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP6.AsSlice(), Mask: net.CIDRMask(a.PrefixLen6, 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(eth, addr6); err != nil {
			return fmt.Errorf("network: IPv6 address %s: %w", sandboxIfName, err)
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("network: bring up %s: %w", sandboxIfName, err)
	}
	route := &netlink.Route{
		LinkIndex: eth.Attrs().Index,
		Gw:        a.Gateway.AsSlice(),
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
	}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("network: default route: %w", err)
	}
	if a.IP6.IsValid() {
		route6 := &netlink.Route{
			LinkIndex: eth.Attrs().Index,
			Gw:        a.Gateway6.AsSlice(),
			Dst:       &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		}
		if err := h.RouteAdd(route6); err != nil {
			return fmt.Errorf("network: IPv6 default route: %w", err)
		}
	}
	return nil
}

// inNetns runs fn on a locked OS thread switched into ns (for the
// per-namespace files under /proc/sys/net). A thread that cannot switch
// back stays locked and is discarded with its goroutine.
func inNetns(ns netns.NsHandle, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, err)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// writeSysctl writes one /proc/sys value.
func writeSysctl(path, value string) error {
	if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", strings.TrimPrefix(path, "/proc/sys/"), err)
	}
	return nil
}

// Teardown removes every piece of the network of id that exists: veth,
// namespace file, address and record. It is idempotent and cleans up
// half-done setups.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("network: bad sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	var errs []error
	// Deleting the host end destroys the peer too (and so would destroying
	// the namespace, but that happens asynchronously in the kernel).
	if link, err := netlink.LinkByName(HostVethName(id)); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("delete veth: %w", err))
		}
	}
	if err := removeNetns(m.NetnsPath(id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(filepath.Join(m.attachDir(), id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := m.release(id); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("network: teardown %s: %w: %w", id, errors.Join(errs...), errdefs.ErrInternal)
	}
	return nil
}

// Get returns the attachment of id, ErrNotFound if it has none.
func (m *Manager) Get(ctx context.Context, id string) (Attachment, error) {
	if !idPattern.MatchString(id) {
		return Attachment{}, fmt.Errorf("network: bad sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	var a Attachment
	data, err := os.ReadFile(filepath.Join(m.attachDir(), id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return Attachment{}, fmt.Errorf("network: attachment %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("network: %w", err)
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return Attachment{}, fmt.Errorf("network: attachment %s: %w: %w", id, err, errdefs.ErrInternal)
	}
	return a, nil
}

// List returns every complete attachment, including ones made by an
// earlier process.
func (m *Manager) List(ctx context.Context) ([]Attachment, error) {
	entries, err := os.ReadDir(m.attachDir())
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	var out []Attachment
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !idPattern.MatchString(id) {
			continue
		}
		a, err := m.Get(ctx, id)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// reconcile loads the IPAM files and removes everything that does not
// belong to a complete attachment.
func (m *Manager) reconcile(ctx context.Context) error {
	// A crash between writeJSONAtomic's write and rename leaves a .tmp.
	if tmps, _ := filepath.Glob(filepath.Join(m.attachDir(), "*.tmp")); len(tmps) > 0 {
		for _, p := range tmps {
			os.Remove(p)
		}
	}
	complete := map[string]Attachment{}
	atts, err := m.List(ctx)
	if err != nil {
		return err
	}
	for _, a := range atts {
		complete[a.ID] = a
	}
	stale := map[string]bool{}
	entries, err := os.ReadDir(m.ipDir())
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	m.mu.Lock()
	for _, e := range entries {
		p := filepath.Join(m.ipDir(), e.Name())
		ip, perr := netip.ParseAddr(e.Name())
		data, rerr := os.ReadFile(p)
		id := strings.TrimSpace(string(data))
		if perr != nil || rerr != nil || !idPattern.MatchString(id) {
			// A crash between create and write leaves an empty file.
			m.log.Info("network: removing invalid address record", "file", p)
			os.Remove(p)
			continue
		}
		if a, ok := complete[id]; !ok || a.IP != ip {
			stale[id] = true
			os.Remove(p)
			continue
		}
		m.byIP[ip] = id
		m.byID[id] = ip
	}
	m.mu.Unlock()
	for id, a := range complete {
		if _, ok := m.byID[id]; !ok || m.byID[id] != a.IP {
			stale[id] = true
		}
	}
	if ents, err := os.ReadDir(m.cfg.NetnsDir); err == nil {
		for _, e := range ents {
			if _, ok := complete[e.Name()]; !ok && idPattern.MatchString(e.Name()) {
				stale[e.Name()] = true
			}
		}
	}
	for id := range stale {
		m.log.Info("network: removing leftover of interrupted setup", "id", id)
		if err := m.Teardown(ctx, id); err != nil {
			return err
		}
	}
	// Bridge ports that belong to no attachment (the record was lost).
	want := map[string]bool{}
	for id := range m.byID {
		want[HostVethName(id)] = true
	}
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge: %w", err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("network: list links: %w", err)
	}
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex != br.Attrs().Index || l.Type() != "veth" || !strings.HasPrefix(a.Name, hostVethPrefix) {
			continue
		}
		if !want[a.Name] {
			m.log.Info("network: removing orphaned veth", "name", a.Name)
			netlink.LinkDel(l)
			continue
		}
		// Ports made before isolation existed become isolated too.
		if err := netlink.LinkSetIsolated(l, true); err != nil {
			return fmt.Errorf("network: isolate bridge port %s: %w", a.Name, err)
		}
	}
	return nil
}

// allocate reserves a free address for id. The address file is created
// with O_EXCL before it is used, so a crash never hands one address out
// twice; reconcile frees files that belong to no complete attachment.
func (m *Manager) allocate(id string) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byID[id]; ok {
		return netip.Addr{}, fmt.Errorf("network: sandbox %s: %w", id, errdefs.ErrAlreadyExists)
	}
	first := m.gateway.Next()
	last := lastHost(m.cfg.Subnet)
	ip := m.cursor
	for range numHosts(m.cfg.Subnet) {
		ip = ip.Next()
		if !m.cfg.Subnet.Contains(ip) || ip.Compare(last) > 0 || ip.Compare(first) < 0 {
			ip = first
		}
		if _, used := m.byIP[ip]; used {
			continue
		}
		f, err := os.OpenFile(filepath.Join(m.ipDir(), ip.String()), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("network: allocate: %w", err)
		}
		_, werr := f.WriteString(id)
		cerr := f.Close()
		if werr != nil || cerr != nil {
			os.Remove(f.Name())
			return netip.Addr{}, fmt.Errorf("network: allocate: %w", errors.Join(werr, cerr))
		}
		m.byIP[ip] = id
		m.byID[id] = ip
		m.cursor = ip
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("network: no free address in %s: %w", m.cfg.Subnet, errdefs.ErrResourceExhausted)
}

// release frees the address of id (in memory and on disk), if any.
func (m *Manager) release(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip, ok := m.byID[id]
	if ok {
		delete(m.byID, id)
		delete(m.byIP, ip)
		if err := os.Remove(filepath.Join(m.ipDir(), ip.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	// Not known in memory (e.g. Teardown during reconcile): scan the files.
	entries, err := os.ReadDir(m.ipDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(m.ipDir(), e.Name())
		if data, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(data)) == id {
			os.Remove(p)
		}
	}
	return nil
}

// lastHost is the highest usable address of p (the broadcast address is
// excluded).
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	hostBits := 32 - p.Bits()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= (1 << hostBits) - 1
	v-- // broadcast
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// numHosts is the number of allocatable sandbox addresses in p (network,
// gateway and broadcast excluded).
func numHosts(p netip.Prefix) int {
	return 1<<(32-p.Bits()) - 3
}

// createNetns creates a new network namespace and bind-mounts it at path.
// The returned handle refers to the new namespace.
func createNetns(path string) (netns.NsHandle, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("network: netns %s: %w", path, errdefs.ErrAlreadyExists)
		}
		return 0, fmt.Errorf("network: netns file: %w", err)
	}
	f.Close()

	type result struct {
		err error
	}
	done := make(chan result, 1)
	// The namespace switch happens on a dedicated, locked OS thread. If the
	// thread cannot be switched back, it stays locked so that Go discards
	// it when the goroutine exits instead of reusing a thread in the wrong
	// namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{fmt.Errorf("network: current netns: %w", err)}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{fmt.Errorf("network: unshare: %w", err)}
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		merr := unix.Mount(src, path, "none", unix.MS_BIND, "")
		if err := netns.Set(orig); err != nil {
			done <- result{fmt.Errorf("network: restore netns: %w", err)}
			return // thread stays locked and is discarded
		}
		runtime.UnlockOSThread()
		if merr != nil {
			merr = fmt.Errorf("network: bind netns: %w", merr)
		}
		done <- result{merr}
	}()
	if r := <-done; r.err != nil {
		os.Remove(path)
		return 0, r.err
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		removeNetns(path)
		return 0, fmt.Errorf("network: open netns: %w", err)
	}
	return h, nil
}

// removeNetns unmounts and removes a namespace file; a missing file is not
// an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns: %w", err)
	}
	return nil
}

// writeJSONAtomic writes v to path through a temporary file and a rename,
// so readers see either nothing or the whole record.
func writeJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
