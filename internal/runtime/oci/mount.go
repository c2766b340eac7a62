package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/mountinfo"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/volume"
)

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

// dropRootfs unmounts the host's copy of a started sandbox's root
// filesystem (runc and crun; runsc's gofer serves the root from the
// host's mount). The sandbox keeps its own copy: its mount namespace was
// cloned from the host's with the root mounted, and the root is private
// (Create), so the unmount does not propagate to it. The sandbox's root
// lives as long as its mount namespace, that is until its last process
// exits; snapshots read the upper dir, not the mount.
//
// Why: every mount left in the host's namespace is copied into each new
// sandbox's mount namespace at clone and shown, with its long overlay
// options, each time a runtime reads /proc/self/mountinfo: with a root
// mount per sandbox, a create cost grew with the number of sandboxes
// (1,000 cold creates on 2 cores: 34/s over the first 250, 14/s over
// 1,000). If the unmount fails, the mount stays until Delete unmounts
// it, as it did before.
func (r *Runtime) dropRootfs(rootfs string) {
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil {
		r.log.Warn("oci: cannot drop the host's mount of a sandbox root", "path", rootfs, "err", err)
	}
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

// volumesDir holds the host-side binds of a sandbox's host volumes.
const volumesDir = "volumes"

// prepareVolumes bind-mounts each volume at dir/volumes/<i> and returns
// the mounts with those paths as sources. A named volume (Mount.Volume) is
// acquired (its filesystem mounted, the sandbox recorded as a user) and
// its SubPath bound confined to it (volume.BindSubPath).
//
// Why not hand the host path to the OCI runtime directly: crun makes
// every bind mount recursive, and runc's "ro" only applies to the top
// mount, so mounts beneath a host path would show up in the sandbox, and
// writable even in a read-only volume. A non-recursive bind made here
// carries no submounts, and it is made read-only (and nosuid, nodev)
// before any runtime sees it, whichever runtime that is.
func prepareVolumes(dir string, vols []runtime.Mount, acquire func(name string) (string, error)) ([]runtime.Mount, error) {
	if len(vols) == 0 {
		return nil, nil
	}
	base := filepath.Join(dir, volumesDir)
	if err := os.Mkdir(base, 0o700); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	out := make([]runtime.Mount, 0, len(vols))
	for i, v := range vols {
		target := filepath.Join(base, strconv.Itoa(i))
		if v.Volume != "" {
			root, err := acquire(v.Volume)
			if err != nil {
				return nil, fmt.Errorf("oci: volume %s: %w", v.Volume, err)
			}
			if err := volume.BindSubPath(root, v.SubPath, target, v.ReadOnly); err != nil {
				return nil, fmt.Errorf("oci: volume %s: %w", v.Volume, err)
			}
			out = append(out, runtime.Mount{Source: target, Destination: v.Destination, ReadOnly: v.ReadOnly})
			continue
		}
		st, err := os.Stat(v.Source)
		if err != nil {
			return nil, fmt.Errorf("oci: volume %s: %w: %w", v.Source, err, errdefs.ErrInvalidArgument)
		}
		if st.IsDir() {
			err = os.Mkdir(target, 0o700)
		} else {
			var f *os.File
			if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600); err == nil {
				f.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
		if err := unix.Mount(v.Source, target, "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("oci: bind volume %s: %w", v.Source, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
		if v.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			return nil, fmt.Errorf("oci: remount volume %s: %w", v.Source, err)
		}
		v.Source = target
		out = append(out, v)
	}
	return out, nil
}

// unmountVolumes undoes prepareVolumes.
func unmountVolumes(dir string) error {
	ents, err := os.ReadDir(filepath.Join(dir, volumesDir))
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range ents {
		if err := unmountAll(filepath.Join(dir, volumesDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or beneath dir. cleanup refuses
// to remove a sandbox directory that has any: RemoveAll would descend
// into a host volume and delete host files.
func mountsUnder(dir string) []string {
	// thread-self: the namespace this thread (and RemoveAll) sees.
	out, err := mountinfo.Under("/proc/thread-self/mountinfo", dir)
	if err != nil {
		return []string{"(cannot read mountinfo: " + err.Error() + ")"}
	}
	return out
}
