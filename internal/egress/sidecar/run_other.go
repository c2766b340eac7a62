//go:build !linux

package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Options configure Run (see run_linux.go).
type Options struct {
	Token     string
	Policy    []byte
	Upstreams []string
	NetNS     string
	DNS       netip.AddrPort
	Listen    string
	StateDir  string
	Logger    *slog.Logger
	VaultKey  []byte
	Ready     func()
}

// Run needs Linux (nftables in the pod's network namespace).
func Run(context.Context, Options) error {
	return fmt.Errorf("egress sidecar: %w: needs Linux", errdefs.ErrNotImplemented)
}
