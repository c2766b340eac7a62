package oci

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// mountOverlay mounts lowers (bottom first) with upper/work at target.
func mountOverlay(lowers []string, upper, work, target string) error {
	if len(lowers) == 0 {
		return fmt.Errorf("oci: image has no layers: %w", errdefs.ErrInvalidArgument)
	}
	// overlayfs wants the topmost lower first.
	rev := make([]string, len(lowers))
	for i, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return fmt.Errorf("oci: layer path %q contains ':' or ',': %w", l, errdefs.ErrInvalidArgument)
		}
		if st, err := os.Stat(l); err != nil || !st.IsDir() {
			return fmt.Errorf("oci: layer %s is not a directory (%v): %w", l, err, errdefs.ErrFailedPrecondition)
		}
		rev[len(lowers)-1-i] = l
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(rev, ":"), upper, work)
	if len(opts) >= os.Getpagesize() {
		return fmt.Errorf("oci: %d layers exceed the overlay mount option size: %w", len(lowers), errdefs.ErrInvalidArgument)
	}
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("oci: mount overlay at %s: %w", target, err)
	}
	return nil
}

// unmountAll unmounts target until nothing is mounted there any more. A
// target that is not a mount point (or does not exist) is fine.
func unmountAll(target string) error {
	for range 8 {
		err := unix.Unmount(target, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(target, unix.MNT_DETACH)
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("oci: unmount %s: %w", target, err)
		}
	}
	return fmt.Errorf("oci: %s still mounted: %w", target, errdefs.ErrInternal)
}
