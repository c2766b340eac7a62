package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// ErrSubPath marks a subPath that cannot be mounted: one that leads out
// of the volume (through ".." or a symlink) or through a file. It comes
// wrapped with errdefs.ErrInvalidArgument.
var ErrSubPath = errors.New("subPath cannot be resolved inside the volume")

// OpenSubPath opens sub beneath the directory root, creating missing
// directories (0755), and returns the open file (a directory or a regular
// file). Resolution is confined to root whatever the volume holds: the
// walk goes through os.Root (openat2 RESOLVE_BENEATH on Linux), so a
// symlink or ".." that would leave root is an error, and no component can
// be swapped for a symlink between the check and the open. A subPath
// that escapes is ErrInvalidArgument; one through a non-directory too.
func OpenSubPath(root, sub string) (*os.File, error) {
	if err := runtime.CheckSubPath(sub); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("volume root %s: %w", root, err)
	}
	defer r.Close()
	if sub == "" {
		sub = "."
	}
	f, err := r.Open(sub)
	if errors.Is(err, fs.ErrNotExist) {
		if err = r.MkdirAll(sub, 0o755); err == nil {
			f, err = r.Open(sub)
		}
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || escapes(err) {
			return nil, fmt.Errorf("subPath %q: %w (%v): %w", sub, ErrSubPath, err, errdefs.ErrInvalidArgument)
		}
		return nil, fmt.Errorf("subPath %q: %w", sub, err)
	}
	return f, nil
}

// escapes reports an os.Root refusal: a path that leaves the root.
func escapes(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "path escapes from parent") || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP))
}

// BindSubPath bind-mounts sub of the directory root at target, which it
// creates (a directory or an empty file, like the source). The bind is
// made from the file descriptor OpenSubPath returned, so it mounts exactly
// the object that was checked. It is non-recursive (mounts beneath are not
// carried), nosuid and nodev, and read-only if readOnly.
func BindSubPath(root, sub, target string, readOnly bool) error {
	f, err := OpenSubPath(root, sub)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	switch {
	case st.IsDir():
		err = os.Mkdir(target, 0o700)
	case st.Mode().IsRegular():
		var t *os.File
		if t, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600); err == nil {
			t.Close()
		}
	default:
		return fmt.Errorf("subPath %q: %w (neither a directory nor a regular file): %w", sub, ErrSubPath, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return err
	}
	src := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind volume path %q: %w", sub, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("remount volume path %q: %w", sub, err)
	}
	return nil
}
