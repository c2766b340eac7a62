package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// bindReadOnly makes target a read-only bind mount of the file src (kept
// if it already is one of the same inode).
//
// Why: on every invocation crun (and runc for `runc init`) copies or
// re-mounts its own binary before running, so that a container cannot
// overwrite the host binary through /proc/self/exe (CVE-2019-5736). A
// binary that already lives on a read-only mount is safe and skips that
// step, which saves several milliseconds per call. An upgrade of src is
// picked up on the next New (the inode changes).
func bindReadOnly(src, target string) error {
	var want, got unix.Stat_t
	if err := unix.Stat(src, &want); err != nil {
		return err
	}
	if err := unix.Stat(target, &got); err == nil {
		var fs unix.Statfs_t
		if got.Dev == want.Dev && got.Ino == want.Ino && unix.Statfs(target, &fs) == nil && fs.Flags&unix.ST_RDONLY != 0 {
			return nil
		}
		if err := unmountAll(target); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o500)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}
