package oci

import (
	"context"
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// SnapshotDir implements runtime.Snapshotter: the overlay upper directory
// <Root>/sandboxes/<id>/upper (or disk/upper with a disk quota). runsc sandboxes are ErrNotImplemented:
// gVisor keeps its own overlay (in memory or in a filestore file), so the
// host upper directory does not hold the sandbox's writes; they are
// snapshotted with Checkpoint instead (checkpoint.go).
func (r *Runtime) SnapshotDir(ctx context.Context, id string) (string, error) {
	if !runtime.ValidID(id) {
		return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return "", err
	}
	if r.kinds[rec.Class] == "runsc" {
		return "", errdefs.WithPublic(fmt.Errorf("snapshot of runsc sandbox %q: %w", id, errdefs.ErrNotImplemented),
			"", fmt.Sprintf("runsc sandboxes are snapshotted with their memory, which this runsc release cannot do (gVisor 0.0~%d or later can)", minCheckpointRunsc))
	}
	upper, _ := writableDirs(r.sandboxDir(id))
	fi, err := os.Stat(upper)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("sandbox %q has no writable layer: %w", id, errdefs.ErrFailedPrecondition)
	}
	return upper, nil
}
