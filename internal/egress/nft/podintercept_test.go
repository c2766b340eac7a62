//go:build linux

package nft

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestPodInterceptRedirectsInNamespace: in a namespace with the pod
// intercept table, TCP to 80/443 reaches the loopback proxy, which learns
// the original destination; other ports, loopback and the proxy's own
// marked connections go where they were sent.
func TestPodInterceptRedirectsInNamespace(t *testing.T) {
	testutil.RequiresRoot(t)
	tp := nettest.New(t)
	nettest.ServeTCP(t, tp.GatewayPath, nettest.GatewayIP.String()+":443")
	nettest.ServeTCP(t, tp.GatewayPath, nettest.GatewayIP.String()+":7000")
	const port, exempt = 18444, 0x6d6f7078
	ctx := context.Background()
	in := func(fn func() error) {
		t.Helper()
		if err := nettest.Do(tp.SandboxPath, fn); err != nil {
			t.Fatal(err)
		}
	}
	in(func() error { return ApplyPodIntercept(ctx, PodInterceptConfig{ProxyPort: port, Exempt: exempt}) })
	var ln net.Listener
	in(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:18444"); return err })
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if dst, err := mitm.OriginalDst(c); err != nil {
				io.WriteString(c, "proxy error "+err.Error())
			} else {
				io.WriteString(c, "proxy "+dst.String())
			}
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	read := func(addr string, mark int) string {
		t.Helper()
		d := net.Dialer{Timeout: 2 * time.Second}
		if mark != 0 {
			d.Control = func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) })
				if err != nil {
					return err
				}
				return serr
			}
		}
		var c net.Conn
		if err := nettest.Do(tp.SandboxPath, func() (err error) { c, err = d.Dial("tcp", addr); return err }); err != nil {
			return "dial error: " + err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	gw := nettest.GatewayIP.String()
	if got := read(gw+":443", 0); got != "proxy "+gw+":443" {
		t.Fatalf("to :443: %q", got)
	}
	if got := read(gw+":7000", 0); got != nettest.Banner {
		t.Fatalf("to :7000 was redirected: %q", got)
	}
	if got := read(gw+":443", exempt); got != nettest.Banner {
		t.Fatalf("the proxy's own connection was redirected: %q", got)
	}
	in(func() error { return ApplyPodIntercept(ctx, PodInterceptConfig{ProxyPort: port, Exempt: exempt}) }) // replaces
	if got := read(gw+":443", 0); got != "proxy "+gw+":443" {
		t.Fatalf("after re-apply: %q", got)
	}
	in(func() error { return RemovePodIntercept(ctx) })
	in(func() error { return RemovePodIntercept(ctx) })
	if got := read(gw+":443", 0); !strings.HasPrefix(got, nettest.Banner) {
		t.Fatalf("after RemovePodIntercept: %q", got)
	}
}
