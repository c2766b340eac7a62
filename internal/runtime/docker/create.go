package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// keepCaps is the capability set of the agent and of every command run as
// root in the sandbox: Docker's default minus NET_RAW, MKNOD and
// AUDIT_WRITE, the same as the oci backend. Everything else is dropped.
var keepCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
}

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
	user, err := r.command(ctx, spec)
	if err != nil {
		return runtime.Status{}, err
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
	if err := r.writeFiles(spec); err != nil {
		return runtime.Status{}, err
	}
	cfg, err := r.containerConfig(spec, user)
	if err != nil {
		return runtime.Status{}, err
	}
	host, volLabels, err := r.hostConfig(ctx, spec)
	if err != nil {
		return runtime.Status{}, err
	}
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
	st, err := r.start(ctx, id)
	if err != nil {
		return runtime.Status{}, err
	}
	r.log.Debug("docker: created", "id", id, "create", tCreate, "total", time.Since(t0), "ip", st.IP)
	return st, nil
}

// command returns the user command the agent runs: spec.Entrypoint, or
// else the image's entrypoint and cmd. A missing image is ErrNotFound.
func (r *Runtime) command(ctx context.Context, spec runtime.Spec) ([]string, error) {
	img, err := r.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		return nil, classify("image "+spec.Image, err)
	}
	if len(spec.Entrypoint) > 0 {
		return spec.Entrypoint, nil
	}
	if img.Config == nil {
		return nil, nil
	}
	return append(slices.Clone(img.Config.Entrypoint), img.Config.Cmd...), nil
}

// writeFiles writes the host files the container bind-mounts: its
// agent.json and, with GatewayDNS, its resolv.conf.
func (r *Runtime) writeFiles(spec runtime.Spec) error {
	agentConf, err := json.Marshal(agentproto.Config{Token: spec.AgentToken, Port: agentproto.Port})
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(r.agentConfPath(spec.ID), agentConf, 0o600); err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	if r.cfg.GatewayDNS {
		conf := "nameserver " + r.net.gateway.String() + "\n"
		if err := atomicfile.WriteFile(r.resolvConfPath(spec.ID), []byte(conf), 0o644); err != nil {
			return fmt.Errorf("docker: %w", err)
		}
	}
	return nil
}

// containerConfig is the container's config: the agent as entrypoint,
// the user command as its arguments, and the labels List reads back.
func (r *Runtime) containerConfig(spec runtime.Spec, user []string) (*container.Config, error) {
	specLabels, err := json.Marshal(spec.Labels)
	if err != nil {
		return nil, err
	}
	hostname := spec.ID
	if len(hostname) > 12 {
		hostname = strings.TrimRight(hostname[:12], "-")
	}
	return &container.Config{
		Image:      spec.Image,
		Hostname:   hostname,
		User:       "0:0",
		Entrypoint: agentproto.Args(nil),
		Cmd:        user,
		Env:        envList(spec.Env),
		WorkingDir: spec.WorkingDir,
		Labels: map[string]string{
			LabelSandbox:    spec.ID,
			LabelScope:      r.cfg.Scope,
			LabelCreatedAt:  time.Now().UTC().Format(time.RFC3339Nano),
			LabelClass:      spec.Class,
			LabelImage:      spec.Image,
			LabelSpecLabels: string(specLabels),
		},
	}, nil
}

// hostConfig is the container's host config: mounts, capabilities and
// limits. It stages the named volumes' binds and returns their labels.
func (r *Runtime) hostConfig(ctx context.Context, spec runtime.Spec) (*container.HostConfig, map[string]string, error) {
	id := spec.ID
	noInit := false
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
		Resources: r.resources(spec.Resources),
	}
	if r.cfg.GatewayDNS {
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
		return nil, nil, err
	}
	host.Mounts = append(host.Mounts, named...)
	return host, volLabels, nil
}

// start starts the created container and isolates its bridge port.
func (r *Runtime) start(ctx context.Context, id string) (runtime.Status, error) {
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
	return r.status(c), nil
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
