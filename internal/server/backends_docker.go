package server

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime/docker"
)

// newDocker builds the Docker Engine backend. Images come through the
// daemon (its EnsureImage replaces moat's image store). Its network gets
// the egress stack of the native backend (startEgress): the host firewall
// and NAT of its bridge, the DNS proxy on the gateway that every sandbox
// resolves through, and the enforcer, which applies network policies
// inside each container's network namespace.
func newDocker(ctx, run context.Context, cfg Config, d deps) (_ backend, err error) {
	agent, err := cfg.agentBinary()
	if err != nil {
		return backend{}, err
	}
	rt, err := docker.New(ctx, docker.Config{
		AgentPath:  agent,
		Host:       cfg.DockerHost,
		Network:    "moat-" + cfg.Bridge,
		Subnet:     cfg.Subnet,
		Subnet6:    cfg.Subnet6,
		GatewayDNS: true,
		StateDir:   filepath.Join(cfg.Root, "docker"),
		Scope:      cfg.Bridge,
	}, docker.Deps{Logger: d.log})
	if err != nil {
		return backend{}, err
	}
	defer func() {
		if err != nil {
			rt.Close()
		}
	}()
	// dockerd made the bridge; its IPv6 forwarding is moat's, as on the
	// native bridge.
	if rt.Subnet6().IsValid() {
		if err := network.Forward6(d.log, rt.Bridge()); err != nil {
			return backend{}, err
		}
	}
	eg, stopEgress, err := startEgress(ctx, run, cfg, rt, d)
	if err != nil {
		return backend{}, err
	}
	return backend{rt: rt, images: daemonImages{rt}, egress: eg,
		close: func() error { return errors.Join(stopEgress(), rt.Close()) }}, nil
}

// daemonImages makes the daemon the image source of the lifecycle.
type daemonImages struct{ rt *docker.Runtime }

func (d daemonImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return d.rt.EnsureImage(ctx, ref, auth)
}
