// Package credvault is the Credential Vault of sandboxes created with
// credentialProxy: each sandbox's CA, its vault of credentials (the rules
// of internal/egress/vault) and the intercepting proxy the egress backend
// runs with them. It plugs into the lifecycle core (lifecycle.CredentialProxies)
// and serves the egress API's /credential-vault routes. Every read and
// write of a sandbox's vault happens under the sandbox's lock and is
// persisted (sealed) before it is applied; the state needs no lock of
// its own.
package credvault

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// CredentialProxy is implemented by Egress backends that can run the
// Credential Vault's intercepting proxy for a sandbox (discovered by type
// assertion). Detach of the egress policy also ends the proxy.
type CredentialProxy interface {
	// AttachProxy starts intercepting attached sandbox id's HTTP(S) with
	// its CA and the rules of its vault (nil: none yet); withheld is told
	// of credentials the proxy withholds (mitm.Client.OnWithheld). A
	// backend that runs the proxy in-process compiles state (State.Compile);
	// one that runs it elsewhere seals it there.
	AttachProxy(ctx context.Context, id string, ca *mitm.CA, state *vault.State, withheld func(context.Context, mitm.Withheld)) error
	// SetProxyRules replaces the vault of the proxy attached with ca; the
	// next request uses its rules.
	SetProxyRules(ctx context.Context, id string, ca *mitm.CA, state *vault.State) error
}

// credProxy is the in-memory credential proxy of a sandbox (the entry's
// value under credKey).
type credProxy struct {
	ca    *mitm.CA
	state *vault.State // nil until POST /credential-vault
}

// credKey keys a sandbox's *credProxy (lifecycle.Entry.Value).
type credKey struct{}

func credOf(e *lifecycle.Entry) *credProxy {
	cp, _ := e.Value(credKey{}).(*credProxy)
	return cp
}

const codeUnsupported = "SANDBOX::API_NOT_SUPPORTED"

// Proxies is the Credential Vault (lifecycle.CredentialProxies and the
// egress API's vault service).
type Proxies struct {
	core   *lifecycle.Service
	egress lifecycle.Egress
	sealer *vault.Sealer
}

// New returns the Credential Vault of core's sandboxes; egress runs the
// proxies (a CredentialProxy) and sealer seals their state. Without
// either, credentialProxy is refused (501).
func New(core *lifecycle.Service, egress lifecycle.Egress, sealer *vault.Sealer) *Proxies {
	return &Proxies{core: core, egress: egress, sealer: sealer}
}

// Check validates credentialProxy on a create.
func (s *Proxies) Check(req lifecycle.CreateRequest, np *policy.NetworkPolicy, memory bool) error {
	if !req.CredentialProxy {
		return nil
	}
	if np == nil {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "credentialProxy requires networkPolicy (the Credential Vault only binds hosts the policy allows)")
	}
	if _, ok := s.egress.(CredentialProxy); !ok || s.sealer == nil {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, codeUnsupported, "credentialProxy is not supported by this server's runtime")
	}
	if memory {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "credentialProxy cannot be enabled on a sandbox restored from a memory snapshot (its processes already run without the sandbox CA)")
	}
	return nil
}

// Prepare makes sandbox e's CA and its record, unless it has them, and
// returns env with the CA its processes trust. The caller holds e's lock.
func (s *Proxies) Prepare(e *lifecycle.Entry, env map[string]string) (map[string]string, error) {
	cp := credOf(e)
	if cp == nil {
		ca, err := mitm.NewCA(e.ID())
		if err != nil {
			return nil, fmt.Errorf("sandbox CA: %w", err)
		}
		cp = &credProxy{ca: ca}
		rec, err := s.sealCredProxy(e.ID(), cp)
		if err != nil {
			return nil, err
		}
		e.SetValue(credKey{}, cp)
		e.Sandbox().CredentialProxy = rec
	}
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	out[agentproto.TrustCAEnv] = string(cp.ca.CertPEM())
	return out, nil
}

func (s *Proxies) sealCredProxy(id string, cp *credProxy) (*lifecycle.CredentialProxyRecord, error) {
	key, err := cp.ca.KeyDER()
	if err != nil {
		return nil, err
	}
	defer clear(key)
	blob, err := vault.SealState(s.sealer, id, cp.state, key)
	if err != nil {
		return nil, err
	}
	return &lifecycle.CredentialProxyRecord{CACert: cp.ca.CertPEM(), Sealed: blob}, nil
}

// Attach starts sandbox e's proxy with its current rules (a no-op for a
// sandbox without one). The caller holds e's lock.
func (s *Proxies) Attach(ctx context.Context, e *lifecycle.Entry) error {
	c := credOf(e)
	if c == nil {
		return nil
	}
	cp, ok := s.egress.(CredentialProxy)
	if !ok {
		return fmt.Errorf("credential proxy: %w", errdefs.ErrNotImplemented)
	}
	return cp.AttachProxy(ctx, e.ID(), c.ca, c.state, s.withheld(e.ID()))
}

// Events of the Credential Vault, in the sandbox's event ring (scope
// runtime, with lifecycle.Service.RecordEvent).
const (
	// EventCredentialWithheld: a request matched a binding but went
	// without its credential.
	EventCredentialWithheld = "CredentialWithheld"
	// ReasonUnresolvedDestination: its destination was an address the
	// sandbox chose (curl --resolve, /etc/hosts, an IP), not one moat's
	// DNS resolved for the host, and not in the binding's
	// match.trustedCidrs.
	ReasonUnresolvedDestination = "UnresolvedDestination"
)

// withheld records sandbox id's withheld credentials as events (the proxy
// reports each binding and host at most once per mitm.WithheldInterval).
func (s *Proxies) withheld(id string) func(context.Context, mitm.Withheld) {
	return func(ctx context.Context, w mitm.Withheld) {
		msg := fmt.Sprintf("binding %q: no credential injected for %s at %s, an address moat's DNS did not resolve for the host "+
			"(reach the host by name through the sandbox's resolver, or trust the address in the binding's match.trustedCidrs, e.g. %s; "+
			"repeats for this binding and host within %v are not recorded)", w.Binding, w.Host, w.Dst, netip.PrefixFrom(w.Dst, w.Dst.BitLen()), mitm.WithheldInterval)
		// The sandbox may be gone (a request in flight while it is
		// deleted): then there is no one to tell.
		_ = s.core.RecordEvent(ctx, id, lifecycle.Event{Type: EventCredentialWithheld, Scope: lifecycle.ScopeRuntime,
			Reason: ReasonUnresolvedDestination, Message: msg})
	}
}

// Recover reopens a recovered sandbox's sealed CA and vault and restarts
// its proxy. The caller holds e's lock.
func (s *Proxies) Recover(ctx context.Context, e *lifecycle.Entry) error {
	rec := e.Sandbox().CredentialProxy
	if rec == nil || len(rec.Sealed) == 0 {
		return nil
	}
	if s.sealer == nil {
		return fmt.Errorf("credential proxy: no vault key configured: %w", errdefs.ErrFailedPrecondition)
	}
	state, key, err := vault.OpenState(s.sealer, e.ID(), rec.Sealed)
	if err != nil {
		return err
	}
	defer clear(key)
	ca, err := mitm.ParseCA(rec.CACert, key)
	if err != nil {
		return err
	}
	e.SetValue(credKey{}, &credProxy{ca: ca, state: state})
	return s.Attach(ctx, e)
}

// CredentialVaults is the Credential Vault of every sandbox, behind the
// egress API's /credential-vault routes (egress.VaultService).
func (s *Proxies) CredentialVaults() CredentialVaults { return CredentialVaults{s} }

// CredentialVaults implements egress.VaultService over the lifecycle.
type CredentialVaults struct{ s *Proxies }

// locked runs fn with sandbox id's entry locked and its proxy present.
func (v CredentialVaults) locked(ctx context.Context, id string, fn func(e *lifecycle.Entry, c *credProxy) error) error {
	return v.s.core.WithLock(ctx, id, func(e *lifecycle.Entry) error {
		c := credOf(e)
		if c == nil {
			return vault.ErrNotEnabled
		}
		return fn(e, c)
	})
}

// hostCheck is sandbox e's own policy as a vault.HostCheck: a binding's
// host must be named by an explicit allow rule of it. The caller holds e's
// lock.
func (v CredentialVaults) hostCheck(e *lifecycle.Entry) (vault.HostCheck, error) {
	own := e.Sandbox().NetworkPolicy
	if own == nil {
		return func(string) bool { return false }, nil
	}
	m, err := policy.Compile(*own)
	if err != nil {
		return nil, err
	}
	return m.ExplicitlyAllows, nil
}

// inGuardrail checks that every host of next's bindings falls inside the
// egress guardrail of e's tenant (every name it denotes allowed): a
// binding cannot carry a credential towards a host the tenant denies.
func (v CredentialVaults) inGuardrail(e *lifecycle.Entry, next *vault.State) error {
	g := v.s.core.EgressGuardrail(e.Owner())
	if g == nil || next == nil {
		return nil
	}
	m, err := policy.Compile(*g)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(next.Bindings)) {
		for _, h := range next.Bindings[name].Match.Hosts {
			if !m.Covers(h) {
				return errdefs.Invalid(vault.CodeInvalid, fmt.Sprintf(
					"binding %q: host %q is outside the egress guardrail of tenant %s (its policy denies it)", name, h, e.Owner()))
			}
		}
	}
	return nil
}

// commit persists next (nil: no vault) for e and then applies it to the
// proxy. Nothing changes if persisting fails. The caller holds e.mu.
func (v CredentialVaults) commit(ctx context.Context, e *lifecycle.Entry, c *credProxy, next *vault.State) error {
	cp := &credProxy{ca: c.ca, state: next}
	rec, err := v.s.sealCredProxy(e.ID(), cp)
	if err != nil {
		return err
	}
	sb := e.Sandbox()
	prev := sb.CredentialProxy
	sb.CredentialProxy = rec
	if err := e.Persist(); err != nil {
		sb.CredentialProxy = prev
		return err
	}
	e.SetValue(credKey{}, cp)
	return v.s.egress.(CredentialProxy).SetProxyRules(ctx, e.ID(), c.ca, next)
}

// CreateVault creates sandbox id's vault (revision 1).
func (v CredentialVaults) CreateVault(ctx context.Context, id string, req vault.CreateRequest) (out vault.View, err error) {
	err = v.locked(ctx, id, func(e *lifecycle.Entry, c *credProxy) error {
		if c.state != nil {
			return vault.ErrExists
		}
		check, err := v.hostCheck(e)
		if err != nil {
			return err
		}
		next, err := vault.New(req, check)
		if err != nil {
			return err
		}
		if err := v.inGuardrail(e, next); err != nil {
			return err
		}
		if err := v.commit(ctx, e, c, next); err != nil {
			return err
		}
		out = next.View()
		return nil
	})
	return out, err
}

// GetVault returns sandbox id's vault.
func (v CredentialVaults) GetVault(ctx context.Context, id string) (out *vault.State, err error) {
	err = v.locked(ctx, id, func(e *lifecycle.Entry, c *credProxy) error {
		if c.state == nil {
			return vault.ErrNotFound
		}
		out = c.state
		return nil
	})
	return out, err
}

// PatchVault applies a PATCH to sandbox id's vault.
func (v CredentialVaults) PatchVault(ctx context.Context, id string, req vault.PatchRequest) (out vault.View, err error) {
	err = v.locked(ctx, id, func(e *lifecycle.Entry, c *credProxy) error {
		if c.state == nil {
			return vault.ErrNotFound
		}
		check, err := v.hostCheck(e)
		if err != nil {
			return err
		}
		next, err := c.state.Apply(req, check)
		if err != nil {
			return err
		}
		if err := v.inGuardrail(e, next); err != nil {
			return err
		}
		if err := v.commit(ctx, e, c, next); err != nil {
			return err
		}
		out = next.View()
		return nil
	})
	return out, err
}

// DeleteVault removes sandbox id's vault; the proxy stays (the sandbox
// still trusts its CA) and injects nothing.
func (v CredentialVaults) DeleteVault(ctx context.Context, id string) error {
	return v.locked(ctx, id, func(e *lifecycle.Entry, c *credProxy) error {
		if c.state == nil {
			return vault.ErrNotFound
		}
		return v.commit(ctx, e, c, nil)
	})
}
