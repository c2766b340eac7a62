package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/network"
)

// sandboxNet is a backend's sandbox network as the egress stack needs it:
// a host bridge the server firewalls, its addresses, and each sandbox's
// network namespace. The native backend's network.Manager (ociNet) and
// the docker backend implement it, so both get the same host firewall,
// DNS proxy, egress enforcer and Credential Vault proxy.
type sandboxNet interface {
	// Bridge is the host bridge of the sandboxes.
	Bridge() string
	// Subnet and Gateway are its IPv4 range and address.
	Subnet() netip.Prefix
	Gateway() netip.Addr
	// Subnet6 and Gateway6 are its IPv6 range and address (invalid: no
	// IPv6 in sandboxes).
	Subnet6() netip.Prefix
	Gateway6() netip.Addr
	// NetnsPath is the file of sandbox id's network namespace.
	NetnsPath(ctx context.Context, id string) (string, error)
	// IP6 is sandbox id's IPv6 address (invalid if none).
	IP6(ctx context.Context, id string) netip.Addr
}

// ociNet is the native backend's network as a sandboxNet.
type ociNet struct{ *network.Manager }

func (n ociNet) NetnsPath(_ context.Context, id string) (string, error) {
	return n.Manager.NetnsPath(id), nil
}
func (n ociNet) IP6(ctx context.Context, id string) netip.Addr {
	if a, err := n.Manager.Get(ctx, id); err == nil {
		return a.IP6
	}
	return netip.Addr{}
}

// startEgress sets up the egress stack of a sandbox network: the host
// firewall and NAT of its bridge (nft.ApplyHost), the Credential Vault
// proxy on the gateway, and the enforcer with its DNS proxy on
// gateway:53, serving until run ends or stop is called.
func startEgress(ctx, run context.Context, cfg Config, sn sandboxNet, d deps) (_ egressAdapter, stop func() error, err error) {
	gw := sn.Gateway()
	if err := nft.ApplyHost(ctx, nft.HostConfig{Bridge: sn.Bridge(), Subnet: sn.Subnet(), Gateway: gw, Subnet6: sn.Subnet6()}); err != nil {
		return egressAdapter{}, nil, fmt.Errorf("host firewall: %w", err)
	}
	vp, err := startCredentialProxy(ctx, run, cfg, sn, d)
	if err != nil {
		return egressAdapter{}, nil, err
	}
	defer func() {
		if err != nil {
			vp.stop()
		}
	}()
	enf, err := newEnforcer(cfg, sn, d, &egress.HostInterceptor{Proxy: vp.proxy, Bridge: sn.Bridge(),
		Addrs: func(ctx context.Context, id string) []netip.Addr {
			// The IPv6 address, with --subnet6: its connections go
			// through the proxy too.
			if a := sn.IP6(ctx, id); a.IsValid() {
				return []netip.Addr{a}
			}
			return nil
		}})
	if err != nil {
		return egressAdapter{}, nil, err
	}
	dnsCtx, stopDNS := context.WithCancel(run)
	dnsDone := make(chan error, 1)
	pc, ln, err := dnsproxy.Listen(ctx, netip.AddrPortFrom(gw, 53).String())
	if err != nil {
		stopDNS()
		enf.Close()
		return egressAdapter{}, nil, fmt.Errorf("egress DNS proxy on %s:53: %w", gw, err)
	}
	go func() { dnsDone <- enf.Serve(dnsCtx, pc, ln) }()
	var once sync.Once
	var closeErr error
	stop = func() error {
		once.Do(func() {
			stopDNS()
			<-dnsDone
			vp.stop()
			closeErr = enf.Close()
		})
		return closeErr
	}
	return egressAdapter{enf: enf, netm: sn, audit: d.audit}, stop, nil
}

func newEnforcer(cfg Config, netm sandboxNet, d deps, icpt egress.Interceptor) (*egress.Enforcer, error) {
	ups, err := cfg.DNSUpstreams, error(nil)
	if len(ups) == 0 {
		ups, err = dnsproxy.UpstreamsFromResolvConf("/etc/resolv.conf")
	}
	if err != nil || len(ups) == 0 {
		// No host resolver: names resolve to nothing, IP rules still work.
		d.log.Warn("no upstream DNS resolvers in /etc/resolv.conf; sandbox DNS will fail", "err", err)
		ups = []string{"127.0.0.1:53"}
	}
	blocked := []netip.Prefix{netm.Subnet(), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("::1/128")}
	if s6 := netm.Subnet6(); s6.IsValid() {
		blocked = append(blocked, s6)
	}
	blocked = append(blocked, hostAddrs()...)
	return egress.New(egress.Config{
		DNS:         netip.AddrPortFrom(netm.Gateway(), 53),
		Upstreams:   ups,
		Blocked:     blocked,
		Logger:      d.log,
		Unattached:  netm.Subnet(),
		Interceptor: icpt,
		OnDecision:  d.audit.decision,
	})
}

// credentialProxy is the Credential Vault's proxy of the native backend:
// listening on the bridge gateway (a free port), fed by the intercept
// table of the bridge.
type credentialProxy struct {
	proxy *mitm.Proxy
	stop  func()
}

// startCredentialProxy binds the proxy on the gateway (and the IPv6
// gateway with --subnet6), installs the bridge's intercept table pointing
// at it (empty: sandboxes are added as they attach, or re-attach after a
// restart) and serves until run ends or stop is called.
func startCredentialProxy(ctx, run context.Context, cfg Config, netm sandboxNet, d deps) (_ credentialProxy, err error) {
	roots, err := cfg.vaultRoots()
	if err != nil {
		return credentialProxy{}, err
	}
	p := mitm.New(mitm.Config{Logger: d.log, RootCAs: roots, OnInjected: d.audit.injected})
	var lns []net.Listener
	defer func() {
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
		}
	}()
	icfg := nft.InterceptConfig{Bridge: netm.Bridge()}
	for _, gw := range []netip.Addr{netm.Gateway(), netm.Gateway6()} {
		if !gw.IsValid() {
			continue
		}
		ln, err := listenFreePort(ctx, gw)
		if err != nil {
			return credentialProxy{}, fmt.Errorf("credential proxy on %s: %w", gw, err)
		}
		lns = append(lns, ln)
		ap := ln.Addr().(*net.TCPAddr).AddrPort()
		if gw.Is4() {
			icfg.Proxy = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		} else {
			icfg.Proxy6 = ap
		}
	}
	if err := nft.ApplyIntercept(ctx, icfg); err != nil {
		return credentialProxy{}, fmt.Errorf("credential proxy: %w", err)
	}
	sctx, cancel := context.WithCancel(run)
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Go(func() {
			if err := p.Serve(sctx, ln); err != nil {
				d.log.Error("credential proxy stopped", "addr", ln.Addr(), "err", err)
			}
		})
	}
	var once sync.Once
	return credentialProxy{proxy: p, stop: func() { once.Do(func() { cancel(); wg.Wait() }) }}, nil
}

// listenFreePort listens on a free TCP port of addr. An IPv6 gateway
// address may still be in duplicate address detection right after the
// bridge came up; that is retried for a few seconds.
func listenFreePort(ctx context.Context, addr netip.Addr) (net.Listener, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", netip.AddrPortFrom(addr, 0).String())
		if err == nil || time.Now().After(deadline) || !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return ln, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hostAddrs are the host's own addresses, unreachable from any sandbox
// with a network policy.
func hostAddrs() []netip.Prefix {
	var out []netip.Prefix
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// egressAdapter locates each sandbox's network namespace for the enforcer.
type egressAdapter struct {
	enf   *egress.Enforcer
	netm  sandboxNet
	audit *auditHooks
}

func (a egressAdapter) Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error {
	path, err := a.netm.NetnsPath(ctx, id)
	if err != nil {
		return err
	}
	return a.enf.Attach(ctx, id, path, ip, p)
}
func (a egressAdapter) Detach(ctx context.Context, id string) error { return a.enf.Detach(ctx, id) }
func (a egressAdapter) Get(id string) (policy.NetworkPolicy, error) { return a.enf.Get(id) }
func (a egressAdapter) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	return a.enf.Modify(ctx, id, fn)
}

// AttachProxy implements credvault.CredentialProxy.
func (a egressAdapter) AttachProxy(ctx context.Context, id string, ca *mitm.CA, state *vault.State, withheld func(context.Context, mitm.Withheld)) error {
	return a.enf.AttachProxy(ctx, id, ca, state.Compile(), a.audit.withheld(id, withheld))
}

// SetProxyRules implements credvault.CredentialProxy.
func (a egressAdapter) SetProxyRules(_ context.Context, id string, _ *mitm.CA, state *vault.State) error {
	return a.enf.SetProxyRules(id, state.Compile())
}
