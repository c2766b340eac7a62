package server

import (
	"context"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime/docker"
)

// newDocker builds the Docker Engine backend. Images come through the
// daemon (its EnsureImage replaces moat's image store). Sandboxes get no
// egress policy support on this backend.
func newDocker(ctx, run context.Context, cfg Config, d deps) (backend, error) {
	agent, err := cfg.agentBinary()
	if err != nil {
		return backend{}, err
	}
	rt, err := docker.New(ctx, docker.Config{
		AgentPath: agent,
		Host:      cfg.DockerHost,
		Network:   "moat-" + cfg.Bridge,
		StateDir:  filepath.Join(cfg.Root, "docker"),
		Scope:     cfg.Bridge,
	}, docker.Deps{Logger: d.log})
	if err != nil {
		return backend{}, err
	}
	return backend{rt: rt, images: daemonImages{rt}, close: rt.Close}, nil
}

// daemonImages makes the daemon the image source of the lifecycle.
type daemonImages struct{ rt *docker.Runtime }

func (d daemonImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return d.rt.EnsureImage(ctx, ref, auth)
}
