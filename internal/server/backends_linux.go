package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/oci"
)

func addPlatformBackends(m map[string]factory) {
	m["oci"] = newOCI
}

func platformClasses() []string { return oci.KnownClasses() }

// newOCI builds the native backend: the sandbox network (bridge, host
// firewall and NAT), the shared egress DNS proxy on the bridge gateway, and
// the OCI runtime whose sandboxes use that proxy as their resolver.
func newOCI(ctx, run context.Context, cfg Config, d deps) (_ backend, err error) {
	agent, err := cfg.agentBinary()
	if err != nil {
		return backend{}, err
	}
	subnet, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil {
		return backend{}, err
	}
	var subnet6 netip.Prefix
	if cfg.Subnet6 != "" {
		if subnet6, err = netip.ParsePrefix(cfg.Subnet6); err != nil {
			return backend{}, err
		}
	}
	netm, err := network.Open(ctx, network.Config{Bridge: cfg.Bridge, Subnet: subnet, Subnet6: subnet6,
		StateDir: filepath.Join(cfg.Root, "oci", "network"), NetnsDir: filepath.Join(cfg.RunRoot, "netns")}, d.log)
	if err != nil {
		return backend{}, fmt.Errorf("network: %w", err)
	}
	gw := netm.Gateway()
	if err := nft.ApplyHost(ctx, nft.HostConfig{Bridge: netm.Bridge(), Subnet: netm.Subnet(), Gateway: gw, Subnet6: netm.Subnet6()}); err != nil {
		return backend{}, fmt.Errorf("host firewall: %w", err)
	}
	vp, err := startCredentialProxy(ctx, run, cfg, netm, d)
	if err != nil {
		return backend{}, err
	}
	defer func() {
		if err != nil {
			vp.stop()
		}
	}()
	enf, err := newEnforcer(cfg, netm, d, &egress.HostInterceptor{Proxy: vp.proxy, Bridge: netm.Bridge(),
		Addrs: func(ctx context.Context, id string) []netip.Addr {
			// The IPv6 address, with --subnet6: its connections go
			// through the proxy too.
			if a, err := netm.Get(ctx, id); err == nil && a.IP6.IsValid() {
				return []netip.Addr{a.IP6}
			}
			return nil
		}})
	if err != nil {
		return backend{}, err
	}
	dnsCtx, stopDNS := context.WithCancel(run)
	dnsDone := make(chan error, 1)
	pc, ln, err := dnsproxy.Listen(ctx, netip.AddrPortFrom(gw, 53).String())
	if err != nil {
		stopDNS()
		return backend{}, fmt.Errorf("egress DNS proxy on %s:53: %w", gw, err)
	}
	go func() { dnsDone <- enf.Serve(dnsCtx, pc, ln) }()
	defer func() {
		if err != nil {
			stopDNS()
			<-dnsDone
		}
	}()
	imgs := newOCIImages(d.images)
	disk, err := cfg.diskQuotaBytes()
	if err != nil {
		imgs.Close()
		return backend{}, err
	}
	volSize, err := cfg.volumeSizeBytes()
	if err != nil {
		imgs.Close()
		return backend{}, err
	}
	rt, err := oci.New(ctx, oci.Config{
		VolumeDefaultSize: volSize,
		Root:              filepath.Join(cfg.Root, "oci"),
		RunRoot:           cfg.RunRoot,
		DefaultClass:      cfg.RuntimeClass,
		AgentPath:         agent,
		DNSServers:        []string{gw.String()},
		Resources:         runtime.Resources{DiskBytes: disk},
		CgroupParent:      cfg.CgroupParent,
		// Sandbox inits are reparented to the server when runc exits; it
		// reaps them (PID 1 of a container host may not).
		Subreaper: true,
	}, oci.Deps{Images: imgs, Network: netm, Logger: d.log})
	if err != nil {
		imgs.Close()
		return backend{}, err
	}
	closeAll := func() error {
		stopDNS()
		<-dnsDone
		vp.stop()
		err := errors.Join(enf.Close(), rt.Close())
		imgs.Close()
		return err
	}
	return backend{rt: rt, egress: egressAdapter{enf: enf, netm: netm}, committer: imageCommitter{d.images}, close: closeAll}, nil
}

func newEnforcer(cfg Config, netm *network.Manager, d deps, icpt egress.Interceptor) (*egress.Enforcer, error) {
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
func startCredentialProxy(ctx, run context.Context, cfg Config, netm *network.Manager, d deps) (_ credentialProxy, err error) {
	roots, err := cfg.vaultRoots()
	if err != nil {
		return credentialProxy{}, err
	}
	p := mitm.New(mitm.Config{Logger: d.log, RootCAs: roots})
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
	enf  *egress.Enforcer
	netm *network.Manager
}

func (a egressAdapter) Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error {
	return a.enf.Attach(ctx, id, a.netm.NetnsPath(id), ip, p)
}
func (a egressAdapter) Detach(ctx context.Context, id string) error { return a.enf.Detach(ctx, id) }
func (a egressAdapter) Get(id string) (policy.NetworkPolicy, error) { return a.enf.Get(id) }
func (a egressAdapter) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	return a.enf.Modify(ctx, id, fn)
}

// AttachProxy implements lifecycle.CredentialProxy.
func (a egressAdapter) AttachProxy(ctx context.Context, id string, ca *mitm.CA, rules *vault.Rules) error {
	return a.enf.AttachProxy(ctx, id, ca, rules)
}

// SetProxyRules implements lifecycle.CredentialProxy.
func (a egressAdapter) SetProxyRules(id string, rules *vault.Rules) error {
	return a.enf.SetProxyRules(id, rules)
}

// ociImages adapts the image store to what the OCI backend needs. It holds
// a lease on the layers of every sandbox (taken at create, again when a
// restarted server re-adopts the sandbox, dropped at delete), so no GC in
// any process (`moat image rm` and `prune` from the CLI, the server's
// disk-budget GC) collects layers under a sandbox, and the layers of an
// image go when its last sandbox does.
type ociImages struct {
	st *image.Store

	mu     sync.Mutex
	leases map[string]*image.Lease // by sandbox ID
}

func newOCIImages(st *image.Store) *ociImages {
	return &ociImages{st: st, leases: map[string]*image.Lease{}}
}

func (a *ociImages) Rootfs(ctx context.Context, id, ref string) (oci.Rootfs, error) {
	l, err := a.st.Acquire(ctx, ref)
	if err != nil {
		return oci.Rootfs{}, err
	}
	a.hold(id, l)
	return oci.Rootfs{Layers: l.Layers, Config: l.Image.Config}, nil
}

func (a *ociImages) Pin(id string, layers []string) error {
	l, err := a.st.LeaseLayers(layers)
	if err != nil {
		return err
	}
	a.hold(id, l)
	return nil
}

func (a *ociImages) hold(id string, l *image.Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old := a.leases[id]; old != nil {
		old.Release()
	}
	a.leases[id] = l
}

func (a *ociImages) Unpin(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.leases[id]; l != nil {
		l.Release()
		delete(a.leases, id)
	}
}

// Close releases every lease.
func (a *ociImages) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, l := range a.leases {
		l.Release()
		delete(a.leases, id)
	}
}

// imageCommitter stores snapshots in the image store as one layer on top
// of the sandbox's image.
type imageCommitter struct{ st *image.Store }

func (c imageCommitter) Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error) {
	base, err := c.st.Get(ctx, baseRef)
	if err != nil {
		return image.Image{}, fmt.Errorf("snapshot base image %s: %w", baseRef, err)
	}
	return c.st.CommitLayer(ctx, upperDir, base, name)
}

func (c imageCommitter) Remove(ctx context.Context, ref string) error { return c.st.Remove(ctx, ref) }
