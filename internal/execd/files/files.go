// Package files is the agent's filesystem service: metadata, search,
// replace, permissions, moves, directories, and streamed upload and
// download (with Range and line ranges). Paths are expanded against the
// children's environment (~, $VAR) and errors map errno to execd codes in
// one place (fileError).
package files

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// FileInfo is the execd file metadata shape. Mode is the permission bits
// written as an octal-looking decimal int (0755 -> 755).
type FileInfo struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	CreatedAt  time.Time `json:"created_at"`
	Owner      string    `json:"owner"`
	Group      string    `json:"group"`
	Mode       int       `json:"mode"`
}

// Permission is the {owner?, group?, mode} request item.
type Permission struct {
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  int    `json:"mode"`
}

// Metadata is the upload "metadata" part.
type Metadata struct {
	Path  string `json:"path"`
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  int    `json:"mode"`
}

// Service serves /files and /directories. It keeps no state of its own.
type Service struct {
	run *proc.Runner
}

// New returns a Service that expands paths with run's environment and
// spools uploads in its directory.
func New(run *proc.Runner) *Service { return &Service{run: run} }

// parseMode reads an octal-as-decimal mode (755 -> 0o755); 0 means def.
func parseMode(m int, def os.FileMode) (os.FileMode, error) {
	if m == 0 {
		return def, nil
	}
	v, err := strconv.ParseUint(strconv.Itoa(m), 8, 32)
	if err != nil || v > 0o7777 {
		return 0, errdefs.Invalid(wire.CodeInvalidRequestBody, fmt.Sprintf("invalid mode %d: digits must be octal", m))
	}
	fm := os.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm, nil
}

func formatMode(m os.FileMode) int {
	v := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	i, _ := strconv.Atoi(strconv.FormatUint(uint64(v), 8))
	return i
}

// fileError maps an os error of a call that creates or changes a path to
// an API error: ENOENT 404 FILE_NOT_FOUND, EACCES/EPERM 403, a path of the
// wrong type or that cannot change (ENOTDIR, EEXIST, EXDEV, EROFS, ...)
// 409 INVALID_FILE, a bad path (EINVAL, ENAMETOOLONG, ELOOP) 400
// INVALID_FILE, ENOSPC/EDQUOT 503, anything else 500 RUNTIME_ERROR.
func fileError(err error, what string) error {
	msg := what + ": " + err.Error()
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrNotFound, err), wire.CodeFileNotFound, "file not found: "+err.Error())
	case errors.Is(err, fs.ErrPermission):
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrPermissionDenied, err), wire.CodeRuntimeError, msg)
	case wire.HasClass(err):
		if p, ok := errdefs.PublicOf(err); ok {
			return p
		}
		return errdefs.WithPublic(err, wire.CodeRuntimeError, msg)
	}
	switch errno {
	case syscall.ENOTDIR, syscall.EISDIR, syscall.EEXIST, syscall.ENOTEMPTY, syscall.EXDEV, syscall.EROFS,
		syscall.ETXTBSY, syscall.EBUSY, syscall.EMLINK:
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrConflict, err), wire.CodeInvalidFile, msg)
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP:
		if strings.ContainsRune(err.Error(), 0) {
			msg = what + ": path contains a NUL byte"
		}
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), wire.CodeInvalidFile, msg)
	case syscall.ENOSPC, syscall.EDQUOT:
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrResourceExhausted, err), wire.CodeRuntimeError, msg)
	}
	return wire.Runtime(err, msg)
}

// lookupError is fileError for a call that only looks a path up (stat,
// open for reading): a path below a regular file (ENOTDIR) does not exist.
func lookupError(err error, what string) error {
	if errors.Is(err, syscall.ENOTDIR) {
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrNotFound, err), wire.CodeFileNotFound, "file not found: "+err.Error())
	}
	return fileError(err, what)
}

func fileType(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "directory"
	case m&os.ModeSymlink != 0:
		return "symlink"
	default:
		return "other"
	}
}

func ownerName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

func groupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(id); err == nil {
		return g.Name
	}
	return id
}

func toFileInfo(p string, fi os.FileInfo) FileInfo {
	info := FileInfo{
		Path:       p,
		Type:       fileType(fi.Mode()),
		Size:       fi.Size(),
		ModifiedAt: fi.ModTime(),
		CreatedAt:  fi.ModTime(),
		Mode:       formatMode(fi.Mode()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Owner, info.Group = ownerName(st.Uid), groupName(st.Gid)
		info.CreatedAt = time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	return info
}

// applyOwner chowns p to owner/group (names or numeric ids); empty = keep.
func applyOwner(p, owner, group string) error {
	uid, gid, err := resolveOwner(owner, group)
	if err != nil {
		return err
	}
	return chownIDs(p, uid, gid)
}

// resolveOwner looks owner and group up (-1 = keep), so a request naming
// an unknown one can fail before it changes anything.
func resolveOwner(owner, group string) (uid, gid int, err error) {
	uid, gid = -1, -1
	if owner != "" {
		if uid, err = lookupUID(owner); err != nil {
			return 0, 0, err
		}
	}
	if group != "" {
		if gid, err = lookupGID(group); err != nil {
			return 0, 0, err
		}
	}
	return uid, gid, nil
}

func chownIDs(p string, uid, gid int) error {
	if uid == -1 && gid == -1 {
		return nil
	}
	if err := os.Lchown(p, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", p, err)
	}
	return nil
}

func lookupUID(name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil {
		return n, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, errdefs.Invalid(wire.CodeInvalidRequestBody, "unknown owner "+strconv.Quote(name))
	}
	return strconv.Atoi(u.Uid)
}

func lookupGID(name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil {
		return n, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, errdefs.Invalid(wire.CodeInvalidRequestBody, "unknown group "+strconv.Quote(name))
	}
	return strconv.Atoi(g.Gid)
}

func applyPermission(p string, perm Permission, def os.FileMode) error {
	if perm.Mode != 0 {
		m, err := parseMode(perm.Mode, def)
		if err != nil {
			return err
		}
		if err := os.Chmod(p, m); err != nil {
			return err
		}
	}
	return applyOwner(p, perm.Owner, perm.Group)
}

func queryPaths(r *http.Request) ([]string, error) {
	paths := r.URL.Query()["path"]
	if len(paths) == 0 {
		return nil, wire.MissingQuery("path")
	}
	return paths, nil
}

// Info serves GET /files/info?path=...: metadata of each path.
func (s *Service) Info(w http.ResponseWriter, r *http.Request) error {
	out := make(map[string]FileInfo)
	for _, p := range r.URL.Query()["path"] {
		fp := s.run.Expand(p)
		fi, err := os.Stat(fp)
		if err != nil {
			return lookupError(err, "error accessing file")
		}
		out[p] = toFileInfo(fp, fi)
	}
	return wire.WriteJSON(w, out)
}

// Delete serves DELETE /files?path=...: removes files (missing ones are skipped; directories are refused).
func (s *Service) Delete(w http.ResponseWriter, r *http.Request) error {
	paths, err := queryPaths(r)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fp := s.run.Expand(p)
		fi, err := os.Lstat(fp)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if err != nil {
			return fileError(err, "error removing file")
		}
		if fi.IsDir() {
			return errdefs.Invalid(wire.CodeInvalidFile, fp+" is a directory; use DELETE /directories")
		}
		if err := os.Remove(fp); err != nil {
			return fileError(err, "error removing file")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// Permissions serves POST /files/permissions: chmod/chown of each path.
func (s *Service) Permissions(w http.ResponseWriter, r *http.Request) error {
	var req map[string]Permission
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	for p, perm := range req {
		fp := s.run.Expand(p)
		if _, err := os.Lstat(fp); err != nil {
			return lookupError(err, "error changing permissions")
		}
		if err := applyPermission(fp, perm, 0); err != nil {
			return fileError(err, "error changing permissions for "+p)
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// Move serves POST /files/mv: renames, creating the destination's parents.
func (s *Service) Move(w http.ResponseWriter, r *http.Request) error {
	var req []struct {
		Src  string `json:"src"`
		Dest string `json:"dest"`
	}
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	for _, m := range req {
		if m.Src == "" || m.Dest == "" {
			return wire.BadBody("src and dest are required")
		}
		src, dst := s.run.Expand(m.Src), s.run.Expand(m.Dest)
		if _, err := os.Lstat(src); err != nil {
			return lookupError(err, "error moving file")
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fileError(err, "error moving file")
		}
		if err := os.Rename(src, dst); err != nil {
			return fileError(err, "error moving file")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// matchBase matches a glob against a basename; "**" matches anything
// (there is no "/" in a basename, so it is the same as "*").
func matchBase(pattern, name string) (bool, error) {
	for strings.Contains(pattern, "**") {
		pattern = strings.ReplaceAll(pattern, "**", "*")
	}
	return path.Match(pattern, name)
}

// Search serves GET /files/search: regular files under path whose basename matches pattern.
func (s *Service) Search(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	root := q.Get("path")
	if root == "" {
		return wire.MissingQuery("path")
	}
	pattern := q.Get("pattern")
	if pattern == "" {
		pattern = "**"
	}
	if _, err := matchBase(pattern, ""); err != nil {
		return errdefs.Invalid(wire.CodeInvalidRequestBody, "invalid pattern "+strconv.Quote(pattern))
	}
	root = s.run.Expand(root)
	if _, err := os.Stat(root); err != nil {
		return lookupError(err, "error searching files")
	}
	out := []FileInfo{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if ok, _ := matchBase(pattern, d.Name()); !ok {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		out = append(out, toFileInfo(p, fi))
		return nil
	})
	if err != nil {
		return fileError(err, "error searching files")
	}
	return wire.WriteJSON(w, out)
}

// Replace serves POST /files/replace: replaces every occurrence of old by new in each file.
func (s *Service) Replace(w http.ResponseWriter, r *http.Request) error {
	var req map[string]struct {
		Old string `json:"old"`
		New string `json:"new"`
	}
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	type result struct {
		ReplacedCount int `json:"replacedCount"`
	}
	results := make(map[string]result)
	for p, item := range req {
		if item.Old == "" {
			return wire.BadBody("old content must not be empty")
		}
		fp := s.run.Expand(p)
		fi, err := os.Stat(fp)
		if err != nil {
			return lookupError(err, "error replacing content")
		}
		data, err := os.ReadFile(fp)
		if err != nil {
			return fileError(err, "error replacing content")
		}
		n := strings.Count(string(data), item.Old)
		if n > 0 {
			out := strings.ReplaceAll(string(data), item.Old, item.New)
			if err := os.WriteFile(fp, []byte(out), fi.Mode().Perm()); err != nil {
				return fileError(err, "error replacing content")
			}
		}
		results[p] = result{ReplacedCount: n}
	}
	if r.URL.Query().Get("verbose") == "true" {
		return wire.WriteJSON(w, results)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
