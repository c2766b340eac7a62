package docker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// netInfo is what New learnt of the sandbox network.
type netInfo struct {
	bridge            string
	subnet, subnet6   netip.Prefix
	gateway, gateway6 netip.Addr
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
