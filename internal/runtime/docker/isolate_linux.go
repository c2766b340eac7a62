package docker

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// isolatePort makes the host end of a sandbox's veth an isolated bridge
// port, as the native backend does: isolated ports exchange frames only
// with the bridge itself (the host), never with each other, so sandboxes
// cannot reach one another at layer 2 whatever their addresses. The host
// end is the peer (IFLA_LINK) of eth0 in the sandbox's netns.
func isolatePort(netnsPath string) error {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("docker: sandbox netns %s: %w", netnsPath, err)
	}
	h, err := netlink.NewHandleAt(ns)
	ns.Close()
	if err != nil {
		return fmt.Errorf("docker: netlink in %s: %w", netnsPath, err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("docker: sandbox eth0: %w", err)
	}
	peer, err := netlink.LinkByIndex(eth.Attrs().ParentIndex)
	if err != nil {
		return fmt.Errorf("docker: host end of the sandbox veth (index %d): %w", eth.Attrs().ParentIndex, err)
	}
	if err := netlink.LinkSetIsolated(peer, true); err != nil {
		return fmt.Errorf("docker: isolate bridge port %s: %w", peer.Attrs().Name, err)
	}
	return nil
}

// readyBridge6 readies the IPv6 side of a dual-stack network's host bridge
// as the native backend does: no router advertisements or redirects taken
// from a sandbox (they would install host routes), and a gateway address
// usable at once. The daemon adds that address with duplicate address
// detection, which cannot run while the bridge has no port (no carrier):
// it would stay tentative, and nothing (the credential proxy, a sandbox's
// first packets) could use it until a container came up and DAD ended.
// It is put back without DAD (the subnet is the server's own).
func readyBridge6(bridge string, gw netip.Prefix) error {
	link, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("docker: bridge %s: %w", bridge, err)
	}
	for _, k := range []string{"accept_ra", "accept_redirects"} {
		if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", bridge, k), []byte("0"), 0o644); err != nil {
			return fmt.Errorf("docker: bridge %s: %w", bridge, err)
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		return fmt.Errorf("docker: addresses of %s: %w", bridge, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: gw.Addr().AsSlice(), Mask: net.CIDRMask(gw.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
	for _, a := range addrs {
		if !a.IP.Equal(addr.IP) {
			continue
		}
		if a.Flags&unix.IFA_F_TENTATIVE == 0 {
			return nil // usable already
		}
		// The kernel keeps a tentative address tentative when its flags
		// change: it goes and comes back.
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("docker: bridge %s: remove tentative %s: %w", bridge, gw, err)
		}
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("docker: bridge %s: address %s: %w", bridge, gw, err)
	}
	return nil
}
