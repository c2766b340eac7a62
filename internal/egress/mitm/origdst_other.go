//go:build !linux

package mitm

import (
	"errors"
	"net"
	"net/netip"
)

// OriginalDst needs Linux conntrack.
func OriginalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("mitm: original destinations need Linux")
}
