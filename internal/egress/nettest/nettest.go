//go:build linux

// Package nettest builds throw-away network namespaces for egress tests: a
// "sandbox" netns wired by a veth pair to a "gateway" netns that plays the
// host and every outside server. All addresses exist only inside these
// namespaces, so tests never send packets anywhere else.
//
//	sandbox netns                 gateway netns
//	eth0 10.250.1.2/24  <-veth->  gw0 10.250.1.1/24 (DNS proxy lives here)
//	     fd00:250:1::2/64              fd00:250:1::1/64
//	default via gateway           lo: outside hosts (AddHost)
//
// Everything needs root; callers gate with testutil.RequiresRoot.
package nettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

// Fixed addresses of the topology.
var (
	SandboxIP  = netip.MustParseAddr("10.250.1.2")
	GatewayIP  = netip.MustParseAddr("10.250.1.1")
	SandboxIP6 = netip.MustParseAddr("fd00:250:1::2")
	GatewayIP6 = netip.MustParseAddr("fd00:250:1::1")
)

// Topology is one sandbox/gateway namespace pair.
type Topology struct {
	Sandbox, Gateway         string // netns names
	SandboxPath, GatewayPath string // netns files
}

// New creates the namespaces and links, and removes them at test cleanup.
// Their names come from a test network lease (package testnet), so no
// other test process uses them and a crashed test's namespaces are
// removed by the next lease of the slot.
func New(t testing.TB) *Topology {
	t.Helper()
	n := testnet.New(t)
	tp := &Topology{Sandbox: n.Netns("sb"), Gateway: n.Netns("gw")}
	tp.SandboxPath = filepath.Join("/run/netns", tp.Sandbox)
	tp.GatewayPath = filepath.Join("/run/netns", tp.Gateway)
	for _, ns := range []string{tp.Sandbox, tp.Gateway} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() {
			// Deleting a netns destroys its veth end, and with it the peer.
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	// The veth is created inside the sandbox netns with its peer directly in
	// the gateway netns: no interface ever appears in the host namespace.
	ip(t, "-n", tp.Sandbox, "link", "add", "eth0", "type", "veth", "peer", "name", "gw0", "netns", tp.Gateway)
	for _, c := range [][]string{
		{"-n", tp.Sandbox, "link", "set", "lo", "up"},
		{"-n", tp.Sandbox, "link", "set", "eth0", "up"},
		{"-n", tp.Sandbox, "addr", "add", SandboxIP.String() + "/24", "dev", "eth0"},
		{"-n", tp.Sandbox, "-6", "addr", "add", SandboxIP6.String() + "/64", "dev", "eth0", "nodad"},
		{"-n", tp.Sandbox, "route", "add", "default", "via", GatewayIP.String()},
		{"-n", tp.Sandbox, "-6", "route", "add", "default", "via", GatewayIP6.String()},
		{"-n", tp.Gateway, "link", "set", "lo", "up"},
		{"-n", tp.Gateway, "link", "set", "gw0", "up"},
		{"-n", tp.Gateway, "addr", "add", GatewayIP.String() + "/24", "dev", "gw0"},
		{"-n", tp.Gateway, "-6", "addr", "add", GatewayIP6.String() + "/64", "dev", "gw0", "nodad"},
	} {
		ip(t, c...)
	}
	return tp
}

// AddHost adds an outside address (e.g. 10.250.2.10 or fd00:250:2::10) to
// the gateway netns (as a host address on its loopback, which the gateway
// delivers locally whatever interface a packet arrives on).
func (tp *Topology) AddHost(t testing.TB, addr netip.Addr) {
	t.Helper()
	args := []string{"-n", tp.Gateway}
	if addr.Is6() {
		args = append(args, "-6")
	}
	args = append(args, "addr", "add", netip.PrefixFrom(addr, addr.BitLen()).String(), "dev", "lo")
	if addr.Is6() {
		args = append(args, "nodad")
	}
	ip(t, args...)
}

func ip(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Do runs fn on an OS thread switched into the netns at path. The thread
// is never returned to the scheduler (the goroutine exits locked, so the
// runtime discards it). Sockets fn creates stay in that netns and may be
// used from any goroutine afterwards.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Banner is what ServeTCP sends on every connection.
const Banner = "moat-egress-test\n"

// ServeTCP listens on addr inside the netns at path and answers each
// connection with Banner. It stops at test cleanup.
func ServeTCP(t testing.TB, path, addr string) {
	t.Helper()
	var ln net.Listener
	if err := Do(path, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, Banner)
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
}

// ServeUDP listens on addr inside the netns at path and echoes datagrams.
func ServeUDP(t testing.TB, path, addr string) {
	t.Helper()
	var pc net.PacketConn
	if err := Do(path, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatalf("listen udp %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	})
	t.Cleanup(func() { pc.Close(); wg.Wait() })
}

// DialTCP connects from inside the netns at path to addr and reads the
// banner; a nil error means the connection got through both ways.
func DialTCP(path, addr string, timeout time.Duration) error {
	var c net.Conn
	if err := Do(path, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	}); err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != Banner {
		return fmt.Errorf("unexpected banner %q", b)
	}
	return nil
}

// EchoUDP sends a datagram from inside the netns at path to addr and waits
// for the echo.
func EchoUDP(path, addr string, timeout time.Duration) error {
	var c net.Conn
	if err := Do(path, func() (err error) { c, err = net.Dial("udp", addr); return err }); err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "ping" {
		return fmt.Errorf("unexpected echo %q", buf[:n])
	}
	return nil
}

// ServeDNS runs a DNS server (UDP and TCP) on addr that answers from
// records (FQDN, lowercase → RR strings, e.g. "a.test. 300 IN A 10.250.2.10";
// CNAMEs are always included) and NXDOMAIN otherwise. path "" means the
// test's own namespace, where addr must be loopback. It returns the bound
// address and a counter of queries served, and stops at test cleanup.
func ServeDNS(t testing.TB, path, addr string, records map[string][]string) (string, *atomic.Int64) {
	t.Helper()
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	listen := func() error {
		for range 50 {
			if pc, err = net.ListenPacket("udp", addr); err != nil {
				return err
			}
			if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
				pc.Close()
				// The UDP port the kernel picked (port 0) may be taken
				// for TCP on a busy machine: pick another.
				if _, port, _ := net.SplitHostPort(addr); port == "0" && errors.Is(err, syscall.EADDRINUSE) {
					continue
				}
				return err
			}
			return nil
		}
		return err
	}
	if path == "" {
		err = listen()
	} else {
		err = Do(path, listen)
	}
	if err != nil {
		t.Fatalf("dns listen %s: %v", addr, err)
	}
	var count atomic.Int64
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		count.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		rrs, ok := records[strings.ToLower(q.Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				m.Rcode = dns.RcodeServerFailure
				break
			}
			if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == dns.TypeCNAME {
				m.Answer = append(m.Answer, rr)
			}
		}
		_ = w.WriteMsg(m)
	})
	var wg sync.WaitGroup
	servers := []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}}
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() { _ = srv.ActivateAndServe() })
		<-started
	}
	t.Cleanup(func() {
		for _, srv := range servers {
			_ = srv.Shutdown()
		}
		wg.Wait()
	})
	return pc.LocalAddr().String(), &count
}

// Query sends one DNS question from inside the netns at path to server
// over network ("udp" or "tcp").
func Query(path, network, server, name string, qtype uint16, timeout time.Duration) (*dns.Msg, error) {
	var c net.Conn
	if err := Do(path, func() (err error) { c, err = net.DialTimeout(network, server, timeout); return err }); err != nil {
		return nil, err
	}
	co := &dns.Conn{Conn: c}
	defer co.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

// Addrs returns the A and AAAA addresses of a DNS answer.
func Addrs(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(v.A.To4()); ok {
				out = append(out, a)
			}
		case *dns.AAAA:
			if a, ok := netip.AddrFromSlice(v.AAAA); ok {
				out = append(out, a)
			}
		}
	}
	return out
}
