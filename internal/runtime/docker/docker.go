// Package docker runs each sandbox as the Docker container "moat-<id>"
// (Engine API 1.41+), the agent bind-mounted as PID 1 with its token in a
// host file, never in the container's config. Labels hold all that a new
// Runtime needs to re-adopt sandboxes, so the daemon is the one source of
// truth. The daemon runs with --iptables=false, so the server firewalls
// the bridge as it does the native one (see BridgePrefix).
package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Class is the only Spec.Class this backend offers.
const Class = "docker"

// Container labels. Every container moat creates carries LabelSandbox and
// LabelScope; List and Status ignore containers without them.
const (
	// LabelSandbox holds the sandbox ID.
	LabelSandbox = "moat.dev/sandbox"
	// LabelScope holds Config.Scope, so several moat servers (or tests)
	// can share one daemon without seeing each other's sandboxes.
	LabelScope = "moat.dev/scope"
	// LabelCreatedAt holds the creation time (RFC 3339, nanoseconds, UTC).
	LabelCreatedAt = "moat.dev/created-at"
	// LabelClass holds the sandbox class.
	LabelClass = "moat.dev/class"
	// LabelImage holds the Spec.Image the sandbox was created from.
	LabelImage = "moat.dev/image"
	// LabelSpecLabels holds the Spec.Labels as a JSON object.
	LabelSpecLabels = "moat.dev/labels"
	// LabelNetwork marks the networks moat created.
	LabelNetwork = "moat.dev/network"
)

// Runtime is the docker backend. It is safe for concurrent use.
type Runtime struct {
	cfg Config
	cli *client.Client
	log *slog.Logger
	net netInfo // the network's bridge and addresses, read at New
	// exits follows the daemon's die events for NotifyExits (exit.go).
	exits exitWatch
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Pauser  = (*Runtime)(nil)

	_ runtime.ExitNotifier = (*Runtime)(nil)
)

// New connects to the daemon, checks that it answers, and makes sure the
// network and the state directory exist. An unreachable daemon is
// ErrUnavailable.
func New(ctx context.Context, cfg Config, deps Deps) (*Runtime, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(cfg.AgentPath); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("docker: agent binary %q is not a regular file (%v): %w", cfg.AgentPath, err, errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cli, err := client.New(client.WithHost(cfg.Host))
	if err != nil {
		return nil, fmt.Errorf("docker: client for %q: %w: %w", cfg.Host, err, errdefs.ErrInvalidArgument)
	}
	r := &Runtime{cfg: cfg, cli: cli, log: log}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ping, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker: daemon at %s: %w: %w", cfg.Host, err, errdefs.ErrUnavailable)
	}
	if ping.OSType != "" && ping.OSType != "linux" {
		cli.Close()
		return nil, fmt.Errorf("docker: daemon OS %q is not linux: %w", ping.OSType, errdefs.ErrFailedPrecondition)
	}
	if err := r.ensureNetwork(ctx); err != nil {
		cli.Close()
		return nil, err
	}
	if err := r.readNetwork(ctx); err != nil {
		cli.Close()
		return nil, err
	}
	if r.net.subnet6.IsValid() && strings.HasPrefix(r.net.bridge, BridgePrefix) {
		if err := readyBridge6(r.net.bridge, netip.PrefixFrom(r.net.gateway6, r.net.subnet6.Bits())); err != nil {
			cli.Close()
			return nil, err
		}
	}
	if err := r.sweepStages(ctx); err != nil {
		log.Warn("docker: leftover volume binds", "err", err)
	}
	log.Debug("docker: connected", "host", cfg.Host, "api", cli.ClientVersion(), "network", cfg.Network)
	return r, nil
}

// Close releases the client's connections. Sandboxes keep running.
func (r *Runtime) Close() error {
	r.stopExits()
	return r.cli.Close()
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "docker" }

// Capabilities implements runtime.Runtime. There is no disk quota: the
// daemon's storage drivers offer one only on some filesystems (overlay2 on
// xfs with pquota), so this backend refuses Resources.DiskBytes.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Classes: []string{Class}}
}

// classify wraps a daemon error with its errdefs class.
func classify(op string, err error) error {
	var class error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		class = errdefs.ErrDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("docker: %s: %w", op, err)
	case cerrdefs.IsNotFound(err):
		class = errdefs.ErrNotFound
	case cerrdefs.IsConflict(err), cerrdefs.IsAlreadyExists(err):
		class = errdefs.ErrConflict
	case cerrdefs.IsInvalidArgument(err):
		class = errdefs.ErrInvalidArgument
	case cerrdefs.IsUnauthorized(err):
		class = errdefs.ErrUnauthenticated
	case cerrdefs.IsPermissionDenied(err):
		class = errdefs.ErrPermissionDenied
	case cerrdefs.IsNotImplemented(err):
		class = errdefs.ErrNotImplemented
	case client.IsErrConnectionFailed(err), cerrdefs.IsUnavailable(err):
		class = errdefs.ErrUnavailable
	default:
		class = errdefs.ErrInternal
	}
	return fmt.Errorf("docker: %s: %w: %w", op, err, class)
}

func containerName(id string) string { return "moat-" + id }

func (r *Runtime) resolvConfPath(id string) string {
	return filepath.Join(r.cfg.StateDir, id+".resolv.conf")
}

func (r *Runtime) agentConfPath(id string) string {
	return filepath.Join(r.cfg.StateDir, id+".agent.json")
}

func notFound(id string) error { return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound) }
