package docker

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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
