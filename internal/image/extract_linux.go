package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// OCI whiteout markers (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	paxXattrPrefix = "SCHILY.xattr."
)

// extractor unpacks one layer tar into an empty directory so that the
// directory can be used directly as an overlayfs lower dir.
//
// Security: every path in the archive is resolved through an os.Root,
// which follows symlinks only while they stay inside the layer directory
// and refuses absolute or escaping ones; the final component is always
// created with *at(2) calls relative to the resolved parent, never
// following a symlink (O_NOFOLLOW / AT_SYMLINK_NOFOLLOW). Names that
// climb out with ".." are rejected outright. So no entry can write,
// chmod, chown or link anything outside the directory.
type extractor struct {
	root *os.Root
	// rootless skips owners and char/block devices and marks opaque dirs
	// with user.overlay.opaque (for "userxattr" mounts in a user
	// namespace); whiteouts work (kernels >= 5.8 allow 0:0 nodes).
	rootless bool

	// parent caches the most recently opened parent directory; entries
	// are usually grouped by directory. It is dropped whenever anything
	// is removed, since that may have replaced a directory on its path.
	parentName string
	parentFile *os.File

	dirs []dirMeta // applied last, deepest first, so children do not bump mtimes
}

type dirMeta struct {
	name         string
	mode         uint32
	atime, mtime time.Time
}

// extractTar extracts the tar stream r into dir (which must exist and be
// empty). It consumes r only up to the end-of-archive marker.
func extractTar(ctx context.Context, r io.Reader, dir string, rootless bool) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	e := &extractor{root: root, rootless: rootless}
	defer e.close()
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer tar: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if err := e.entry(hdr, tr); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	return e.finishDirs()
}

func (e *extractor) close() {
	e.dropParent()
	e.root.Close()
}

func (e *extractor) dropParent() {
	if e.parentFile != nil {
		e.parentFile.Close()
	}
	e.parentFile, e.parentName = nil, ""
}

// cleanName turns an archive path into a clean relative path ("." for the
// root). Leading slashes are dropped (archives commonly carry them); a
// path that climbs above the root is ErrInvalidArgument.
func cleanName(n string) (string, error) {
	if strings.IndexByte(n, 0) >= 0 {
		return "", fmt.Errorf("NUL in path: %w", errdefs.ErrInvalidArgument)
	}
	c := path.Clean(n)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %q escapes the layer: %w", n, errdefs.ErrInvalidArgument)
	}
	c = strings.TrimLeft(c, "/")
	if c == "" {
		c = "."
	}
	return c, nil
}

func splitName(n string) (parent, base string) {
	parent, base = path.Split(n)
	parent = strings.TrimSuffix(parent, "/")
	if parent == "" {
		parent = "."
	}
	return parent, base
}

// openParent returns a directory fd for parent (resolved inside the root),
// creating missing directories (archives may omit parent entries).
func (e *extractor) openParent(parent string, create bool) (int, error) {
	if e.parentFile != nil && e.parentName == parent {
		return int(e.parentFile.Fd()), nil
	}
	e.dropParent()
	f, err := e.root.Open(parent)
	if errors.Is(err, fs.ErrNotExist) && create {
		if err = e.root.MkdirAll(parent, 0o755); err == nil {
			f, err = e.root.Open(parent)
		}
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return -1, fmt.Errorf("parent %q: %w", parent, errdefs.ErrInvalidArgument)
		}
		// os.Root reports symlink escapes as plain errors.
		return -1, fmt.Errorf("parent %q: %v: %w", parent, err, errdefs.ErrInvalidArgument)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return -1, err
	}
	if !fi.IsDir() {
		f.Close()
		return -1, fmt.Errorf("parent %q is not a directory: %w", parent, errdefs.ErrInvalidArgument)
	}
	e.parentFile, e.parentName = f, parent
	return int(f.Fd()), nil
}

// removeExisting removes base in pfd unless it is a directory and keepDir.
// It reports whether a directory exists (and was kept).
func (e *extractor) removeExisting(pfd int, name, base string, keepDir bool) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return true, nil
		}
		e.dropParent()
		return false, e.root.RemoveAll(name)
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return false, err
	}
	return false, nil
}

func (e *extractor) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("layer root must be a directory: %w", errdefs.ErrInvalidArgument)
		}
		e.dirs = append(e.dirs, dirMeta{name: ".", mode: uint32(hdr.Mode) & 0o7777, atime: hdr.AccessTime, mtime: hdr.ModTime})
		return e.chown(e.rootFd(), ".", hdr, 0)
	}
	parent, base := splitName(name)

	if strings.HasPrefix(base, whiteoutPrefix) {
		return e.whiteout(parent, base)
	}

	pfd, err := e.openParent(parent, true)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return e.dir(pfd, name, base, hdr)
	case tar.TypeReg, tar.TypeGNUSparse: // archive/tar reads the old TypeRegA as TypeReg
		if hdr.Typeflag == tar.TypeGNUSparse {
			return fmt.Errorf("GNU sparse files are not supported: %w", errdefs.ErrInvalidArgument)
		}
		return e.regular(pfd, name, hdr, r)
	case tar.TypeSymlink:
		return e.symlink(pfd, name, hdr)
	case tar.TypeLink:
		return e.hardlink(pfd, name, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return e.device(pfd, name, hdr)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("unsupported tar entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
}

// replace removes whatever is at name (base in pfd) and returns the
// parent's fd again, since a removal drops the cached parent.
func (e *extractor) replace(pfd int, name string) (int, error) {
	parent, base := splitName(name)
	if _, err := e.removeExisting(pfd, name, base, false); err != nil {
		return -1, err
	}
	return e.openParent(parent, true)
}

func (e *extractor) dir(pfd int, name, base string, hdr *tar.Header) error {
	exists, err := e.removeExisting(pfd, name, base, true)
	if err != nil {
		return err
	}
	if !exists {
		// 0o700 until finishDirs, so a read-only dir can still be filled.
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return err
		}
	}
	if err := e.chown(pfd, base, hdr, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if len(hdr.PAXRecords) > 0 {
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = e.xattrs(fd, hdr)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	e.dirs = append(e.dirs, dirMeta{name: name, mode: uint32(hdr.Mode) & 0o7777, atime: hdr.AccessTime, mtime: hdr.ModTime})
	return nil
}

func (e *extractor) regular(pfd int, name string, hdr *tar.Header, r io.Reader) error {
	pfd, err := e.replace(pfd, name)
	if err != nil {
		return err
	}
	_, base := splitName(name)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	if err := e.fill(f, hdr, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return setTimes(pfd, base, hdr)
}

// fill copies a regular file's content into f and applies its owner,
// mode and xattrs (in that order: chown clears set-id bits).
func (e *extractor) fill(f *os.File, hdr *tar.Header, r io.Reader) error {
	if _, err := io.Copy(f, r); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fd := int(f.Fd())
	if err := e.chown(fd, "", hdr, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return err
	}
	return e.xattrs(fd, hdr)
}

func (e *extractor) symlink(pfd int, name string, hdr *tar.Header) error {
	pfd, err := e.replace(pfd, name)
	if err != nil {
		return err
	}
	_, base := splitName(name)
	// The target is stored verbatim: it is only ever resolved inside
	// the sandbox's mount namespace, never by the extractor (os.Root
	// refuses to follow escaping links).
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return err
	}
	if err := e.chown(pfd, base, hdr, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return setTimes(pfd, base, hdr)
}

func (e *extractor) hardlink(pfd int, name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	if target == "." {
		return fmt.Errorf("hard link to the layer root: %w", errdefs.ErrInvalidArgument)
	}
	if pfd, err = e.replace(pfd, name); err != nil {
		return err
	}
	// Open the target's parent separately (it may differ from ours).
	tparent, tbase := splitName(target)
	tf, err := e.root.Open(tparent)
	if err != nil {
		return fmt.Errorf("hard link target %q: %v: %w", hdr.Linkname, err, errdefs.ErrInvalidArgument)
	}
	defer tf.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(tf.Fd()), tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hard link target %q: %v: %w", hdr.Linkname, err, errdefs.ErrInvalidArgument)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hard link to directory %q: %w", hdr.Linkname, errdefs.ErrInvalidArgument)
	}
	_, base := splitName(name)
	// flags 0: linkat does not follow a symlink target.
	return unix.Linkat(int(tf.Fd()), tbase, pfd, base, 0)
}

func (e *extractor) device(pfd int, name string, hdr *tar.Header) error {
	pfd, err := e.replace(pfd, name)
	if err != nil {
		return err
	}
	var typ uint32
	switch hdr.Typeflag {
	case tar.TypeChar:
		typ = unix.S_IFCHR
	case tar.TypeBlock:
		typ = unix.S_IFBLK
	default:
		typ = unix.S_IFIFO
	}
	if e.rootless && typ != unix.S_IFIFO {
		return nil // needs CAP_MKNOD; see extractor.rootless
	}
	_, base := splitName(name)
	mode := uint32(hdr.Mode) & 0o7777
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := unix.Mknodat(pfd, base, typ|mode, int(dev)); err != nil {
		return err
	}
	if err := e.chown(pfd, base, hdr, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	// Mknod applied the umask; chown may have cleared set-id bits.
	if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
		return err
	}
	return setTimes(pfd, base, hdr)
}

func (e *extractor) rootFd() int {
	fd, _ := e.openParent(".", false)
	return fd
}

// whiteout converts an OCI whiteout entry to its overlayfs form: ".wh.x"
// becomes a 0:0 character device "x"; ".wh..wh..opq" marks the parent
// directory opaque. Other ".wh..wh." names are aufs bookkeeping, ignored.
func (e *extractor) whiteout(parent, base string) error {
	pfd, err := e.openParent(parent, true)
	if err != nil {
		return err
	}
	if base == whiteoutOpaque {
		attr := "trusted.overlay.opaque"
		if e.rootless {
			attr = "user.overlay.opaque"
		}
		return unix.Fsetxattr(pfd, attr, []byte("y"), 0)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return fmt.Errorf("bad whiteout %q: %w", base, errdefs.ErrInvalidArgument)
	}
	// A layer must not contain both x and .wh.x; the whiteout wins.
	if _, err := e.removeExisting(pfd, path.Join(parent, target), target, false); err != nil {
		return err
	}
	if pfd, err = e.openParent(parent, true); err != nil {
		return err
	}
	return unix.Mknodat(pfd, target, unix.S_IFCHR, 0)
}

// chown sets the entry's numeric owner (names in the archive are ignored:
// they would be resolved against the host's passwd). Rootless, it does
// nothing.
func (e *extractor) chown(dirfd int, base string, hdr *tar.Header, flags int) error {
	if e.rootless {
		return nil
	}
	return unix.Fchownat(dirfd, base, hdr.Uid, hdr.Gid, flags)
}

// xattrs applies the archive's extended attributes to fd. trusted.* and
// *.overlay.* attributes are dropped: they would let an image forge
// overlayfs metadata (redirects, metacopy, opaque) in the store.
func (e *extractor) xattrs(fd int, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, paxXattrPrefix)
		if !ok {
			continue
		}
		if strings.HasPrefix(attr, "trusted.") || strings.Contains(attr, ".overlay.") {
			continue
		}
		if !strings.HasPrefix(attr, "user.") && !strings.HasPrefix(attr, "security.") {
			continue
		}
		if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil {
			if e.rootless || errors.Is(err, unix.ENOTSUP) {
				continue // best effort without privileges or fs support
			}
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
	}
	return nil
}

func timespecs(hdr *tar.Header) []unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
}

func setTimes(pfd int, base string, hdr *tar.Header) error {
	if err := unix.UtimesNanoAt(pfd, base, timespecs(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// finishDirs applies directory modes and times, deepest last-created
// first, after all content is in place.
func (e *extractor) finishDirs() error {
	for i := len(e.dirs) - 1; i >= 0; i-- {
		d := e.dirs[i]
		parent, base := ".", "."
		if d.name != "." {
			parent, base = splitName(d.name)
		}
		pfd, err := e.openParent(parent, false)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue // replaced by a later entry
		}
		if err := unix.Fchmodat(pfd, base, d.mode, 0); err != nil {
			return fmt.Errorf("chmod %q: %w", d.name, err)
		}
		hdr := &tar.Header{AccessTime: d.atime, ModTime: d.mtime}
		if err := setTimes(pfd, base, hdr); err != nil {
			return err
		}
	}
	return nil
}
