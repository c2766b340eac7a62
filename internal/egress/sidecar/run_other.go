//go:build !linux

package sidecar

import (
	"context"
	"fmt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Run needs Linux (nftables in the pod's network namespace).
func Run(context.Context, Options) error {
	return fmt.Errorf("egress sidecar: %w: needs Linux", errdefs.ErrNotImplemented)
}
