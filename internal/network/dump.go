package network

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dump runs a netlink dump (a link, address or route list) again when the
// kernel flags it interrupted: the table changed while it was read, which
// on a host where other servers and tests add and remove links happens
// often enough to have failed a server's start. A few tries suffice; the
// last error is returned otherwise.
func dump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range 10 {
		if v, err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}
