// Package docker is the sandbox backend that runs each sandbox as a Docker
// container through the Docker Engine API (API version 1.41 or newer, i.e.
// Docker 20.10+; the client negotiates the version down).
//
// A sandbox is the container "moat-<id>" on one user-defined bridge network
// (Config.Network). Its entrypoint is the moat agent (cmd/moat-agent),
// bind-mounted read-only at /.moat/moat-agent and started as
// `/.moat/moat-agent --config /.moat/agent.json -- <user command>`, so the
// agent is PID 1 (Docker's init is disabled). agent.json, which holds the
// agent token, lives in Config.StateDir on the host and is bind-mounted
// read-only; the token is never stored in the container's config or labels.
//
// Everything needed to re-adopt a sandbox after a server restart is kept in
// container labels (see the label constants), so the Docker daemon is the
// only source of truth: List and Status read it back, and a new Runtime over
// the same daemon and Config.Scope sees every sandbox the old one created.
//
// The network moat creates is "internal", without masquerading, on a host
// bridge named BridgeName(network); the host reaches each sandbox at its
// bridge address (Endpoint). Docker itself does not enforce "internal"
// when it runs with --iptables=false (as scripts/docker-setup.sh starts
// it): the server firewalls the bridge as it does the native one (egress
// through its NAT, policy enforced in each container's netns, found by
// NetnsPath), and the script's nft table inet moat-docker keeps the host
// closed to BridgePrefix* bridges but for DNS and the credential proxy.
// Like native sandboxes, sandboxes are isolated bridge ports (they cannot
// reach each other), have no IPv6 unless the network is dual-stack
// (Config.Subnet6), and resolve through the gateway (Config.GatewayDNS).
// There is no disk quota (Resources.DiskBytes is refused).
package docker

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
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

// Paths inside every sandbox.
const ()

// Defaults.
const (
	DefaultHost      = "unix:///var/run/docker.sock"
	DefaultNetwork   = "moat"
	DefaultStateDir  = "/var/lib/moat/docker"
	DefaultScope     = "default"
	DefaultPidsLimit = 4096
)

// keepCaps is the capability set of the agent and of every command run as
// root in the sandbox: Docker's default minus NET_RAW, MKNOD and
// AUDIT_WRITE, the same as the oci backend. Everything else is dropped.
var keepCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
}

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

// Runtime is the docker backend. It is safe for concurrent use.
type Runtime struct {
	cfg Config
	cli *client.Client
	log *slog.Logger
	net netInfo // the network's bridge and addresses, read at New
}

// netInfo is what New learnt of the sandbox network.
type netInfo struct {
	bridge            string
	subnet, subnet6   netip.Prefix
	gateway, gateway6 netip.Addr
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Pauser  = (*Runtime)(nil)
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
func (r *Runtime) Close() error { return r.cli.Close() }

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "docker" }

// Capabilities implements runtime.Runtime. There is no disk quota: the
// daemon's storage drivers offer one only on some filesystems (overlay2 on
// xfs with pquota), so this backend refuses Resources.DiskBytes.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Classes: []string{Class}}
}

// readNetwork learns the network's host bridge and addresses.
func (r *Runtime) readNetwork(ctx context.Context) error {
	res, err := r.cli.NetworkInspect(ctx, r.cfg.Network, client.NetworkInspectOptions{})
	if err != nil {
		return classify("inspect network "+r.cfg.Network, err)
	}
	n := netInfo{bridge: res.Network.Options[optBridgeName]}
	if n.bridge == "" {
		// A network moat did not create: the daemon names its bridge.
		n.bridge = "br-" + res.Network.ID[:min(12, len(res.Network.ID))]
	}
	for _, c := range res.Network.IPAM.Config {
		switch {
		case c.Subnet.Addr().Is4() && !n.subnet.IsValid():
			n.subnet, n.gateway = c.Subnet, c.Gateway
		case c.Subnet.Addr().Is6() && !n.subnet6.IsValid():
			n.subnet6, n.gateway6 = c.Subnet, c.Gateway
		}
	}
	if n.subnet.IsValid() && !n.gateway.IsValid() {
		n.gateway = n.subnet.Masked().Addr().Next() // the daemon's default
	}
	if n.subnet6.IsValid() && !n.gateway6.IsValid() {
		n.gateway6 = n.subnet6.Masked().Addr().Next()
	}
	if !n.subnet.IsValid() {
		return fmt.Errorf("docker: network %s has no IPv4 subnet: %w", r.cfg.Network, errdefs.ErrFailedPrecondition)
	}
	r.net = n
	return nil
}

// Bridge is the host bridge of the sandbox network.
func (r *Runtime) Bridge() string { return r.net.bridge }

// Subnet is the sandbox network's IPv4 range.
func (r *Runtime) Subnet() netip.Prefix { return r.net.subnet }

// Gateway is the bridge's IPv4 address.
func (r *Runtime) Gateway() netip.Addr { return r.net.gateway }

// Subnet6 is the sandbox network's IPv6 range (invalid: IPv6 off).
func (r *Runtime) Subnet6() netip.Prefix { return r.net.subnet6 }

// Gateway6 is the bridge's IPv6 address (invalid: IPv6 off).
func (r *Runtime) Gateway6() netip.Addr { return r.net.gateway6 }

// NetnsPath returns the file of sandbox id's network namespace (the
// daemon's sandbox key), for the egress enforcer.
func (r *Runtime) NetnsPath(ctx context.Context, id string) (string, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return "", err
	}
	if c.NetworkSettings == nil || c.NetworkSettings.SandboxKey == "" {
		return "", fmt.Errorf("sandbox %q has no network namespace (not running?): %w", id, errdefs.ErrFailedPrecondition)
	}
	return c.NetworkSettings.SandboxKey, nil
}

// IP6 returns sandbox id's IPv6 address (invalid if none).
func (r *Runtime) IP6(ctx context.Context, id string) netip.Addr {
	c, err := r.inspect(ctx, id)
	if err != nil || c.NetworkSettings == nil {
		return netip.Addr{}
	}
	if ep := c.NetworkSettings.Networks[r.cfg.Network]; ep != nil {
		return ep.GlobalIPv6Address
	}
	return netip.Addr{}
}

// BridgePrefix starts the name of the host bridge of every network moat
// creates. scripts/docker-setup.sh drops forwarded traffic from these
// bridges and unsolicited traffic from them to the host, because with
// --iptables=false an internal network still gives containers a default
// route through the host.
const BridgePrefix = "moatd-"

const optBridgeName = "com.docker.network.bridge.name"

// BridgeName is the host bridge of the network moat creates for the given
// Docker network name (at most 15 characters).
func BridgeName(network string) string {
	sum := sha256.Sum256([]byte(network))
	return BridgePrefix + hex.EncodeToString(sum[:4])
}

// ensureNetwork creates the network unless it exists. A flock in StateDir
// serializes concurrent servers: API 1.41 daemons accept two networks
// with the same name.
func (r *Runtime) ensureNetwork(ctx context.Context) error {
	lock, err := os.OpenFile(filepath.Join(r.cfg.StateDir, "network.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("docker: lock: %w", err)
	}
	res, err := r.cli.NetworkInspect(ctx, r.cfg.Network, client.NetworkInspectOptions{})
	if err == nil {
		if d := res.Network.Driver; d != "bridge" {
			return fmt.Errorf("docker: network %q has driver %q, want bridge: %w", r.cfg.Network, d, errdefs.ErrFailedPrecondition)
		}
		if !res.Network.Internal || !strings.HasPrefix(res.Network.Options[optBridgeName], BridgePrefix) {
			r.log.Warn("docker: network was not created by moat; egress is not contained", "network", r.cfg.Network)
		}
		return nil
	}
	if !cerrdefs.IsNotFound(err) {
		return classify("inspect network "+r.cfg.Network, err)
	}
	opts := client.NetworkCreateOptions{
		Driver:   "bridge",
		Internal: true,
		Labels:   map[string]string{LabelNetwork: "1"},
		Options: map[string]string{
			"com.docker.network.bridge.enable_ip_masquerade": "false",
			optBridgeName: BridgeName(r.cfg.Network),
		},
	}
	if r.cfg.Subnet != "" {
		p := netip.MustParsePrefix(r.cfg.Subnet)
		opts.IPAM = &network.IPAM{Driver: "default", Config: []network.IPAMConfig{{Subnet: p}}}
	}
	if r.cfg.Subnet6 != "" {
		on := true
		opts.EnableIPv6 = &on
		if opts.IPAM == nil {
			opts.IPAM = &network.IPAM{Driver: "default"}
		}
		opts.IPAM.Config = append(opts.IPAM.Config, network.IPAMConfig{Subnet: netip.MustParsePrefix(r.cfg.Subnet6).Masked()})
	}
	if _, err := r.cli.NetworkCreate(ctx, r.cfg.Network, opts); err != nil {
		return classify("create network "+r.cfg.Network, err)
	}
	r.log.Info("docker: created network", "network", r.cfg.Network)
	return nil
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

// validate checks spec: the common rules (runtime.Spec.Validate), then
// this backend's extras: its one class, and the daemon's larger memory
// minimum.
func (r *Runtime) validate(spec *runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Class == "" {
		spec.Class = Class
	}
	if spec.Class != Class {
		return runtime.Invalid("runtime class %q is not available", spec.Class)
	}
	if m := spec.Resources.MemoryBytes; m != 0 && m < minMemoryBytes {
		return runtime.Invalid("memory limit must be at least %d MiB", minMemoryBytes>>20)
	}
	if spec.Resources.DiskBytes != 0 {
		return errdefs.WithPublic(fmt.Errorf("docker: disk quota: %w", errdefs.ErrNotImplemented),
			"SANDBOX::API_NOT_SUPPORTED", "a disk quota (resourceLimits.disk) is not supported by the docker runtime; use the native runtime")
	}
	return nil
}

// minMemoryBytes is the Docker daemon's smallest memory limit.
const minMemoryBytes = 6 << 20

// inspect returns the container of sandbox id, ErrNotFound if there is
// none (or it belongs to another scope).
func (r *Runtime) inspect(ctx context.Context, id string) (container.InspectResponse, error) {
	if !runtime.ValidID(id) {
		return container.InspectResponse{}, notFound(id)
	}
	res, err := r.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return container.InspectResponse{}, notFound(id)
		}
		return container.InspectResponse{}, classify("inspect "+id, err)
	}
	c := res.Container
	if c.Config == nil || c.State == nil || c.Config.Labels[LabelSandbox] != id || c.Config.Labels[LabelScope] != r.cfg.Scope {
		return container.InspectResponse{}, notFound(id)
	}
	return c, nil
}

// Create implements runtime.Runtime. The image must be present in the
// daemon (see EnsureImage); a missing one is ErrNotFound.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Status, err error) {
	if err := r.validate(&spec); err != nil {
		return runtime.Status{}, err
	}
	id := spec.ID
	t0 := time.Now()
	switch _, err := r.inspect(ctx, id); {
	case err == nil:
		return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrAlreadyExists)
	case !errdefs.IsNotFound(err):
		return runtime.Status{}, err
	}
	img, err := r.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		return runtime.Status{}, classify("image "+spec.Image, err)
	}
	var imgEntrypoint, imgCmd []string
	if img.Config != nil {
		imgEntrypoint, imgCmd = img.Config.Entrypoint, img.Config.Cmd
	}

	// From here on, a failure removes what was made (rollback).
	rollback := func() {
		os.Remove(r.agentConfPath(id))
		os.Remove(r.resolvConfPath(id))
		if err := r.unstageVolumes(id); err != nil {
			r.log.Error("docker: rollback of failed create left volume binds", "id", id, "err", err)
		}
	}
	defer func() {
		if err != nil && rollback != nil {
			rollback()
		}
	}()
	agentConf, err := json.Marshal(agentproto.Config{Token: spec.AgentToken, Port: agentproto.Port})
	if err != nil {
		return runtime.Status{}, err
	}
	if err := atomicfile.WriteFile(r.agentConfPath(id), agentConf, 0o600); err != nil {
		return runtime.Status{}, fmt.Errorf("docker: %w", err)
	}

	createdAt := time.Now().UTC()
	specLabels, err := json.Marshal(spec.Labels)
	if err != nil {
		return runtime.Status{}, err
	}
	user := spec.Entrypoint
	if len(user) == 0 {
		user = append(slices.Clone(imgEntrypoint), imgCmd...)
	}
	res := r.resources(spec.Resources)
	hostname := id
	if len(hostname) > 12 {
		hostname = strings.TrimRight(hostname[:12], "-")
	}
	noInit := false
	cfg := &container.Config{
		Image:      spec.Image,
		Hostname:   hostname,
		User:       "0:0",
		Entrypoint: agentproto.Args(nil),
		Cmd:        user,
		Env:        envList(spec.Env),
		WorkingDir: spec.WorkingDir,
		Labels: map[string]string{
			LabelSandbox:    id,
			LabelScope:      r.cfg.Scope,
			LabelCreatedAt:  createdAt.Format(time.RFC3339Nano),
			LabelClass:      spec.Class,
			LabelImage:      spec.Image,
			LabelSpecLabels: string(specLabels),
		},
	}
	host := &container.HostConfig{
		NetworkMode: container.NetworkMode(r.cfg.Network),
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: r.cfg.AgentPath, Target: agentproto.BinPath, ReadOnly: true},
			{Type: mount.TypeBind, Source: r.agentConfPath(id), Target: agentproto.ConfigPath, ReadOnly: true},
		},
		Sysctls:     map[string]string{},
		CapDrop:     []string{"ALL"},
		CapAdd:      slices.Clone(keepCaps),
		SecurityOpt: []string{"no-new-privileges"},
		Init:        &noInit,
		Runtime:     r.cfg.Runtime,
		LogConfig: container.LogConfig{
			Type:   "json-file",
			Config: map[string]string{"max-size": "10m", "max-file": "1"},
		},
		Resources: res,
	}
	if r.cfg.GatewayDNS {
		conf := "nameserver " + r.net.gateway.String() + "\n"
		if err := atomicfile.WriteFile(r.resolvConfPath(id), []byte(conf), 0o644); err != nil {
			return runtime.Status{}, fmt.Errorf("docker: %w", err)
		}
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeBind, Source: r.resolvConfPath(id), Target: "/etc/resolv.conf", ReadOnly: true})
	}
	if !r.net.subnet6.IsValid() {
		// No IPv6 path at all, not even link-local (as the native backend).
		host.Sysctls["net.ipv6.conf.all.disable_ipv6"] = "1"
		host.Sysctls["net.ipv6.conf.default.disable_ipv6"] = "1"
	}
	for _, m := range spec.Mounts {
		if m.Volume != "" {
			continue
		}
		// Host volumes: non-recursive binds, like the native backend.
		host.Mounts = append(host.Mounts, mount.Mount{
			Type: mount.TypeBind, Source: m.Source, Target: m.Destination, ReadOnly: m.ReadOnly,
			BindOptions: &mount.BindOptions{NonRecursive: true, Propagation: mount.PropagationRPrivate},
		})
	}
	named, volLabels, err := r.namedVolumeMounts(ctx, id, spec.Mounts)
	if err != nil {
		return runtime.Status{}, err
	}
	host.Mounts = append(host.Mounts, named...)
	maps.Copy(cfg.Labels, volLabels)
	netCfg := &network.NetworkingConfig{
		EndpointsConfig: map[string]*network.EndpointSettings{r.cfg.Network: {}},
	}
	if _, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: containerName(id), Config: cfg, HostConfig: host, NetworkingConfig: netCfg,
	}); err != nil {
		if cerrdefs.IsConflict(err) {
			// Another Create won the name: its container is not ours to remove.
			rollback = nil
			return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrAlreadyExists)
		}
		return runtime.Status{}, classify("create "+id, err)
	}
	rollback = func() {
		if rerr := r.remove(context.WithoutCancel(ctx), id); rerr != nil {
			r.log.Error("docker: rollback of failed create left resources", "id", id, "err", rerr)
		}
	}
	tCreate := time.Since(t0)
	if _, err := r.cli.ContainerStart(ctx, containerName(id), client.ContainerStartOptions{}); err != nil {
		return runtime.Status{}, classify("start "+id, err)
	}
	c, err := r.inspect(ctx, id)
	if err != nil {
		return runtime.Status{}, err
	}
	if err := isolatePort(c.NetworkSettings.SandboxKey); err != nil {
		return runtime.Status{}, err
	}
	st := r.status(c)
	r.log.Debug("docker: created", "id", id, "create", tCreate, "total", time.Since(t0), "ip", st.IP)
	return st, nil
}

func (r *Runtime) resources(in runtime.Resources) container.Resources {
	if in.CPUMillis == 0 {
		in.CPUMillis = r.cfg.DefaultResources.CPUMillis
	}
	if in.MemoryBytes == 0 {
		in.MemoryBytes = r.cfg.DefaultResources.MemoryBytes
	}
	if in.PidsLimit == 0 {
		in.PidsLimit = r.cfg.DefaultResources.PidsLimit
	}
	var out container.Resources
	out.NanoCPUs = in.CPUMillis * 1_000_000
	if in.MemoryBytes > 0 {
		out.Memory = in.MemoryBytes
		out.MemorySwap = in.MemoryBytes // no swap beyond the limit
	}
	if in.PidsLimit > 0 {
		p := in.PidsLimit
		out.PidsLimit = &p
	}
	return out
}

// envList renders env sorted by name; the daemon merges it over the
// image's environment (ours wins) and adds a default PATH.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// status converts an inspected container.
func (r *Runtime) status(c container.InspectResponse) runtime.Status {
	labels := c.Config.Labels
	st := runtime.Status{
		ID:    labels[LabelSandbox],
		Class: labels[LabelClass],
	}
	if t, err := time.Parse(time.RFC3339Nano, labels[LabelCreatedAt]); err == nil {
		st.CreatedAt = t
	} else if t, err := time.Parse(time.RFC3339Nano, c.Created); err == nil {
		st.CreatedAt = t.UTC()
	}
	if s := labels[LabelSpecLabels]; s != "" && s != "null" {
		if err := json.Unmarshal([]byte(s), &st.Labels); err != nil {
			st.Message = "corrupt " + LabelSpecLabels + " label"
		}
	}
	if c.NetworkSettings != nil {
		if ep := c.NetworkSettings.Networks[r.cfg.Network]; ep != nil && ep.IPAddress.IsValid() {
			st.IP = ep.IPAddress.String()
		}
	}
	s := c.State
	switch {
	case s.Paused || s.Status == container.StatePaused:
		st.State = runtime.StatePaused
		st.Pid = s.Pid
	case s.Running || s.Status == container.StateRunning || s.Status == container.StateRestarting:
		st.State = runtime.StateRunning
		st.Pid = s.Pid
	case s.Status == container.StateCreated:
		st.State = runtime.StateCreating
	case s.Status == container.StateExited || s.Status == container.StateDead:
		st.State = runtime.StateStopped
		st.ExitCode = s.ExitCode
		st.IP = ""
		if s.Error != "" {
			st.Message = s.Error
		} else if s.OOMKilled {
			st.Message = "killed: out of memory"
		}
	default:
		st.State = runtime.StateUnknown
		st.Message = "docker state " + string(s.Status)
	}
	return st
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return runtime.Status{}, err
	}
	return r.status(c), nil
}

// List implements runtime.Runtime: the containers of this Config.Scope.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	f := make(client.Filters).Add("label", LabelSandbox).Add("label", LabelScope+"="+r.cfg.Scope)
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, classify("list", err)
	}
	out := make([]runtime.Status, 0, len(res.Items))
	for _, s := range res.Items {
		id := s.Labels[LabelSandbox]
		c, err := r.inspect(ctx, id)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			out = append(out, runtime.Status{ID: id, State: runtime.StateUnknown, Message: err.Error()})
			continue
		}
		out = append(out, r.status(c))
	}
	slices.SortFunc(out, func(a, b runtime.Status) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Endpoint implements runtime.Runtime: the container's address on the
// network, which the host reaches through the bridge.
func (r *Runtime) Endpoint(ctx context.Context, id string, port int) (string, error) {
	if port <= 0 || port > 65535 {
		return "", runtime.Invalid("invalid port %d", port)
	}
	c, err := r.inspect(ctx, id)
	if err != nil {
		return "", err
	}
	st := r.status(c)
	if st.State != runtime.StateRunning && st.State != runtime.StatePaused {
		return "", fmt.Errorf("sandbox %q is %s: %w", id, st.State, errdefs.ErrFailedPrecondition)
	}
	if st.IP == "" {
		return "", fmt.Errorf("sandbox %q has no address on network %q: %w", id, r.cfg.Network, errdefs.ErrFailedPrecondition)
	}
	return net.JoinHostPort(st.IP, fmt.Sprint(port)), nil
}

// Stop implements runtime.Runtime. A paused sandbox is thawed first so
// that it can handle SIGTERM.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	switch r.status(c).State {
	case runtime.StateStopped, runtime.StateCreating:
		return nil
	case runtime.StatePaused:
		if _, err := r.cli.ContainerUnpause(ctx, c.ID, client.ContainerUnpauseOptions{}); err != nil && !cerrdefs.IsConflict(err) {
			return classify("unpause "+id, err)
		}
	}
	if grace <= 0 {
		return r.kill(ctx, id, c.ID)
	}
	secs := int((grace + time.Second - 1) / time.Second)
	if _, err := r.cli.ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &secs}); err != nil {
		if cerrdefs.IsNotFound(err) {
			return notFound(id)
		}
		return classify("stop "+id, err)
	}
	return nil
}

// kill sends SIGKILL and waits until the container has stopped. (API
// 1.41 has no stop signal parameter; `stop -t 0` sends SIGTERM first.)
func (r *Runtime) kill(ctx context.Context, id, cid string) error {
	if _, err := r.cli.ContainerKill(ctx, cid, client.ContainerKillOptions{Signal: "SIGKILL"}); err != nil {
		switch {
		case cerrdefs.IsNotFound(err):
			return notFound(id)
		case !cerrdefs.IsConflict(err): // conflict: it is not running any more
			return classify("kill "+id, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w := r.cli.ContainerWait(wctx, cid, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-w.Result:
		return nil
	case err := <-w.Error:
		if cerrdefs.IsNotFound(err) {
			return notFound(id)
		}
		return classify("wait "+id, err)
	}
}

// Pause implements runtime.Pauser (the daemon's freezer).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	if st := r.status(c).State; st != runtime.StateRunning {
		return fmt.Errorf("sandbox %q is %s, not running: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if _, err := r.cli.ContainerPause(ctx, c.ID, client.ContainerPauseOptions{}); err != nil {
		if cerrdefs.IsConflict(err) {
			return fmt.Errorf("sandbox %q: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		}
		return classify("pause "+id, err)
	}
	return nil
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	if st := r.status(c).State; st != runtime.StatePaused {
		return fmt.Errorf("sandbox %q is %s, not paused: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if _, err := r.cli.ContainerUnpause(ctx, c.ID, client.ContainerUnpauseOptions{}); err != nil {
		if cerrdefs.IsConflict(err) {
			return fmt.Errorf("sandbox %q: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		}
		return classify("resume "+id, err)
	}
	return nil
}

// Delete implements runtime.Runtime: force-removes the container (and its
// anonymous volumes) and the agent.json. Unknown IDs are a no-op.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	switch _, err := r.inspect(ctx, id); {
	case errdefs.IsNotFound(err):
		// Not ours (or gone): only a leftover agent.json and volume binds
		// may remain.
		if err := r.removeFiles(id); err != nil {
			return err
		}
		return r.unstageVolumes(id)
	case err != nil:
		return err
	}
	return r.remove(ctx, id)
}

func (r *Runtime) remove(ctx context.Context, id string) error {
	_, err := r.cli.ContainerRemove(ctx, containerName(id), client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		// A removal already in progress (409) finishes on its own.
		if !cerrdefs.IsConflict(err) || !strings.Contains(err.Error(), "already in progress") {
			return classify("remove "+id, err)
		}
	}
	if err := r.removeFiles(id); err != nil {
		return err
	}
	return r.unstageVolumes(id)
}

// removeFiles removes sandbox id's agent.json and resolv.conf.
func (r *Runtime) removeFiles(id string) error {
	for _, p := range []string{r.agentConfPath(id), r.resolvConfPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("docker: %w", err)
		}
	}
	return nil
}

// EnsureImage returns the image ref from the daemon, pulling it first
// (with auth, if given) when the daemon does not have it. Name is ref as
// given; ID, Layers and Config come from the daemon's image inspect.
func (r *Runtime) EnsureImage(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	if ref == "" {
		return image.Image{}, runtime.Invalid("image is required")
	}
	res, err := r.cli.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		if perr := r.pull(ctx, ref, auth); perr != nil {
			return image.Image{}, perr
		}
		res, err = r.cli.ImageInspect(ctx, ref)
	}
	if err != nil {
		return image.Image{}, classify("image "+ref, err)
	}
	img := image.Image{
		Name:   ref,
		ID:     res.ID,
		Layers: res.RootFS.Layers,
		Size:   res.Size,
	}
	if len(res.RepoDigests) > 0 {
		if _, d, ok := strings.Cut(res.RepoDigests[0], "@"); ok {
			img.Digest = d
		}
	}
	if t := res.Metadata.LastTagTime; !t.IsZero() {
		img.CreatedAt = t
	} else if t, err := time.Parse(time.RFC3339Nano, res.Created); err == nil {
		img.CreatedAt = t
	}
	if c := res.Config; c != nil {
		img.Config = image.Config{
			Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User,
		}
	}
	return img, nil
}

func (r *Runtime) pull(ctx context.Context, ref string, auth *image.Auth) error {
	opts := client.ImagePullOptions{}
	if auth != nil && (auth.Username != "" || auth.Password != "") {
		data, err := json.Marshal(struct {
			Username string `json:"username,omitempty"`
			Password string `json:"password,omitempty"`
		}{auth.Username, auth.Password})
		if err != nil {
			return err
		}
		opts.RegistryAuth = base64.URLEncoding.EncodeToString(data)
	}
	t0 := time.Now()
	resp, err := r.cli.ImagePull(ctx, ref, opts)
	if err != nil {
		switch {
		case cerrdefs.IsInvalidArgument(err):
			return runtime.Invalid("invalid image reference %q", ref)
		case cerrdefs.IsNotFound(err), cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err), errors.Is(err, context.Canceled):
			return classify("pull "+ref, err)
		}
		// The daemon reports a registry it cannot reach as a 500.
		return fmt.Errorf("docker: pull %s: %w: %w", ref, err, errdefs.ErrUnavailable)
	}
	defer resp.Close()
	for msg, err := range resp.JSONMessages(ctx) {
		if err != nil {
			return classify("pull "+ref, err)
		}
		if msg.Error != nil {
			return pullError(ref, msg.Error.Message)
		}
	}
	r.log.Debug("docker: pulled", "image", ref, "took", time.Since(t0))
	return nil
}

// pullError classifies an error reported in the pull stream, which
// carries only a message.
func pullError(ref, msg string) error {
	m := strings.ToLower(msg)
	var class error
	switch {
	case strings.Contains(m, "not found") || strings.Contains(m, "manifest unknown") || strings.Contains(m, "does not exist"):
		class = errdefs.ErrNotFound
	case strings.Contains(m, "unauthorized") || strings.Contains(m, "authentication required"):
		class = errdefs.ErrUnauthenticated
	case strings.Contains(m, "denied"):
		class = errdefs.ErrPermissionDenied
	default:
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("docker: pull %s: %s: %w", ref, msg, class)
}
