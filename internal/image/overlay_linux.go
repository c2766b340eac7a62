package image

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// MountRootfs is the one overlay mount of moat: the native runtime mounts
// every sandbox root with it, and snapshots commit its upper dir.
//
// MountRootfs mounts an overlayfs at target with lowers (bottom first, as
// LayerPaths returns them) below upper, using work as the overlay work
// dir (same filesystem as upper, empty). With upper == "" the mount is
// read-only (and a single lower is bind-mounted read-only instead).
//
// Redirects, metacopy and the inode index are switched off, so the upper
// dir stays committable with CommitLayer and layers never gain overlay
// metadata beyond whiteouts and opaque markers.
//
// The mount(2) option string is limited to one page. When the plain
// lowerdir list would not fit, the lowers are opened O_PATH and passed as
// short /proc/self/fd/N paths (the kernel resolves them at mount time;
// the descriptors are closed afterwards), which fits ~200 layers; more is
// ErrInvalidArgument. Paths containing ',' or ':' are ErrInvalidArgument
// (overlayfs would misparse them); a lower that is not a directory is
// ErrFailedPrecondition.
func MountRootfs(lowers []string, upper, work, target string) error {
	if len(lowers) == 0 {
		return fmt.Errorf("overlay mount %s: no lower dirs: %w", target, errdefs.ErrInvalidArgument)
	}
	for _, p := range append(append([]string{}, lowers...), upper, work, target) {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("overlay mount: path %q contains ',' or ':': %w", p, errdefs.ErrInvalidArgument)
		}
	}
	for _, l := range lowers {
		if st, err := os.Stat(l); err != nil || !st.IsDir() {
			return fmt.Errorf("overlay mount: layer %s is not a directory (%v): %w", l, err, errdefs.ErrFailedPrecondition)
		}
	}
	if upper == "" && len(lowers) == 1 {
		if err := unix.Mount(lowers[0], target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount %s: %w", target, err)
		}
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			unix.Unmount(target, unix.MNT_DETACH)
			return fmt.Errorf("remount %s read-only: %w", target, err)
		}
		return nil
	}
	top := make([]string, len(lowers)) // overlayfs wants the top-most first
	for i, l := range lowers {
		top[len(lowers)-1-i] = l
	}
	opts := overlayOptions(top, upper, work)
	if len(opts) >= os.Getpagesize() {
		var fds []int
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		short := make([]string, len(top))
		for i, l := range top {
			fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("overlay lower %s: %w", l, err)
			}
			fds = append(fds, fd)
			short[i] = "/proc/self/fd/" + strconv.Itoa(fd)
		}
		opts = overlayOptions(short, upper, work)
		if len(opts) >= os.Getpagesize() {
			return fmt.Errorf("overlay mount %s: %d layers exceed the mount option limit: %w", target, len(lowers), errdefs.ErrInvalidArgument)
		}
	}
	var flags uintptr
	if upper == "" {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("overlay mount %s: %w", target, err)
	}
	return nil
}

func overlayOptions(top []string, upper, work string) string {
	var b strings.Builder
	b.WriteString("lowerdir=")
	b.WriteString(strings.Join(top, ":"))
	if upper != "" {
		b.WriteString(",upperdir=" + upper + ",workdir=" + work)
	}
	b.WriteString(",redirect_dir=off,metacopy=off,index=off")
	return b.String()
}

// Unmount unmounts target. Not being mounted (or not existing) is not an
// error. A busy mount is detached lazily (MNT_DETACH) so teardown always
// makes progress; the kernel frees it when the last user goes.
func Unmount(target string) error {
	err := unix.Unmount(target, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		return nil
	default:
		return fmt.Errorf("unmount %s: %w", target, err)
	}
}
