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
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/moat-sandbox/moat/internal/atomicfile"
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
	// Spares is how many sandbox networks (namespace, veth pair, address)
	// the Manager keeps made ahead, so that Setup only hands one over (see
	// spares.go). 0 (the default) makes every network in Setup.
	Spares int `json:"spares,omitempty"`
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
	if c.Spares < 0 || c.Spares > 1024 {
		return fmt.Errorf("network: %d spares: want 0 to 1024: %w", c.Spares, errdefs.ErrInvalidArgument)
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
// serializes them). Close it when done: it removes the spares and waits
// for the veth deletions Teardown left running.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	gateway netip.Addr

	mu     sync.Mutex
	byIP   map[netip.Addr]string // allocated address -> ID (spareOwner for a spare's)
	byID   map[string]netip.Addr
	cursor netip.Addr    // last allocated address, for next-fit allocation
	spares []*spare      // ready spares (Config.Spares)
	making bool          // the filler is making one
	ready  chan struct{} // closed (and replaced) when the filler is done with one
	closed bool

	// Host veths being deleted (deletions.go), by name.
	delMu      sync.Mutex
	deleting   map[string]chan struct{} // closed once deleted
	delQueue   []netlink.Link
	delRunning bool

	// The spare filler (only with Config.Spares > 0).
	kick     chan struct{}
	stop     chan struct{}
	fillDone chan struct{}
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

		deleting: map[string]chan struct{}{},
	}
	m.cursor = m.gateway
	for _, d := range []string{m.ipDir(), m.attachDir(), cfg.NetnsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
	}
	if err := checkSubnetFree(cfg); err != nil {
		return nil, err
	}
	if err := m.ensureBridge(); err != nil {
		return nil, err
	}
	if err := m.reconcile(ctx); err != nil {
		return nil, err
	}
	if cfg.Spares > 0 {
		m.kick, m.stop, m.fillDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		m.ready = make(chan struct{})
		go m.fill()
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

// Setup creates the network of sandbox id, or gives it a spare made
// ahead. On error nothing is left behind. Setting up an ID that already
// has an attachment is ErrAlreadyExists.
func (m *Manager) Setup(ctx context.Context, id string) (_ Attachment, err error) {
	if !idPattern.MatchString(id) {
		return Attachment{}, fmt.Errorf("network: bad sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return Attachment{}, err
	}
	m.mu.Lock()
	_, attached := m.byID[id]
	m.mu.Unlock()
	if attached {
		return Attachment{}, fmt.Errorf("network: sandbox %s: %w", id, errdefs.ErrAlreadyExists)
	}
	// A veth of an earlier sandbox of this ID may still be being deleted.
	if err := m.awaitDeleted(ctx, HostVethName(id)); err != nil {
		return Attachment{}, err
	}
	if s := m.takeSpare(); s != nil {
		return m.claim(ctx, id, s)
	}
	ip, err := m.allocate(id)
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		if s := m.awaitSpare(ctx); s != nil {
			return m.claim(ctx, id, s)
		}
	}
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
	a := m.attachment(ip, HostVethName(id))
	a.ID, a.NetnsPath = id, m.NetnsPath(id)
	ns, err := newNetns()
	if err != nil {
		return Attachment{}, err
	}
	defer ns.Close()
	if err := bindNetns(ns, a.NetnsPath); err != nil {
		return Attachment{}, err
	}
	host, err := m.plumb(a, ns)
	if err != nil {
		return Attachment{}, err
	}
	if err := netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: host}}); err != nil {
		return Attachment{}, fmt.Errorf("network: bring up %s: %w", a.HostVeth, err)
	}
	if err := writeJSONAtomic(filepath.Join(m.attachDir(), id+".json"), a); err != nil {
		return Attachment{}, fmt.Errorf("network: record attachment: %w", err)
	}
	return a, nil
}

// attachment is the network of address ip with host veth hostVeth: its
// addresses, prefixes and gateways (without an owner yet).
func (m *Manager) attachment(ip netip.Addr, hostVeth string) Attachment {
	a := Attachment{IP: ip, PrefixLen: m.cfg.Subnet.Bits(), Gateway: m.gateway, HostVeth: hostVeth}
	if m.cfg.Subnet6.IsValid() {
		a.IP6, a.PrefixLen6, a.Gateway6 = m.ip6For(ip), m.cfg.Subnet6.Bits(), m.Gateway6()
	}
	return a
}

// Teardown removes every piece of the network of id that exists: veth,
// namespace file, address and record. It is idempotent and cleans up
// half-done setups.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("network: bad sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	var errs []error
	m.mu.Lock()
	ip, known := m.byID[id]
	m.mu.Unlock()
	if known {
		m.forgetNeighbors(ip, m.ip6For(ip))
	}
	// Deleting the host end destroys the peer too. It is the slow step (the
	// kernel waits for an RCU grace period, holding the rtnl lock), so it
	// happens after Teardown returns (deleteLater).
	if link, err := netlink.LinkByName(HostVethName(id)); err == nil {
		m.deleteLater(link)
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
	m.kickFiller() // an address is free: a spare may be wanted
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
	return m.removeOrphanedPorts()
}

// removeOrphanedPorts removes the bridge ports that belong to no
// attachment (the record was lost), isolates the others, and sweeps the
// bridge's neighbor table.
func (m *Manager) removeOrphanedPorts() error {
	want := map[string]bool{}
	for id := range m.byID {
		want[HostVethName(id)] = true
	}
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge: %w", err)
	}
	links, err := dump(netlink.LinkList)
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
	return m.sweepNeighbors(br)
}

// writeJSONAtomic writes v to path through a temporary file and a rename,
// so readers see either nothing or the whole record.
func writeJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o600)
}
