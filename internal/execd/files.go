package execd

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web"
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

// permission is the {owner?, group?, mode} request item.
type permission struct {
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  int    `json:"mode"`
}

// fileMetadata is the upload "metadata" part.
type fileMetadata struct {
	Path  string `json:"path"`
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  int    `json:"mode"`
}

func (s *Server) fileRoutes(h func(string, web.HandlerFunc)) {
	h("GET /files/info", s.handleFilesInfo)
	h("DELETE /files", s.handleDeleteFiles)
	h("POST /files/permissions", s.handlePermissions)
	h("POST /files/mv", s.handleMove)
	h("GET /files/search", s.handleSearch)
	h("POST /files/replace", s.handleReplace)
	h("POST /files/upload", s.handleUpload)
	h("GET /files/download", s.handleDownload)
	h("GET /directories/list", s.handleListDir)
	h("POST /directories", s.handleMkdir)
	h("DELETE /directories", s.handleRmdir)
}

// expandPath expands ~, $HOME and $VAR (from env) and makes p absolute.
func expandPath(p string, env []string) string {
	getenv := func(k string) string {
		if v := lookupEnv(env, k); v != "" {
			return v
		}
		return os.Getenv(k)
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		home := getenv("HOME")
		if home == "" {
			home = "/root"
		}
		p = home + p[1:]
	}
	p = os.Expand(p, getenv)
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return p
}

func (s *Server) expand(p string) string { return expandPath(p, s.baseEnv()) }

// parseMode reads an octal-as-decimal mode (755 -> 0o755); 0 means def.
func parseMode(m int, def os.FileMode) (os.FileMode, error) {
	if m == 0 {
		return def, nil
	}
	v, err := strconv.ParseUint(strconv.Itoa(m), 8, 32)
	if err != nil || v > 0o7777 {
		return 0, errdefs.Invalid(CodeInvalidRequestBody, fmt.Sprintf("invalid mode %d: digits must be octal", m))
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

// fileError turns an os error from a call that creates or changes a path
// into an API error:
//
//	ENOENT                        404 FILE_NOT_FOUND
//	EACCES, EPERM                 403 RUNTIME_ERROR
//	ENOTDIR, EISDIR, EEXIST,      409 INVALID_FILE (the path exists with
//	ENOTEMPTY, EXDEV, EROFS,          the wrong type or cannot change)
//	ETXTBSY, EBUSY, EMLINK
//	EINVAL, ENAMETOOLONG, ELOOP   400 INVALID_FILE (a bad path: a NUL byte,
//	                                  a directory moved into itself, ...)
//	ENOSPC, EDQUOT                503 RUNTIME_ERROR
//
// and anything else to 500 RUNTIME_ERROR.
func fileError(err error, what string) error {
	msg := what + ": " + err.Error()
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrNotFound, err), CodeFileNotFound, "file not found: "+err.Error())
	case errors.Is(err, fs.ErrPermission):
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrPermissionDenied, err), CodeRuntimeError, msg)
	case hasClass(err):
		if p, ok := errdefs.PublicOf(err); ok {
			return p
		}
		return errdefs.WithPublic(err, CodeRuntimeError, msg)
	}
	switch errno {
	case syscall.ENOTDIR, syscall.EISDIR, syscall.EEXIST, syscall.ENOTEMPTY, syscall.EXDEV, syscall.EROFS,
		syscall.ETXTBSY, syscall.EBUSY, syscall.EMLINK:
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrConflict, err), CodeInvalidFile, msg)
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP:
		if strings.ContainsRune(err.Error(), 0) {
			msg = what + ": path contains a NUL byte"
		}
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), CodeInvalidFile, msg)
	case syscall.ENOSPC, syscall.EDQUOT:
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrResourceExhausted, err), CodeRuntimeError, msg)
	}
	return errRuntime(err, msg)
}

// lookupError is fileError for a call that only looks a path up (stat,
// open for reading): a path below a regular file (ENOTDIR) does not exist.
func lookupError(err error, what string) error {
	if errors.Is(err, syscall.ENOTDIR) {
		return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrNotFound, err), CodeFileNotFound, "file not found: "+err.Error())
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
		return 0, errdefs.Invalid(CodeInvalidRequestBody, "unknown owner "+strconv.Quote(name))
	}
	return strconv.Atoi(u.Uid)
}

func lookupGID(name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil {
		return n, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, errdefs.Invalid(CodeInvalidRequestBody, "unknown group "+strconv.Quote(name))
	}
	return strconv.Atoi(g.Gid)
}

func applyPermission(p string, perm permission, def os.FileMode) error {
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
		return nil, errMissingQuery("path")
	}
	return paths, nil
}

func (s *Server) handleFilesInfo(w http.ResponseWriter, r *http.Request) error {
	out := make(map[string]FileInfo)
	for _, p := range r.URL.Query()["path"] {
		fp := s.expand(p)
		fi, err := os.Stat(fp)
		if err != nil {
			return lookupError(err, "error accessing file")
		}
		out[p] = toFileInfo(fp, fi)
	}
	return writeJSON(w, out)
}

func (s *Server) handleDeleteFiles(w http.ResponseWriter, r *http.Request) error {
	paths, err := queryPaths(r)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fp := s.expand(p)
		fi, err := os.Lstat(fp)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if err != nil {
			return fileError(err, "error removing file")
		}
		if fi.IsDir() {
			return errdefs.Invalid(CodeInvalidFile, fp+" is a directory; use DELETE /directories")
		}
		if err := os.Remove(fp); err != nil {
			return fileError(err, "error removing file")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handlePermissions(w http.ResponseWriter, r *http.Request) error {
	var req map[string]permission
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	for p, perm := range req {
		fp := s.expand(p)
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

func (s *Server) handleMove(w http.ResponseWriter, r *http.Request) error {
	var req []struct {
		Src  string `json:"src"`
		Dest string `json:"dest"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	for _, m := range req {
		if m.Src == "" || m.Dest == "" {
			return errBody("src and dest are required")
		}
		src, dst := s.expand(m.Src), s.expand(m.Dest)
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

func (s *Server) handleSearch(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	root := q.Get("path")
	if root == "" {
		return errMissingQuery("path")
	}
	pattern := q.Get("pattern")
	if pattern == "" {
		pattern = "**"
	}
	if _, err := matchBase(pattern, ""); err != nil {
		return errdefs.Invalid(CodeInvalidRequestBody, "invalid pattern "+strconv.Quote(pattern))
	}
	root = s.expand(root)
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
	return writeJSON(w, out)
}

func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request) error {
	var req map[string]struct {
		Old string `json:"old"`
		New string `json:"new"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	type result struct {
		ReplacedCount int `json:"replacedCount"`
	}
	results := make(map[string]result)
	for p, item := range req {
		if item.Old == "" {
			return errBody("old content must not be empty")
		}
		fp := s.expand(p)
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
		return writeJSON(w, results)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// handleUpload streams a multipart body of (metadata, file) pairs to disk.
// Pairs are matched in order: the i-th metadata part describes the i-th
// file part. A file part that arrives before its metadata is spooled to the
// state directory.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) error {
	mr, err := multipartReader(r)
	if err != nil {
		return errdefs.Invalid(CodeInvalidFile, "expected a multipart/form-data body: "+err.Error())
	}
	var metas []fileMetadata
	var spooled []string
	defer func() {
		for _, p := range spooled {
			os.Remove(p)
		}
	}()
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.Invalid(CodeInvalidFile, "error reading multipart body: "+err.Error())
		}
		switch part.FormName() {
		case "metadata":
			var m fileMetadata
			if err := json.NewDecoder(io.LimitReader(part, 1<<20)).Decode(&m); err != nil {
				return errdefs.Invalid(CodeInvalidFileMetadata, "invalid metadata part: "+err.Error())
			}
			if m.Path == "" {
				return errdefs.Invalid(CodeInvalidFileMetadata, "metadata path is required")
			}
			if len(spooled) > 0 {
				src := spooled[0]
				spooled = spooled[1:]
				if err := s.placeSpooled(src, m); err != nil {
					os.Remove(src)
					return err
				}
				continue
			}
			metas = append(metas, m)
		case "file":
			if len(metas) > 0 {
				m := metas[0]
				metas = metas[1:]
				if err := s.writeUpload(part, m); err != nil {
					return err
				}
				continue
			}
			f, err := os.CreateTemp(s.dir, "upload-")
			if err != nil {
				return errRuntime(err, "")
			}
			spooled = append(spooled, f.Name())
			bw := bufio.NewWriterSize(f, 1<<20)
			_, err = io.Copy(bw, part)
			if err == nil {
				err = bw.Flush()
			}
			f.Close()
			if err != nil {
				return errdefs.Invalid(CodeInvalidFileContent, "error reading file part: "+err.Error())
			}
		}
		part.Close()
	}
	if len(metas) > 0 || len(spooled) > 0 {
		return errdefs.Invalid(CodeInvalidFile, "metadata and file parts must come in pairs")
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// multipartReader is r.MultipartReader with a 1 MiB read buffer instead
// of 4 KiB, which roughly halves the syscalls of a large upload.
func multipartReader(r *http.Request) (*multipart.Reader, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return nil, err
	}
	if mt != "multipart/form-data" && mt != "multipart/mixed" {
		return nil, fmt.Errorf("content type %q is not multipart", mt)
	}
	if params["boundary"] == "" {
		return nil, http.ErrMissingBoundary
	}
	return multipart.NewReader(bufio.NewReaderSize(r.Body, 1<<20), params["boundary"]), nil
}

func (s *Server) writeUpload(src io.Reader, m fileMetadata) error {
	mode, err := parseMode(m.Mode, 0o644)
	if err != nil {
		return err
	}
	uid, gid, err := resolveOwner(m.Owner, m.Group)
	if err != nil {
		return err
	}
	dst := s.expand(m.Path)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fileError(err, "error creating parent directory")
	}
	_, statErr := os.Lstat(dst)
	created := errors.Is(statErr, fs.ErrNotExist)
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return fileError(err, "error creating file")
	}
	// multipart parts read in chunks of a few KiB: batch the writes.
	bw := bufio.NewWriterSize(f, 1<<20)
	_, err = io.Copy(bw, src)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if created {
			os.Remove(dst) // do not leave a partial new file behind
		}
		return errdefs.Invalid(CodeInvalidFileContent, "error writing "+dst+": "+err.Error())
	}
	if err := os.Chmod(dst, mode); err != nil {
		return fileError(err, "error setting mode")
	}
	if err := chownIDs(dst, uid, gid); err != nil {
		return fileError(err, "error setting owner")
	}
	return nil
}

func (s *Server) placeSpooled(src string, m fileMetadata) error {
	f, err := os.Open(src)
	if err != nil {
		return errRuntime(err, "")
	}
	defer f.Close()
	defer os.Remove(src)
	return s.writeUpload(f, m)
}

// handleDownload serves a file with Range support (206, 416) through
// http.ServeContent.
func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Query().Get("path")
	if p == "" {
		return errMissingQuery("path")
	}
	fp := s.expand(p)
	f, err := os.Open(fp)
	if err != nil {
		return lookupError(err, "error opening file")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileError(err, "error opening file")
	}
	if fi.IsDir() {
		return errdefs.Invalid(CodeInvalidFile, fp+" is a directory")
	}
	if lr, ok, err := parseLineRange(r); ok {
		if err != nil {
			return err
		}
		return serveLines(w, f, lr)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(fp)}))
	ew := &serveErrorWriter{ResponseWriter: w}
	http.ServeContent(ew, r, "", fi.ModTime(), f)
	if ew.status != 0 {
		// A bad Range (416) or a failed precondition (412): ServeContent
		// wrote plain text; answer with the {code, message} envelope.
		w.Header().Del("X-Content-Type-Options")
		web.WriteJSON(w, ew.status, web.ErrorBody{Code: CodeInvalidRequestBody, Message: strings.TrimSpace(ew.msg.String())})
	}
	return nil
}

// serveErrorWriter holds back an error status and body written by
// http.ServeContent so the handler can replace them with a JSON error.
type serveErrorWriter struct {
	http.ResponseWriter
	status int
	msg    strings.Builder
}

func (w *serveErrorWriter) WriteHeader(code int) {
	if code >= 400 {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *serveErrorWriter) Write(p []byte) (int, error) {
	if w.status != 0 {
		return w.msg.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// ReadFrom keeps the server's sendfile path for the file body.
func (w *serveErrorWriter) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok && w.status == 0 {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w}, r)
}

func (w *serveErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// handleListDir lists a directory to the given depth (default 1) in
// lexical order; symlinks are reported as such and not followed.
func (s *Server) handleListDir(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		return errMissingQuery("path")
	}
	depth := 1
	if v := q.Get("depth"); v != "" {
		d, err := strconv.Atoi(v)
		if err != nil || d < 1 {
			return errdefs.Invalid(CodeInvalidRequestBody, "depth must be a positive integer")
		}
		depth = d
	}
	root := s.expand(p)
	fi, err := os.Lstat(root)
	if err != nil {
		return lookupError(err, "error listing directory")
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return errdefs.Invalid(CodeInvalidFile, root+" is a symlink")
	}
	if !fi.IsDir() {
		return errdefs.Invalid(CodeInvalidFile, root+" is not a directory")
	}
	out := []FileInfo{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if level > 1 && errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			ep := filepath.Join(dir, e.Name())
			info, err := e.Info()
			if err != nil {
				continue
			}
			out = append(out, toFileInfo(ep, info))
			if e.IsDir() && level < depth {
				if err := walk(ep, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return fileError(err, "error listing directory")
	}
	return writeJSON(w, out)
}

func (s *Server) handleMkdir(w http.ResponseWriter, r *http.Request) error {
	var req map[string]permission
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	for p, perm := range req {
		mode, err := parseMode(perm.Mode, 0o755)
		if err != nil {
			return err
		}
		uid, gid, err := resolveOwner(perm.Owner, perm.Group)
		if err != nil {
			return err
		}
		fp := s.expand(p)
		if err := os.MkdirAll(fp, mode); err != nil {
			return fileError(err, "error creating directory")
		}
		if perm.Mode != 0 {
			if err := os.Chmod(fp, mode); err != nil {
				return fileError(err, "error creating directory")
			}
		}
		if err := chownIDs(fp, uid, gid); err != nil {
			return fileError(err, "error creating directory")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleRmdir(w http.ResponseWriter, r *http.Request) error {
	paths, err := queryPaths(r)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fp := s.expand(p)
		if fp == "/" {
			return errdefs.Invalid(CodeInvalidFile, "refusing to remove /")
		}
		if err := os.RemoveAll(fp); err != nil {
			return fileError(err, "error removing directory")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
