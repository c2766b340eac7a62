package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/volume"
)

// Per-sandbox disk quota.
//
// A sandbox with Resources.DiskBytes > 0 gets its writable layer on a
// quota filesystem of its own (volume.CreateFS, the rule shared with
// named volumes): a sparse ext4 file <dir>/disk.img of that size, without
// a journal (the layer is ephemeral), loop-mounted at <dir>/disk; the
// overlay upper and work dirs are <dir>/disk/upper and <dir>/disk/work.
// Writes beyond the quota fail with ENOSPC inside the sandbox; the loop
// device auto-clears when <dir>/disk is unmounted.

// minDiskBytes is the smallest quota accepted.
const minDiskBytes = volume.MinQuotaBytes

const (
	diskImage = "disk.img"
	diskMount = "disk"
)

// writableDirs returns the overlay upper and work dirs of a sandbox
// directory: on the quota filesystem if it has one.
func writableDirs(dir string) (upper, work string) {
	if exists(filepath.Join(dir, diskImage)) {
		return filepath.Join(dir, diskMount, "upper"), filepath.Join(dir, diskMount, "work")
	}
	return filepath.Join(dir, "upper"), filepath.Join(dir, "work")
}

// setupDisk creates, formats and mounts the quota filesystem of size
// bytes in dir, with upper and work directories on it.
func setupDisk(ctx context.Context, dir string, size int64) error {
	img := filepath.Join(dir, diskImage)
	mnt := filepath.Join(dir, diskMount)
	if err := volume.CreateFS(ctx, img, size, volume.FSOptions{}); err != nil {
		return fmt.Errorf("oci: disk quota: %w", err)
	}
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	if err := volume.MountFS(img, mnt); err != nil {
		return fmt.Errorf("oci: disk quota: %w", err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(mnt, d), 0o700); err != nil {
			return fmt.Errorf("oci: %w", err)
		}
	}
	// The container root must be traversable by non-root users.
	if err := os.Chmod(filepath.Join(mnt, "upper"), 0o755); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	return nil
}
