//go:build linux

package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Interceptor sends a sandbox's outbound HTTP(S) through the credential
// proxy (Credential Vault). It is how the enforcer stays independent of
// where sandboxes live: the native backend redirects on its bridge
// (HostInterceptor); another backend (Docker) supplies its own.
type Interceptor interface {
	// Intercept starts sending new connections of sandbox id (attached
	// with address ip) to ports 80 and 443 through the proxy, served as
	// client c.
	Intercept(ctx context.Context, id string, ip netip.Addr, c *mitm.Client) error
	// Release stops it (idempotent).
	Release(ctx context.Context, id string) error
}

// HostInterceptor redirects on the host with the intercept table of a
// bridge (nft.ApplyIntercept, installed by the caller) to Proxy. It is
// safe for concurrent use.
type HostInterceptor struct {
	Proxy  *mitm.Proxy
	Bridge string
	// Addrs returns the addresses of sandbox id besides the one it was
	// attached with (its IPv6 address with --subnet6); nil: none.
	Addrs func(ctx context.Context, id string) []netip.Addr

	mu    sync.Mutex
	addrs map[string][]netip.Addr // by sandbox: what Intercept added
}

// Intercept implements Interceptor.
func (h *HostInterceptor) Intercept(ctx context.Context, id string, ip netip.Addr, c *mitm.Client) (err error) {
	addrs := []netip.Addr{ip}
	if h.Addrs != nil {
		addrs = append(addrs, h.Addrs(ctx, id)...)
	}
	var done []netip.Addr
	defer func() {
		if err != nil {
			h.release(ctx, done)
		}
	}()
	for _, a := range addrs {
		if err := h.Proxy.Register(a, c); err != nil {
			return err
		}
		done = append(done, a)
		if err := nft.AddInterceptClient(ctx, h.Bridge, a); err != nil {
			return err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.addrs == nil {
		h.addrs = map[string][]netip.Addr{}
	}
	h.addrs[id] = addrs
	return nil
}

// Release implements Interceptor.
func (h *HostInterceptor) Release(ctx context.Context, id string) error {
	h.mu.Lock()
	addrs := h.addrs[id]
	delete(h.addrs, id)
	h.mu.Unlock()
	return h.release(ctx, addrs)
}

func (h *HostInterceptor) release(ctx context.Context, addrs []netip.Addr) error {
	var errs []error
	for _, a := range addrs {
		errs = append(errs, nft.RemoveInterceptClient(ctx, h.Bridge, a))
		h.Proxy.Unregister(a)
	}
	return errors.Join(errs...)
}

// AttachProxy starts the credential proxy for attached sandbox id: its
// HTTP(S) goes through the Interceptor, TLS to bound hosts is terminated
// with ca, and rules (nil: none yet) say what to inject. Credentials are
// injected only towards addresses the sandbox resolved for the host
// through the DNS proxy, which the enforcer records, or that the binding
// trusts; withheld (nil: none) is told of the others
// (mitm.Client.OnWithheld).
func (e *Enforcer) AttachProxy(ctx context.Context, id string, ca *mitm.CA, rules *vault.Rules, withheld func(context.Context, mitm.Withheld)) error {
	if e.cfg.Interceptor == nil {
		return fmt.Errorf("egress: this server cannot intercept sandbox traffic (no credential proxy): %w", errdefs.ErrNotImplemented)
	}
	sb, err := e.lookup(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.detached {
		return fmt.Errorf("egress: sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if sb.proxy != nil {
		sb.proxy.SetRules(rules)
		sb.proxy.OnWithheld(withheld)
		return nil
	}
	c := mitm.NewClient(id, ca, sb.resolvedTo)
	c.SetRules(rules)
	c.OnWithheld(withheld)
	if err := e.cfg.Interceptor.Intercept(ctx, sb.id, sb.ip, c); err != nil {
		return fmt.Errorf("egress: sandbox %q: credential proxy: %w", id, err)
	}
	sb.proxy = c
	return nil
}

// SetProxyRules replaces the injection rules of sandbox id; the next
// request of every connection uses them.
func (e *Enforcer) SetProxyRules(id string, rules *vault.Rules) error {
	sb, err := e.lookup(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.detached || sb.proxy == nil {
		return fmt.Errorf("egress: sandbox %q has no credential proxy: %w", id, errdefs.ErrNotFound)
	}
	sb.proxy.SetRules(rules)
	return nil
}

// releaseProxyLocked undoes AttachProxy. Preconditions: sb.mu is held.
func (e *Enforcer) releaseProxyLocked(ctx context.Context, sb *sandbox) error {
	if sb.proxy == nil {
		return nil
	}
	sb.proxy = nil
	return e.cfg.Interceptor.Release(ctx, sb.id)
}

// resolvedTo reports whether the sandbox's DNS lookups of host returned
// ip (recently enough to be remembered).
func (sb *sandbox) resolvedTo(host string, ip netip.Addr) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	r, ok := sb.names[policy.NormalizeName(host)]
	return ok && slices.Contains(r.ips, ip.Unmap())
}
