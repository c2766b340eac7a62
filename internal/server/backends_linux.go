package server

import (
	"context"
	"net/netip"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/oci"
)

func addPlatformBackends(m map[string]factory) {
	m["oci"] = newOCI
}

func newOCI(ctx context.Context, cfg Config, d deps) (runtime.Runtime, func() error, error) {
	subnet, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil {
		return nil, nil, err
	}
	rt, err := oci.New(ctx, oci.Config{
		Root:         filepath.Join(cfg.Root, "oci"),
		RunRoot:      cfg.RunRoot,
		DefaultClass: cfg.RuntimeClass,
		// Sandbox inits are reparented to the server when runc exits; it
		// reaps them (PID 1 of a container host may not).
		Subreaper: true,
		Network:      network.Config{Bridge: cfg.Bridge, Subnet: subnet},
	}, oci.Deps{Images: ociImages{d.images}, Logger: d.log})
	if err != nil {
		return nil, nil, err
	}
	return rt, rt.Close, nil
}

// ociImages adapts the image store to what the OCI backend needs.
type ociImages struct{ st *image.Store }

func (a ociImages) Rootfs(ctx context.Context, ref string) (oci.Rootfs, error) {
	img, err := a.st.Get(ctx, ref)
	if err != nil {
		return oci.Rootfs{}, err
	}
	layers, err := a.st.LayerPaths(ctx, img)
	if err != nil {
		return oci.Rootfs{}, err
	}
	return oci.Rootfs{Layers: layers, Config: img.Config}, nil
}
