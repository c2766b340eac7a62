package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// The host side: the moat bridge, its pinned MAC and its neighbor table.

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
		if err := Forward6(m.log, m.cfg.Bridge); err != nil {
			return err
		}
		addr6 := &netlink.Addr{IPNet: &net.IPNet{IP: m.Gateway6().AsSlice(), Mask: net.CIDRMask(m.cfg.Subnet6.Bits(), 128)},
			Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(link, addr6); err != nil {
			return fmt.Errorf("network: IPv6 address bridge %s: %w", m.cfg.Bridge, err)
		}
	} else {
		// IPv6 turned off since an earlier start: drop the old gateway
		// address (link-local ones stay; sandboxes have IPv6 disabled).
		addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_V6) })
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
	m.settleDeletes()
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

// forgetNeighbors drops the host's neighbor entries (the permanent ones
// plumb set, or dynamic ones from before) for a sandbox's addresses on
// the bridge; an invalid address is skipped.
func (m *Manager) forgetNeighbors(ips ...netip.Addr) {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return
	}
	for _, ip := range ips {
		if !ip.IsValid() {
			continue
		}
		n := &netlink.Neigh{LinkIndex: br.Attrs().Index, IP: net.IP(ip.AsSlice())}
		if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			m.log.Debug("network: forget neighbor", "ip", ip, "err", err)
		}
	}
}

// sweepNeighbors removes the bridge's neighbor entries for sandbox
// addresses that belong to no attachment: left by a sandbox whose record
// was lost in a crash. An address is reused after a delete, and an entry
// left from its previous owner would point at a MAC that no longer exists.
func (m *Manager) sweepNeighbors(br netlink.Link) error {
	neighs, err := dump(func() ([]netlink.Neigh, error) { return netlink.NeighList(br.Attrs().Index, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("network: list neighbors of %s: %w", m.cfg.Bridge, err)
	}
	m.mu.Lock()
	live := map[netip.Addr]bool{}
	for ip := range m.byIP {
		live[ip] = true
		if ip6 := m.ip6For(ip); ip6.IsValid() {
			live[ip6] = true
		}
	}
	m.mu.Unlock()
	for _, n := range neighs {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		ours := m.cfg.Subnet.Contains(ip) || (m.cfg.Subnet6.IsValid() && m.cfg.Subnet6.Contains(ip))
		if !ours || live[ip] || ip == m.gateway || ip == m.Gateway6() {
			continue
		}
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("network: remove stale neighbor %s on %s: %w", ip, m.cfg.Bridge, err)
		}
	}
	return nil
}
