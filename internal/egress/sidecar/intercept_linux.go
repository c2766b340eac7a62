//go:build linux

package sidecar

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nft"
)

// podInterceptor is the sidecar's egress.Interceptor: the pod intercept
// table sends the pod's HTTP(S) to the credential proxy on loopback,
// which tells the pod's connections apart by their source, the pod's own
// addresses.
type podInterceptor struct {
	proxy *mitm.Proxy
	port  uint16

	mu    sync.Mutex
	addrs []netip.Addr
}

// Intercept implements egress.Interceptor.
func (p *podInterceptor) Intercept(ctx context.Context, _ string, _ netip.Addr, c *mitm.Client) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range podAddrs() {
		if err := p.proxy.Register(a, c); err != nil {
			return err
		}
		p.addrs = append(p.addrs, a)
	}
	return nft.ApplyPodIntercept(ctx, nft.PodInterceptConfig{ProxyPort: p.port, Exempt: ProxyMark})
}

// Release implements egress.Interceptor.
func (p *podInterceptor) Release(ctx context.Context, _ string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.addrs {
		p.proxy.Unregister(a)
	}
	p.addrs = nil
	return nft.RemovePodIntercept(ctx)
}

// podAddrs are the namespace's addresses other than loopback: the source
// of every connection the pod makes outwards.
func podAddrs() []netip.Addr {
	var out []netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && !ip.Unmap().IsLoopback() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// markedDial dials with the proxy's mark, so its upstream connections are
// not redirected to itself (they still pass the policy's filter).
func markedDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, ProxyMark) })
		return errors.Join(err, serr)
	}}
	return d.DialContext(ctx, network, addr)
}
