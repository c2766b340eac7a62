package mitm

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OriginalDst returns the destination a connection had before the host's
// NAT redirected it to the proxy (getsockopt SO_ORIGINAL_DST, or
// IP6T_SO_ORIGINAL_DST for IPv6), from conntrack.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("mitm: not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	v6 := addrPortOf(c.LocalAddr()).Addr().Is6()
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if v6 {
			var info *unix.IPv6MTUInfo
			info, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst)
			if serr == nil {
				port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&info.Addr.Port))[:])
				out = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), port)
			}
			return
		}
		// The kernel writes a struct sockaddr_in into the 20-byte mreq.
		var m *unix.IPv6Mreq
		m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if serr == nil {
			port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
			out = netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port)
		}
	})
	if err == nil {
		err = serr
	}
	if errors.Is(err, syscall.ENOENT) {
		return netip.AddrPort{}, errors.New("mitm: connection was not redirected (no conntrack NAT entry)")
	}
	return out, err
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h),
// which x/sys/unix does not define.
const ip6tSOOriginalDst = 80
