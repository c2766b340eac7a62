package lifecycle

import (
	"context"
	"fmt"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// This file is the Credential Vault's state access: every read and write
// of a sandbox's vault goes through CredentialVaults, under the sandbox's
// entry lock, and is persisted (sealed) before it is applied.

// CredentialProxy is implemented by Egress backends that can run the
// Credential Vault's intercepting proxy for a sandbox (discovered by type
// assertion). Detach of the egress policy also ends the proxy.
type CredentialProxy interface {
	// AttachProxy starts intercepting attached sandbox id's HTTP(S) with
	// its CA and injection rules (nil: none yet).
	AttachProxy(ctx context.Context, id string, ca *mitm.CA, rules *vault.Rules) error
	// SetProxyRules replaces the rules; the next request uses them.
	SetProxyRules(id string, rules *vault.Rules) error
}

// CredentialProxyRecord is the persisted credential proxy of a sandbox.
// Nothing secret is stored in the clear: the CA key and the vault are
// sealed with the server's vault key (vault.Sealer), bound to the sandbox.
type CredentialProxyRecord struct {
	// CACert is the sandbox CA certificate (PEM, public). Empty until the
	// sandbox is provisioned.
	CACert []byte `json:"caCert,omitempty"`
	// Sealed is vault.SealState of the vault (if any) and the CA key.
	Sealed []byte `json:"sealed,omitempty"`
}

// credProxy is the in-memory credential proxy of a sandbox (entry.cred).
type credProxy struct {
	ca    *mitm.CA
	state *vault.State // nil until POST /credential-vault
}

const codeUnsupported = "SANDBOX::API_NOT_SUPPORTED"

// checkCredentialProxy validates credentialProxy on a create.
func (s *Service) checkCredentialProxy(req CreateRequest, np *policy.NetworkPolicy, memory bool) error {
	if !req.CredentialProxy {
		return nil
	}
	if np == nil {
		return errdefs.Invalid(codeInvalid, "credentialProxy requires networkPolicy (the Credential Vault only binds hosts the policy allows)")
	}
	if _, ok := s.deps.Egress.(CredentialProxy); !ok || s.deps.Sealer == nil {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, codeUnsupported, "credentialProxy is not supported by this server's runtime")
	}
	if memory {
		return errdefs.Invalid(codeInvalid, "credentialProxy cannot be enabled on a sandbox restored from a memory snapshot (its processes already run without the sandbox CA)")
	}
	return nil
}

// newCredProxy makes sandbox e's CA and its record. The caller holds e.mu.
func (s *Service) newCredProxy(e *entry) error {
	ca, err := mitm.NewCA(e.sb.ID)
	if err != nil {
		return fmt.Errorf("sandbox CA: %w", err)
	}
	cp := &credProxy{ca: ca}
	rec, err := s.sealCredProxy(e.sb.ID, cp)
	if err != nil {
		return err
	}
	e.cred, e.sb.CredentialProxy = cp, rec
	return nil
}

func (s *Service) sealCredProxy(id string, cp *credProxy) (*CredentialProxyRecord, error) {
	key, err := cp.ca.KeyDER()
	if err != nil {
		return nil, err
	}
	defer clear(key)
	blob, err := vault.SealState(s.deps.Sealer, id, cp.state, key)
	if err != nil {
		return nil, err
	}
	return &CredentialProxyRecord{CACert: cp.ca.CertPEM(), Sealed: blob}, nil
}

// attachCredProxy starts sandbox e's proxy with its current rules. The
// caller holds e.mu.
func (s *Service) attachCredProxy(ctx context.Context, e *entry) error {
	cp, ok := s.deps.Egress.(CredentialProxy)
	if !ok {
		return fmt.Errorf("credential proxy: %w", errdefs.ErrNotImplemented)
	}
	return cp.AttachProxy(ctx, e.sb.ID, e.cred.ca, e.cred.state.Compile())
}

// recoverCredProxy reopens a recovered sandbox's sealed CA and vault and
// restarts its proxy. The caller holds e.mu.
func (s *Service) recoverCredProxy(ctx context.Context, e *entry) error {
	rec := e.sb.CredentialProxy
	if rec == nil || len(rec.Sealed) == 0 {
		return nil
	}
	if s.deps.Sealer == nil {
		return fmt.Errorf("credential proxy: no vault key configured: %w", errdefs.ErrFailedPrecondition)
	}
	state, key, err := vault.OpenState(s.deps.Sealer, e.sb.ID, rec.Sealed)
	if err != nil {
		return err
	}
	defer clear(key)
	ca, err := mitm.ParseCA(rec.CACert, key)
	if err != nil {
		return err
	}
	e.cred = &credProxy{ca: ca, state: state}
	return s.attachCredProxy(ctx, e)
}

// CredentialVaults is the Credential Vault of every sandbox, behind the
// egress API's /credential-vault routes (egress.VaultService).
func (s *Service) CredentialVaults() CredentialVaults { return CredentialVaults{s} }

// CredentialVaults implements egress.VaultService over the lifecycle.
type CredentialVaults struct{ s *Service }

// locked runs fn with sandbox id's entry locked and its proxy present.
func (v CredentialVaults) locked(ctx context.Context, id string, fn func(e *entry) error) error {
	e, err := v.s.get(ctx, id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cred == nil {
		return vault.ErrNotEnabled
	}
	return fn(e)
}

// hostCheck is the sandbox's current policy as a vault.HostCheck.
func (v CredentialVaults) hostCheck(id string) (vault.HostCheck, error) {
	p, err := v.s.deps.Egress.Get(id)
	if err != nil {
		return nil, err
	}
	m, err := policy.Compile(p)
	if err != nil {
		return nil, err
	}
	return m.ExplicitlyAllows, nil
}

// commit persists next (nil: no vault) for e and then applies it to the
// proxy. Nothing changes if persisting fails. The caller holds e.mu.
func (v CredentialVaults) commit(e *entry, next *vault.State) error {
	cp := &credProxy{ca: e.cred.ca, state: next}
	rec, err := v.s.sealCredProxy(e.sb.ID, cp)
	if err != nil {
		return err
	}
	prev := e.sb.CredentialProxy
	e.sb.CredentialProxy = rec
	if err := v.s.persist(e); err != nil {
		e.sb.CredentialProxy = prev
		return err
	}
	e.cred = cp
	return v.s.deps.Egress.(CredentialProxy).SetProxyRules(e.sb.ID, next.Compile())
}

// CreateVault creates sandbox id's vault (revision 1).
func (v CredentialVaults) CreateVault(ctx context.Context, id string, req vault.CreateRequest) (out vault.View, err error) {
	err = v.locked(ctx, id, func(e *entry) error {
		if e.cred.state != nil {
			return vault.ErrExists
		}
		check, err := v.hostCheck(id)
		if err != nil {
			return err
		}
		next, err := vault.New(req, check)
		if err != nil {
			return err
		}
		if err := v.commit(e, next); err != nil {
			return err
		}
		out = next.View()
		return nil
	})
	return out, err
}

// GetVault returns sandbox id's vault.
func (v CredentialVaults) GetVault(ctx context.Context, id string) (out *vault.State, err error) {
	err = v.locked(ctx, id, func(e *entry) error {
		if e.cred.state == nil {
			return vault.ErrNotFound
		}
		out = e.cred.state
		return nil
	})
	return out, err
}

// PatchVault applies a PATCH to sandbox id's vault.
func (v CredentialVaults) PatchVault(ctx context.Context, id string, req vault.PatchRequest) (out vault.View, err error) {
	err = v.locked(ctx, id, func(e *entry) error {
		if e.cred.state == nil {
			return vault.ErrNotFound
		}
		check, err := v.hostCheck(id)
		if err != nil {
			return err
		}
		next, err := e.cred.state.Apply(req, check)
		if err != nil {
			return err
		}
		if err := v.commit(e, next); err != nil {
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
	return v.locked(ctx, id, func(e *entry) error {
		if e.cred.state == nil {
			return vault.ErrNotFound
		}
		return v.commit(e, nil)
	})
}
