package envd

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/moat-sandbox/moat/internal/errdefs"
	fspb "github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem"
)

// metadataPrefix is the xattr namespace of file metadata (X-Metadata-*).
const metadataPrefix = "user.e2b."

// filesystemServer implements filesystem.Filesystem.
type filesystemServer struct{ s *Service }

// fsError classifies a file error about p (nil stays nil): missing is
// not_found, a bad path invalid_argument, a full disk resource_exhausted.
func fsError(err error, p string) error {
	if err == nil {
		return nil
	}
	if _, ok := errdefs.PublicOf(err); ok {
		return err
	}
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errors.Is(err, fs.ErrNotExist), errno == syscall.ENOTDIR:
		return errdefs.Newf(errdefs.ErrNotFound, "path '%s' does not exist", p)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Newf(errdefs.ErrPermissionDenied, "permission denied: %s", p)
	case errno == syscall.ENOSPC, errno == syscall.EDQUOT:
		return errdefs.Newf(errdefs.ErrResourceExhausted, "not enough disk space: %s", p)
	case errno == syscall.EINVAL, errno == syscall.ENAMETOOLONG, errno == syscall.ELOOP, errno == syscall.EISDIR,
		errno == syscall.EEXIST, errno == syscall.ENOTEMPTY, errno == syscall.EXDEV:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s: %v", p, errno)
	}
	return errdefs.Newf(errdefs.ErrInternal, "%s: %v", p, err)
}

// nameOf returns the user or group name of id, or the number.
func nameOf(id uint32, group bool) string {
	s := strconv.FormatUint(uint64(id), 10)
	if group {
		if g, err := user.LookupGroupId(s); err == nil {
			return g.Name
		}
		return s
	}
	if u, err := user.LookupId(s); err == nil {
		return u.Username
	}
	return s
}

// entryInfo describes p as envd does: permissions from lstat; for a
// symlink the resolved target, with type and mode of the target
// (unspecified when it dangles).
func entryInfo(p string) (*fspb.EntryInfo, error) {
	li, err := os.Lstat(p)
	if err != nil {
		return nil, fsError(err, p)
	}
	e := &fspb.EntryInfo{
		Name:         filepath.Base(p),
		Path:         p,
		Size:         li.Size(),
		Permissions:  li.Mode().String(),
		ModifiedTime: timestamppb.New(li.ModTime()),
		Metadata:     readMetadata(p),
	}
	fi := fs.FileInfo(li)
	if li.Mode()&os.ModeSymlink != 0 {
		// The type and mode are the target's; a link that cannot be
		// resolved points at itself and has neither.
		target, terr := filepath.EvalSymlinks(p)
		if terr != nil {
			target = p
		}
		e.SymlinkTarget = &target
		fi = nil
		if ti, err := os.Stat(target); err == nil {
			fi = ti
		}
	}
	if fi != nil {
		switch {
		case fi.Mode().IsRegular():
			e.Type = fspb.FileType_FILE_TYPE_FILE
		case fi.IsDir():
			e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
		}
		e.Mode = uint32(fi.Mode().Perm())
	}
	if st, ok := li.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = nameOf(st.Uid, false), nameOf(st.Gid, true)
	}
	return e, nil
}

// readMetadata returns p's user.e2b.* xattrs without the prefix (nil if
// none or unsupported).
func readMetadata(p string) map[string]string {
	names := listXattrs(p)
	var md map[string]string
	for _, n := range names {
		if !strings.HasPrefix(n, metadataPrefix) {
			continue
		}
		buf := make([]byte, 4096)
		sz, err := unix.Lgetxattr(p, n, buf)
		if err != nil {
			continue
		}
		if md == nil {
			md = make(map[string]string)
		}
		md[strings.TrimPrefix(n, metadataPrefix)] = string(buf[:sz])
	}
	return md
}

func listXattrs(p string) []string {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// writeMetadata replaces p's metadata with md (empty clears it).
func writeMetadata(p string, md map[string]string) error {
	for _, n := range listXattrs(p) {
		if strings.HasPrefix(n, metadataPrefix) {
			unix.Lremovexattr(p, n)
		}
	}
	for k, v := range md {
		if err := unix.Lsetxattr(p, metadataPrefix+k, []byte(v), 0); err != nil {
			return errdefs.Newf(errdefs.ErrInternal, "set metadata on %s: %v", p, err)
		}
	}
	return nil
}

func (f *filesystemServer) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	a, p, err := f.s.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcError(err)
	}
	var e *fspb.EntryInfo
	if err := a.as(func() (err error) { e, err = entryInfo(p); return err }); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

// rpcPath resolves an RPC's path for its user.
func (s *Service) rpcPath(h http.Header, p string) (account, string, error) {
	a, err := s.rpcAccount(h)
	if err != nil {
		return account{}, "", err
	}
	rp, err := s.resolvePath(p, a)
	return a, rp, err
}

func (f *filesystemServer) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	a, p, err := f.s.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcError(err)
	}
	var entries []*fspb.EntryInfo
	if err := a.as(func() (err error) { entries, err = listDir(p, int(max(req.Msg.GetDepth(), 1))); return err }); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

// listDir lists p down to depth levels, in lexical order.
func listDir(p string, depth int) ([]*fspb.EntryInfo, error) {
	dir, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, fsError(err, p)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fsError(err, p)
	}
	if !st.IsDir() {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s' is not a directory", p)
	}
	var entries []*fspb.EntryInfo
	err = filepath.WalkDir(dir, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			if q == dir {
				return err
			}
			return nil // a subdirectory that went away or cannot be read
		}
		if q == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, q)
		level := strings.Count(rel, string(filepath.Separator)) + 1
		if e, err := entryInfo(q); err == nil {
			entries = append(entries, e)
		}
		if d.IsDir() && level >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fsError(err, p)
	}
	return entries, nil
}

func (f *filesystemServer) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	a, p, err := f.s.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcError(err)
	}
	var e *fspb.EntryInfo
	err = a.as(func() (err error) {
		if st, err := os.Stat(p); err == nil {
			if st.IsDir() {
				return errdefs.Newf(errdefs.ErrAlreadyExists, "directory '%s' already exists", p)
			}
			return errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s' already exists and is not a directory", p)
		}
		if err := mkdirAll(p); err != nil {
			return err
		}
		e, err = entryInfo(p)
		return err
	})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemServer) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	a, src, err := f.s.rpcPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, rpcError(err)
	}
	dst, err := f.s.resolvePath(req.Msg.GetDestination(), a)
	if err != nil {
		return nil, rpcError(err)
	}
	var e *fspb.EntryInfo
	err = a.as(func() (err error) {
		if _, err := os.Lstat(src); err != nil {
			return fsError(err, src)
		}
		if err := mkdirAll(filepath.Dir(dst)); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return fsError(err, dst)
		}
		e, err = entryInfo(dst)
		return err
	})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func (f *filesystemServer) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	a, p, err := f.s.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcError(err)
	}
	if p == "/" {
		return nil, rpcError(errdefs.Newf(errdefs.ErrInvalidArgument, "refusing to remove /"))
	}
	if err := a.as(func() error { return fsError(os.RemoveAll(p), p) }); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}
