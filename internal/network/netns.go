package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// The sandbox side: the network namespace file, the veth pair and
// everything configured inside the namespace.

// plumb creates the veth pair and configures both ends; the host end is
// left down (a port without a carrier: no frame passes) for the caller to
// bring up, after renaming it if it was made ahead as a spare. It returns
// the host end's interface index.
func (m *Manager) plumb(a Attachment, ns netns.NsHandle) (int, error) {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return 0, fmt.Errorf("network: bridge %s: %w: %w", m.cfg.Bridge, err, errdefs.ErrUnavailable)
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
			return 0, fmt.Errorf("network: veth %s: %w", a.HostVeth, errdefs.ErrAlreadyExists)
		}
		return 0, fmt.Errorf("network: create veth %s: %w", a.HostVeth, err)
	}
	if err := netlink.LinkSetIsolated(veth, true); err != nil {
		return 0, fmt.Errorf("network: isolate bridge port %s: %w", a.HostVeth, err)
	}
	eth, err := configureSandboxEnd(a, ns, br.Attrs().HardwareAddr)
	if err != nil {
		return 0, err
	}
	// The host's static neighbor entries (see permanentNeighbor).
	for _, ip := range []netip.Addr{a.IP, a.IP6} {
		if !ip.IsValid() {
			continue
		}
		if err := netlink.NeighSet(permanentNeighbor(br.Attrs().Index, ip, eth.Attrs().HardwareAddr)); err != nil {
			return 0, fmt.Errorf("network: static neighbor entry for %s on %s: %w", ip, m.cfg.Bridge, err)
		}
	}
	return veth.Attrs().Index, nil
}

// configureSandboxEnd configures the sandbox's side in namespace ns: lo
// up, eth0's addresses (IPv6 turned off without one), default routes and
// a static neighbor entry for the gateway (the bridge, MAC gwMAC). It
// returns eth0.
func configureSandboxEnd(a Attachment, ns netns.NsHandle, gwMAC net.HardwareAddr) (netlink.Link, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("network: netlink in sandbox netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("network: sandbox lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return nil, fmt.Errorf("network: bring up lo: %w", err)
	}
	eth, err := h.LinkByName(sandboxIfName)
	if err != nil {
		return nil, fmt.Errorf("network: sandbox %s: %w", sandboxIfName, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP.AsSlice(), Mask: net.CIDRMask(a.PrefixLen, 32)}}
	if err := h.AddrAdd(eth, addr); err != nil {
		return nil, fmt.Errorf("network: address %s: %w", sandboxIfName, err)
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
		return nil, fmt.Errorf("network: sandbox IPv6 setting: %w", err)
	}
	if a.IP6.IsValid() {
		addr6 := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP6.AsSlice(), Mask: net.CIDRMask(a.PrefixLen6, 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(eth, addr6); err != nil {
			return nil, fmt.Errorf("network: IPv6 address %s: %w", sandboxIfName, err)
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		return nil, fmt.Errorf("network: bring up %s: %w", sandboxIfName, err)
	}
	route := &netlink.Route{
		LinkIndex: eth.Attrs().Index,
		Gw:        a.Gateway.AsSlice(),
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
	}
	if err := h.RouteAdd(route); err != nil {
		return nil, fmt.Errorf("network: default route: %w", err)
	}
	if a.IP6.IsValid() {
		route6 := &netlink.Route{
			LinkIndex: eth.Attrs().Index,
			Gw:        a.Gateway6.AsSlice(),
			Dst:       &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		}
		if err := h.RouteAdd(route6); err != nil {
			return nil, fmt.Errorf("network: IPv6 default route: %w", err)
		}
	}
	// Static neighbor entries both ways (see permanentNeighbor).
	for _, gw := range []netip.Addr{a.Gateway, a.Gateway6} {
		if !gw.IsValid() {
			continue
		}
		if err := h.NeighSet(permanentNeighbor(eth.Attrs().Index, gw, gwMAC)); err != nil {
			return nil, fmt.Errorf("network: static neighbor entry for the gateway %s: %w", gw, err)
		}
	}
	return eth, nil
}

// permanentNeighbor is a NUD_PERMANENT neighbor entry ip -> mac on link.
//
// The host's entry for a sandbox (its address -> the MAC of its eth0, on
// the bridge) and the sandbox's entry for its gateway (-> the bridge's
// pinned MAC) are permanent, set when the veth is made. The kernel keeps
// one neighbor table for all network namespaces together and refuses new
// dynamic entries past net.ipv4.neigh.default.gc_thresh3 (1,024 by
// default), and an entry in use cannot be collected for the tens of
// seconds it stays reachable: with two resolved entries per sandbox, a
// cold batch of 1,000 sandboxes held the table at its limit (1,025
// entries, new ones refused: table_fulls in /proc/net/stat/arp_cache), so
// a new sandbox could go unresolved past the agent-ready timeout
// (SANDBOX::EXECD_START_FAILED). Permanent entries are exempt from that
// limit and from collection, and no ARP or NDP exchange delays a
// sandbox's first packets. The host's entries go with the sandbox
// (Teardown) or, when their record was lost, at Open (reconcile).
func permanentNeighbor(link int, ip netip.Addr, mac net.HardwareAddr) *netlink.Neigh {
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	return &netlink.Neigh{
		LinkIndex:    link,
		Family:       family,
		State:        netlink.NUD_PERMANENT,
		IP:           net.IP(ip.AsSlice()),
		HardwareAddr: mac,
	}
}

// inNetns runs fn on a locked OS thread switched into ns (for the
// per-namespace files under /proc/sys/net).
func inNetns(ns netns.NsHandle, fn func() error) error {
	return onNetnsThread(func() error { return netns.Set(ns) }, fn)
}

// onNetnsThread runs enter, which moves the calling thread into another
// network namespace (setns or unshare), then fn, on a dedicated locked OS
// thread, and switches the thread back. A thread that cannot switch back
// stays locked, so Go discards it with its goroutine instead of reusing a
// thread in the wrong namespace.
func onNetnsThread(enter, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return // the thread stays locked and is discarded
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

// newNetns creates a network namespace and returns a handle to it (an open
// file). Nothing else refers to the namespace yet: closing the handle
// before bindNetns destroys it, with every device in it (the kernel does
// that asynchronously).
func newNetns() (netns.NsHandle, error) {
	fd := -1
	err := onNetnsThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		return nil
	}, func() (err error) {
		fd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return 0, fmt.Errorf("network: new netns: %w", err)
	}
	return netns.NsHandle(fd), nil
}

// bindNetns bind-mounts namespace ns at path, a file it creates, so that the
// namespace outlives the handle (and this process) until removeNetns.
func bindNetns(ns netns.NsHandle, path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("network: netns %s: %w", path, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("network: netns file: %w", err)
	}
	f.Close()
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", int(ns)), path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("network: bind netns: %w", err)
	}
	return nil
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

// Readdress gives the sandbox end of id's network its addresses, default
// routes and gateway neighbor entries again, as Setup made them; what is
// still there is kept. gVisor's runsc takes the addresses off eth0 when
// it starts a sandbox (its own netstack holds them from then on), so a
// sandbox started again in the same namespace, a hibernated one waking,
// needs them back for runsc to find them.
func (m *Manager) Readdress(ctx context.Context, id string) error {
	a, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge %s: %w: %w", m.cfg.Bridge, err, errdefs.ErrUnavailable)
	}
	ns, err := netns.GetFromPath(a.NetnsPath)
	if err != nil {
		return fmt.Errorf("network: sandbox netns %s: %w", a.NetnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("network: netlink in sandbox netns: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName(sandboxIfName)
	if err != nil {
		return fmt.Errorf("network: sandbox %s: %w", sandboxIfName, err)
	}
	addrs := []*netlink.Addr{{IPNet: &net.IPNet{IP: a.IP.AsSlice(), Mask: net.CIDRMask(a.PrefixLen, 32)}}}
	routes := []*netlink.Route{{LinkIndex: eth.Attrs().Index, Gw: a.Gateway.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}}
	if a.IP6.IsValid() {
		addrs = append(addrs, &netlink.Addr{IPNet: &net.IPNet{IP: a.IP6.AsSlice(), Mask: net.CIDRMask(a.PrefixLen6, 128)}, Flags: unix.IFA_F_NODAD})
		routes = append(routes, &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: a.Gateway6.AsSlice(),
			Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}})
	}
	for _, addr := range addrs {
		if err := h.AddrReplace(eth, addr); err != nil {
			return fmt.Errorf("network: address %s on %s: %w", addr.IPNet, sandboxIfName, err)
		}
	}
	for _, route := range routes {
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("network: default route via %s: %w", route.Gw, err)
		}
	}
	for _, gw := range []netip.Addr{a.Gateway, a.Gateway6} {
		if !gw.IsValid() {
			continue
		}
		if err := h.NeighSet(permanentNeighbor(eth.Attrs().Index, gw, br.Attrs().HardwareAddr)); err != nil {
			return fmt.Errorf("network: static neighbor entry for the gateway %s: %w", gw, err)
		}
	}
	return nil
}
