package oci

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Per-sandbox disk quota.
//
// A sandbox with Resources.DiskBytes > 0 gets its writable layer on a
// filesystem of its own: a sparse file <dir>/disk.img of that size,
// formatted ext4 (no journal, no reserved blocks) and loop-mounted at
// <dir>/disk; the overlay upper and work dirs are <dir>/disk/upper and
// <dir>/disk/work. Writes beyond the quota fail with ENOSPC inside the
// sandbox and the host filesystem only ever holds the blocks actually
// written. The loop device is attached with LO_FLAGS_AUTOCLEAR, so the
// kernel releases it when <dir>/disk is unmounted (or when the attaching
// process dies before mounting). An ext4 file was chosen over a tmpfs
// upper because tmpfs pages are charged to the sandbox's memory cgroup: a
// full disk would OOM-kill the writer instead of returning ENOSPC.

// minDiskBytes is the smallest quota accepted (ext4 needs some room for
// its metadata).
const minDiskBytes = 16 << 20

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
func setupDisk(dir string, size int64) error {
	img := filepath.Join(dir, diskImage)
	mnt := filepath.Join(dir, diskMount)
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	// lazy init keeps mkfs at a few milliseconds for any size; the
	// sandbox is ephemeral, so no journal.
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=1,nodiscard", img).CombinedOutput()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("oci: disk quota needs mkfs.ext4 (e2fsprogs): %w", errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("oci: mkfs.ext4: %v: %s: %w", err, strings.TrimSpace(string(out)), errdefs.ErrInternal)
	}
	loop, err := attachLoop(f)
	if err != nil {
		return err
	}
	defer loop.Close()
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	if err := unix.Mount(loop.Name(), mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("oci: mount %s at %s: %w", loop.Name(), mnt, err)
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

// attachLoop binds backing to a free loop device (auto-clearing) and
// returns the open device.
func attachLoop(backing *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("oci: disk quota needs loop devices: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	defer ctl.Close()
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("oci: get free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], backing.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("oci: configure loop%d: %w", n, err)
		}
		// Another process took it between GET_FREE and CONFIGURE.
	}
	return nil, fmt.Errorf("oci: no free loop device: %w", errdefs.ErrUnavailable)
}
