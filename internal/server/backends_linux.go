package server

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/oci"
)

func addPlatformBackends(m map[string]factory) {
	m["oci"] = newOCI
}

func platformClasses() []string { return oci.KnownClasses() }

// newOCI builds the native backend: the sandbox network (bridge, host
// firewall and NAT), the shared egress DNS proxy on the bridge gateway, and
// the OCI runtime whose sandboxes use that proxy as their resolver.
func newOCI(ctx, run context.Context, cfg Config, d deps) (_ backend, err error) {
	agent, err := cfg.agentBinary()
	if err != nil {
		return backend{}, err
	}
	subnet, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil {
		return backend{}, err
	}
	var subnet6 netip.Prefix
	if cfg.Subnet6 != "" {
		if subnet6, err = netip.ParsePrefix(cfg.Subnet6); err != nil {
			return backend{}, err
		}
	}
	netm, err := network.Open(ctx, network.Config{Bridge: cfg.Bridge, Subnet: subnet, Subnet6: subnet6,
		StateDir: filepath.Join(cfg.Root, "oci", "network"), NetnsDir: filepath.Join(cfg.RunRoot, "netns"),
		Spares: cfg.NetworkSpares}, d.log)
	if err != nil {
		return backend{}, fmt.Errorf("network: %w", err)
	}
	defer func() {
		if err != nil {
			netm.Close()
		}
	}()
	eg, stopEgress, err := startEgress(ctx, run, cfg, ociNet{netm}, d)
	if err != nil {
		return backend{}, err
	}
	defer func() {
		if err != nil {
			stopEgress()
		}
	}()
	gw := netm.Gateway()
	imgs := newOCIImages(d.images)
	disk, err := cfg.diskQuotaBytes()
	if err != nil {
		imgs.Close()
		return backend{}, err
	}
	volSize, err := cfg.volumeSizeBytes()
	if err != nil {
		imgs.Close()
		return backend{}, err
	}
	rt, err := oci.New(ctx, oci.Config{
		VolumeDefaultSize: volSize,
		Root:              filepath.Join(cfg.Root, "oci"),
		RunRoot:           cfg.RunRoot,
		DefaultClass:      cfg.RuntimeClass,
		AgentPath:         agent,
		DNSServers:        []string{gw.String()},
		Resources:         runtime.Resources{DiskBytes: disk},
		CgroupParent:      cfg.CgroupParent,
		// Sandbox inits are reparented to the server when runc exits; it
		// reaps them (PID 1 of a container host may not).
		Subreaper: true,
	}, oci.Deps{Images: imgs, Network: netm, Logger: d.log})
	if err != nil {
		imgs.Close()
		return backend{}, err
	}
	closeAll := func() error {
		err := errors.Join(stopEgress(), rt.Close(), netm.Close())
		imgs.Close()
		return err
	}
	return backend{rt: rt, egress: eg, committer: imageCommitter{d.images}, close: closeAll}, nil
}

// ociImages adapts the image store to what the OCI backend needs. It holds
// a lease on the layers of every sandbox (taken at create, again when a
// restarted server re-adopts the sandbox, dropped at delete), so no GC in
// any process (`moat image rm` and `prune` from the CLI, the server's
// disk-budget GC) collects layers under a sandbox, and the layers of an
// image go when its last sandbox does.
type ociImages struct {
	st *image.Store

	mu     sync.Mutex
	leases map[string]*image.Lease // by sandbox ID
}

func newOCIImages(st *image.Store) *ociImages {
	return &ociImages{st: st, leases: map[string]*image.Lease{}}
}

func (a *ociImages) Rootfs(ctx context.Context, id, ref string) (oci.Rootfs, error) {
	l, err := a.st.Acquire(ctx, ref)
	if err != nil {
		return oci.Rootfs{}, err
	}
	a.hold(id, l)
	return oci.Rootfs{Layers: l.Layers, Config: l.Image.Config}, nil
}

func (a *ociImages) Pin(id string, layers []string) error {
	l, err := a.st.LeaseLayers(layers)
	if err != nil {
		return err
	}
	a.hold(id, l)
	return nil
}

func (a *ociImages) hold(id string, l *image.Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old := a.leases[id]; old != nil {
		old.Release()
	}
	a.leases[id] = l
}

func (a *ociImages) Unpin(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.leases[id]; l != nil {
		l.Release()
		delete(a.leases, id)
	}
}

// Close releases every lease.
func (a *ociImages) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, l := range a.leases {
		l.Release()
		delete(a.leases, id)
	}
}

// imageCommitter stores snapshots in the image store as one layer on top
// of the sandbox's image.
type imageCommitter struct{ st *image.Store }

func (c imageCommitter) Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error) {
	base, err := c.st.Get(ctx, baseRef)
	if err != nil {
		return image.Image{}, fmt.Errorf("snapshot base image %s: %w", baseRef, err)
	}
	return c.st.CommitLayer(ctx, upperDir, base, name)
}

func (c imageCommitter) Remove(ctx context.Context, ref string) error { return c.st.Remove(ctx, ref) }
