package network

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// checkSubnetFree refuses a Subnet or Subnet6 that another interface
// already routes, in any routing table, before Open touches the host. Two
// bridges with one subnet leave the kernel two routes for the same
// addresses: sandboxes of both break, and the second server then fails
// to bind its DNS proxy on the shared gateway address. Any overlapping
// route is a conflict (a narrower one on another bridge would take part
// of our sandboxes' traffic, ours would take part of its), except a wider
// one through a gateway (a 10.0.0.0/8 towards a VPN, say), which the
// bridge's more specific route merely shadows. Default routes and routes
// through the bridge itself (a restart) do not count.
func checkSubnetFree(cfg Config) error {
	own := -1
	if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
		own = l.Attrs().Index
	} else if nf := (netlink.LinkNotFoundError{}); !errors.As(err, &nf) {
		return fmt.Errorf("network: look up bridge %s: %w", cfg.Bridge, err)
	}
	for _, p := range []netip.Prefix{cfg.Subnet, cfg.Subnet6} {
		if !p.IsValid() {
			continue
		}
		fam := netlink.FAMILY_V4
		if p.Addr().Is6() {
			fam = netlink.FAMILY_V6
		}
		routes, err := dump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return fmt.Errorf("network: list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || r.LinkIndex == own && own > 0 {
				continue
			}
			a, ok := netip.AddrFromSlice(r.Dst.IP)
			bits, _ := r.Dst.Mask.Size()
			if !ok || bits == 0 {
				continue
			}
			rp := netip.PrefixFrom(a.Unmap(), bits).Masked()
			if rp.Overlaps(p) && !(rp.Bits() < p.Bits() && r.Gw != nil) {
				dev := "no device"
				if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
					dev = l.Attrs().Name
				}
				return fmt.Errorf("network: subnet %s is already routed: %s on %s (table %d); choose a subnet no interface uses: %w",
					p, rp, dev, r.Table, errdefs.ErrFailedPrecondition)
			}
		}
	}
	return nil
}
