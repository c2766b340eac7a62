//go:build linux

package egress

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/testutil"
)

const (
	allowedHost = "10.250.2.10" // allowed.test
	deniedHost  = "10.250.2.20" // denied.test
	otherDNS    = "10.250.2.53" // a resolver the sandbox must not use
	cidrHost    = "10.250.3.10" // inside an allowed CIDR
	v6Host      = "fd00:250:2::10"
	v6Other     = "fd00:250:2::20"
)

func TestEnforcerEndToEnd(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tp := nettest.New(t)
	for _, h := range []string{allowedHost, deniedHost, otherDNS, cidrHost, v6Host, v6Other} {
		tp.AddHost(t, netip.MustParseAddr(h))
	}
	for _, h := range []string{allowedHost, deniedHost, cidrHost, v6Host, v6Other} {
		nettest.ServeTCP(t, tp.GatewayPath, net.JoinHostPort(h, "80"))
	}
	// The upstream resolver runs on the test's loopback: only the proxy
	// (host side) talks to it.
	records := map[string][]string{
		"allowed.test.": {"allowed.test. 300 IN A " + allowedHost, "allowed.test. 300 IN AAAA " + v6Host},
		"denied.test.":  {"denied.test. 300 IN A " + deniedHost},
		"www.cdn.test.": {"www.cdn.test. 300 IN A " + deniedHost},
	}
	upAddr, upQueries := nettest.ServeDNS(t, "", "127.0.0.1:0", records)
	// Another resolver, reachable before enforcement, blocked after.
	nettest.ServeDNS(t, tp.GatewayPath, net.JoinHostPort(otherDNS, "53"), records)

	proxyAddr := netip.AddrPortFrom(nettest.GatewayIP, 53)
	e, err := New(Config{DNS: proxyAddr, Upstreams: []string{upAddr}, Timeout: 2 * time.Second,
		Blocked: []netip.Prefix{netip.MustParsePrefix("10.250.1.0/24")},
		Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	var (
		pc net.PacketConn
		ln net.Listener
	)
	if err := nettest.Do(tp.GatewayPath, func() (err error) { pc, ln, err = dnsproxy.Listen(ctx, proxyAddr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.Serve(ctx, pc, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	dial := func(step, host string, want bool) {
		t.Helper()
		wait := 2 * time.Second
		if !want {
			wait = 300 * time.Millisecond
		}
		err := nettest.DialTCP(tp.SandboxPath, net.JoinHostPort(host, "80"), wait)
		if want && err != nil {
			t.Errorf("%s: %s should be reachable: %v", step, host, err)
		} else if !want && err == nil {
			t.Errorf("%s: %s should be blocked", step, host)
		}
	}
	resolve := func(step, network, name string, qtype uint16, wantRcode int, wantAddrs ...string) {
		t.Helper()
		r, err := nettest.Query(tp.SandboxPath, network, proxyAddr.String(), name, qtype, 2*time.Second)
		if err != nil {
			t.Errorf("%s: %s %s via proxy: %v", step, network, name, err)
			return
		}
		var got []string
		for _, a := range nettest.Addrs(r) {
			got = append(got, a.String())
		}
		if r.Rcode != wantRcode || !slices.Equal(got, wantAddrs) {
			t.Errorf("%s: %s %s: rcode %s addrs %v, want %s %v", step, network, name,
				dns.RcodeToString[r.Rcode], got, dns.RcodeToString[wantRcode], wantAddrs)
		}
	}
	otherResolver := func(step string, want bool) {
		t.Helper()
		for _, network := range []string{"udp", "tcp"} {
			wait := 2 * time.Second
			if !want {
				wait = 300 * time.Millisecond
			}
			_, err := nettest.Query(tp.SandboxPath, network, net.JoinHostPort(otherDNS, "53"), "denied.test", dns.TypeA, wait)
			if want && err != nil {
				t.Errorf("%s: %s query to %s should work: %v", step, network, otherDNS, err)
			} else if !want && err == nil {
				t.Errorf("%s: %s query to %s should be blocked", step, network, otherDNS)
			}
		}
	}

	// 0 baseline without enforcement: everything is reachable, so the
	// checks below can fail.
	dial("0 baseline", deniedHost, true)
	dial("0 baseline", v6Other, true)
	otherResolver("0 baseline", true)

	// 1 attach a default-deny policy.
	p := policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{
		{Action: policy.Allow, Target: "allowed.test"},
		{Action: policy.Allow, Target: "10.250.3.0/24"},
		{Action: policy.Allow, Target: "*.cdn.test"},
		{Action: policy.Allow, Target: "10.250.1.1"}, // Blocked wins over the policy
	}}
	start := time.Now()
	if err := e.Attach(ctx, "sb1", tp.SandboxPath, nettest.SandboxIP, p); err != nil {
		t.Fatal(err)
	}
	t.Logf("Attach: %v", time.Since(start))
	if err := e.Attach(ctx, "sb1", tp.SandboxPath, nettest.SandboxIP, p); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Attach: %v", err)
	}

	dial("1 before resolving", allowedHost, false) // not resolved yet: not open
	resolve("1", "udp", "allowed.test", dns.TypeA, dns.RcodeSuccess, allowedHost)
	dial("1 allowed domain", allowedHost, true)
	resolve("1", "tcp", "allowed.test", dns.TypeAAAA, dns.RcodeSuccess, v6Host)
	dial("1 allowed domain v6", v6Host, true)
	q := upQueries.Load()
	resolve("1", "udp", "denied.test", dns.TypeA, dns.RcodeNameError)
	resolve("1", "tcp", "denied.test", dns.TypeA, dns.RcodeNameError)
	if upQueries.Load() != q {
		t.Error("1: denied names reached the upstream")
	}
	dial("1 direct IP", deniedHost, false)
	dial("1 direct IPv6", v6Other, false)
	dial("1 allowed CIDR", cidrHost, true)
	otherResolver("1", false)
	if err := nettest.DialTCP(tp.SandboxPath, "10.250.1.1:80", 300*time.Millisecond); err == nil {
		t.Error("1: gateway reachable despite Blocked")
	}

	// 2 live update through the HTTP API: allowed.test flips to deny (its
	// open address closes at once), denied.test to allow.
	api := httptest.NewServer(NewHandler(e, "sb1", HandlerOptions{Token: "tok"}))
	defer api.Close()
	call := func(method, body string) string {
		t.Helper()
		req, _ := http.NewRequest(method, api.URL+"/policy", strings.NewReader(body))
		req.Header.Set(AuthHeader, "tok")
		resp, err := api.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s /policy: %d %s", method, resp.StatusCode, b)
		}
		return string(b)
	}
	start = time.Now()
	call("PATCH", `[{"action":"deny","target":"allowed.test"},{"action":"allow","target":"denied.test"}]`)
	t.Logf("PATCH (live update): %v", time.Since(start))
	dial("2 after flip", allowedHost, false)
	dial("2 after flip v6", v6Host, false)
	resolve("2", "udp", "allowed.test", dns.TypeA, dns.RcodeNameError)
	resolve("2", "udp", "denied.test", dns.TypeA, dns.RcodeSuccess, deniedHost)
	dial("2 newly allowed", deniedHost, true)
	dial("2 CIDR kept", cidrHost, true)

	// 3 an update that keeps a name allowed keeps its address open without
	// a new lookup; removing the rule closes it.
	call("DELETE", `["10.250.3.0/24"]`)
	dial("3 kept resolution", deniedHost, true)
	dial("3 removed CIDR", cidrHost, false)
	if got := call("GET", ""); !strings.Contains(got, `"enforcementMode":"dns+nft"`) || strings.Contains(got, "10.250.3.0/24") {
		t.Errorf("GET = %s", got)
	}
	call("PUT", `{"defaultAction":"deny"}`)
	dial("3 deny-all", deniedHost, false)
	resolve("3", "udp", "denied.test", dns.TypeA, dns.RcodeNameError)

	// 4 default allow: direct traffic flows, denied names still NXDOMAIN,
	// and other resolvers stay blocked.
	if _, err := e.Update(ctx, "sb1", policy.NetworkPolicy{DefaultAction: policy.Allow,
		Egress: []policy.Rule{{Action: policy.Deny, Target: "denied.test"}, {Action: policy.Deny, Target: v6Other}}}); err != nil {
		t.Fatal(err)
	}
	dial("4 allow-all", deniedHost, true)
	dial("4 denied IPv6 rule", v6Other, false)
	resolve("4", "udp", "denied.test", dns.TypeA, dns.RcodeNameError)
	resolve("4", "udp", "www.cdn.test", dns.TypeA, dns.RcodeSuccess, deniedHost)
	otherResolver("4", false)
	if _, err := e.Update(ctx, "sb1", policy.NetworkPolicy{Egress: []policy.Rule{{Action: "bogus", Target: "x.test"}}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("invalid Update: %v", err)
	}
	if got, _ := e.Get("sb1"); got.DefaultAction != policy.Allow {
		t.Errorf("failed Update changed the policy: %+v", got)
	}

	// 5 detach removes everything.
	if err := e.Detach(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", tp.Sandbox, "nft", "list", "tables").CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("tables left after Detach: %q %v", out, err)
	}
	dial("5 detached", v6Other, true)
	otherResolver("5", true)
	resolve("5", "udp", "allowed.test", dns.TypeA, dns.RcodeRefused)
	if err := e.Detach(ctx, "sb1"); !errdefs.IsNotFound(err) {
		t.Errorf("second Detach: %v", err)
	}
	if _, err := e.Get("sb1"); !errdefs.IsNotFound(err) {
		t.Errorf("Get after Detach: %v", err)
	}
}

// TestEnforcerConcurrentFlips races DNS lookups against policy flips and
// checks the invariant the per-sandbox lock provides: once an Update that
// denies a name returns, its addresses are closed, whatever lookups were
// in flight.
func TestEnforcerConcurrentFlips(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tp := nettest.New(t)
	tp.AddHost(t, netip.MustParseAddr(allowedHost))
	nettest.ServeTCP(t, tp.GatewayPath, net.JoinHostPort(allowedHost, "80"))
	upAddr, _ := nettest.ServeDNS(t, "", "127.0.0.1:0", map[string][]string{
		"allowed.test.": {"allowed.test. 300 IN A " + allowedHost},
	})
	proxyAddr := netip.AddrPortFrom(nettest.GatewayIP, 53)
	e, err := New(Config{DNS: proxyAddr, Upstreams: []string{upAddr}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var (
		pc net.PacketConn
		ln net.Listener
	)
	if err := nettest.Do(tp.GatewayPath, func() (err error) { pc, ln, err = dnsproxy.Listen(ctx, proxyAddr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.Serve(ctx, pc, ln) }()
	defer func() { cancel(); <-served }()

	allow := policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{{Action: policy.Allow, Target: "allowed.test"}}}
	deny := policy.DenyAll()
	if err := e.Attach(ctx, "sb", tp.SandboxPath, nettest.SandboxIP, allow); err != nil {
		t.Fatal(err)
	}
	defer e.Detach(context.Background(), "sb")

	stop := make(chan struct{})
	done := make(chan struct{})
	var lookups int
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = nettest.Query(tp.SandboxPath, "udp", proxyAddr.String(), "allowed.test", dns.TypeA, time.Second)
			lookups++
		}
	}()
	var worst time.Duration
	for i := range 40 {
		p := allow
		if i%2 == 1 {
			p = deny
		}
		start := time.Now()
		if _, err := e.Update(ctx, "sb", p); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, time.Since(start))
		time.Sleep(5 * time.Millisecond)
	}
	// The loop ended on deny; let in-flight lookups finish, then check.
	close(stop)
	<-done
	t.Logf("%d lookups during 40 updates; slowest update %v", lookups, worst)
	if err := nettest.DialTCP(tp.SandboxPath, net.JoinHostPort(allowedHost, "80"), 300*time.Millisecond); err == nil {
		t.Fatal("address of a denied name is open after the final Update")
	}
}
