package docker

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Defaults.
const (
	DefaultHost      = "unix:///var/run/docker.sock"
	DefaultNetwork   = "moat"
	DefaultStateDir  = "/var/lib/moat/docker"
	DefaultScope     = "default"
	DefaultPidsLimit = 4096
)

// Config configures the backend. The zero value selects every default.
// To add a field: document its unit and default here and apply the default
// in setDefaults.
type Config struct {
	// Host is the Docker daemon address (default unix:///var/run/docker.sock).
	Host string `json:"host,omitempty"`
	// Network is the name of the bridge network the sandboxes join
	// (default "moat"). New creates it, internal, if it does not exist.
	Network string `json:"network,omitempty"`
	// Subnet is the IPv4 subnet of the network when New creates it
	// (e.g. "10.253.0.0/16"); empty lets the daemon choose.
	Subnet string `json:"subnet,omitempty"`
	// Subnet6, if set, makes the network dual-stack when New creates it
	// (an IPv6 prefix such as a ULA /64); empty disables IPv6 inside the
	// sandboxes altogether, as the native backend does.
	Subnet6 string `json:"subnet6,omitempty"`
	// GatewayDNS makes every sandbox resolve through port 53 of the
	// network's gateway, where the server runs its egress DNS proxy: each
	// sandbox gets its own /etc/resolv.conf, bind-mounted over the
	// daemon's (whose embedded resolver would hide the sandbox's address
	// from the proxy).
	GatewayDNS bool `json:"gatewayDNS,omitempty"`
	// AgentPath is the host path of the agent binary (cmd/moat-agent)
	// bind-mounted into each sandbox. Required; it must be a static binary.
	// The server installs the agent moat carries (internal/agentbin).
	AgentPath string `json:"agentPath,omitempty"`
	// StateDir holds the per-sandbox agent.json files (default
	// /var/lib/moat/docker). It must be visible to the daemon.
	StateDir string `json:"stateDir,omitempty"`
	// Scope tells this server's containers apart from other moat servers'
	// on the same daemon (default "default").
	Scope string `json:"scope,omitempty"`
	// DefaultResources are the defaults for zero Spec.Resources fields.
	// PidsLimit defaults to 4096; CPU and memory default to unlimited.
	// DiskBytes is not enforced by this backend.
	DefaultResources runtime.Resources `json:"defaultResources"`
	// Runtime is the daemon's OCI runtime name (`docker run --runtime`),
	// e.g. "runsc" if the daemon has it configured; empty = daemon default.
	Runtime string `json:"runtime,omitempty"`
}

func (c *Config) setDefaults() error {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Network == "" {
		c.Network = DefaultNetwork
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.Scope == "" {
		c.Scope = DefaultScope
	}
	if c.DefaultResources.PidsLimit == 0 {
		c.DefaultResources.PidsLimit = DefaultPidsLimit
	}
	if c.AgentPath == "" {
		return fmt.Errorf("docker: Config.AgentPath is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := runtime.CheckAgentBinary(c.AgentPath); err != nil {
		return err
	}
	if !filepath.IsAbs(c.AgentPath) || !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("docker: AgentPath and StateDir must be absolute: %w", errdefs.ErrInvalidArgument)
	}
	if c.Subnet != "" {
		if _, err := netip.ParsePrefix(c.Subnet); err != nil {
			return fmt.Errorf("docker: subnet %q: %w: %w", c.Subnet, err, errdefs.ErrInvalidArgument)
		}
	}
	if c.Subnet6 != "" {
		if p, err := netip.ParsePrefix(c.Subnet6); err != nil || !p.Addr().Is6() {
			return fmt.Errorf("docker: subnet6 %q: want an IPv6 prefix: %w", c.Subnet6, errdefs.ErrInvalidArgument)
		}
	}
	r := c.DefaultResources
	if r.CPUMillis < 0 || r.MemoryBytes < 0 || r.PidsLimit < 0 {
		return fmt.Errorf("docker: default resources must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Deps are the backend's collaborators.
type Deps struct {
	// Logger receives debug and error logs (default: discard).
	Logger *slog.Logger
}
