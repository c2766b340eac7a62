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

// MountRootfs mounts lowers (bottom first) below upper at target, the one
// overlay mount of moat (read-only if upper is ""). Redirects, metacopy
// and the index are off so that CommitLayer can commit the upper dir. A
// lowerdir list over mount(2)'s one page goes as /proc/self/fd/N paths of
// O_PATH descriptors (~200 layers fit). Paths with ',' or ':' are
// ErrInvalidArgument: overlayfs would misparse them.
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
