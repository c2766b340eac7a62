//go:build linux

// Package egress enforces OpenSandbox network policies ("dns+nft" mode)
// for every sandbox of a host.
//
// Design: one process-wide DNS proxy (package dnsproxy) listens on the
// bridge gateway (e.g. 10.88.0.1:53) and identifies each sandbox by the
// source IP of its queries; every sandbox gets an nftables table in its own
// network namespace (package nft) that only lets DNS reach that proxy and
// only lets traffic reach addresses the policy allows statically (IP/CIDR
// rules) or that the proxy has just resolved for an allowed name. One
// listener for all sandboxes keeps density high: no per-sandbox process,
// socket or port.
//
// Consistency: a sandbox's policy changes and its resolved-address
// insertions are serialized by a per-sandbox lock, and the proxy re-checks
// each resolved name against the current policy under that lock before the
// firewall opens its addresses. An Update replaces the whole nftables
// table atomically, re-installing only the remembered resolutions that the
// new policy still allows, so flipping a name to deny closes its addresses
// at once (established connections survive, as in OpenSandbox).
//
// Enforcement survives the moat server: Close releases resources but keeps
// every sandbox's ruleset (fail closed), and a restarted server re-Attaches.
//
// Credential Vault (intercept.go): AttachProxy puts an attached sandbox's
// HTTP(S) through the credential proxy (package mitm) via the configured
// Interceptor. The proxy injects a credential only towards an address the
// sandbox resolved for the bound host through this enforcer's DNS proxy.
package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Config configures an Enforcer.
type Config struct {
	// DNS is the address the shared DNS proxy listens on and the only
	// resolver sandboxes may reach, normally the bridge gateway port 53
	// (10.88.0.1:53). Sandboxes' resolv.conf must point at its address.
	DNS netip.AddrPort
	// Upstreams are the resolvers allowed names are forwarded to
	// ("host:port"). Required.
	Upstreams []string
	// Blocked ranges are unreachable from every sandbox whatever the
	// policy or DNS says (e.g. the bridge subnet, 169.254.0.0/16, host
	// addresses); the DNS address stays reachable. Without it an allowed
	// domain resolving to a host address would open the host.
	Blocked []netip.Prefix
	// Timeout, MinTTL and MaxTTL configure the proxy (dnsproxy.Config).
	Timeout, MinTTL, MaxTTL time.Duration
	// MaxNames bounds the resolved names remembered per sandbox for
	// re-installation on policy updates. Default 4096.
	MaxNames int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Unattached is the address range of sandboxes that may use the DNS
	// proxy without being attached (no network policy: allow all names).
	// Unset means such queries are refused.
	Unattached netip.Prefix
	// Interceptor sends Credential Vault sandboxes' HTTP(S) through the
	// credential proxy (AttachProxy). Nil: the vault is unsupported.
	Interceptor Interceptor
	// OnDecision, if set, is told of the egress decisions of attached
	// sandboxes (every DNS query's verdict). It must not block; callers
	// aggregate (the audit trail does).
	OnDecision func(Decision)
	// Mark, if not 0, is for an enforcer that runs inside the network
	// namespace it filters (the Kubernetes egress sidecar): its upstream
	// DNS sockets carry this mark, which the ruleset lets through. Only a
	// holder of CAP_NET_ADMIN or CAP_NET_RAW can mark a socket.
	Mark uint32
	// LocalProxy is nft.Config.LocalProxy (the egress sidecar's credential
	// proxy port on loopback; 0: none).
	LocalProxy uint16
}

// Decision is one egress verdict for a sandbox.
type Decision struct {
	SandboxID string
	Host      string
	Port      int // 0: a name lookup
	Allowed   bool
	// Rule is the target of the policy rule that decided, or "default".
	Rule string
	// Layer is where it was decided: "dns".
	Layer string
}

// Enforcer applies network policies to sandboxes. It is safe for
// concurrent use.
type Enforcer struct {
	cfg   Config
	log   *slog.Logger
	proxy *dnsproxy.Server

	mu        sync.Mutex
	sandboxes map[string]*sandbox
}

// sandbox is one attached sandbox.
type sandbox struct {
	id     string
	ip     netip.Addr
	fw     *nft.Firewall
	client *dnsproxy.Client

	// mu serializes policy changes, firewall updates and the DNS hook.
	mu       sync.Mutex
	matcher  *policy.Matcher
	names    map[string]resolvedName
	detached bool
	// proxy is the sandbox's credential proxy client (AttachProxy), if any.
	proxy *mitm.Client
}

type resolvedName struct {
	ips     []netip.Addr
	expires time.Time
}

// New validates cfg and returns an Enforcer; call Serve to run its DNS proxy.
func New(cfg Config) (*Enforcer, error) {
	if !cfg.DNS.IsValid() || cfg.DNS.Port() == 0 {
		return nil, fmt.Errorf("egress: DNS listen address required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.MaxNames <= 0 {
		cfg.MaxNames = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dcfg := dnsproxy.Config{
		Upstreams: cfg.Upstreams, Timeout: cfg.Timeout, MinTTL: cfg.MinTTL, MaxTTL: cfg.MaxTTL, Logger: cfg.Logger,
	}
	if fn := cfg.OnDecision; fn != nil {
		dcfg.OnDecision = func(c *dnsproxy.Client, name string, allowed bool, rule string) {
			fn(Decision{SandboxID: c.ID, Host: name, Allowed: allowed, Rule: rule, Layer: "dns"})
		}
	}
	if cfg.Mark != 0 {
		dcfg.Dialer = &net.Dialer{Timeout: cfg.Timeout, Control: markControl(cfg.Mark)}
	}
	if cfg.Unattached.IsValid() {
		m, err := policy.Compile(policy.AllowAll())
		if err != nil {
			return nil, err
		}
		dcfg.Fallback, dcfg.FallbackPrefix = dnsproxy.NewClient(m, nil), cfg.Unattached
	}
	proxy, err := dnsproxy.New(dcfg)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return &Enforcer{cfg: cfg, log: cfg.Logger, proxy: proxy, sandboxes: map[string]*sandbox{}}, nil
}

// ListenAndServe binds Config.DNS (UDP and TCP) and serves DNS until ctx is
// done. The address must exist (the bridge is up).
func (e *Enforcer) ListenAndServe(ctx context.Context) error {
	pc, ln, err := dnsproxy.Listen(ctx, e.cfg.DNS.String())
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return e.Serve(ctx, pc, ln)
}

// Serve serves DNS on listeners the caller bound (e.g. inside another
// namespace) until ctx is done. See dnsproxy.Server.Serve.
func (e *Enforcer) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener) error {
	return e.proxy.Serve(ctx, pc, ln)
}

// Attach starts enforcing p for sandbox id, whose network namespace is at
// netnsPath and whose DNS queries come from sandboxIP. It replaces any
// ruleset left in the namespace by an earlier server. On error nothing
// stays installed.
func (e *Enforcer) Attach(ctx context.Context, id, netnsPath string, sandboxIP netip.Addr, p policy.NetworkPolicy) (err error) {
	if id == "" || !sandboxIP.IsValid() {
		return fmt.Errorf("egress: attach needs a sandbox id and IP: %w", errdefs.ErrInvalidArgument)
	}
	m, err := policy.Compile(p)
	if err != nil {
		return err
	}
	e.mu.Lock()
	if _, ok := e.sandboxes[id]; ok {
		e.mu.Unlock()
		return fmt.Errorf("egress: sandbox %q: %w", id, errdefs.ErrAlreadyExists)
	}
	sb := &sandbox{id: id, ip: sandboxIP.Unmap(), matcher: m, names: map[string]resolvedName{}}
	e.sandboxes[id] = sb // reserve the id; Attach of the same id fails meanwhile
	e.mu.Unlock()
	defer func() {
		if err != nil {
			e.mu.Lock()
			delete(e.sandboxes, id)
			e.mu.Unlock()
		}
	}()

	fw, err := nft.Open(netnsPath)
	if err != nil {
		return fmt.Errorf("egress: sandbox %q: %w", id, err)
	}
	if err := fw.Apply(ctx, e.nftConfig(m, nil)); err != nil {
		fw.Close()
		return fmt.Errorf("egress: sandbox %q: %w", id, err)
	}
	sb.fw = fw
	sb.client = dnsproxy.NewClient(m, sb.onResolved(e))
	sb.client.ID = id
	if err := e.proxy.Register(sb.ip, sb.client); err != nil {
		rmErr := fw.Remove(context.WithoutCancel(ctx))
		fw.Close()
		return errors.Join(fmt.Errorf("egress: sandbox %q: %w", id, err), rmErr)
	}
	return nil
}

// Get returns the policy in force for sandbox id.
func (e *Enforcer) Get(id string) (policy.NetworkPolicy, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.matcher.Policy(), nil
}

// Update replaces the policy of sandbox id and returns the normalized
// policy now in force.
func (e *Enforcer) Update(ctx context.Context, id string, p policy.NetworkPolicy) (policy.NetworkPolicy, error) {
	return e.Modify(ctx, id, func(policy.NetworkPolicy) (policy.NetworkPolicy, error) { return p, nil })
}

// Modify atomically replaces the policy of sandbox id with fn(current).
// Nothing changes if fn or the installation fails. This is how PATCH and
// DELETE edit a policy without lost updates.
func (e *Enforcer) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.detached {
		return policy.NetworkPolicy{}, fmt.Errorf("egress: sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	next, err := fn(sb.matcher.Policy())
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	m, err := policy.Compile(next)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	now := time.Now()
	var keep []nft.Resolved
	for name, r := range sb.names {
		if r.expires.Before(now) || m.Evaluate(name) != policy.Allow {
			delete(sb.names, name)
			continue
		}
		keep = append(keep, nft.Resolved{IPs: r.ips, TTL: r.expires.Sub(now)})
	}
	if err := sb.fw.Apply(ctx, e.nftConfig(m, keep)); err != nil {
		return policy.NetworkPolicy{}, fmt.Errorf("egress: sandbox %q: %w", id, err)
	}
	sb.matcher = m
	sb.client.SetPolicy(m)
	return m.Policy(), nil
}

// Detach stops enforcing for sandbox id and removes its ruleset. Call it
// before the namespace is destroyed (the Firewall holds it open until then).
func (e *Enforcer) Detach(ctx context.Context, id string) error {
	e.mu.Lock()
	sb, ok := e.sandboxes[id]
	if ok && sb.fw != nil {
		delete(e.sandboxes, id)
	}
	e.mu.Unlock()
	if !ok || sb.fw == nil {
		return fmt.Errorf("egress: sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	e.proxy.Unregister(sb.ip)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.detached = true
	perr := e.releaseProxyLocked(ctx, sb)
	err := sb.fw.Remove(ctx)
	return errors.Join(perr, err, sb.fw.Close())
}

// Close releases every sandbox's namespace handle but leaves the rulesets
// in place, so sandboxes stay confined while the server is down.
func (e *Enforcer) Close() error {
	e.mu.Lock()
	sbs := e.sandboxes
	e.sandboxes = map[string]*sandbox{}
	e.mu.Unlock()
	var errs []error
	for _, sb := range sbs {
		if sb.fw == nil {
			continue
		}
		e.proxy.Unregister(sb.ip)
		sb.mu.Lock()
		sb.detached = true
		errs = append(errs, sb.fw.Close())
		sb.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (e *Enforcer) lookup(id string) (*sandbox, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sb, ok := e.sandboxes[id]
	if !ok || sb.fw == nil { // fw == nil: Attach still in progress
		return nil, fmt.Errorf("egress: sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (e *Enforcer) nftConfig(m *policy.Matcher, resolved []nft.Resolved) nft.Config {
	return nft.Config{Policy: m, DNS: e.cfg.DNS, Blocked: e.cfg.Blocked, Resolved: resolved, Exempt: e.cfg.Mark, LocalProxy: e.cfg.LocalProxy}
}

// markControl sets SO_MARK on a dialer's sockets.
func markControl(mark uint32) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark)) })
		return errors.Join(err, serr)
	}
}

// onResolved returns the DNS hook of sb: re-check the name under the
// current policy, open the addresses, remember them for later Updates.
func (sb *sandbox) onResolved(e *Enforcer) dnsproxy.ResolvedFunc {
	return func(ctx context.Context, name string, ips []netip.Addr, ttl time.Duration) error {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if sb.detached || sb.matcher.Evaluate(name) != policy.Allow {
			return dnsproxy.ErrDenied
		}
		// Under default allow the chain accepts anyway; only remember.
		if sb.matcher.Default() != policy.Allow {
			if err := sb.fw.AllowResolved(ctx, ips, ttl); err != nil {
				return err
			}
		}
		sb.rememberLocked(name, ips, time.Now().Add(ttl), e.cfg.MaxNames)
		return nil
	}
}

// rememberLocked records a resolution, evicting expired entries and then
// the soonest-expiring one when the cache is full.
func (sb *sandbox) rememberLocked(name string, ips []netip.Addr, expires time.Time, maxNames int) {
	ips = slices.Clone(ips) // the caller's slice is not ours to grow
	if old, ok := sb.names[name]; ok && old.expires.After(time.Now()) {
		// Earlier addresses stay open until their own expiry; keep them.
		expires = later(expires, old.expires)
		for _, ip := range old.ips {
			if !slices.Contains(ips, ip) {
				ips = append(ips, ip)
			}
		}
	}
	if _, ok := sb.names[name]; !ok && len(sb.names) >= maxNames {
		now := time.Now()
		var oldest string
		for n, r := range sb.names {
			if r.expires.Before(now) {
				delete(sb.names, n)
			} else if oldest == "" || r.expires.Before(sb.names[oldest].expires) {
				oldest = n
			}
		}
		if len(sb.names) >= maxNames {
			delete(sb.names, oldest)
		}
	}
	sb.names[name] = resolvedName{ips: ips, expires: expires}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
