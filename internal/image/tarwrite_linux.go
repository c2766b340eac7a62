package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// tarOptions control writeTar.
type tarOptions struct {
	// overlayUpper converts overlayfs upper-dir metadata to OCI form:
	// 0:0 character devices become ".wh.<name>" and opaque directories get
	// a ".wh..wh..opq" entry. Upper dirs using redirects or metacopy are
	// refused (MountRootfs never enables them).
	overlayUpper bool
}

// writeTar writes dir as an uncompressed layer tar to w. The output is
// deterministic for a given tree: entries are in lexical order, owners
// are numeric only, access and change times are omitted, and hard links
// are emitted as links to the first path seen.
func writeTar(ctx context.Context, w io.Writer, dir string, opts tarOptions) error {
	t := &tarWriter{tw: tar.NewWriter(w), opts: opts, links: map[inode]string{}}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		return t.entry(p, filepath.ToSlash(rel))
	})
	if err != nil {
		return err
	}
	return t.tw.Close()
}

type inode struct{ dev, ino uint64 }

// tarWriter is writeTar's state: the archive and, for hard links, the
// first path seen of each inode with more than one link.
type tarWriter struct {
	tw    *tar.Writer
	opts  tarOptions
	links map[inode]string
}

// entry archives the file at p under the name rel.
func (t *tarWriter) entry(p, rel string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	mtime := time.Unix(st.Mtim.Unix()).UTC()
	if t.opts.overlayUpper && st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(st.Rdev) == 0 && unix.Minor(st.Rdev) == 0 {
		parent, base := filepath.Split(rel)
		return t.tw.WriteHeader(&tar.Header{Name: parent + whiteoutPrefix + base, Typeflag: tar.TypeReg,
			ModTime: mtime, Format: tar.FormatPAX})
	}
	hdr, err := t.header(p, rel, &st)
	if err != nil || hdr == nil {
		return err
	}
	opaque := false
	if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeDir {
		if opaque, err = readXattrs(p, hdr, t.opts); err != nil {
			return err
		}
	}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
		if err := t.content(p, hdr.Size); err != nil {
			return err
		}
	}
	if opaque {
		return t.tw.WriteHeader(&tar.Header{Name: rel + "/" + whiteoutOpaque, Typeflag: tar.TypeReg,
			ModTime: mtime, Format: tar.FormatPAX})
	}
	return nil
}

// header describes the file at p, or returns nil for a socket (which
// cannot be archived).
func (t *tarWriter) header(p, rel string, st *unix.Stat_t) (*tar.Header, error) {
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		Format:  tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case unix.S_IFREG:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
		if st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := t.links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				t.links[key] = rel
			}
		}
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
		var err error
		if hdr.Linkname, err = os.Readlink(p); err != nil {
			return nil, err
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil, nil
	}
	return hdr, nil
}

// content copies size bytes of the regular file at p into the archive.
func (t *tarWriter) content(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	n, err := io.Copy(t.tw, io.LimitReader(f, size))
	f.Close()
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s changed size while archiving", p)
	}
	return nil
}

// readXattrs copies the archivable xattrs of p into hdr and, for overlay
// upper dirs, reports whether p is an opaque directory.
func readXattrs(p string, hdr *tar.Header, opts tarOptions) (opaque bool, err error) {
	names, err := listXattrs(p)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		v, err := getXattr(p, n)
		if err != nil {
			return false, err
		}
		switch {
		case n == "trusted.overlay.opaque" || n == "user.overlay.opaque":
			if opts.overlayUpper && string(v) == "y" {
				opaque = true
			}
		case n == "trusted.overlay.redirect" || n == "user.overlay.redirect" ||
			n == "trusted.overlay.metacopy" || n == "user.overlay.metacopy":
			if opts.overlayUpper {
				return false, fmt.Errorf("%s uses overlayfs %s, which cannot be committed: %w", p, n, errdefs.ErrNotImplemented)
			}
		case strings.HasPrefix(n, "trusted.") || strings.Contains(n, ".overlay."):
			// overlayfs bookkeeping (origin, impure, ...) and other
			// privileged namespaces are not part of the image.
		case strings.HasPrefix(n, "user.") || strings.HasPrefix(n, "security."):
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords[paxXattrPrefix+n] = string(v)
		}
	}
	return opaque, nil
}

func listXattrs(p string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", p, err)
		}
		var out []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get xattr %s of %s: %w", name, p, err)
		}
		return buf[:n], nil
	}
}
