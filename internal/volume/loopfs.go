package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Quota filesystems: the one rule behind every size limit moat enforces on
// the native runtime (a sandbox's writable layer, a named volume).
//
// A quota filesystem is a sparse file of the limit's size, formatted ext4
// with no reserved blocks and loop-mounted. Writes beyond the limit fail
// with ENOSPC inside the sandbox, and the host filesystem only ever holds
// the blocks actually written. The loop device is attached with
// LO_FLAGS_AUTOCLEAR, so the kernel releases it when the filesystem's last
// mount goes away (or when the attaching process dies before mounting): a
// crashed server leaks no loop device. ext4 was chosen over tmpfs because
// tmpfs pages are charged to the sandbox's memory cgroup: a full disk would
// OOM-kill the writer instead of returning ENOSPC.

// MinQuotaBytes is the smallest quota filesystem accepted (ext4 needs some
// room for its metadata).
const MinQuotaBytes = 16 << 20

// MaxQuotaBytes is the largest: 16 TiB, ext4's limit with 4 KiB blocks
// and without the 64bit feature.
const MaxQuotaBytes = 16 << 40

// FSOptions tune a quota filesystem.
type FSOptions struct {
	// Journal keeps an ext4 journal. Ephemeral filesystems (a sandbox's
	// writable layer) go without, which makes creation a few milliseconds;
	// persistent ones (named volumes) keep it so a host crash cannot
	// corrupt them.
	Journal bool
}

// CreateFS creates the image file img (which must not exist) of size bytes
// and formats it ext4. On error nothing is left behind.
func CreateFS(ctx context.Context, img string, size int64, opts FSOptions) (err error) {
	if size < MinQuotaBytes || size > MaxQuotaBytes {
		return fmt.Errorf("quota filesystem size %d: must be between %d and %d bytes: %w", size, MinQuotaBytes, int64(MaxQuotaBytes), errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("quota filesystem image: %w", err)
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(img)
		}
	}()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("quota filesystem image: %w", err)
	}
	// Lazy init keeps mkfs at a few milliseconds for any size.
	args := []string{"-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}
	if !opts.Journal {
		args = append(args, "-O", "^has_journal")
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", append(args, img)...).CombinedOutput()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("quota filesystems need mkfs.ext4 (e2fsprogs): %w", errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("mkfs.ext4: %v: %s: %w", err, strings.TrimSpace(string(out)), errdefs.ErrInternal)
	}
	return nil
}

// MountFS mounts img's ext4 filesystem at target (an existing
// directory), nosuid and nodev, on a free loop device (auto-clearing).
//
// If the filesystem is still alive on the loop device of an earlier mount,
// MountFS mounts that one again instead. That happens when a mount
// namespace cloned elsewhere on the host (any container being set up)
// holds a copy of the last mount: the unmount here does not end the
// filesystem, which may still hold data not yet written to img. A second
// instance on a new loop device would read img without that data (a file
// written just before the unmount is missing) and the two would then
// overwrite each other's blocks. The kernel shares one instance per
// device, so mounting the live device again keeps a single filesystem.
func MountFS(img, target string) error {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("quota filesystem image: %w", err)
	}
	defer f.Close()
	const flags = unix.MS_NOSUID | unix.MS_NODEV
	if live := liveLoop(img, f); live != nil {
		// Held open, the device cannot auto-clear before the mount.
		err := unix.Mount(live.Name(), target, "ext4", flags, "")
		live.Close()
		if err == nil {
			return nil
		}
		// Its filesystem went in between: a new instance is safe now.
	}
	loop, err := attachLoop(f)
	if err != nil {
		return err
	}
	// Closing the device after the mount is what lets AUTOCLEAR release
	// it once the filesystem is unmounted.
	defer loop.Close()
	if err := unix.Mount(loop.Name(), target, "ext4", flags, ""); err != nil {
		return fmt.Errorf("mount %s at %s: %w", loop.Name(), target, err)
	}
	return nil
}

// liveLoop returns, opened, a loop device still bound to the image file f
// (whose path is img), or nil. The file's identity (device and inode) is
// checked, not only its path: a deleted image's device must not serve a
// new image created at the same path.
func liveLoop(img string, f *os.File) *os.File {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil
	}
	path, err := filepath.EvalSymlinks(img)
	if err != nil {
		return nil
	}
	for _, name := range LoopsBacking(path) {
		dev, err := os.OpenFile("/dev/"+name, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
		if err == nil && info.Device == st.Dev && info.Inode == st.Ino {
			return dev
		}
		dev.Close()
	}
	return nil
}

// attachLoop binds backing to a free loop device (auto-clearing) and
// returns the open device.
func attachLoop(backing *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("quota filesystems need loop devices: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	defer ctl.Close()
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("get free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, err
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
			return nil, fmt.Errorf("configure loop%d: %w", n, err)
		}
		// Another process took it between GET_FREE and CONFIGURE.
	}
	return nil, fmt.Errorf("no free loop device: %w", errdefs.ErrUnavailable)
}

// LoopsReleased waits up to d for every loop device backing path (see
// LoopsBacking) to go, and returns those still there. An auto-clearing
// loop device is released when its filesystem's last mount goes, and a
// mount namespace that another process on the host cloned while the
// volume was mounted (any container being set up) holds a copy of that
// mount until it tears its namespace down: a check right after an unmount
// may see the device for a moment longer.
func LoopsReleased(path string, d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		l := LoopsBacking(path)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LoopsBacking lists the loop devices (e.g. "loop3") whose backing file
// is path or lies under it: tests use it to prove that nothing leaked.
func LoopsBacking(path string) []string {
	ents, _ := os.ReadDir("/sys/block")
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile("/sys/block/" + e.Name() + "/loop/backing_file")
		if err != nil {
			continue
		}
		f := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if f == path || strings.HasPrefix(f, strings.TrimSuffix(path, "/")+"/") {
			out = append(out, e.Name())
		}
	}
	return out
}
