//go:build linux

package nft

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

// TestInterceptRedirectsOnlyClients runs the host side of the credential
// proxy in a nettest topology (the gateway netns plays the host): a
// client sandbox's TCP to ports 80/443 reaches the proxy listener, which
// learns the original destination from conntrack; other ports, other
// sandboxes and removed clients reach the real server; the proxy port
// itself is closed to direct connections.
func TestInterceptRedirectsOnlyClients(t *testing.T) {
	testutil.RequiresRoot(t)
	tp := nettest.New(t)
	// The outside server sits in a third netns routed through the
	// gateway (an address of the gateway itself would be host input,
	// which the host table closes).
	outNS := testnet.New(t).Netns("icpt") // a name no other test process uses
	outPath := "/run/netns/" + outNS
	outside := netip.MustParseAddr("10.250.3.2")
	for _, args := range [][]string{
		{"netns", "add", outNS},
		{"-n", tp.Gateway, "link", "add", "out0", "type", "veth", "peer", "name", "eth0", "netns", outNS},
		{"-n", tp.Gateway, "addr", "add", "10.250.3.1/24", "dev", "out0"},
		{"-n", tp.Gateway, "link", "set", "out0", "up"},
		{"-n", outNS, "addr", "add", outside.String() + "/24", "dev", "eth0"},
		{"-n", outNS, "link", "set", "eth0", "up"},
		{"-n", outNS, "link", "set", "lo", "up"},
		{"-n", outNS, "route", "add", "default", "via", "10.250.3.1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		if args[0] == "netns" {
			t.Cleanup(func() { exec.Command("ip", "netns", "del", outNS).Run() })
		}
	}
	nettest.ServeTCP(t, outPath, outside.String()+":443")
	nettest.ServeTCP(t, outPath, outside.String()+":7000")
	ctx := context.Background()
	proxyAddr := netip.AddrPortFrom(nettest.GatewayIP, 18443)
	inGW := func(fn func() error) {
		t.Helper()
		if err := nettest.Do(tp.GatewayPath, fn); err != nil {
			t.Fatal(err)
		}
	}
	inGW(func() error {
		return ApplyHost(ctx, HostConfig{Bridge: "gw0", Subnet: netip.MustParsePrefix("10.250.1.0/24"), Gateway: nettest.GatewayIP})
	})
	inGW(func() error { return ApplyIntercept(ctx, InterceptConfig{Bridge: "gw0", Proxy: proxyAddr}) })

	// The "proxy": answers with the original destination of each connection.
	var ln net.Listener
	inGW(func() (err error) { ln, err = net.Listen("tcp", proxyAddr.String()); return err })
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dst, err := mitm.OriginalDst(c)
			if err != nil {
				io.WriteString(c, "proxy error "+err.Error())
			} else {
				io.WriteString(c, "proxy "+dst.String())
			}
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })

	read := func(addr string) string {
		t.Helper()
		var c net.Conn
		if err := nettest.Do(tp.SandboxPath, func() (err error) { c, err = net.DialTimeout("tcp", addr, 2*time.Second); return err }); err != nil {
			return "dial error: " + err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if got := read(outside.String() + ":443"); got != nettest.Banner {
		t.Fatalf("before AddInterceptClient: %q", got)
	}
	inGW(func() error { return AddInterceptClient(ctx, "gw0", nettest.SandboxIP) })
	inGW(func() error { return AddInterceptClient(ctx, "gw0", nettest.SandboxIP) }) // idempotent
	if got := read(outside.String() + ":443"); got != "proxy "+outside.String()+":443" {
		t.Fatalf("client to :443: %q", got)
	}
	if got := read(outside.String() + ":7000"); got != nettest.Banner {
		t.Fatalf("client to :7000 was redirected: %q", got)
	}
	if got := read(proxyAddr.String()); !strings.HasPrefix(got, "dial error") {
		t.Fatalf("the proxy port answered a direct connection: %q", got)
	}
	inGW(func() error { return RemoveInterceptClient(ctx, "gw0", nettest.SandboxIP) })
	inGW(func() error { return RemoveInterceptClient(ctx, "gw0", nettest.SandboxIP) })
	if got := read(outside.String() + ":443"); got != nettest.Banner {
		t.Fatalf("after RemoveInterceptClient: %q", got)
	}
	inGW(func() error { return RemoveIntercept(ctx, "gw0") })
}
