package credvault

import (
	"context"
	"errors"
	"fmt"

	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// CopyVault gives sandbox to (which has a credential proxy and no vault
// yet) the vault of sandbox from: the same credentials and bindings, each
// binding's hosts explicitly allowed by to's own policy. A source
// without a vault copies nothing. Used by a fork that asks for it: by
// default a child gets none of its source's credentials.
func (v CredentialVaults) CopyVault(ctx context.Context, from, to string) error {
	src, err := v.GetVault(ctx, from)
	if errors.Is(err, vault.ErrNotFound) || errors.Is(err, vault.ErrNotEnabled) {
		return nil
	}
	if err != nil {
		return err
	}
	return v.locked(ctx, to, func(e *lifecycle.Entry, c *credProxy) error {
		if c.state != nil {
			return vault.ErrExists
		}
		check, err := v.hostCheck(e)
		if err != nil {
			return err
		}
		if err := v.inGuardrail(e, src); err != nil {
			return err
		}
		for _, b := range src.Bindings {
			for _, h := range b.Match.Hosts {
				if !check(h) {
					return errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
						fmt.Sprintf("the source's credential binding %q names host %s, which the child's network policy does not allow", b.Name, h))
				}
			}
		}
		// A State is immutable: the child shares the source's.
		return v.commit(ctx, e, c, src)
	})
}
