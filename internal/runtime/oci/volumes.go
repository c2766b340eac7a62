package oci

import (
	"context"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// Named volumes (runtime.Volumes) live in Config.Root/volumes, one quota
// filesystem each (internal/volume.Store). Create acquires the volumes a
// sandbox mounts and binds them (prepareVolumes); cleanup releases them
// once the sandbox's binds are gone; recover sweeps users that no longer
// exist. The store refuses to delete a volume with users.

// CreateVolume implements runtime.Volumes.
func (r *Runtime) CreateVolume(ctx context.Context, spec runtime.VolumeSpec) (runtime.Volume, error) {
	return r.vols.Create(ctx, spec)
}

// GetVolume implements runtime.Volumes.
func (r *Runtime) GetVolume(ctx context.Context, name string) (runtime.Volume, error) {
	return r.vols.Get(ctx, name)
}

// ListVolumes implements runtime.Volumes.
func (r *Runtime) ListVolumes(ctx context.Context) ([]runtime.Volume, error) {
	return r.vols.List(ctx)
}

// DeleteVolume implements runtime.Volumes.
func (r *Runtime) DeleteVolume(ctx context.Context, name string) error {
	return r.vols.Delete(ctx, name)
}
